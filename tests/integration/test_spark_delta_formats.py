"""The delta sink reads every log format into the same Delta tables (issue 17, item 2).

Two levels, both with the session-wide ``spark`` fixture:

* records made by the framework's own encoders (``cdc.formats.make_encoder``) for a PostgreSQL
  and a MySQL table with every common column type, under each Debezium ``decimal.handling.mode``,
  go through the sink's micro-batch (``DeltaJob.apply``) as ``json``, ``debezium-json`` and
  ``avro`` (schemas in the stack's registry): the tables are equal, types, values and
  bookkeeping columns;
* a real PostgreSQL captured into Kafka in each format, under inserts, updates, deletes,
  primary-key changes and a new column, read by the sink's streaming query: the tables are
  equal, and equal to the source table.
"""

from __future__ import annotations

import threading
import uuid

import psycopg2
import pytest
from pyspark.sql import functions as F

from cdc.config.model import LogConfig
from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.formats import avro as avro_format
from cdc.formats import make_encoder
from cdc.formats.connect_types import DebeziumOptions
from cdc.log.base import TopicSettings
from cdc.log.kafka import KafkaLog
from cdc.offsets import OffsetStore
from cdc.runtime.contexts import sink_context
from cdc.runtime.runner import SourceRunner
from cdc.runtime.schemas import SchemaBook
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from spark_sinks.job import DeltaJob
from spark_sinks.schemas import SchemaRegistry
from tests.contexts import attached
from tests.integration.pg_capture import execute, pg_config, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.registry]

PG_TABLE = TableId("shop", "public", "things")
PG_COLUMNS = (
    Column("id", "integer", True, False), Column("code", "numeric(8,3)", True, False),
    Column("price", "numeric(10,2)"), Column("big", "numeric(40,5)"), Column("free", "numeric"),
    Column("day", "date"), Column("at", "timestamp without time zone"), Column("at3", "timestamp(3) without time zone"),
    Column("zoned", "timestamp with time zone"), Column("clock", "time without time zone"),
    Column("doc", "jsonb"), Column("blob", "bytea"), Column("flag", "boolean"), Column("small", "smallint"),
    Column("n", "bigint"), Column("ratio", "double precision"), Column("name", "text"), Column("tag", "uuid"),
    Column("span", "interval"), Column("words", "text[]"))
PG_ROWS = [
    {"id": 1, "code": "1.250", "price": "12.50", "big": "123456789012345678901234567890123.12345",
     "free": "3.14159", "day": "1958-06-03", "at": "2024-01-02T03:04:05.5", "at3": "2024-01-02T03:04:05.123",
     "zoned": "2024-01-02T03:04:05.500000Z", "clock": "10:11:12.5", "doc": {"a": [1, 2.5], "b": "é"},
     "blob": "AP8=", "flag": True, "small": -3, "n": 9007199254740993, "ratio": 0.25, "name": "one",
     "tag": "0b3a6f4e-3f35-4f6a-9a43-6f0e5b3c2d11", "span": "PT93600S", "words": ["a", "b"]},
    {"id": 2, "code": "-0.005", "price": "-0.01", "big": "-99999999999999999999999999999999999.99999",
     "free": "-12345678901234567890123456789012345678901234567890.5", "day": "1970-01-01",
     "at": "1969-12-31T23:59:59.999999", "at3": "1970-01-01T00:00:00", "zoned": "1999-12-31T23:59:59.000001Z",
     "clock": "00:00:00", "doc": [], "blob": "", "flag": False, "small": 0, "n": -1, "ratio": -1.5, "name": "",
     "tag": "00000000-0000-0000-0000-000000000000", "span": "PT0S", "words": []},
    {"id": 3, "code": "99999.999", "price": "99999999.99", "big": None, "free": "0", "day": "2024-02-29",
     "at": "2262-04-11T23:47:16.854775", "at3": "2000-01-01T00:00:00.001", "zoned": "2024-02-29T00:00:00.000000Z",
     "clock": "23:59:59.999999", "doc": {"nested": {"k": None}}, "blob": None, "flag": None, "small": 32767,
     "n": None, "ratio": None, "name": "three", "tag": None, "span": None, "words": None},
]

MY_TABLE = TableId("shop", None, "gadgets")
MY_COLUMNS = (
    Column("id", "bigint unsigned", True, False), Column("price", "decimal(12,4)"), Column("day", "date"),
    Column("at", "datetime(6)"), Column("at0", "datetime"), Column("stamp", "timestamp(3)"),
    Column("clock", "time(6)"), Column("doc", "json"), Column("blob", "varbinary(16)"), Column("tiny", "tinyint"),
    Column("big", "bigint unsigned"), Column("flag", "tinyint(1)"), Column("mood", "enum('sad','ok')"),
    Column("parts", "set('a','b','c')"), Column("bits", "bit(12)"), Column("name", "varchar(20)"))
