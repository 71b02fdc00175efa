"""Small things a user trips over (issue: running it for months, the papercuts): each with the
behaviour that was wrong."""

from __future__ import annotations

import logging
import uuid

import pytest

from cdc.log.embedded import EmbeddedLog
from tests.integration.pg_capture import topic_state, wait_until


@pytest.mark.mysql
def test_the_mysql_source_logs_ddl_of_captured_databases_only(tmp_path, mysql_url, mysql_db, caplog):
    from tests.integration.test_mysql_source import capturing, execute, mysql_config

    other = f"t_other_{uuid.uuid4().hex[:8]}"
    execute(mysql_url, mysql_db, "CREATE TABLE a (id INT PRIMARY KEY, v TEXT)", "INSERT INTO a VALUES (0, 'y')")
    execute(mysql_url, None, f"CREATE DATABASE `{other}`")
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        caplog.set_level(logging.INFO, logger="sources.mysql.stream")
        with capturing(mysql_config(mysql_url, mysql_db), log, "d") as capture:
            wait_until(lambda: topic_state(log, f"d.{mysql_db}.a"), capture=capture)  # streaming now
            execute(mysql_url, other, "CREATE TABLE noise (id INT PRIMARY KEY)", "ALTER TABLE noise ADD COLUMN x INT")
            execute(mysql_url, mysql_db, "ALTER TABLE a ADD COLUMN extra INT", "INSERT INTO a VALUES (1, 'x', 2)")
            wait_until(lambda: len(topic_state(log, f"d.{mysql_db}.a")) == 2, capture=capture)
    finally:
        log.close()
        execute(mysql_url, None, f"DROP DATABASE IF EXISTS `{other}`")
    ddl = [r.getMessage() for r in caplog.records if r.getMessage().startswith("DDL at")]
    assert any("ADD COLUMN extra" in m for m in ddl), ddl
    assert not any("noise" in m for m in ddl), ddl


@pytest.mark.mysql
def test_mysql_to_mysql_keeps_varchar_and_enum_and_grows_them_in_place(mysql_url, mysql_db):
    from cdc.errors import SchemaChangeError
    from tests.unit.test_sql_sink import TOPIC, Sinks, column_types, rows, schema_record, upsert

    sinks = Sinks(f"{mysql_url}/{mysql_db}")
    try:
        sinks.records[TOPIC] = schema_record([("id", "int"), ("name", "varchar(40)"), ("size", "enum('S','M','it''s')"),
                                              ("note", "text"), ("code", "varchar(5000)")])
        sink = sinks()  # schema_policy: fail
        sink.write([upsert(1, 10, name="Ann", size="it's", note="n", code="c")])
        types = column_types(sink, "orders__g1", full=True)
        assert types["name"] == "VARCHAR(40)" and types["size"] == "ENUM('S','M','IT''S')"
        assert types["note"] == types["code"] == "LONGTEXT"  # text, and a varchar too long to keep
        # Grown in the source: changed in place even under `fail`, nothing lost.
        sinks.records[TOPIC] = schema_record([("id", "int"), ("name", "varchar(99)"), ("size", "enum('S','M','it''s','L')"),
                                              ("note", "text"), ("code", "varchar(5000)")], version=2)
        sink.write([upsert(2, 11, name="B" * 99, size="L", note="m", code="d")])
        types = column_types(sink, "orders__g1", full=True)
        assert types["name"] == "VARCHAR(99)" and types["size"] == "ENUM('S','M','IT''S','L')"
        assert rows(sink, "id, name, size") == [(1, "Ann", "it's"), (2, "B" * 99, "L")]
        # Shrunk: that loses values, so it is a decision for the policy (here: fail).
        sinks.records[TOPIC] = schema_record([("id", "int"), ("name", "varchar(10)"), ("size", "enum('S','M','it''s','L')"),
                                              ("note", "text"), ("code", "varchar(5000)")], version=3)
        with pytest.raises(SchemaChangeError, match="name: varchar.99. -> varchar.10."):
            sink.write([upsert(3, 12, name="C", size="S", note="o", code="e")])
    finally:
        sinks.stop()


