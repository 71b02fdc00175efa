"""Shared parts of the end-to-end tests of schema changes under live writes: the source databases
with their DDL script, a writer that keeps changing rows in whatever shape the tables have, a
reader that polls a target all along, and the comparisons of a target with its source.

Used by tests/integration/test_schema_live.py; a new end-to-end test that needs a live writer
against PostgreSQL or MariaDB takes ``Writer`` with a ``PgDb``/``MyDb`` from here.
"""

from __future__ import annotations

import random
import threading
import time
from decimal import Decimal

import orjson
import psycopg2
import pymysql
import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from cdc.log.kafka import KafkaLog
from tests.conftest import mysql_connect
from tests.integration.pg_capture import execute, wait_until
from tests.sql import query as rows_of_statement

# The script: (step, PostgreSQL statement, MariaDB statement). A rename comes before the type
# changes so that the sinks which stop at a type change meet it too.
SCRIPT = [
    ("add a nullable column", "ALTER TABLE orders ADD COLUMN c1 text",
     "ALTER TABLE orders ADD COLUMN c1 text"),
    ("add a column with a default", "ALTER TABLE orders ADD COLUMN c2 integer DEFAULT 0",
     "ALTER TABLE orders ADD COLUMN c2 int DEFAULT 0"),
    ("add a NOT NULL column with a default", "ALTER TABLE orders ADD COLUMN c3 integer NOT NULL DEFAULT 7",
     "ALTER TABLE orders ADD COLUMN c3 int NOT NULL DEFAULT 7"),
    ("rename a column", "ALTER TABLE orders RENAME COLUMN c1 TO c1r",
     "ALTER TABLE orders RENAME COLUMN c1 TO c1r"),
    ("widen a numeric", "ALTER TABLE orders ALTER COLUMN amount TYPE numeric(14,4)",
     "ALTER TABLE orders MODIFY amount decimal(14,4)"),
    ("int to text", "ALTER TABLE orders ALTER COLUMN qty TYPE text", "ALTER TABLE orders MODIFY qty text"),
    ("numeric to double", "ALTER TABLE orders ALTER COLUMN amount TYPE double precision",
     "ALTER TABLE orders MODIFY amount double"),
    ("drop a column", "ALTER TABLE orders DROP COLUMN note", "ALTER TABLE orders DROP COLUMN note"),
    ("add a table", "CREATE TABLE items (id integer PRIMARY KEY, label text)",
     "CREATE TABLE items (id int PRIMARY KEY, label text)"),
    ("drop and create a table again",
     "DROP TABLE items; CREATE TABLE items (id integer PRIMARY KEY, label text, weight numeric(6,3))",
     "DROP TABLE items; CREATE TABLE items (id int PRIMARY KEY, label text, weight decimal(6,3))"),
]
STEPS = [step for step, _, _ in SCRIPT]


class PgDb:
    kind = "postgres"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.script = [pg for _, pg, _ in SCRIPT]
        self.url = dsn.replace("postgresql://", "postgresql+psycopg2://", 1)  # SQLAlchemy's, to compare

    def connect(self):
        return psycopg2.connect(self.dsn)

    def execute(self, statement: str) -> None:
        execute(self.dsn, statement)

    def seed(self, rows: int = 30) -> None:
        self.execute("CREATE TABLE orders (id integer PRIMARY KEY, qty integer, amount numeric(12,2), note text, "
                     "t integer DEFAULT 0)")
        self.execute(f"INSERT INTO orders SELECT g, g, g * 1.25, 'seed', 0 FROM generate_series(1, {rows}) g")

    label = "'v' || id || '-' || t"  # an expression that gives every row its own text

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
        self.base, self.db = url, db
        self.script = [my for _, _, my in SCRIPT]
        self.url = url.replace("mysql://", "mysql+pymysql://", 1) + "/" + db

    def connect(self):
        return mysql_connect(self.base, self.db)

    def execute(self, statement: str) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for part in statement.split("; "):
                    cur.execute(part)
            conn.commit()
        finally:
            conn.close()

    def seed(self, rows: int = 30) -> None:
        self.execute("CREATE TABLE orders (id int PRIMARY KEY, qty int, amount decimal(12,2), note text, "
                     "t int DEFAULT 0)")
        self.execute(f"INSERT INTO orders SELECT seq, seq, seq * 1.25, 'seed', 0 FROM seq_1_to_{rows}")

    label = "CONCAT('v', id, '-', t)"

    def upsert_item(self, cur, key: int) -> None:
        cur.execute("INSERT INTO items (id, label) VALUES (%s, 'i') ON DUPLICATE KEY UPDATE "
                    "label = CONCAT(label, '.')", (key,))

    def has_items(self, cur) -> bool:
        cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() "
                    "AND table_name = 'items'")
        return cur.fetchone()[0] > 0

    missing_table = pymysql.err.ProgrammingError


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql)])
def source_db(request):
    """The script's source database, once per source kind (a test imports this fixture)."""
    if request.param == "postgres":
        return PgDb(request.getfixturevalue("pg_dsn"))
    return MyDb(request.getfixturevalue("mysql_url"), request.getfixturevalue("mysql_db"))