# A TIME(6) whose fraction ends in zeros reads back from debezium-json without them (as in the
# framework's other sinks; docs/wire-formats.md): these are written without them.
MY_ROWS = [
    {"id": 18446744073709551615, "price": "12.5000", "day": "2024-02-29", "at": "2024-01-02T03:04:05.000006",
     "at0": "2024-01-02T03:04:05", "stamp": "2024-01-02T03:04:05.120Z", "clock": "-838:59:59",
     "doc": {"x": 1}, "blob": "AAEC", "tiny": -128, "big": 18446744073709551615, "flag": 1, "mood": "ok",
     "parts": ["a", "c"], "bits": 4095, "name": "g1"},
    {"id": 2, "price": "-0.0001", "day": "1000-01-01", "at": "9999-12-31T23:59:59.999999", "at0": "1970-01-01T00:00:00",
     "stamp": "1970-01-01T00:00:01Z", "clock": "12:00:00.5", "doc": None, "blob": None, "tiny": 127, "big": 0,
     "flag": 0, "mood": "sad", "parts": [], "bits": 0, "name": None},
]


def _changes(table: TableId, columns, rows: list[dict]) -> list[ChangeEvent]:
    """Inserts of ``rows``, an update, an older (late) update, a delete and a primary-key change."""
    key_names = [c.name for c in columns if c.key]

    def key(row):
        return {k: row[k] for k in key_names}

    first, last = rows[0], rows[-1]
    doomed = {**first, "id": 99}
    events, version = [], 100
    for row in (*rows, doomed):
        version += 1
        events.append(ChangeEvent(Op.READ, table, key(row), None, row, version, 1_700_000_000_000 + version))
    updated = {**first, "name": "changed"}
    events.append(ChangeEvent(Op.UPDATE, table, key(first), None, updated, 200, 1_700_000_000_200))
    events.append(ChangeEvent(Op.UPDATE, table, key(first), None, {**first, "name": "late"}, 150, 1_700_000_000_150))
    events.append(ChangeEvent(Op.DELETE, table, key(doomed), key(doomed), None, 210, 1_700_000_000_210))
    moved = {**last, "id": 30}  # a primary-key change: a delete of the old key, a create of the new
    events.append(ChangeEvent(Op.DELETE, table, key(last), key(last), None, 220, 1_700_000_000_220))
    events.append(ChangeEvent(Op.CREATE, table, key(moved), None, moved, 221, 1_700_000_000_221))
    return events


def _records(fmt: str, connector: str, table: TableId, columns, rows, options: DebeziumOptions,
             prefix: str = "p", registry_url: str | None = None) -> list[tuple]:
    encoder = make_encoder(fmt, connector, "src", prefix, options=options, registry_url=registry_url)
    shape = SchemaChange(table, tuple(columns), 1, 0)
    if hasattr(encoder, "learn"):
        encoder.learn([shape])
    encoder.schema_versions[table] = 1
    records = encoder.encode(_changes(table, columns, rows), now_ms=1_700_000_001_000)
    return [(r.key, r.value, r.topic, 0, offset) for offset, r in enumerate(records)]


def _schema_record(table: TableId, columns) -> dict:
    return {"source": "src", "db": table.db, "schema": table.schema, "table": table.table, "version": 1, "ts_ms": 0,
            "columns": [{"name": c.name, "type": c.type, "key": c.key, "nullable": c.nullable} for c in columns]}


def _table(spark, tmp_path, name: str, records: list[tuple], topic: str, record: dict, prefix: str = "p",
           registry_url: str | None = None, **settings):
    config = DeltaSinkConfig(name=name, type="delta", topics=[f"{prefix}.*"], path=str(tmp_path / name),
                             checkpoint=str(tmp_path / f"{name}-cp"), **settings)
    job = DeltaJob(config, bootstrap_servers="unused:9092", prefix=prefix, registry_url=registry_url,
                   context=sink_context(name))
    job.registry.remember(topic, record)
    job.bind(f"test-{uuid.uuid4().hex}")
    frame = spark.createDataFrame(records, "key binary, value binary, topic string, partition int, offset long")
    job.apply(frame, 0)
    assert job.failure is None
    namespace = record["schema"] or record["db"]
    return spark.read.format("delta").load(f"{config.path}/{namespace}/{record['table']}")


