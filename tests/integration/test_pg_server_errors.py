"""PostgreSQL start-up errors against the real server: each is classified by what the server or
libpq reports (cdc/servers/postgres.py), permanent ones name the setting or grant to change, and a
role with REPLICATION that owns its tables can capture the default ``public.*``."""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager

import psycopg2
import psycopg2.extras
import pytest
from pydantic import SecretStr

from cdc.config.validate import parse_config
from cdc.errors import ConfigError, PrerequisiteError, RetriableError
from sources.postgres.source import PostgresSource
from tests.integration.pg_capture import (
    capturing,
    embedded_log,  # noqa: F401 - the fixture ``log``
    execute,
    pg_config,
    topic_state,
    wait_until,
)

pytestmark = pytest.mark.postgres


def _with(dsn: str, *, user: str | None = None, password: str | None = None, database: str | None = None,
          query: str = "") -> str:
    """``dsn`` (a postgresql:// URI of the local stack, no password) with other parts."""
    scheme, rest = dsn.split("://", 1)
    login, location = rest.split("@", 1)
    host, name = location.split("/", 1)
    login = (user or login) + (f":{password}" if password else "")
    return f"{scheme}://{login}@{host}/{database or name}" + (f"?{query}" if query else "")


def _start(dsn: str, tmp_path) -> None:
    _start_with(pg_config(dsn, tmp_path))


def _start_with(config) -> None:
    """``start`` a source; a config made with model_copy skips validation, as a plugin's caller may."""
    source = PostgresSource(config, None)
    try:
        source.start()
    finally:
        source.stop()