class Writer:
    """Inserts and updates ``orders`` (and ``items`` once it exists) until stopped, in whatever
    shape the tables have; DDL waits for its transactions and they wait for the DDL."""

    def __init__(self, db, seed: int = 11) -> None:
        self.db, self.rng = db, random.Random(seed)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.changes = 0
        self.error: BaseException | None = None
        self.go, self.idle = threading.Event(), threading.Event()
        self.go.set()

    def start(self) -> None:
        self.thread.start()

    def pause(self) -> None:
        """Until ``resume``: the test compares source and targets at rest."""
        self.go.clear()
        self.idle.wait(30)

    def resume(self, then: int = 20) -> None:
        """Write again, and return once ``then`` more transactions committed."""
        goal = self.changes + then
        self.go.set()
        wait_until(lambda: self.changes >= goal or self.error, timeout=60, what="the writer writing")

    def close(self) -> None:
        self.stop.set()
        self.go.set()
        if self.thread.is_alive():
            self.thread.join()

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


class Reader:
    """Counts the rows of ``table`` behind ``url`` every few milliseconds, all along, as a reader
    of the target would: ``seen`` must never show a missing, empty or shrinking table."""

    def __init__(self, url: str, table: str = "orders") -> None:
        self.url, self.table = url, table
        self.seen: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        engine = sa.create_engine(self.url)
        while not self.stop.is_set():
            try:
                with engine.connect() as conn:
                    self.seen.append(conn.exec_driver_sql(f"SELECT count(*) FROM {self.table}").scalar())
            except sa.exc.DBAPIError:
                if self.seen:  # once there, the view never goes away
                    self.seen.append(-1)
            time.sleep(0.02)
        engine.dispose()

    def partial_moments(self) -> str | None:
        """None if the reader never saw a missing, empty or shrinking table; else where it did."""
        seen = self.seen
        if not seen:
            return "the reader saw nothing at all"
        for i, count in enumerate(seen):
            if count <= 0 or (i and count < seen[i - 1]):
                return f"reads {i - 5}..{i + 5} of {len(seen)}: {seen[max(0, i - 5):i + 5]}"
        return None


def _norm(value):
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, float, Decimal)):
        return Decimal(str(value)).normalize()
    return str(value)


def query(url: str, sql: str) -> list[tuple] | None:
    """Rows of ``sql`` (None when it fails: a table not there yet)."""
    try:
        return rows_of_statement(url, sql)
    except sa.exc.DBAPIError:
        return None


def source_columns(url: str, table: str) -> list[str]:
    here = "DATABASE()" if url.startswith("mysql") else "current_schema()"
    found = query(url, f"SELECT column_name FROM information_schema.columns WHERE table_schema = {here} "
                       f"AND table_name = '{table}' ORDER BY ordinal_position")
    return [r[0] for r in found or ()]


def rows_of(url: str, table: str, columns: list[str]) -> dict:
    fetched = query(url, f"SELECT {', '.join(columns)} FROM {table}") or []
    return {row[0]: tuple(_norm(v) for v in row[1:]) for row in fetched}


def differences(url: str, source: str, table: str, columns: list[str]) -> dict | None:
    """None when the target's ``table`` equals the source's on ``columns``, else key -> (source, target)."""
    there, here = rows_of(url, table, columns), rows_of(source, table, columns)
    if here and there == here:
        return None
    return {k: (here.get(k), there.get(k)) for k in sorted(set(here) | set(there), key=str)
            if here.get(k) != there.get(k)}


def converge(url: str, source: str, table: str, columns: list[str], what: str, timeout: float = 90) -> None:
    """Wait until the target's ``table`` equals the source's (on ``columns``); the difference if not."""
    deadline = time.monotonic() + timeout
    while True:
        differ = differences(url, source, table, columns)
        if differ is None:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} ({table}, {columns}): {len(differ)} keys differ (source, target): "
                                 f"{list(differ.items())[:5]}")
        time.sleep(0.2)


def current_physical(url: str, table: str) -> str:
    """The physical table behind the view ``table`` of the (only) sink writing ``url``."""
    current = query(url, "SELECT generation FROM cdc_sink_generations WHERE state = 'current'")
    return f"{table}__g{current[0][0] if current else 1}"


