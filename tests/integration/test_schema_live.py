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
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path

import orjson
import psycopg2
import pymysql
import pytest
import sqlalchemy as sa

from cdc.log.kafka import KafkaLog
from tests.conftest import mysql_connect
from tests.daemon import run_daemon, stop_daemon as _stop
from tests.integration.pg_capture import execute, wait_until

pytestmark = [pytest.mark.kafka]

STEPS = ["add a nullable column", "add a column with a default", "add a NOT NULL column with a default",
         "widen a numeric", "int to text", "numeric to double", "drop a column", "rename a column", "add a table",
         "drop and create a table again"]
PG_SCRIPT = [
    "ALTER TABLE orders ADD COLUMN c1 text",
    "ALTER TABLE orders ADD COLUMN c2 integer DEFAULT 0",
    "ALTER TABLE orders ADD COLUMN c3 integer NOT NULL DEFAULT 7",
    "ALTER TABLE orders ALTER COLUMN amount TYPE numeric(14,4)",
    "ALTER TABLE orders ALTER COLUMN qty TYPE text",
    "ALTER TABLE orders ALTER COLUMN amount TYPE double precision",
    "ALTER TABLE orders DROP COLUMN note",
    "ALTER TABLE orders RENAME COLUMN c1 TO c1r",
    "CREATE TABLE items (id integer PRIMARY KEY, label text)",
    "DROP TABLE items; CREATE TABLE items (id integer PRIMARY KEY, label text, weight numeric(6,3))",
]
MYSQL_SCRIPT = [
    "ALTER TABLE orders ADD COLUMN c1 text",
    "ALTER TABLE orders ADD COLUMN c2 int DEFAULT 0",
    "ALTER TABLE orders ADD COLUMN c3 int NOT NULL DEFAULT 7",
    "ALTER TABLE orders MODIFY amount decimal(14,4)",
    "ALTER TABLE orders MODIFY qty text",
    "ALTER TABLE orders MODIFY amount double",
    "ALTER TABLE orders DROP COLUMN note",
    "ALTER TABLE orders RENAME COLUMN c1 TO c1r",
    "CREATE TABLE items (id int PRIMARY KEY, label text)",
    "DROP TABLE items; CREATE TABLE items (id int PRIMARY KEY, label text, weight decimal(6,3))",
]
STOPS = {"fl": "widen a numeric", "ev": "numeric to double"}
# SQLite's declared types (the sink's README, "Types") of the changed columns after each step.
SQLITE_TYPES = {"widen a numeric": {"amount": "NUMERIC(14, 4)"}, "int to text": {"qty": "TEXT"},
                "numeric to double": {"amount": "DOUBLE"}}
# The evolving target's types, changed in place (PostgreSQL target: format_type; MariaDB: column_type).
EV_TYPES = {"postgres": {"widen a numeric": {"amount": "numeric(14,4)"}, "int to text": {"qty": "text"}},
            "mysql": {"widen a numeric": {"amount": "decimal(14,4)"}, "int to text": {"qty": "longtext"}}}
# The type names of the shapes the stopped sinks met.
STOPPED_AT = {"postgres": {"fl": "numeric(14,4)", "ev": "double precision"},
              "mysql": {"fl": "decimal(14,4)", "ev": "double"}}


class PgDb:
    kind = "postgres"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.script = PG_SCRIPT

    def connect(self):
        return psycopg2.connect(self.dsn)

    def execute(self, statement: str) -> None:
        execute(self.dsn, statement)

    def seed(self) -> None:
        self.execute("CREATE TABLE orders (id integer PRIMARY KEY, qty integer, amount numeric(12,2), note text, "
                     "t integer DEFAULT 0)")
        self.execute("INSERT INTO orders SELECT g, g, g * 1.25, 'seed', 0 FROM generate_series(1, 30) g")

    def upsert_item(self, cur, key: int) -> None:
        cur.execute("INSERT INTO items (id, label) VALUES (%s, 'i') ON CONFLICT (id) DO UPDATE "
                    "SET label = items.label || '.'", (key,))

    def has_items(self, cur) -> bool:
        cur.execute("SELECT to_regclass('items')")
        return cur.fetchone()[0] is not None

    missing_table = psycopg2.errors.UndefinedTable