@pytest.fixture
def role(pg_admin_dsn):
    """A fresh login role (cluster-wide): dropped after the test with what it owns."""
    name = f"r_{uuid.uuid4().hex[:10]}"
    execute(pg_admin_dsn, f'CREATE ROLE "{name}" LOGIN')
    yield name
    conn = psycopg2.connect(pg_admin_dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        cur.execute("SELECT datname FROM pg_database WHERE datallowconn")
        databases = [r[0] for r in cur.fetchall()]
    conn.close()
    for database in databases:  # a role is dropped only when nothing in any database refers to it
        try:
            execute(_with(pg_admin_dsn, database=database), f'DROP OWNED BY "{name}"')
        except psycopg2.Error:
            pass  # a database dropped meanwhile (another test's)
    execute(pg_admin_dsn, f'DROP ROLE IF EXISTS "{name}"')


@contextmanager
def hba_rules_first(admin_dsn: str, lines: list[str]):
    """pg_hba.conf with ``lines`` before the stack's own rules, put back afterwards. The caller
    waits for evidence that the server reloaded it."""
    conn = psycopg2.connect(admin_dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT setting FROM pg_settings WHERE name = 'hba_file'")
        path = cur.fetchone()[0]
        cur.execute("SELECT pg_read_file(%s)", (path,))
        # COPY writes text format: keep the rules (no comments), with spaces for tabs.
        rules = [line.replace("\t", " ") for line in cur.fetchone()[0].splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]

    def write(content: list[str]) -> None:
        with conn.cursor() as cur:
            target = psycopg2.extensions.QuotedString(path).getquoted().decode()
            cur.execute(f"COPY (SELECT unnest(%s::text[])) TO {target}", (content,))
            cur.execute("SELECT pg_reload_conf()")

    write(lines + rules)
    try:
        yield
    finally:
        write(rules)
        conn.close()


def wait_refused(dsn: str, **kwargs) -> None:
    """Until a connection with ``dsn`` is refused: evidence that the server reloaded pg_hba.conf."""
    deadline = time.monotonic() + 30
    while True:
        try:
            psycopg2.connect(dsn, **kwargs).close()
        except psycopg2.OperationalError:
            return
        assert time.monotonic() < deadline, "the server did not reload pg_hba.conf"
        time.sleep(0.1)


@pytest.fixture
def password_role(pg_admin_dsn, role):
    """``role`` with a password that the server checks (the stack trusts everyone else)."""
    execute(pg_admin_dsn, f"ALTER ROLE \"{role}\" PASSWORD 'right-password'")
    rules = [f"host all {role} 127.0.0.1/32 scram-sha-256", f"host all {role} ::1/128 scram-sha-256"]
    with hba_rules_first(pg_admin_dsn, rules):
        wait_refused(_with(pg_admin_dsn, user=role, password="wrong-password"))
        yield role


def test_a_wrong_password_is_a_config_error_naming_the_dsn(pg_dsn, password_role, tmp_path):
    dsn = _with(pg_dsn, user=password_role, password="wrong-password")
    with pytest.raises(ConfigError) as raised:
        _start(dsn, tmp_path)
    assert not raised.value.retriable
    assert "the dsn (or dsn_file) of source pg" in str(raised.value)
    assert "password" in str(raised.value)


def test_a_missing_database_is_a_config_error(pg_dsn, tmp_path):
    with pytest.raises(ConfigError, match=r"the dsn \(or dsn_file\) of source pg"):
        _start(_with(pg_dsn, database="no_such_database"), tmp_path)


def test_a_bad_sslmode_is_a_config_error_naming_the_option(pg_dsn, tmp_path):
    config = pg_config(pg_dsn, tmp_path).model_copy(update={"dsn": SecretStr(_with(pg_dsn, query="sslmode=sometimes"))})
    with pytest.raises(ConfigError, match=r"sslmode='sometimes' is not one of disable, allow, .*source pg"):
        _start_with(config)


def test_an_unknown_dsn_option_is_a_config_error_naming_it(pg_dsn, tmp_path):
    config = pg_config(pg_dsn, tmp_path).model_copy(update={"dsn": SecretStr(_with(pg_dsn, query="colour=blue"))})
    with pytest.raises(ConfigError, match=r'"colour".*the dsn \(or dsn_file\) of source pg'):
        _start_with(config)


def test_a_bad_dsn_option_is_reported_by_validation_with_its_line(pg_dsn):
    text = f"""
log:
  embedded: {{path: ./log}}
sources:
  - name: pg
    type: postgres
    dsn: "{_with(pg_dsn, query='sslmode=sometimes')}"
"""
    with pytest.raises(ConfigError) as raised:
        parse_config(text)
    [problem] = raised.value.problems
    assert (problem.line, problem.path) == (7, "sources[0].dsn")
    assert "sslmode='sometimes' is not one of" in problem.message


def test_ssl_demanded_of_a_server_without_it_is_a_config_error(pg_dsn, tmp_path):
    # The stack's server has no SSL: libpq gives up before the server says a word.
    with pytest.raises(ConfigError, match=r"not with sslmode=require"):
        _start(_with(pg_dsn, query="sslmode=require"), tmp_path)


def test_a_server_that_does_not_answer_is_retriable(tmp_path):
    with pytest.raises(RetriableError, match="does not answer"):
        _start("postgresql://postgres@127.0.0.1:9/postgres?connect_timeout=5", tmp_path)


# --- a role that is not a superuser -----------------------------------------------------------------

def test_a_replication_role_that_owns_its_tables_captures_public_star(pg_dsn, role, tmp_path, log):
    """README: REPLICATION, plus ownership of the tables and CREATE on the database, is enough for
    the default ``tables: ["public.*"]`` (FOR TABLES IN SCHEMA would need a superuser)."""
    database = pg_dsn.rsplit("/", 1)[1]
    execute(pg_dsn, f'ALTER ROLE "{role}" REPLICATION', f'GRANT CREATE ON DATABASE "{database}" TO "{role}"',
            f'GRANT CREATE ON SCHEMA public TO "{role}"')  # PostgreSQL 15+ grants it to no one else
    dsn = _with(pg_dsn, user=role)
    execute(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)", "INSERT INTO items VALUES (1, 'a')")
    with capturing(pg_config(dsn, tmp_path), log, "ns") as capture:
        wait_until(lambda: topic_state(log, "ns.public.items"), what="the snapshot", capture=capture)
        execute(dsn, "INSERT INTO items VALUES (2, 'b')")
        wait_until(lambda: len(topic_state(log, "ns.public.items")) == 2, what="the stream", capture=capture)
    # A table created later joins the publication at the next start, and is streamed from then on.
    execute(dsn, "CREATE TABLE later (id int PRIMARY KEY)")
    with capturing(pg_config(dsn, tmp_path), log, "ns") as capture:
        wait_until(lambda: _published(dsn, "later"), what="the new table in the publication", capture=capture)
        execute(dsn, "INSERT INTO later VALUES (7)")
        wait_until(lambda: topic_state(log, "ns.public.later"), what="the new table", capture=capture)
    assert topic_state(log, "ns.public.later") == {'{"id":7}': {"id": 7}}


def _published(dsn: str, table: str) -> bool:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_publication_tables WHERE pubname = 'cdc_pg' AND tablename = %s",
                        (table,))
            return cur.fetchone()[0] == 1
    finally:
        conn.close()


def test_a_role_without_replication_is_named(pg_dsn, role, tmp_path):
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY)")
    with pytest.raises(PrerequisiteError, match=f'the role {role} has no REPLICATION.*ALTER ROLE "{role}"'):
        _start(_with(pg_dsn, user=role), tmp_path)


