"""Schema changes under a live writer, end to end: source -> Kafka -> running sql sinks, while a
script of DDL runs against the source (tests/live_ddl.py: add columns, rename one, widen a
numeric, int to text, numeric to double, drop a column, add a table, drop and create it again).

For each source (PostgreSQL, MariaDB) and each target kind (PostgreSQL, SQLite, DuckDB), one
daemon per sink, all on that target kind, one per policy:

* ``rb`` (``schema_policy: rebuild``): after every step the target equals the source (values and
  the types of the sink's README), and a reader polling it meanwhile never sees a missing, empty
  or shrinking table while a rebuild switches (DuckDB lets no reader in while the sink runs: there
  the sinks are stopped once caught up, read, and started again at each step).
* ``ev`` (``evolve``): follows the additions, the rename, the widenings in place and numeric ->
  double by the source's own cast, and equals the source after each. On SQLite, which changes no
  column's type, it stops at the first type change, with the message naming table, column, both
  types and the fixing command; none of its rows is of the new shape.
* ``fl`` (``fail``): follows the additions, stops at the rename, with no row of the new shape
  written.

After each DDL but the rename the test rewrites every row (``UPDATE ... SET t = t + 1``) so all
rows flow in the new shape: rows a DDL changes in place without logging them are the subject of
the rename step (its values stay under the new name with no row written again) and of
test_a_new_columns_default_reaches_rows_the_source_never_logged.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psycopg2
import pytest

from tests.daemon import run_daemon
from tests.daemon import stop_daemon as _stop
from tests.integration.pg_capture import execute, wait_until
from tests.live_ddl import (
    STEPS,
    PgDb,
    Reader,
    Writer,
    caught_up,
    converge,
    differences,
    explain_missing,
    query,
    rows_of,
    shape_version,
    source_columns,
    source_db,  # noqa: F401 - the fixture
    target_types,
)

pytestmark = [pytest.mark.kafka]

POLICIES = {"fl": "fail", "ev": "evolve", "rb": "rebuild"}
# The target's own type names of the changed columns after each step (sinks/sql/README.md, "Types").
TYPES = {
    "postgres": {"rename a column": {"c1r": "TEXT"}, "widen a numeric": {"amount": "NUMERIC(14,4)"},
                 "int to text": {"qty": "TEXT"}, "numeric to double": {"amount": "DOUBLE PRECISION"}},
    "sqlite": {"rename a column": {"c1r": "TEXT"}, "widen a numeric": {"amount": "NUMERIC(14, 4)"},
               "int to text": {"qty": "TEXT"}, "numeric to double": {"amount": "DOUBLE"}},
    "duckdb": {"rename a column": {"c1r": "VARCHAR"}, "widen a numeric": {"amount": "DECIMAL(14,4)"},
               "int to text": {"qty": "VARCHAR"}, "numeric to double": {"amount": "DOUBLE"}},
}


def stops_at(name: str, target: str) -> str | None:
    """The step at which sink ``name`` stops on ``target`` (None: it follows every step)."""
    if name == "fl":
        return "rename a column"
    if name == "ev":  # SQLite changes no column type in place
        return "widen a numeric" if target == "sqlite" else None
    return None


def stopped_by(db, name: str, target: str):
    """(what the stop message says, a test of the shape that stopped it) for sink ``name``."""
    step = stops_at(name, target)
    if step == "rename a column":
        return ["column c1 renamed to c1r", "schema_policy: evolve"], lambda cols: "c1r" in cols
    new = {"widen a numeric": {"postgres": "numeric(14,4)", "mysql": "decimal(14,4)"}}[step][db.kind]
    return (["column amount: ", f"-> {new}", f"cdc rebuild CONFIG {name}"],
            lambda cols: cols.get("amount", {}).get("type") == new)


def _source(db, tmp_path: Path) -> tuple[str, str]:
    if db.kind == "postgres":
        return (f"{{name: src, type: postgres, dsn: '{db.dsn}', tables: ['public.*'], "
                f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}"), "public"
    return (f"{{name: src, type: mysql, url: '{db.base}', server_id: {random.randrange(10_000, 2**31)}, "
            f"tables: ['{db.db}.*'], heartbeat_interval: 1}}"), db.db


def _config(tmp_path: Path, db, urls: dict[str, str], kafka: str) -> tuple[Path, str, str]:
    """The config file (sinks named as ``urls``' keys, policies as POLICIES), the topic prefix and
    the source's namespace."""
    prefix = f"s_{uuid.uuid4().hex[:8]}"
    source, namespace = _source(db, tmp_path)
    sink = "{{name: {0}, type: sql, url: '{1}', topics: ['{2}.{3}.*'], batch_wait_ms: 50, schema_policy: {4}}}"
    sinks = "".join(f"  - {sink.format(name, url, prefix, namespace, POLICIES[name])}\n" for name, url in urls.items())
    path = tmp_path / "cdc.yaml"
    path.write_text(f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
                    f"sources:\n  - {source}\nsinks:\n{sinks}http: null\n")
    return path, prefix, namespace


def _run(config: Path, only: str) -> subprocess.Popen:
    return run_daemon(config, only, log=f"{only}.log")  # a restart appends


@pytest.fixture(params=["postgres", "sqlite", "duckdb"])
def target_urls(request, tmp_path):
    """(target kind, sink name -> the URL of its own target database or file)."""
    kind = request.param
    if kind != "postgres":
        suffix = "db" if kind == "sqlite" else "duckdb"
        yield kind, {name: f"{kind}:///{tmp_path}/{name}.{suffix}" for name in POLICIES}
        return
    admin = request.getfixturevalue("pg_admin_dsn")
    names = {name: f"target_{name}_{uuid.uuid4().hex[:8]}" for name in POLICIES}
    for database in names.values():
        execute(admin, f'CREATE DATABASE "{database}"')
    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://", 1)
    yield kind, {name: f"{base}/{database}" for name, database in names.items()}
    for database in names.values():
        execute(admin, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _equal_after(step: str, kind: str, urls: dict[str, str], source: str, processes: dict, config: Path,
                 kafka: str, prefix: str, namespace: str) -> None:
    """Every sink in ``urls`` equals the source (tables, values, the step's types) once caught up."""
    tables = [t for t in ("orders", "items") if source_columns(source, t)]
    if kind != "duckdb":
        for name, url in urls.items():
            for table in tables:
                converge(url, source, table, source_columns(source, table), f"{name} equal to the source after '{step}'")
            _check_types(step, kind, name, url)
        return
    # DuckDB lets no reader in while the sink runs: once the sinks committed everything they
    # consume, stop them (all at once), read, and start them again (their topics may still be
    # filling at the start: then again).
    topics = [f"{prefix}.{namespace}.{t}" for t in tables]
    deadline = time.monotonic() + 120
    while True:
        for name in urls:
            wait_until(lambda: caught_up(kafka, name, topics), timeout=120, what=f"{name} caught up after '{step}'")
        threads = [threading.Thread(target=_stop, args=(processes[name],)) for name in urls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        try:
            differ = {(name, t): d for name, url in urls.items() for t in tables
                      if (d := differences(url, source, t, source_columns(source, t)))}
            if not differ:
                for name, url in urls.items():
                    _check_types(step, kind, name, url)
                return
            if time.monotonic() >= deadline:
                why = "\n".join(explain_missing(kafka, prefix, f"{prefix}.{namespace}.{t}", list(d)[:10], name,
                                                 config.parent / f"{name}.log") for (name, t), d in differ.items())
                raise AssertionError(f"after '{step}': {str(differ)[:800]}\n{why}")
        finally:
            for name in urls:
                processes[name] = _run(config, name)
        time.sleep(1)


def _check_types(step: str, kind: str, name: str, url: str) -> None:
    expected = TYPES[kind].get(step, {})
    wait_until(lambda: all(target_types(url, "orders").get(c) == t for c, t in expected.items()),
               timeout=60, what=f"{name}: {expected} after '{step}'")
    if step == "rename a column":
        assert "c1" not in target_types(url, "orders"), name
    if step == "drop a column" and name == "rb":  # a new generation without it
        assert "note" not in target_types(url, "orders")


def test_a_ddl_script_under_a_live_writer_reaches_every_policy(source_db, target_urls, kafka_bootstrap, tmp_path):
    db, (kind, urls) = source_db, target_urls
    db.seed()
    config, prefix, namespace = _config(tmp_path, db, urls, kafka_bootstrap)
    processes = {name: _run(config, name) for name in ("src", *urls)}
    reader = Reader(urls["rb"]) if kind != "duckdb" else None  # a reader of the rebuilding sink's target
    writer = Writer(db)
    following = dict(urls)
    try:
        _equal_after("the first fill", kind, following, db.url, processes, config, kafka_bootstrap, prefix, namespace)
        if reader:
            reader.start()
        writer.start()
        for step, ddl in zip(STEPS, db.script):
            writer.resume()
            db.execute(ddl)  # while the writer writes
            if step == "add a nullable column":  # every row, in the new shape, with a value to rename later
                db.execute(f"UPDATE orders SET t = t + 1, c1 = {db.label}")
            elif step != "rename a column":  # the renamed column's values must stay without a rewrite
                db.execute("UPDATE orders SET t = t + 1")
            writer.resume()
            writer.pause()
            for name in [n for n in following if stops_at(n, kind) == step]:
                assert processes[name].wait(90) != 0, f"{name} did not stop at '{step}'"
                del following[name]
            _equal_after(step, kind, following, db.url, processes, config, kafka_bootstrap, prefix, namespace)
        assert writer.error is None, writer.error
        assert writer.changes > 50
    finally:
        writer.close()
        if reader:
            reader.close()
        for process in processes.values():
            _stop(process)
    assert set(following) == {n for n in urls if stops_at(n, kind) is None}, f"{sorted(following)} did not stop"
    # The rebuilt target never showed a reader a missing, empty or partial table.
    if reader:
        assert reader.partial_moments() is None, reader.partial_moments()
    # The stopped sinks named what stopped them, and wrote no row of the new shape.
    for name in [n for n in ("fl", "ev") if stops_at(n, kind)]:
        said, has = stopped_by(db, name, kind)
        text = (tmp_path / f"{name}.log").read_text()
        assert all(part in text for part in said), (said, text[-2000:])
        newest_row = query(urls[name], "SELECT max(__cdc_version) FROM orders__g1")[0][0]
        assert newest_row < shape_version(kafka_bootstrap, prefix, "orders", has)


@pytest.mark.postgres
def test_sinks_killed_between_a_shape_change_and_its_first_row_and_inside_a_rebuild_end_equal_to_the_source(
        pg_dsn, pg_admin_dsn, kafka_bootstrap, tmp_path):
    """kill -9 of the evolving sink after it renamed and retyped its columns for a new shape and
    before it wrote a row of that shape (its write held on a lock the test takes, seen waiting),
    and of the rebuilding sink while its new generation is open and partly written: after a
    restart both equal the source (the renamed column's values too), and the rebuilt target's
    readers never saw a partial table."""
    db = PgDb(pg_dsn)
    db.execute("CREATE TABLE orders (id integer PRIMARY KEY, qty integer, amount numeric(12,2), note text, "
               "t integer DEFAULT 0, c1 text)")
    db.execute("INSERT INTO orders SELECT g, g, g * 1.25, 'seed', 0, 'v' || g FROM generate_series(1, 20000) g")
    target = f"target_{uuid.uuid4().hex[:8]}"
    execute(pg_admin_dsn, f'CREATE DATABASE "{target}"')
    ev_url = pg_admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://", 1) + "/" + target
    source, rb_url = db.url, f"sqlite:///{tmp_path}/rb.db"
    config, prefix, _ = _config(tmp_path, db, {"rb": rb_url, "ev": ev_url}, kafka_bootstrap)
    processes = {name: _run(config, name) for name in ("src", "rb", "ev")}
    reader = Reader(rb_url)
    hold = psycopg2.connect(ev_url.replace("postgresql+psycopg2://", "postgresql://", 1))
    try:
        for url in (rb_url, ev_url):
            converge(url, source, "orders", ["id", "qty", "amount", "t", "c1"], "the first fill", timeout=120)
        reader.start()
        # Every write of a live sink first reads the current generation under a shared row lock:
        # held here, the sink does its DDL for the new shape and then waits before any row.
        with hold.cursor() as cur:
            cur.execute("SELECT * FROM cdc_sink_generations FOR UPDATE")
        db.execute("ALTER TABLE orders RENAME COLUMN c1 TO c1r; ALTER TABLE orders ALTER COLUMN qty TYPE text")
        db.execute("UPDATE orders SET t = t + 1")
        wait_until(lambda: {"c1r": "TEXT", "qty": "TEXT"}.items() <= target_types(ev_url, "orders").items(),
                   timeout=90, what="ev: c1r and qty text")
        wait_until(lambda: query(ev_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND wait_event_type = 'Lock'")[0][0] > 0,
                   timeout=60, what="ev: its first write of the new shape waiting")
        os.killpg(processes["ev"].pid, signal.SIGKILL)
        processes["ev"].wait()
        hold.rollback()
        newest_row = query(ev_url, "SELECT max(__cdc_version) FROM orders__g1")[0][0]
        assert newest_row < shape_version(kafka_bootstrap, prefix, "orders", lambda cols: "c1r" in cols)
        # The rebuilding sink renamed in place, then met the type change: kill it once generation 2
        # holds rows and readers still see generation 1.
        deadline = time.monotonic() + 120
        while not (query(rb_url, "SELECT 1 FROM cdc_sink_generations WHERE state = 'open'")
                   and (query(rb_url, "SELECT count(*) FROM orders__g2") or [(0,)])[0][0] > 0):
            assert time.monotonic() < deadline, "rb: no rebuild under way"
            time.sleep(0.01)
        os.killpg(processes["rb"].pid, signal.SIGKILL)
        processes["rb"].wait()
        assert query(rb_url, "SELECT generation FROM cdc_sink_generations WHERE state = 'current'") == [(1,)]
        for name in ("ev", "rb"):
            processes[name] = _run(config, name)
        for url in (rb_url, ev_url):
            converge(url, source, "orders", ["id", "qty", "amount", "t", "c1r"], "after the restart", timeout=120)
            assert "c1" not in target_types(url, "orders")
        wait_until(lambda: target_types(rb_url, "orders")["qty"] == "TEXT", timeout=90, what="rb: qty TEXT")
    finally:
        hold.close()
        reader.close()
        for process in processes.values():
            _stop(process)
        execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
    assert reader.seen and min(reader.seen) == 20000, sorted(set(reader.seen))[:10]


@pytest.mark.postgres
def test_a_new_columns_default_reaches_rows_the_source_never_logged(pg_dsn, pg_admin_dsn, kafka_bootstrap, tmp_path):
    """ADD COLUMN ... DEFAULT gives the existing rows a value without writing them to the WAL: the
    source publishes it with the shape (PostgreSQL's missing value), the sink sets it on the rows
    it wrote before the shape. Nothing rewrites the old rows here."""
    db = PgDb(pg_dsn)
    db.seed()
    target = f"target_{uuid.uuid4().hex[:8]}"
    execute(pg_admin_dsn, f'CREATE DATABASE "{target}"')
    ev_url = pg_admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://", 1) + "/" + target
    source = db.url
    config, _, _ = _config(tmp_path, db, {"ev": ev_url}, kafka_bootstrap)
    processes = {name: _run(config, name) for name in ("src", "ev")}
    try:
        converge(ev_url, source, "orders", ["id", "amount"], "the first fill", timeout=120)
        db.execute("ALTER TABLE orders ADD COLUMN c2 integer NOT NULL DEFAULT 42, ADD COLUMN c4 text DEFAULT 'a, \"b\"'")
        db.execute("INSERT INTO orders (id, c2) VALUES (1000, 7)")  # one row of the new shape
        columns = ["id", "amount", "c2", "c4"]
        converge(ev_url, source, "orders", columns, "the defaults in rows never logged")
        assert len(rows_of(ev_url, "orders", columns)) == 31
    finally:
        for process in processes.values():
            _stop(process)
        execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
