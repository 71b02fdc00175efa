"""A row that names a schema version the schema topic never delivers stops the sink, after a
bounded wait, with an error naming the row; nothing past it is committed (real Kafka, the SQL
sink into a SQLite file)."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from cdc.errors import ShapeMissingError
from cdc.events import Column, TableId
from cdc.log.kafka import KafkaLog
from cdc.runtime.sink_runner import SinkRunner
from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink
from tests.integration.pg_capture import kafka_log  # noqa: F401 - the fixture ``log``
from tests.shapes import ShapedTopics

pytestmark = pytest.mark.kafka

TABLE = TableId("shop", "public", "items")
KNOWN, NEVER = 100, 150  # the shape published, and the one rows name that never is


def _publish(log: KafkaLog, prefix: str) -> None:
    topics = ShapedTopics(log, prefix)
    columns = (Column("id", "int4", key=True, nullable=False), Column("v", "text"))
    topics.publish(TABLE, KNOWN, columns, [{"id": i, "v": "old"} for i in range(5)])
    # Rows of a shape whose record never reaches the schema topic.
    topics.publish(TABLE, NEVER, None, [{"id": i, "v": "new", "w": 1} for i in range(5, 8)])


def test_a_shape_that_never_arrives_stops_the_sink_at_its_first_row(log, kafka_topic, tmp_path):
    prefix = kafka_topic
    _publish(log, prefix)
    topic = TABLE.topic(prefix)
    [first_unknown] = [r.offset for r in log.read_all(topic) if b'"schema_version":150' in r.value][:1]
    url = f"sqlite:///{tmp_path / 'target.db'}"
    config = SqlSinkConfig(name="shapes", type="sql", url=url, topics=[f"{prefix}.public.*"],
                           batch_wait_ms=50, schema_wait=2)
    runner = SinkRunner(SqlSink(config), log, prefix)

    with pytest.raises(ShapeMissingError) as raised:
        runner.run(threading.Event(), until_caught_up=True)

    err = raised.value
    assert (err.topic, err.partition, err.offset, err.version) == (topic, 0, first_unknown, NEVER)
    assert err.table == "shop.public.items" and not err.retriable
    assert f"{topic}[0]@{first_unknown}" in str(err) and "schema version 150" in str(err)
    # Nothing past the row was committed, and no row of the unknown shape reached the target.
    reader = log.reader("shapes")
    committed = reader.committed([(topic, 0)]).get((topic, 0))
    reader.close()
    assert committed is None or committed <= first_unknown
    with sa.create_engine(url).connect() as conn:
        rows = conn.execute(sa.text("SELECT id, v FROM items ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [(i, "old") for i in range(5)]
