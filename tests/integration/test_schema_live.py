"""Schema changes under a live writer, end to end: source -> Kafka -> three running sql sinks, one
per policy, while a script of DDL runs against the source.

* ``rb`` (``schema_policy: rebuild``, SQLite target): after every step the target equals the
  source (values and the documented types), and a reader polling it meanwhile never sees fewer
  rows than it saw before (no partial or empty table while a rebuild switches).
* ``ev`` (``evolve``, PostgreSQL target): follows the additions and the widenings in place, equals
  the source after each, and stops at the first change it cannot make without losing values,
  with the message naming table, column, both types and the fixing command; none of its rows
  is of the new shape.
* ``fl`` (``fail``, DuckDB target): follows the additions, stops at the first type change, with
  no row of the new shape written.

After each DDL the test rewrites every row (``UPDATE ... SET id = id``) so all rows flow in the
new shape: rows a DDL changes in place without logging them (a new column's default, a renamed
column) are not the subject here (see the sinks' README, "Schema changes").
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path

import orjson
import psycopg2
import pytest
import sqlalchemy as sa

from cdc.log.kafka import KafkaLog
from tests.integration.pg_capture import execute, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

# (step, DDL); the tables and the sinks they stop.
SCRIPT = [
    ("add a nullable column", "ALTER TABLE orders ADD COLUMN c1 text"),
    ("add a column with a default", "ALTER TABLE orders ADD COLUMN c2 integer DEFAULT 0"),
    ("add a NOT NULL column with a default", "ALTER TABLE orders ADD COLUMN c3 integer NOT NULL DEFAULT 7"),
    ("widen a numeric", "ALTER TABLE orders ALTER COLUMN amount TYPE numeric(14,4)"),
    ("int to text", "ALTER TABLE orders ALTER COLUMN qty TYPE text"),
    ("numeric to double", "ALTER TABLE orders ALTER COLUMN amount TYPE double precision"),
    ("drop a column", "ALTER TABLE orders DROP COLUMN note"),
    ("rename a column", "ALTER TABLE orders RENAME COLUMN c1 TO c1r"),
    ("add a table", "CREATE TABLE items (id integer PRIMARY KEY, label text)"),
    ("drop and create a table again", "DROP TABLE items; CREATE TABLE items (id integer PRIMARY KEY, label text, "
                                      "weight numeric(6,3))"),
]
STOPS = {"fl": "widen a numeric", "ev": "numeric to double"}
# SQLite's declared types (the sink's README, "Types") of the changed columns after each step.
SQLITE_TYPES = {"widen a numeric": {"amount": "NUMERIC(14, 4)"}, "int to text": {"qty": "TEXT"},
                "numeric to double": {"amount": "DOUBLE"}}
PG_TYPES = {"widen a numeric": {"amount": "numeric(14,4)"}, "int to text": {"qty": "text"}}


class Writer:
    """Inserts and updates ``orders`` (and ``items`` once it exists) until stopped, in whatever
    shape the tables have; DDL waits for its transactions and they wait for the DDL."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.rng = dsn, random.Random(11)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.changes = 0
        self.error: BaseException | None = None
        self.go, self.idle = threading.Event(), threading.Event()
        self.go.set()

    def pause(self) -> None:
        """Until ``resume``: the test compares source and targets at rest."""
        self.go.clear()
        self.idle.wait(30)

    def resume(self, then: int = 20) -> None:
        """Write again, and return once ``then`` more transactions committed."""
        goal = self.changes + then
        self.go.set()
        wait_until(lambda: self.changes >= goal or self.error, timeout=60, what="the writer writing")

    def _run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        next_id = 1000
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    if not self.go.is_set():
                        self.idle.set()
                        self.go.wait(1)
                        continue
                    self.idle.clear()
                    next_id += 1
                    try:
                        cur.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (next_id, next_id / 1000))
                        cur.execute("UPDATE orders SET amount = amount + 0.001 WHERE id = %s",
                                    (self.rng.randrange(1, 30),))
                        cur.execute("SELECT to_regclass('items')")
                        if cur.fetchone()[0] is not None:
                            cur.execute("INSERT INTO items (id, label) VALUES (%s, 'i') ON CONFLICT (id) DO UPDATE "
                                        "SET label = items.label || '.'", (self.rng.randrange(1, 10),))
                    except psycopg2.errors.UndefinedTable:
                        conn.rollback()
                        continue
                    conn.commit()
                    self.changes += 1
                    time.sleep(0.005)
        except BaseException as err:  # noqa: BLE001 - the test reports it
            self.error = err
        finally:
            conn.close()


