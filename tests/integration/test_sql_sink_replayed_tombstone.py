"""The SQL sink and a tombstone alone in its batch on a replay: a row deleted and inserted again
with the same key must stay (tests/integration/test_opensearch_sink.py has the same for the
OpenSearch sink; cdc.api.SinkContext.delete_read says why)."""

from __future__ import annotations

import threading

import pytest

from cdc.events import ChangeEvent, Op, TableId
from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.positions import Counter
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import EnvelopeEncoder
from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink

TABLE = TableId("shop", "public", "items")
TOPIC = TABLE.topic("p")


@pytest.fixture(params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request, tmp_path) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("pg_dsn")
    return f"sqlite:///{tmp_path / 'target.db'}"


def _event(op: Op, version: int) -> ChangeEvent:
    row = {"id": 7, "name": f"v{version}"}
    return ChangeEvent(op, TABLE, {"id": 7}, row if op is Op.DELETE else None, None if op is Op.DELETE else row,
                       version, 0)


def _caught_up(log, target: str, soft_delete: bool, batch_size: int = 100) -> list[tuple]:
    sink = SqlSink(SqlSinkConfig(name="wh", type="sql", topics=["p.*"], url=target, soft_delete=soft_delete,
                                 batch_size=batch_size, batch_wait_ms=10))
    sink.start()
    try:
        SinkRunner(sink, log, "p").run(threading.Event(), until_caught_up=True)
        live = " WHERE NOT __cdc_deleted" if soft_delete else ""
        with sink.engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(f"SELECT id, name, __cdc_version FROM items{live}")]
    finally:
        sink.stop()


@pytest.mark.parametrize("resume_at", [1, 2])
@pytest.mark.parametrize("soft_delete", [False, True], ids=["hard-delete", "soft-delete"])
def test_a_replayed_tombstone_alone_keeps_the_row_inserted_after_it(target, tmp_path, soft_delete, resume_at):
    """insert @0, delete @1, tombstone @2, insert again @3; a run wrote everything and was killed
    before committing past ``resume_at``; the replay reads one record per batch."""
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        log.ensure_topic(TOPIC, TopicSettings(partitions=1))
        writer = log.writer()
        writer.publish(EnvelopeEncoder("postgresql", "src", "p").encode(
            [_event(Op.CREATE, 3), _event(Op.DELETE, 5), _event(Op.CREATE, 7)]), Counter(1))
        writer.flush(30)
        writer.close()
        assert [r.offset for r in log.read_all(TOPIC)] == [0, 1, 2, 3]
        assert _caught_up(log, target, soft_delete) == [(7, "v7", 7)]
        reader = log.reader("wh")
        reader.commit({(TOPIC, 0): resume_at})  # killed after the write of 2..3, before its commit
        reader.close()
        assert _caught_up(log, target, soft_delete, batch_size=1) == [(7, "v7", 7)]
    finally:
        log.close()


@pytest.mark.parametrize("soft_delete", [False, True], ids=["hard-delete", "soft-delete"])
def test_a_replayed_tombstone_whose_delete_was_compacted_away_keeps_the_row_inserted_after_it(
        target, tmp_path, soft_delete):
    """insert @0 and delete @1 compacted away while the sink lagged, tombstone @2 (its delete's
    version in its header), insert again @3; a run wrote 2..3 and was killed before committing;
    the replay finds the tombstone alone with no delete read before it. Without a version on the
    tombstone the row was deleted (``soft_delete``: marked deleted at its own version, so the
    replayed insert was refused and the row lost); with one it is a delete at 5, older than the row."""
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        log.ensure_topic(TOPIC, TopicSettings(partitions=1, min_compaction_lag_ms=0))
        writer = log.writer()
        encoder = EnvelopeEncoder("postgresql", "src", "p")
        writer.publish(encoder.encode([_event(Op.CREATE, 3), _event(Op.DELETE, 5)]), Counter(1))
        log.compact(TOPIC)
        assert [(r.offset, r.value) for r in log.read_all(TOPIC)] == [(2, None)]  # the tombstone, alone
        writer.publish(encoder.encode([_event(Op.CREATE, 7)]), Counter(2))
        writer.close()
        assert _caught_up(log, target, soft_delete) == [(7, "v7", 7)]
        reader = log.reader("wh")
        reader.commit({(TOPIC, 0): 2})  # killed after the write of 2..3, before its commit
        reader.close()
        assert _caught_up(log, target, soft_delete, batch_size=1) == [(7, "v7", 7)]
    finally:
        log.close()