def target_types(url: str, table: str) -> dict[str, str]:
    """Column -> the target's own type name (upper case) of the table behind view ``table``."""
    physical = current_physical(url, table)
    if url.startswith("sqlite"):
        return {r[1]: r[2].upper() for r in query(url, f"PRAGMA table_info('{physical}')")}
    if url.startswith("mysql"):
        return {c: t.upper() for c, t in query(url, f"SELECT column_name, column_type FROM information_schema.columns "
                                                   f"WHERE table_schema = DATABASE() AND table_name = '{physical}'")}
    if url.startswith("duckdb"):
        return {c: t.upper() for c, t in query(url, f"SELECT column_name, data_type FROM information_schema.columns "
                                                   f"WHERE table_name = '{physical}'")}
    return {c: t.upper() for c, t in query(url, f"SELECT a.attname, format_type(a.atttypid, a.atttypmod) "
                                               f"FROM pg_attribute a WHERE a.attrelid = '{physical}'::regclass "
                                               f"AND a.attnum > 0 AND NOT a.attisdropped")}


def shape_version(kafka: str, prefix: str, table: str, has, source: str | None = None) -> int:
    """The version of the first shape of ``table`` (of connector ``source``, if given) whose
    columns (name -> column record) satisfy ``has``."""
    log = KafkaLog(kafka)
    try:
        for record in log.read_all(f"{prefix}.schema-changes"):
            value = orjson.loads(record.value)
            if value["table"] == table and source in (None, value["source"]) and has({c["name"]: c for c in value["columns"]}):
                return value["version"]
    finally:
        log.close()
    raise AssertionError(f"no such shape of {table}")


def caught_up(kafka: str, group: str, topics: list[str]) -> bool:
    """True when consumer group ``group`` has committed every partition of ``topics`` up to its end
    (a sink between a rebuild's start and its switch commits nothing, so it is not caught up)."""
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": group, "enable.auto.commit": False})
    try:
        return _caught_up(consumer, group, topics)
    except KafkaException as err:  # a loaded broker timing out, a new topic's leader not elected yet: ask again
        error = err.args[0]
        if error.retriable() or error.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                                                 KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                                                 KafkaError.UNKNOWN_TOPIC_OR_PART):
            return False
        raise
    finally:
        consumer.close()


def _caught_up(consumer: Consumer, group: str, topics: list[str]) -> bool:
    metadata = consumer.list_topics(timeout=10).topics
    if any(t not in metadata for t in topics):
        return False
    partitions = [TopicPartition(t, p) for t in topics for p in metadata[t].partitions]
    for _ in range(30):  # the group coordinator may still be moving: ask again
        try:
            committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(partitions, timeout=10)}
            break
        except KafkaException as err:
            if not err.args[0].retriable() and err.args[0].code() != KafkaError.NOT_COORDINATOR:
                raise
            time.sleep(0.5)
    else:
        raise AssertionError(f"group {group}: committed offsets could not be read")
    for tp in partitions:
        low, high = consumer.get_watermark_offsets(tp, timeout=10)
        if high > low and committed[(tp.topic, tp.partition)] < high:
            return False
    return True


def explain_missing(kafka: str, prefix: str, topic: str, keys, sink: str, log_path) -> str:
    """Why a sink lacks ``keys`` of ``topic``: what the topic holds for them (did the source
    publish them?), what the sink's dead-letter topic holds, the group's committed offsets, and the
    warnings and errors of the sink's log. For the message of a failed comparison."""
    wanted = {orjson.dumps({"id": k}) if not isinstance(k, bytes) else k for k in keys}
    log = KafkaLog(kafka)
    lines = []
    try:
        for record in log.read_all(topic):
            if record.key in wanted or any(str(k).encode() in (record.key or b"") for k in keys):
                lines.append(f"{topic}[{record.partition}]@{record.offset} key={record.key!r} "
                             f"value={(record.value or b'')[:300]!r}")
        letters = f"{prefix}.dead-letter.{sink}"
        if letters in log.topics():
            lines += [f"dead letter @{r.offset}: {(r.value or b'')[:400]!r}" for r in log.read_all(letters)]
        consumer = Consumer({"bootstrap.servers": kafka, "group.id": sink, "enable.auto.commit": False})
        try:
            parts = [TopicPartition(topic, p) for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions]
            lines += [f"committed {tp.topic}[{tp.partition}] = {tp.offset}, end "
                      f"{consumer.get_watermark_offsets(tp, timeout=10)}" for tp in consumer.committed(parts, timeout=10)]
        finally:
            consumer.close()
    except Exception as err:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
        lines.append(f"(diagnosis failed: {err!r})")
    finally:
        log.close()
    try:
        noted = [line for line in open(log_path, errors="replace") if " WARNING " in line or " ERROR " in line]
        lines += ["sink log:"] + [line.rstrip()[:300] for line in noted[-25:]]
    except OSError as err:
        lines.append(f"(no sink log: {err})")
    return "\n".join(lines)
