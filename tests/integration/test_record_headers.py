"""Record headers through both logs (real Kafka and the embedded SQLite log): every record the
capture publishes carries its version and source name (a tombstone its delete's version), in every
format and on every path (events, snapshot RowBlocks, truncates to every partition, schema
records); they read back through the reader and Kafka's bulk reader, a tombstone's version reaches
its SinkEvent, and records written without headers (before they existed) read as before, an
embedded log file from then included."""

from __future__ import annotations

import sqlite3
import time
import uuid

import pytest

from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.formats import make_encoder
from cdc.headers import SOURCE, VERSION
from cdc.log.base import Log, LogRecord, TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.log.partitioner import partition_for
from cdc.positions import Counter
from cdc.serde import Record, encode_schema_change, schema_changes_topic
from cdc.sink_events import decode_batch, decode_key, decode_packed
from tests.unit.test_row_block import _block, _row_block

TABLE = TableId("shop", "public", "orders")  # the RowBlock helpers' table
COLUMNS = (Column("id", "bigint", True, False), Column("note", "text"), Column("total", "numeric(10,2)"),
           Column("tags", "integer[]"))


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def log(request, tmp_path) -> Log:
    if request.param == "embedded":
        instance = EmbeddedLog(tmp_path / "log", TopicSettings(partitions=3), fsync=False)
    else:
        from cdc.log.kafka import KafkaLog

        instance = KafkaLog(request.getfixturevalue("kafka_bootstrap"), TopicSettings(partitions=3))
    yield instance
    instance.close()


def _events() -> list[ChangeEvent]:
    def row(i: int) -> dict:
        return {"id": i, "note": f"n{i}", "total": "1.50", "tags": [i]}
    return [ChangeEvent(Op.CREATE, TABLE, {"id": 1}, None, row(1), 10, 1),
            ChangeEvent(Op.UPDATE, TABLE, {"id": 1}, None, row(1), 11, 1),
            ChangeEvent(Op.DELETE, TABLE, {"id": 1}, row(1), None, 12, 1),
            ChangeEvent(Op.CREATE, TABLE, {"id": 2}, None, row(2), 2 ** 63 - 1, 1),
            ChangeEvent(Op.DELETE, TABLE, {"id": 2}, row(2), None, -(2 ** 63), 1),
            ChangeEvent(Op.TRUNCATE, TABLE, None, None, None, 13, 1)]


def _headers(version: int) -> list:
    return [(VERSION, b"%d" % version), (SOURCE, b"pg-src")]


@pytest.mark.parametrize("fmt", ["json", "debezium-json"])
def test_every_record_carries_its_version_and_source_a_tombstone_its_deletes(log, fmt):
    prefix = f"h{uuid.uuid4().hex[:8]}"
    encoder = make_encoder(fmt, "postgresql", "pg-src", prefix, log.ensure_topic)
    if fmt != "json":
        encoder.learn([SchemaChange(TABLE, COLUMNS, 5, 0)])
        encoder.schema_versions[TABLE] = 5
    log.ensure_topic(schema_changes_topic(prefix))
    writer = log.writer()
    writer.publish([encode_schema_change(SchemaChange(TABLE, COLUMNS, 5, 0), "pg-src", prefix)])
    truncates = 3
    writer.publish_events(encoder, _events())
    writer.publish_events(encoder, _row_block(_block([7, 8])), Counter(1))  # a snapshot's rows, version 4242
    assert writer.flush(60) == Counter(1)
    writer.close()

    [shape] = log.read_all(schema_changes_topic(prefix))
    assert shape.headers == _headers(5)
    records = log.read_all(encoder.topic(TABLE))
    assert all(abs(r.timestamp_ms - time.time() * 1000) < 600_000 for r in records)  # made now
    assert all(r.partition == partition_for(r.key, 3) for r in records if b'"op":"t"' not in (r.value or b""))
    made = sorted((r.value is None, int(r.headers[0][1])) for r in records)
    assert made == sorted([(False, 10), (False, 11), (False, 12), (True, 12), (False, 2 ** 63 - 1),
                           (False, -(2 ** 63)), (True, -(2 ** 63)), (False, 4242), (False, 4242)]
                          + [(False, 13)] * truncates)
    assert all(r.headers == _headers(int(r.headers[0][1])) for r in records)
    first = [(r.value is None, r.headers) for r in records if r.key is not None and decode_key(r.key) == {"id": 1}]
    assert first == [(False, _headers(10)), (False, _headers(11)), (False, _headers(12)), (True, _headers(12))]
    copies = [r for r in records if r.value is not None and b'"op":"t"' in r.value]
    assert sorted(r.partition for r in copies) == [0, 1, 2][:truncates]  # one to every partition, with headers
    assert all(r.headers == _headers(13) for r in copies)


def test_a_tombstone_reads_with_its_deletes_version_through_every_reader(log):
    prefix = f"h{uuid.uuid4().hex[:8]}"
    encoder = make_encoder("json", "postgresql", "pg-src", prefix, log.ensure_topic)
    writer = log.writer()
    writer.publish_events(encoder, _events()[:5], Counter(1))
    assert writer.flush(60) == Counter(1)
    writer.close()
    topic = encoder.topic(TABLE)

    events, poisons, _ = decode_batch(log.read_all(topic), {})
    readers = {"reader": (events, poisons)}
    if not isinstance(log, EmbeddedLog):  # Kafka's packed reads (cdc/_rdconsume.c), as a sink's runner reads
        readers["bulk"] = _read_packed(log, topic)
    for name, (events, poisons) in readers.items():
        assert poisons == [], name
        assert [(e.key["id"], e.op, e.version) for e in events if e.op is None] == \
            [(1, None, 12), (2, None, -(2 ** 63))], name