def _same(left, right) -> None:
    assert left.dtypes == right.dtypes
    ordered = sorted(left.columns)
    # Rows as JSON text: exact values of every type (NaN, binary, decimals, timestamps to the
    # microsecond) compared as text.
    micros = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
              "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}

    def text(frame):
        return sorted(r[0] for r in frame.select(F.to_json(F.struct(*ordered), micros)).collect())
    assert text(left) == text(right)


@pytest.mark.parametrize("mode", ["precise", "string", "double"])
@pytest.mark.parametrize("connector, table, columns, rows", [
    ("postgresql", PG_TABLE, PG_COLUMNS, PG_ROWS), ("mysql", MY_TABLE, MY_COLUMNS, MY_ROWS)], ids=["pg", "mysql"])
def test_every_format_writes_the_same_table(spark, tmp_path, registry_url, connector, table, columns, rows, mode):
    options = DebeziumOptions(decimal_handling_mode=mode)
    record = _schema_record(table, columns)
    prefix = f"p{uuid.uuid4().hex[:8]}"  # the registry's subjects are per topic: fresh ones per test
    topic = f"{prefix}.{table.schema or table.db}.{table.table}"
    tables = {fmt: _table(spark, tmp_path, fmt, _records(fmt, connector, table, columns, rows, options, prefix,
                                                         registry_url),
                          topic, record, prefix, registry_url)
              for fmt in ("json", "debezium-json", "avro")}
    plain = tables["json"]
    assert plain.count() == len(rows)  # one deleted, one moved to a new key
    assert plain.where("id = 30").count() == 1 and plain.where("id = 99").count() == 0
    for fmt in ("debezium-json", "avro"):
        assert tables[fmt].where("name = 'changed'").count() == 1  # the update applied, the late one not
    if mode == "double":
        # Debezium's double mode rounds decimals through a double: compare the exact columns only.
        rounded = {c.name for c in columns if c.type.split("(")[0] in ("numeric", "decimal")} - \
            {c.name for c in columns if c.key}
        tables = {fmt: frame.drop(*rounded) for fmt, frame in tables.items()}
    _same(tables["json"], tables["debezium-json"])
    _same(tables["json"], tables["avro"])


def test_a_new_shape_in_a_later_batch_brings_a_new_connect_schema(spark, tmp_path, registry_url):
    """Batch 0 in a table's first shape, batch 1 in a shape with one more column: the second
    batch's Connect schema (debezium-json: read from its batch; avro: its writer schema read from
    the registry by its id) is new to the job, and every format agrees."""
    before = (Column("id", "integer", True, False), Column("price", "numeric(10,2)"), Column("day", "date"))
    after = (*before, Column("at", "timestamp(6) without time zone"))
    rows = [{"id": 1, "price": "1.50", "day": "2024-01-01"}, {"id": 2, "price": "-2.25", "day": "1969-07-20"}]
    later = [ChangeEvent(Op.UPDATE, PG_TABLE, {"id": 1}, None, {**rows[0], "at": "2024-05-06T07:08:09.123456"},
                         300, 1_700_000_000_300),
             ChangeEvent(Op.CREATE, PG_TABLE, {"id": 3}, None, {"id": 3, "price": "3.00", "day": "2000-01-01",
                                                                "at": "1999-12-31T23:59:59"}, 301, 1_700_000_000_301)]
    prefix = f"p{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.public.things"
    tables, jobs = {}, {}
    for fmt in ("json", "debezium-json", "avro"):
        encoder = make_encoder(fmt, "postgresql", "src", prefix, registry_url=registry_url)
        job = jobs[fmt] = DeltaJob(DeltaSinkConfig(name=f"lake_{fmt[:4]}", type="delta", topics=[f"{prefix}.*"],
                                                   path=str(tmp_path / fmt), checkpoint=str(tmp_path / f"{fmt}-cp")),
                                   bootstrap_servers="unused:9092", prefix=prefix, registry_url=registry_url,
                                   context=sink_context(f"lake_{fmt[:4]}"))
        job.bind(f"test-{uuid.uuid4().hex}")
        offset = 0
        for batch_id, (columns, events) in enumerate([(before, _changes(PG_TABLE, before, rows)), (after, later)]):
            shape = SchemaChange(PG_TABLE, columns, batch_id + 1, 0)
            if hasattr(encoder, "learn"):
                encoder.learn([shape])
            encoder.schema_versions[PG_TABLE] = batch_id + 1
            records = encoder.encode(events, now_ms=1_700_000_001_000)
            frame = spark.createDataFrame(
                [(r.key, r.value, r.topic, 0, offset + i) for i, r in enumerate(records)],
                "key binary, value binary, topic string, partition int, offset long")
            offset += len(records)
            job.registry.remember(topic, {**_schema_record(PG_TABLE, columns), "version": batch_id + 1})
            job.apply(frame, batch_id)
        tables[fmt] = spark.read.format("delta").load(f"{tmp_path / fmt}/public/things")
    assert len(jobs["debezium-json"].codecs.known()) == 3  # the value schemas of both shapes, one key schema
    assert len(jobs["avro"].avro.known()) == 3  # the same, as registry ids
    assert tables["json"].where("id = 3 AND at IS NOT NULL").count() == 1
    _same(tables["json"], tables["debezium-json"])
    # _changes' update sets ``name``, which these shapes lack: Connect JSON carries it beside its
    # schema (stored as text), Avro cannot carry a field its schema lacks.
    assert "name" not in tables["avro"].columns
    _same(tables["json"].drop("name"), tables["avro"])


