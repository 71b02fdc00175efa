"""A record whose row lacks the table's key column is dead-lettered as missing its key, not as a
NOT NULL failure of whichever column the sink probed first."""

from __future__ import annotations

import threading

import orjson
import pytest

from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import Record
from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink

TOPIC = "p.public.items"


def _envelope(version: int, after: dict) -> bytes:
    return orjson.dumps({"before": None, "after": after, "op": "c", "ts_ms": 0,
                         "source": {"connector": "postgresql", "name": "src", "db": "db", "schema": "public",
                                    "table": "items", "snapshot": "false", "version": version}})


@pytest.fixture(params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request, tmp_path) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("pg_dsn")
    return f"sqlite:///{tmp_path / 'target.db'}"


def test_a_row_missing_its_key_column_is_dead_lettered_as_such(target, tmp_path):
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    log.ensure_topic(TOPIC, TopicSettings(partitions=1))
    writer = log.writer()
    writer.publish([Record(TOPIC, b'{"id":1}', _envelope(1, {"id": 1, "name": "a", "qty": 1})),
                    Record(TOPIC, b"{}", _envelope(2, {"name": "no key", "qty": 2})),
                    Record(TOPIC, b'{"id":3}', _envelope(3, {"id": 3, "name": "c", "qty": 3}))])
    writer.flush(30)
    writer.close()
    sink = SqlSink(SqlSinkConfig(name="wh", type="sql", topics=["p.*"], url=target))
    sink.start()
    try:
        SinkRunner(sink, log, "p").run(threading.Event(), until_caught_up=True)
        with sink.engine.connect() as conn:
            assert [r[0] for r in conn.exec_driver_sql("SELECT id FROM items ORDER BY id")] == [1, 3]
    finally:
        sink.stop()
    [dead] = [orjson.loads(r.value) for r in log.read_all("p.dead-letter.wh")]
    log.close()
    assert dead["offset"] == 1
    assert "no value for the table's key column id" in dead["reason"]
    assert "column name" not in dead["reason"] and "column qty" not in dead["reason"]
