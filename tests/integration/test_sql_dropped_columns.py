"""A column dropped in the source, per the SQL sink's ``schema_policy``: ``fail``/``evolve``/
``ignore`` keep it (older rows keep their values, rows written since hold NULL); ``rebuild``
makes a new generation without it. Real Kafka, the sink runtime, a SQLite target file."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from cdc.events import Column, Op, TableId
from cdc.runtime.sink_runner import SinkRunner
from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink
from tests.integration.pg_capture import kafka_log  # noqa: F401 - the fixture ``log``
from tests.shapes import ShapedTopics

pytestmark = pytest.mark.kafka

TABLE = TableId("shop", "public", "items")
WITH_NOTE = (Column("id", "int4", key=True, nullable=False), Column("qty", "int4"), Column("note", "text"))
WITHOUT_NOTE = WITH_NOTE[:2]


def _catch_up(log, prefix, url, policy, name="wh") -> None:
    config = SqlSinkConfig(name=f"{prefix}-{name}", type="sql", url=url, topics=[f"{prefix}.public.*"],
                           batch_wait_ms=50, schema_policy=policy)
    SinkRunner(SqlSink(config), log, prefix).run(threading.Event(), until_caught_up=True)


def _read(url) -> tuple[list[str], list[tuple]]:
    with sa.create_engine(url).connect() as conn:
        result = conn.execute(sa.text("SELECT * FROM items ORDER BY id"))
        columns = [c for c in result.keys() if not c.startswith("__cdc")]
        return columns, [tuple(row._mapping[c] for c in columns) for row in result]


@pytest.mark.parametrize("policy", ["fail", "evolve", "rebuild"])
def test_a_dropped_column_per_policy(log, kafka_topic, tmp_path, policy):
    prefix = kafka_topic
    topics = ShapedTopics(log, prefix)
    url = f"sqlite:///{tmp_path / 'wh.db'}"
    topics.publish(TABLE, 100, WITH_NOTE, [{"id": 1, "qty": 1, "note": "a"}, {"id": 2, "qty": 2, "note": "b"}])
    _catch_up(log, prefix, url, policy)
    topics.publish(TABLE, 200, WITHOUT_NOTE, [{"id": 2, "qty": 20}, {"id": 3, "qty": 30}], op=Op.UPDATE)
    _catch_up(log, prefix, url, policy)

    columns, rows = _read(url)
    if policy == "rebuild":
        assert columns == ["id", "qty"] and rows == [(1, 1), (2, 20), (3, 30)]
        with sa.create_engine(url).connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        assert "items__g2" in tables and "items__g1" not in tables
    else:  # kept: older rows keep their value, rows written since hold NULL
        assert columns == ["id", "qty", "note"] and rows == [(1, 1, "a"), (2, 20, None), (3, 30, None)]

    # A sink started afresh on the same topics (a bootstrap) ends with the same table.
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    _catch_up(log, prefix, fresh, policy, name="fresh")
    assert _read(fresh) == (columns, rows)
