"""On Kafka: a row deleted and inserted again with the same key survives a replay that finds its
tombstone alone in a batch (the embedded log's version is in test_opensearch_sink.py). Kafka's
packed reads and the fetch of the record before a tombstone at the offset a run resumed from
(cdc/runtime/read_trail.py) go through the broker here."""

from __future__ import annotations

import threading

import pytest
from opensearchpy import OpenSearch

from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.log.base import TopicSettings
from cdc.positions import Counter
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import EnvelopeEncoder, encode_schema_change
from sinks.opensearch import OpenSearchSink, OpenSearchSinkConfig
from sinks.opensearch.generations import STATE_INDEX
from tests.integration.pg_capture import kafka_log  # noqa: F401 - the fixture ``log``

pytestmark = [pytest.mark.opensearch, pytest.mark.kafka]

COLUMNS = (Column("id", "integer", key=True), Column("name", "text"))


def _event(table: TableId, op: Op, version: int) -> ChangeEvent:
    row = {"id": 7, "name": f"v{version}"}
    return ChangeEvent(op, table, {"id": 7}, row if op is Op.DELETE else None, None if op is Op.DELETE else row,
                       version, 0)


@pytest.mark.parametrize("resume_at", [1, 2])
def test_a_replayed_tombstone_alone_keeps_the_row_inserted_after_it(log, opensearch_url, opensearch_index,
                                                                     resume_at):
    prefix = opensearch_index
    table = TableId("shop", "public", "items")
    topic = table.topic(prefix)
    log.ensure_topic(topic, TopicSettings(partitions=1))
    log.ensure_topic(f"{prefix}.schema-changes", TopicSettings(partitions=1))
    writer = log.writer()
    writer.publish([encode_schema_change(SchemaChange(table, COLUMNS, 1, 0), "src", prefix)]
                   + EnvelopeEncoder("postgresql", "src", prefix).encode(
                       [_event(table, Op.CREATE, 3), _event(table, Op.DELETE, 5), _event(table, Op.CREATE, 7)]),
                   Counter(1))
    writer.flush(30)
    writer.close()
    assert [(r.offset, r.value is None) for r in log.read_all(topic)] == [(0, False), (1, False), (2, True),
                                                                          (3, False)]
    client = OpenSearch(opensearch_url)

    def caught_up(**overrides) -> dict:
        sink = OpenSearchSink(OpenSearchSinkConfig(name=prefix, hosts=[opensearch_url], topics=[f"{prefix}.*"],
                                                   index_name=f"{prefix}.{{table}}", batch_wait_ms=10,
                                                   **overrides))
        SinkRunner(sink, log, prefix).run(threading.Event(), until_caught_up=True)
        client.indices.refresh(index=f"{prefix}.items")
        hits = client.search(index=f"{prefix}.items", body={"query": {"match_all": {}}})["hits"]["hits"]
        return {h["_id"]: h["_source"]["name"] for h in hits}

    try:
        assert caught_up() == {"7": "v7"}
        reader = log.reader(prefix)
        reader.commit({(topic, 0): resume_at})  # killed after the write of 2..3, before its commit
        reader.close()
        assert caught_up(batch_size=1) == {"7": "v7"}
    finally:
        client.delete(index=STATE_INDEX, id=prefix, params={"ignore": 404})
        client.close()


@pytest.mark.parametrize("compacted_by", ["log", "hand"], ids=["embedded-compacted", "kafka-without-the-delete"])
def test_a_replayed_tombstone_whose_delete_was_compacted_away_keeps_the_row_inserted_after_it(
        request, tmp_path, opensearch_url, opensearch_index, compacted_by):
    """The delete compacted away while the sink lagged (the embedded log compacts it; on Kafka its
    record is left out, as the log cleaner leaves it), then the key inserted again; a run wrote the
    tombstone and the row and was killed before committing; the replay finds the tombstone alone,
    with no delete read before it. Without a version it was resolved against the index and wrote
    a tombstone document at the row's own version, so the replayed row was refused and lost; with
    its delete's version (its header) it is a delete at 5, older than the row."""
    prefix = opensearch_index
    table = TableId("shop", "public", "items")
    topic = table.topic(prefix)
    if compacted_by == "log":
        from cdc.log.embedded import EmbeddedLog
        log = EmbeddedLog(tmp_path / "log", fsync=False)
    else:
        log = request.getfixturevalue("log")
    encoder = EnvelopeEncoder("postgresql", "src", prefix)
    log.ensure_topic(topic, TopicSettings(partitions=1, min_compaction_lag_ms=0))
    log.ensure_topic(f"{prefix}.schema-changes", TopicSettings(partitions=1))
    writer = log.writer()
    writer.publish([encode_schema_change(SchemaChange(table, COLUMNS, 1, 0), "src", prefix)])
    inserted, deleted = encoder.encode([_event(table, Op.CREATE, 3)]), encoder.encode([_event(table, Op.DELETE, 5)])
    if compacted_by == "log":
        writer.publish(inserted + deleted, Counter(1))
        log.compact(topic)
    else:
        writer.publish(inserted + deleted[1:], Counter(1))  # the delete's record is gone, its tombstone not
    writer.publish(encoder.encode([_event(table, Op.CREATE, 7)]), Counter(2))
    writer.flush(30)
    writer.close()
    read = log.read_all(topic)
    assert [r.value is None for r in read] == ([True, False] if compacted_by == "log" else [False, True, False])
    tombstone_at = read[-2].offset
    client = OpenSearch(opensearch_url)

    def caught_up(**overrides) -> dict:
        sink = OpenSearchSink(OpenSearchSinkConfig(name=prefix, hosts=[opensearch_url], topics=[f"{prefix}.*"],
                                                   index_name=f"{prefix}.{{table}}", batch_wait_ms=10,
                                                   **overrides))
        SinkRunner(sink, log, prefix).run(threading.Event(), until_caught_up=True)
        client.indices.refresh(index=f"{prefix}.items")
        hits = client.search(index=f"{prefix}.items", body={"query": {"match_all": {}}})["hits"]["hits"]
        return {h["_id"]: h["_source"]["name"] for h in hits}

    try:
        assert caught_up() == {"7": "v7"}
        reader = log.reader(prefix)
        reader.commit({(topic, 0): tombstone_at})  # killed after the write of the tombstone and the row
        reader.close()
        assert caught_up(batch_size=1) == {"7": "v7"}
    finally:
        client.delete(index=STATE_INDEX, id=prefix, params={"ignore": 404})
        client.close()
        if compacted_by == "log":
            log.close()