# --- a real PostgreSQL, Kafka and the streaming query ----------------------------------------

THINGS = ("CREATE TABLE things (id int PRIMARY KEY, price numeric(10,2), free numeric, day date, "
          "at timestamp, zoned timestamptz, clock time, doc jsonb, blob bytea, flag boolean, n bigint, "
          "ratio double precision, name text, tag uuid)")
SEED = ("INSERT INTO things SELECT g, g * 1.25, g / 7.0, DATE '1958-06-03' + g, "
        "TIMESTAMP '2024-01-02 03:04:05.5' + g * INTERVAL '1 hour 1.000001 second', "
        "TIMESTAMPTZ '1999-12-31 23:59:59.999999+00' + g * INTERVAL '1 minute', TIME '10:11:12.5', "
        "jsonb_build_object('g', g, 'list', jsonb_build_array(g, 'é', 2.5)), decode(lpad(to_hex(g), 4, '0'), 'hex'), "
        "g % 2 = 0, g * 1000000000000, g / 3.0, 'thing ' || g, md5(g::text)::uuid FROM generate_series(1, 60) g")
CHANGES = (
    "UPDATE things SET price = -price, name = name || ' updated', doc = '{\"changed\": true}' WHERE id % 5 = 0",
    "DELETE FROM things WHERE id % 7 = 0",
    "UPDATE things SET id = id + 1000 WHERE id IN (3, 4)",   # primary-key changes
    "INSERT INTO things (id, price, day, name) VALUES (500, 0.01, '2024-02-29', 'sparse')",
    "ALTER TABLE things ADD COLUMN note text",                 # a new shape under the running capture
    "UPDATE things SET note = 'noted ' || id WHERE id % 3 = 0",
    "UPDATE things SET free = 123456789012345678901234567890123456789012.5 WHERE id = 1",
    "INSERT INTO things (id, name) VALUES (0, 'last')",
)


class FormatCapture:
    """A PostgreSQL capture writing ``fmt`` under its own topic prefix and slot, on a thread."""

    def __init__(self, dsn: str, tmp_path, log: KafkaLog, prefix: str, fmt: str, registry_url: str) -> None:
        from cdc.plugins import source_plugin

        config = pg_config(dsn, tmp_path / prefix, name=f"pg_{prefix}", slot=f"fmt_{prefix}")
        offsets = OffsetStore(log, prefix)
        source = source_plugin("postgres")(config, offsets.load(config.name))
        self.runner = SourceRunner(source, log, offsets, prefix, TopicSettings(partitions=2), offset_interval=0.2,
                                   log_format=fmt, registry_url=registry_url)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.runner.run(self.stop_event)
        except BaseException as err:  # noqa: BLE001 - raised by stop()
            self.error = err

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the capture did not stop within 60s"
        if self.error is not None:
            raise self.error


def _keys(log: KafkaLog, topic: str) -> set[str]:
    """The live keys of a topic in either format (decoded as the framework's sinks decode them),
    as the json format's key text."""
    from cdc.sink_events import decode_record

    if topic not in log.topics():
        return set()
    newest: dict[bytes, tuple[int, bool]] = {}
    for record in log.read_all(topic):
        event = decode_record(record)
        if event.op is None or event.op.value == "t":
            continue
        key = event.key_json
        if key not in newest or newest[key][0] < event.version:
            newest[key] = (event.version, event.op.value != "d")
    return {key.decode() for key, (_, live) in newest.items() if live}