def test_a_role_that_does_not_own_the_tables_is_told_the_fix(pg_dsn, role, tmp_path):
    database = pg_dsn.rsplit("/", 1)[1]
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY)", f'GRANT SELECT ON items TO "{role}"',
            f'ALTER ROLE "{role}" REPLICATION', f'GRANT CREATE ON DATABASE "{database}" TO "{role}"')
    with pytest.raises(PrerequisiteError) as raised:
        _start(_with(pg_dsn, user=role), tmp_path)
    message = str(raised.value)
    assert f'the role {role} does not own "public"."items"' in message
    assert f'OWNER TO "{role}"' in message and "manage_publication: false" in message


def test_a_role_that_cannot_read_a_table_is_told_the_grant(pg_dsn, role, tmp_path):
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY)", f'ALTER ROLE "{role}" REPLICATION')
    with pytest.raises(PrerequisiteError, match=f'GRANT SELECT ON "public"."items" TO "{role}"'):
        _start(_with(pg_dsn, user=role), tmp_path)


def test_a_role_that_cannot_create_the_publication_is_told_the_grant(pg_dsn, role, tmp_path):
    database = pg_dsn.rsplit("/", 1)[1]
    execute(pg_dsn, f'ALTER ROLE "{role}" REPLICATION', f'REVOKE CREATE ON DATABASE "{database}" FROM PUBLIC',
            f'GRANT CREATE ON SCHEMA public TO "{role}"')
    execute(_with(pg_dsn, user=role), "CREATE TABLE items (id int PRIMARY KEY)")
    with pytest.raises(PrerequisiteError, match=f'GRANT CREATE ON DATABASE "{database}" TO "{role}"'):
        _start(_with(pg_dsn, user=role), tmp_path)


def test_a_slot_held_by_a_superusers_process_is_a_classified_error(pg_dsn, role, tmp_path):
    """The source ends a leftover walsender of its own name; a role that may not end it gets an error
    from the tree (here: the grant it lacks), not an unclassified driver error."""
    database = pg_dsn.rsplit("/", 1)[1]
    execute(pg_dsn, f'ALTER ROLE "{role}" REPLICATION', f'GRANT CREATE ON DATABASE "{database}" TO "{role}"',
            f'GRANT CREATE ON SCHEMA public TO "{role}"')
    dsn = _with(pg_dsn, user=role)
    execute(dsn, "CREATE TABLE items (id int PRIMARY KEY)")
    execute(pg_dsn, "CREATE PUBLICATION cdc_pg FOR TABLE items")
    holder = psycopg2.connect(pg_dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                              application_name="cdc-pg")  # a superuser's walsender with the source's name
    try:
        cursor = holder.cursor()
        cursor.create_replication_slot("cdc_pg", output_plugin="pgoutput")
        cursor.start_replication(slot_name="cdc_pg", decode=False,
                                 options={"proto_version": "1", "publication_names": "cdc_pg"})
        conn = psycopg2.connect(pg_dsn)
        try:
            wait_until(lambda: _slot_active(conn), what="the slot held")
        finally:
            conn.close()
        with pytest.raises(PrerequisiteError, match=f"42501.*grant the role {role} "):
            _start(dsn, tmp_path)
    finally:
        holder.close()


def _slot_active(conn) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT active_pid IS NOT NULL FROM pg_replication_slots WHERE slot_name = 'cdc_pg'")
        row = cur.fetchone()
    conn.rollback()
    return bool(row and row[0])


def test_status_with_a_refused_password_names_the_setting_and_does_not_exit_0(pg_dsn, password_role, tmp_path):
    """`cdc status` printed "... is unreachable: ... password authentication failed" and exited
    0; a server that answers and refuses the login is a setting to correct: exit 77."""
    import subprocess
    import sys

    dsn = _with(pg_dsn, user=password_role, password="wrong-password")
    config = tmp_path / "cdc.yaml"
    config.write_text("log:\n  embedded: {path: ./data, topic_prefix: st}\n"
                      f"sources:\n  - {{name: pg, type: postgres, dsn: '{dsn}'}}\nhttp: null\n")
    result = subprocess.run([sys.executable, "-m", "cdc.cli", "status", str(config)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 77, result.stderr
    assert "the dsn (or dsn_file) of source pg" in result.stderr and "unreachable" not in result.stderr