class MyDb:
    kind = "mysql"

    def __init__(self, url: str, db: str) -> None:
        self.url, self.db = url, db
        self.script = MYSQL_SCRIPT

    def connect(self):
        return mysql_connect(self.url, self.db)

    def execute(self, statement: str) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for part in statement.split("; "):
                    cur.execute(part)
            conn.commit()
        finally:
            conn.close()

    def seed(self) -> None:
        self.execute("CREATE TABLE orders (id int PRIMARY KEY, qty int, amount decimal(12,2), note text, "
                     "t int DEFAULT 0)")
        self.execute("INSERT INTO orders SELECT seq, seq, seq * 1.25, 'seed', 0 FROM seq_1_to_30")

    def upsert_item(self, cur, key: int) -> None:
        cur.execute("INSERT INTO items (id, label) VALUES (%s, 'i') ON DUPLICATE KEY UPDATE "
                    "label = CONCAT(label, '.')", (key,))

    def has_items(self, cur) -> bool:
        cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() "
                    "AND table_name = 'items'")
        return cur.fetchone()[0] > 0

    missing_table = pymysql.err.ProgrammingError


class Writer:
    """Inserts and updates ``orders`` (and ``items`` once it exists) until stopped, in whatever
    shape the tables have; DDL waits for its transactions and they wait for the DDL."""

    def __init__(self, db) -> None:
        self.db, self.rng = db, random.Random(11)
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
        conn = self.db.connect()
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
                        if self.db.has_items(cur):
                            self.db.upsert_item(cur, self.rng.randrange(1, 10))
                    except self.db.missing_table:  # items dropped in between
                        conn.rollback()
                        continue
                    conn.commit()
                    self.changes += 1
                    time.sleep(0.005)
        except BaseException as err:  # noqa: BLE001 - the test reports it
            self.error = err
        finally:
            conn.close()


def _config(tmp_path: Path, db, ev_url: str, kafka: str) -> tuple[Path, str]:
    prefix = f"s_{uuid.uuid4().hex[:8]}"
    if db.kind == "postgres":
        source, namespace = (f"{{name: src, type: postgres, dsn: '{db.dsn}', tables: ['public.*'], "
                             f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}"), "public"
    else:
        source, namespace = (f"{{name: src, type: mysql, url: '{db.url}', server_id: {random.randrange(10_000, 2**31)}, "
                             f"tables: ['{db.db}.*'], heartbeat_interval: 1}}"), db.db
    sink = "{{name: {0}, type: sql, url: '{1}', topics: ['{2}.{3}.*'], batch_wait_ms: 50, schema_policy: {4}}}"
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {source}\n"
        f"sinks:\n"
        f"  - {sink.format('rb', f'sqlite:///{tmp_path}/rb.db', prefix, namespace, 'rebuild')}\n"
        f"  - {sink.format('ev', ev_url, prefix, namespace, 'evolve')}\n"
        f"  - {sink.format('fl', f'duckdb:///{tmp_path}/fl.duckdb', prefix, namespace, 'fail')}\n"
        f"http: null\n")
    return path, prefix


def _run(config: Path, only: str) -> subprocess.Popen:
    return run_daemon(config, only, log=f"{only}.log")  # a restart appends


def _norm(value):
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, float, Decimal)):
        return Decimal(str(value)).normalize()
    return str(value)