def _config(tmp_path: Path, source: str, pg_target: str, kafka: str) -> tuple[Path, str]:
    prefix = f"s_{uuid.uuid4().hex[:8]}"
    pg_url = pg_target.replace("postgresql://", "postgresql+psycopg2://", 1)
    sink = "{{name: {0}, type: sql, url: '{1}', topics: ['{2}.public.*'], batch_wait_ms: 50, schema_policy: {3}}}"
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{source}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"sinks:\n"
        f"  - {sink.format('rb', f'sqlite:///{tmp_path}/rb.db', prefix, 'rebuild')}\n"
        f"  - {sink.format('ev', pg_url, prefix, 'evolve')}\n"
        f"  - {sink.format('fl', f'duckdb:///{tmp_path}/fl.duckdb', prefix, 'fail')}\n"
        f"http: null\n")
    return path, prefix


def _run(config: Path, only: str) -> subprocess.Popen:
    out = open(config.parent / f"{only}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config), "--only", only],
                            cwd=config.parent, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _norm(value):
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, float, Decimal)):
        return Decimal(str(value)).normalize()
    return str(value)


def source_columns(dsn: str, table: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
                        "AND table_name = %s ORDER BY ordinal_position", (table,))
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def rows_of(url_or_dsn: str, table: str, columns: list[str]) -> dict:
    select = f"SELECT {', '.join(columns)} FROM {table}"
    if url_or_dsn.startswith("postgresql://"):
        conn = psycopg2.connect(url_or_dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(select)
                fetched = cur.fetchall()
        except psycopg2.Error:
            return {}
        finally:
            conn.close()
    else:
        engine = sa.create_engine(url_or_dsn)
        try:
            with engine.connect() as conn:
                fetched = list(conn.exec_driver_sql(select))
        except sa.exc.DBAPIError:
            return {}
        finally:
            engine.dispose()
    return {row[0]: tuple(_norm(v) for v in row[1:]) for row in fetched}


def sqlite_types(path: Path, table: str) -> dict[str, str]:
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            view = conn.exec_driver_sql(f"SELECT sql FROM sqlite_master WHERE name = '{table}'").scalar()
            physical = view.rsplit(" ", 1)[-1].strip('"')
            return {r[1]: r[2].upper() for r in conn.exec_driver_sql(f"PRAGMA table_info('{physical}')")}
    finally:
        engine.dispose()


def pg_types(dsn: str, table: str) -> dict[str, str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped", (table,))
            return dict(cur.fetchall())
    finally:
        conn.close()


def shape_version(kafka: str, prefix: str, table: str, column: str, type_: str) -> int:
    """The version of the first shape of ``table`` whose ``column`` has ``type_``."""
    log = KafkaLog(kafka)
    try:
        for record in log.read_all(f"{prefix}.schema-changes"):
            value = orjson.loads(record.value)
            if value["table"] == table and any(c["name"] == column and c["type"] == type_ for c in value["columns"]):
                return value["version"]
    finally:
        log.close()
    raise AssertionError(f"no shape of {table} with {column} {type_}")


def newest_row_version(url: str, table: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql(f"SELECT max(__cdc_version) FROM {table}").scalar()
    finally:
        engine.dispose()


def converge(url: str, source: str, table: str, columns: list[str], what: str, timeout: float = 90) -> None:
    """Wait until the target's ``table`` equals the source's (on ``columns``); the difference if not."""
    deadline = time.monotonic() + timeout
    while True:
        there, here = rows_of(url, table, columns), rows_of(source, table, columns)
        if here and there == here:
            return
        if time.monotonic() > deadline:
            differ = {k: (here.get(k), there.get(k)) for k in sorted(set(here) | set(there), key=str)
                      if here.get(k) != there.get(k)}
            raise AssertionError(f"{what} ({table}, {columns}): {len(differ)} keys differ (source, target): "
                                 f"{list(differ.items())[:5]}")
        time.sleep(0.2)


def test_a_ddl_script_under_a_live_writer_reaches_every_policy(pg_dsn, pg_admin_dsn, kafka_bootstrap, tmp_path):
    target = f"target_{uuid.uuid4().hex[:8]}"
    execute(pg_admin_dsn, f'CREATE DATABASE "{target}"')
    target_dsn = pg_admin_dsn.rsplit("/", 1)[0] + "/" + target
    execute(pg_dsn, "CREATE TABLE orders (id integer PRIMARY KEY, qty integer, amount numeric(12,2), note text)",
            "INSERT INTO orders SELECT g, g, g * 1.25, 'seed' FROM generate_series(1, 30) g")
    config, prefix = _config(tmp_path, pg_dsn, target_dsn, kafka_bootstrap)
    processes = {name: _run(config, name) for name in ("src", "rb", "ev", "fl")}
    seen: list[int] = []
    stop_reading = threading.Event()

    def reader() -> None:  # what a reader of the rebuilt target sees, all along
        engine = sa.create_engine(f"sqlite:///{tmp_path}/rb.db")
        while not stop_reading.is_set():
            try:
                with engine.connect() as conn:
                    seen.append(conn.exec_driver_sql("SELECT count(*) FROM orders").scalar())
            except sa.exc.DBAPIError:
                if seen:  # once there, the view never goes away
                    seen.append(-1)
            time.sleep(0.02)
        engine.dispose()

    watcher = threading.Thread(target=reader)
    writer = Writer(pg_dsn)
    try:
        wait_until(lambda: rows_of(f"sqlite:///{tmp_path}/rb.db", "orders", ["id"]), timeout=120, what="first rows")
        watcher.start()
        writer.thread.start()
        following = {"rb": f"sqlite:///{tmp_path}/rb.db", "ev": target_dsn}
        for step, ddl in SCRIPT:
            writer.resume()
            execute(pg_dsn, ddl)  # while the writer writes
            execute(pg_dsn, "UPDATE orders SET id = id")  # every row, in the new shape
            writer.resume()
            writer.pause()
            for table in ("orders", "items"):
                columns = source_columns(pg_dsn, table)
                if not columns:
                    continue
                for name, url in list(following.items()):
                    if STOPS.get(name) == step:
                        continue
                    converge(url, pg_dsn, table, columns, f"{name} equal to the source after '{step}'")
            for column, type_ in SQLITE_TYPES.get(step, {}).items():  # a rebuild switches readers
                wait_until(lambda: sqlite_types(tmp_path / "rb.db", "orders")[column] == type_, timeout=90,
                           what=f"rb: orders.{column} {type_} after '{step}'")
            for column, type_ in PG_TYPES.get(step, {}).items():  # changed in place, before its rows
                if "ev" in following:
                    assert pg_types(target_dsn, "orders__g1")[column] == type_, step
            for name, stop_step in STOPS.items():
                if stop_step == step:
                    assert processes[name].wait(60) != 0, f"{name} did not stop at '{step}'"
                    following.pop(name, None)
        assert writer.error is None, writer.error
        assert writer.changes > 50
    finally:
        writer.stop.set()
        if writer.thread.is_alive():
            writer.thread.join()
        stop_reading.set()
        if watcher.is_alive():
            watcher.join()
        for process in processes.values():
            _stop(process)
    # The rebuilt target never showed a reader a missing, empty or partial table.
    assert seen and min(seen) > 0 and all(b >= a for a, b in zip(seen, seen[1:])), seen[:50]
    # The stopped sinks named what stopped them, and wrote no row of the new shape.
    for name, type_, column, url in (("ev", "double precision", "amount", target_dsn.replace(
            "postgresql://", "postgresql+psycopg2://", 1)), ("fl", "numeric(14,4)", "amount",
                                                           f"duckdb:///{tmp_path}/fl.duckdb")):
        text = (tmp_path / f"{name}.log").read_text()
        assert f"column {column}: " in text and f"-> {type_}" in text and f"cdc rebuild CONFIG {name}" in text, \
            text[-2000:]
        assert newest_row_version(url, "orders__g1") < shape_version(kafka_bootstrap, prefix, "orders", column, type_)
    execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
