"""The SQL sink's raw rows through the real runtime: Kafka -> SinkRunner -> PostgreSQL.

The runtime hands the SQL sink upserts' rows as JSON bytes (``raw_rows``) and its C loop writes
them into the typed COPY; the same topic written by a sink that gets every row as a dict (how it
ran before) must give the same table, awkward values, deletes, tombstones and a poison record
included.
"""

from __future__ import annotations

import threading
import uuid

import psycopg2
import pytest

from cdc import sink_events
from cdc.events import ChangeEvent, Op, TableId
from cdc.log.base import TopicSettings
from cdc.log.kafka import KafkaLog
from cdc.positions import Counter
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import EnvelopeEncoder, Record
from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink
from tests.integration.pg_capture import execute

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

TABLE = TableId("shop", "public", "things")
VALUES = ["plain", "tab\there", "new\nline\r", "back\\slash \\N", 'quote"', "é 日本 😀", "\x01\x1f", ""]


class DictRowsSqlSink(SqlSink):
    raw_rows = False  # every row decoded to a dict by the runtime


class Seen:
    """Wraps a sink's write to count the rows it got as bytes and as dicts."""

    def __init__(self, sink: SqlSink) -> None:
        self.raw = self.dicts = 0
        write = sink.write

        def counting(events):
            for event in events:
                if isinstance(event.after, bytes):
                    self.raw += 1
                elif isinstance(event.after, dict):
                    self.dicts += 1
            write(events)
        sink.write = counting


def _events() -> list[ChangeEvent]:
    events, version = [], 0
    for round_ in range(3):
        for key in range(40):
            version += 1
            if round_ == 2 and key % 7 == 0:
                events.append(ChangeEvent(Op.DELETE, TABLE, {"id": key}, {"id": key}, None, version, 0))
                continue
            row = {"id": key, "name": VALUES[(key + round_) % len(VALUES)], "amount": f"{key * 1.25 + round_:.2f}",
                   "ratio": [0.1, 1e22, -0.0, 3][key % 4], "flag": key % 3 == 0,
                   "doc": {"k": VALUES[key % len(VALUES)], "n": [1, 2.5, None]} if key % 2 else None,
                   "big": 2**63 - 1 - key}
            events.append(ChangeEvent(Op.UPDATE if round_ else Op.CREATE, TABLE, {"id": key}, None, row, version, 0))
    return events


def _schema_record() -> dict:
    columns = [("id", "bigint", True), ("name", "text", False), ("amount", "numeric(12,2)", False),
               ("ratio", "double precision", False), ("flag", "boolean", False), ("doc", "jsonb", False),
               ("big", "numeric(20,0)", False)]
    return {"source": "src", "db": "shop", "schema": "public", "table": "things", "version": 1, "ts_ms": 0,
            "ddl": None, "columns": [{"name": n, "type": t, "key": k, "nullable": not k} for n, t, k in columns]}


def _table(dsn: str) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, name, amount, ratio, flag, doc::text, big, __cdc_version FROM things ORDER BY id")
            return cur.fetchall()
    finally:
        conn.close()


@pytest.mark.skipif(not sink_events.raw_rows_decoded(), reason="cdc._decode not built, or CDC_NATIVE=0")
def test_rows_as_bytes_land_as_rows_decoded_to_dicts_land(pg_admin_dsn, kafka_bootstrap):
    run = uuid.uuid4().hex[:8]
    prefix = f"raw_{run}"
    kafka = KafkaLog(kafka_bootstrap)
    topic = TABLE.topic(prefix)
    databases = []
    try:
        kafka.ensure_topic(topic, TopicSettings(partitions=2))
        writer = kafka.writer()
        events = _events()
        writer.publish_events(EnvelopeEncoder("postgresql", "src", prefix), events[:50], None)
        writer.publish([Record(topic, b'{"id":3}', b'{"before":null,"after":{"id":3,"name":"x"},"op":"u",')])
        writer.publish_events(EnvelopeEncoder("postgresql", "src", prefix), events[50:], Counter(1))
        writer.flush(30)
        writer.close()
        tables, seen = [], []
        for kind in (SqlSink, DictRowsSqlSink):
            name = f"raw_{run}_{kind.__name__.lower()}"
            execute(pg_admin_dsn, f'CREATE DATABASE "{name}"')
            databases.append(name)
            dsn = pg_admin_dsn.rsplit("/", 1)[0] + "/" + name
            url = dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
            sink = kind(SqlSinkConfig(name="raw", type="sql", url=url, topics=[f"{prefix}.*"], batch_size=25))
            seen.append(Seen(sink))
            runner = SinkRunner(sink, kafka, prefix, group=f"raw-{run}-{kind.__name__}")
            runner.schema_for = lambda topic, version=None: _schema_record()
            runner.run(threading.Event(), from_start=True, until_caught_up=True)
            assert runner.stats.errors == 1  # the cut-off record went to the dead-letter topic
            tables.append(_table(dsn))
        assert seen[0].raw > 60 and seen[0].dicts == 0  # the fast path ran, on every upsert
        assert seen[1].raw == 0 and seen[1].dicts > 60
        assert tables[0] == tables[1]
        assert len(tables[0]) == 40 - 6 and {row[0] for row in tables[0]} == {k for k in range(40) if k % 7}
        assert any("\t" in row[1] for row in tables[0]) and any("😀" in (row[5] or "") for row in tables[0])
    finally:
        kafka.delete_topic(topic)
        kafka.close()
        for name in databases:
            execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