@pytest.mark.kafka
@pytest.mark.postgres
def test_postgres_in_every_format_makes_equal_delta_tables(spark, pg_dsn, kafka_bootstrap, kafka_topic, tmp_path,
                                                           registry_url):
    execute(pg_dsn, THINGS, SEED)
    avro_format.use_registry(registry_url)  # _keys reads the avro topic as the framework's sinks do
    log = KafkaLog(kafka_bootstrap)
    prefixes = {"json": f"{kafka_topic}_j", "debezium-json": f"{kafka_topic}_d", "avro": f"{kafka_topic}_a"}
    captures = {fmt: FormatCapture(pg_dsn, tmp_path, log, prefix, fmt, registry_url)
                for fmt, prefix in prefixes.items()}
    tables = {}
    try:
        for fmt, prefix in prefixes.items():
            wait_until(lambda: len(_keys(log, f"{prefix}.public.things")) == 60, what=f"the {fmt} snapshot",
                       capture=captures[fmt])
        execute(pg_dsn, *CHANGES)
        for fmt, prefix in prefixes.items():
            wait_until(lambda: '{"id":0}' in _keys(log, f"{prefix}.public.things"), what=f"the {fmt} changes",
                       capture=captures[fmt])
            assert SchemaRegistry(SchemaBook(log, prefix), prefix).record(f"{prefix}.public.things") is not None
        first = next(iter(log.read_all(f"{prefixes['debezium-json']}.public.things")))
        assert first.key.startswith(b'{"schema":'), "the debezium-json capture should write Connect JSON keys"
        ids = {int.from_bytes(r.value[1:5], "big") for r in log.read_all(f"{prefixes['avro']}.public.things")
               if r.value is not None}
        assert len(ids) == 2, "the avro capture should write values of two schema ids (before and after the ALTER)"
        for fmt, prefix in prefixes.items():
            # One micro-batch per format (Spark's cost per batch dominates on a small machine): rows of
            # both shapes in it, written in the newest. A later batch with a new Connect schema is
            # test_a_new_shape_in_a_later_batch_brings_a_new_connect_schema's.
            config = DeltaSinkConfig.model_validate(dict(
                name=f"lake_{fmt.replace('-', '_')}", type="delta", topics=[f"{prefix}.public.*"],
                path=str(tmp_path / f"lake-{fmt}"), checkpoint=str(tmp_path / f"cp-{fmt}"), available_now=True,
                topic_prefix=prefix, kafka={"bootstrap_servers": kafka_bootstrap},
                spark={"conf": {"spark.sql.shuffle.partitions": "2"}}))
            sink = attached(DeltaSink(config))
            sink.run(threading.Event(), session=spark, log=LogConfig.model_validate(
                {"kafka": {"bootstrap_servers": kafka_bootstrap, "topic_prefix": prefix}, "format": fmt,
                 "schema_registry": {"url": registry_url}}))
            assert sink.job.failure is None
            assert sink.job.stats.events > 60
            tables[fmt] = spark.read.format("delta").load(f"{config.path}/public/things")
    finally:
        for capture in captures.values():
            capture.stop()
        log.close()
        avro_format.use_registry(None)

    plain, connect, avro = tables["json"], tables["debezium-json"], tables["avro"]
    assert dict(plain.dtypes) == {
        "id": "bigint", "price": "decimal(10,2)", "free": "string", "day": "date", "at": "timestamp_ntz",
        "zoned": "timestamp", "clock": "string", "doc": "string", "blob": "binary", "flag": "boolean", "n": "bigint",
        "ratio": "double", "name": "string", "tag": "string", "note": "string", "__cdc_key": "string",
        "__cdc_version": "bigint", "__cdc_op": "string", "__cdc_ts_ms": "bigint"}
    # Each capture took its own snapshot, at its own position: snapshot rows carry different
    # versions and times; the streamed changes come from the same WAL records in both.
    position = ["__cdc_version", "__cdc_ts_ms"]
    for other in (connect, avro):
        _same(plain.drop(*position), other.drop(*position))
        _same(plain.where("__cdc_op <> 'r'"), other.where("__cdc_op <> 'r'"))
        assert other.where("__cdc_op <> 'r'").count() > 10
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, name, free::text, note FROM things")
            source = sorted(cur.fetchall())
    finally:
        conn.close()
    for other in (connect, avro):
        assert sorted(tuple(r) for r in other.select("id", "name", "free", "note").collect()) == source
        assert other.where("id IN (1003, 1004) AND note IS NULL OR id = 1").count() == 3