def query(url: str, sql: str) -> list[tuple] | None:
    """Rows of ``sql`` (None when it fails: a table not there yet)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(sql)]
    except sa.exc.DBAPIError:
        return None
    finally:
        engine.dispose()


def source_columns(url: str, table: str) -> list[str]:
    here = "DATABASE()" if url.startswith("mysql") else "current_schema()"
    found = query(url, f"SELECT column_name FROM information_schema.columns WHERE table_schema = {here} "
                       f"AND table_name = '{table}' ORDER BY ordinal_position")
    return [r[0] for r in found or ()]


def rows_of(url: str, table: str, columns: list[str]) -> dict:
    fetched = query(url, f"SELECT {', '.join(columns)} FROM {table}") or []
    return {row[0]: tuple(_norm(v) for v in row[1:]) for row in fetched}


def target_types(url: str, table: str) -> dict[str, str]:
    """Column -> the target's own type name of the table behind view ``table``."""
    if url.startswith("sqlite"):
        view = query(url, f"SELECT sql FROM sqlite_master WHERE name = '{table}'")[0][0]
        physical = view.rsplit(" ", 1)[-1].strip('"')
        return {r[1]: r[2].upper() for r in query(url, f"PRAGMA table_info('{physical}')")}
    if url.startswith("mysql"):
        return dict(query(url, f"SELECT column_name, column_type FROM information_schema.columns "
                               f"WHERE table_schema = DATABASE() AND table_name = '{table}__g1'"))
    return dict(query(url, f"SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                           f"WHERE a.attrelid = '{table}__g1'::regclass AND a.attnum > 0 AND NOT a.attisdropped"))


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


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql)])
def source_and_ev_target(request):
    """(the source database, the URL of the evolving sink's target): PostgreSQL -> a PostgreSQL
    target, MariaDB -> a MariaDB target."""
    if request.param == "postgres":
        dsn, admin = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_admin_dsn")
        target = f"target_{uuid.uuid4().hex[:8]}"
        execute(admin, f'CREATE DATABASE "{target}"')
        yield PgDb(dsn), admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://", 1) + "/" + target
        execute(admin, f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
        return
    url, db = request.getfixturevalue("mysql_url"), request.getfixturevalue("mysql_db")
    target = f"{db}_t"
    MyDb(url, db).execute(f"CREATE DATABASE `{target}`")
    yield MyDb(url, db), url.replace("mysql://", "mysql+pymysql://", 1) + "/" + target
    MyDb(url, db).execute(f"DROP DATABASE IF EXISTS `{target}`")


def source_url(db) -> str:
    if db.kind == "postgres":
        return db.dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
    return db.url.replace("mysql://", "mysql+pymysql://", 1) + "/" + db.db


def test_a_ddl_script_under_a_live_writer_reaches_every_policy(source_and_ev_target, kafka_bootstrap, tmp_path):
    db, ev_url = source_and_ev_target
    db.seed()
    source = source_url(db)
    rb_url = f"sqlite:///{tmp_path}/rb.db"
    config, prefix = _config(tmp_path, db, ev_url, kafka_bootstrap)
    processes = {name: _run(config, name) for name in ("src", "rb", "ev", "fl")}
    seen: list[int] = []
    stop_reading = threading.Event()

    def reader() -> None:  # what a reader of the rebuilt target sees, all along
        engine = sa.create_engine(rb_url)
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
    writer = Writer(db)
    try:
        wait_until(lambda: rows_of(rb_url, "orders", ["id", "t"]), timeout=120, what="first rows")
        watcher.start()
        writer.thread.start()
        following = {"rb": rb_url, "ev": ev_url}
        for step, ddl in zip(STEPS, db.script):
            writer.resume()
            db.execute(ddl)  # while the writer writes
            db.execute("UPDATE orders SET t = t + 1")  # every row, in the new shape
            writer.resume()
            writer.pause()
            for table in ("orders", "items"):
                columns = source_columns(source, table)
                for name, url in list(following.items()) if columns else ():
                    if STOPS.get(name) != step:
                        converge(url, source, table, columns, f"{name} equal to the source after '{step}'")
            for column, type_ in SQLITE_TYPES.get(step, {}).items():  # a rebuild switches readers
                wait_until(lambda: target_types(rb_url, "orders")[column] == type_, timeout=90,
                           what=f"rb: orders.{column} {type_} after '{step}'")
            for column, type_ in EV_TYPES[db.kind].get(step, {}).items():  # changed in place, before its rows
                assert target_types(ev_url, "orders")[column] == type_, step
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
    for name, url in (("ev", ev_url), ("fl", f"duckdb:///{tmp_path}/fl.duckdb")):
        type_ = STOPPED_AT[db.kind][name]
        text = (tmp_path / f"{name}.log").read_text()
        assert "column amount: " in text and f"-> {type_}" in text and f"cdc rebuild CONFIG {name}" in text, \
            text[-2000:]
        newest_row = query(url, "SELECT max(__cdc_version) FROM orders__g1")[0][0]
        assert newest_row < shape_version(kafka_bootstrap, prefix, "orders", "amount", type_)


@pytest.mark.postgres
def test_sinks_killed_after_a_shape_changed_and_inside_a_rebuild_end_equal_to_the_source(
        pg_dsn, pg_admin_dsn, kafka_bootstrap, tmp_path):
    """kill -9 of the evolving sink once its table took the new shape (before or while it writes
    the new rows), and of the rebuilding sink while its new generation is open: after a restart
    both equal the source, and the rebuilt target's readers never saw a partial table."""
    db = PgDb(pg_dsn)
    db.execute("CREATE TABLE orders (id integer PRIMARY KEY, qty integer, amount numeric(12,2), note text, "
               "t integer DEFAULT 0)")
    db.execute("INSERT INTO orders SELECT g, g, g * 1.25, 'seed', 0 FROM generate_series(1, 20000) g")
    target = f"target_{uuid.uuid4().hex[:8]}"
    execute(pg_admin_dsn, f'CREATE DATABASE "{target}"')
    ev_url = pg_admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://", 1) + "/" + target
    source, rb_url = source_url(db), f"sqlite:///{tmp_path}/rb.db"
    config, _ = _config(tmp_path, db, ev_url, kafka_bootstrap)
    processes = {name: _run(config, name) for name in ("src", "rb", "ev")}
    seen: list[int] = []
    stop_reading = threading.Event()

    def reader() -> None:
        engine = sa.create_engine(rb_url)
        while not stop_reading.is_set():
            try:
                with engine.connect() as conn:
                    seen.append(conn.exec_driver_sql("SELECT count(*) FROM orders").scalar())
            except sa.exc.DBAPIError:
                seen.append(-1)
            time.sleep(0.02)
        engine.dispose()

    watcher = threading.Thread(target=reader)
    try:
        columns = ["id", "qty", "amount", "t"]
        for url in (rb_url, ev_url):
            converge(url, source, "orders", columns, "the first fill", timeout=120)
        watcher.start()
        db.execute("ALTER TABLE orders ALTER COLUMN qty TYPE text")
        db.execute("UPDATE orders SET t = t + 1")
        # The evolving sink changed its column in place: kill it now, whatever it wrote since.
        wait_until(lambda: target_types(ev_url, "orders").get("qty") == "text", timeout=90, what="ev: qty text")
        os.killpg(processes["ev"].pid, signal.SIGKILL)
        # The rebuilding sink opened generation 2 and has not switched to it: kill it there.
        deadline = time.monotonic() + 90
        while not query(rb_url, "SELECT 1 FROM cdc_sink_generations WHERE state = 'open'"):
            assert time.monotonic() < deadline, "rb: no rebuild under way"
            time.sleep(0.01)
        os.killpg(processes["rb"].pid, signal.SIGKILL)
        assert query(rb_url, "SELECT generation FROM cdc_sink_generations WHERE state = 'current'") == [(1,)]
        for name in ("ev", "rb"):
            processes[name].wait()
            processes[name] = _run(config, name)
        for url in (rb_url, ev_url):
            converge(url, source, "orders", columns, "after the restart", timeout=120)
        wait_until(lambda: target_types(rb_url, "orders")["qty"] == "TEXT", timeout=90, what="rb: qty TEXT")
    finally:
        stop_reading.set()
        if watcher.is_alive():
            watcher.join()
        for process in processes.values():
            _stop(process)
        execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')
    assert seen and min(seen) == 20000, sorted(set(seen))[:10]


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
    source = source_url(db)
    config, _ = _config(tmp_path, db, ev_url, kafka_bootstrap)
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