def test_grows_only_when_every_value_fits():
    from sinks.sql.types import grows

    assert grows("varchar(10)", "varchar(20)", "mysql") and not grows("varchar(20)", "varchar(10)", "mysql")
    assert grows("enum('a','b')", "enum('a','b','c')", "mysql")
    assert not grows("enum('a','b')", "enum('b','a')", "mysql")  # reordered: stored numbers change meaning
    assert grows("enum('a','bbb')", "varchar(3)", "mysql") and not grows("enum('a','bbb')", "varchar(2)", "mysql")
    assert grows("varchar(10)", "text", "mysql") and not grows("text", "varchar(10)", "mysql")
    assert not grows("varchar(10)", "varchar(20)", "postgresql")  # no string length there to grow


def test_tail_into_head_ends_quietly(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "cdc.yaml"
    config.write_text("log:\n  embedded: {path: ./data, topic_prefix: p}\n"
                      "sources:\n  - {name: gen, type: generator, keys: 50, events: 3000}\nhttp: null\n")
    run = subprocess.run([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=tmp_path, capture_output=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    tail = subprocess.Popen([sys.executable, "-m", "cdc.cli", "tail", str(config), "p.public.items",
                             "--from-beginning"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = tail.stdout.readline()  # what `head -1` reads; then it goes away
    tail.stdout.close()
    _, stderr = tail.communicate(timeout=60)
    assert first.startswith(b"p.public.items[")
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr, stderr.decode()[-2000:]
    assert tail.returncode == 0


def test_a_sinks_log_lines_name_its_phase_and_no_negative_counts(tmp_path):
    """A plugin's own records carry the worker's phase (not `[wh/-]`), and DuckDB's unknown
    row count (-1) is not logged as `forgot -1 deletes`."""
    import subprocess
    import sys

    from cdc.dev.services import free_port
    from tests.integration.test_daemon_control import _rows, _stop, _wait

    port = free_port()
    config = tmp_path / "cdc.yaml"
    # Small batches and a tiny delete memory: the sink prunes its remembered deletes at every write.
    config.write_text("log:\n  embedded: {path: ./data, topic_prefix: p}\n"
                      "sources:\n  - {name: gen, type: generator, keys: 50, events: 300, delete_every: 5}\n"
                      "sinks:\n  - {name: wh, type: sql, url: 'duckdb:///target.db', topics: ['p.*'], "
                      f"batch_size: 20, delete_memory_hours: 0.0001}}\nhttp: '127.0.0.1:{port}'\n")
    process = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait("the sink wrote everything", lambda: (_rows(port).get("wh") or {}).get("events", 0) >= 300, process)
    finally:
        output = _stop(process)
    assert "sql sink wh: started on duckdb" in output
    assert "[wh/-]" not in output, output
    assert "forgot -1" not in output, output


@pytest.mark.postgres
def test_streaming_is_announced_once(tmp_path, pg_dsn):
    """The source says it streams, with the position; the runner does not say it again."""
    import subprocess
    import sys

    import psycopg2

    from cdc.dev.services import free_port
    from tests.integration.test_daemon_control import _rows, _stop, _wait

    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items VALUES (1)")
    port = free_port()
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  embedded: {{path: ./data, topic_prefix: p}}\n"
                      f"sources:\n  - {{name: pg, type: postgres, dsn: '{pg_dsn}', tables: [public.items]}}\n"
                      f"http: '127.0.0.1:{port}'\n")
    process = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait("the source streams", lambda: (_rows(port).get("pg") or {}).get("phase") == "streaming", process)
    finally:
        output = _stop(process)
    assert "sources.postgres.source: streaming from" in output
    assert "phase streaming" not in output, output