def _read_packed(log: Log, topic: str) -> tuple[list, list]:
    ends = log.end_offsets(topic)
    reader = log.bulk_reader()
    assert reader is not None, "cdc._rdconsume was not built (scripts/setup installs librdkafka-dev)"
    events, poisons, deadline = [], [], time.monotonic() + 60
    try:
        reader.assign({tp: 0 for tp in ends})
        while not all(reader.ends.get(tp, 0) >= end for tp, end in ends.items()):
            assert time.monotonic() < deadline
            made, bad, _ = decode_packed(reader.poll(1000, 0.5), {})
            events += made
            poisons += bad
    finally:
        reader.close()
    return sorted(events, key=lambda e: (e.partition, e.offset)), poisons


def test_records_written_without_headers_read_as_before(log):
    """A record from before headers existed: no headers, and a tombstone without a version (the
    sinks resolve those as they did, cdc/sink_events.py)."""
    topic = f"h{uuid.uuid4().hex[:8]}.public.orders"
    log.ensure_topic(topic)
    value = b'{"before":{"id":1},"after":null,"op":"d","ts_ms":1,"source":{"table":"orders","version":12}}'
    writer = log.writer()
    writer.publish([Record(topic, b'{"id":1}', value), Record(topic, b'{"id":1}', None)], Counter(1))
    assert writer.flush(60) == Counter(1)
    writer.close()
    records = log.read_all(topic)
    assert [(r.value is None, r.headers) for r in records] == [(False, None), (True, None)]
    events, poisons, _ = decode_batch(records, {})
    assert poisons == [] and [(e.op, e.version) for e in events] == [(Op.DELETE, 12), (None, None)]


OLD_SCHEMA = """
CREATE TABLE topics (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, cleanup_policy TEXT NOT NULL,
    min_compaction_lag_ms INTEGER NOT NULL, delete_retention_ms INTEGER NOT NULL);
CREATE TABLE partitions (
    id INTEGER PRIMARY KEY, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL DEFAULT 0, clean_offset INTEGER NOT NULL DEFAULT 0,
    UNIQUE (topic, partition));
CREATE TABLE records (
    id INTEGER PRIMARY KEY, key BLOB, value BLOB, timestamp_ms INTEGER NOT NULL);
CREATE INDEX records_by_key ON records (key);
CREATE INDEX tombstones ON records (timestamp_ms) WHERE value IS NULL;
CREATE TABLE group_offsets (
    grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition)) WITHOUT ROWID;
CREATE VIEW log AS
    SELECT p.topic, p.partition, r.id & 1099511627775 AS offset, r.key, r.value, r.timestamp_ms
    FROM records AS r JOIN partitions AS p ON p.id = r.id >> 40;
INSERT INTO topics VALUES ('p.public.orders', 1, 'compact', 0, 86400000);
INSERT INTO partitions (id, topic, partition, next_offset) VALUES (1, 'p.public.orders', 0, 2);
INSERT INTO records VALUES (1099511627776, '{"id":1}', '{"op":"d","source":{"version":12}}', 1);
INSERT INTO records VALUES (1099511627777, '{"id":1}', NULL, 1);
INSERT INTO group_offsets VALUES ('sink', 'p.public.orders', 0, 1);
"""


def test_an_embedded_log_from_before_headers_is_opened_in_place(tmp_path):
    """A log.db written by the embedded log before records had headers: opening it adds the
    column (once, however often it is opened); its records and group offsets stay and read with
    no headers, and new records carry theirs."""
    (tmp_path / "log").mkdir()
    old = sqlite3.connect(tmp_path / "log" / "log.db")
    old.executescript(OLD_SCHEMA)
    old.close()

    for _ in range(2):
        log = EmbeddedLog(tmp_path / "log", fsync=False)
        log.close()
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        writer = log.writer()
        writer.publish([Record("p.public.orders", b'{"id":1}', b"{}", False, _headers(13))])
        writer.close()
        assert [(r.offset, r.value is None, r.headers) for r in log.read_all("p.public.orders")] == \
            [(0, False, None), (1, True, None), (2, False, _headers(13))]
        assert log.reader("sink").committed([("p.public.orders", 0)]) == {("p.public.orders", 0): 1}
        view = sqlite3.connect(tmp_path / "log" / "log.db")
        assert view.execute("SELECT offset, headers IS NULL FROM log ORDER BY offset").fetchall() == \
            [(0, 1), (1, 1), (2, 0)]
        view.close()
    finally:
        log.close()


def test_the_embedded_log_keeps_headers_as_given(tmp_path):
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        log.ensure_topic("t")
        odd = [("x", None), ("\u00e9", b"\x00\xff"), ("x", b"")]
        writer = log.writer()
        writer.publish([Record("t", b"k", b"v", False, odd), Record("t", b"k", None, False, [])])
        writer.close()
        assert [r.headers for r in log.read_all("t")] == [odd, None]
        assert log.read_all("t")[0] == LogRecord("t", 0, 0, b"k", b"v", log.read_all("t")[0].timestamp_ms, odd)
    finally:
        log.close()
