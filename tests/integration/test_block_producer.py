"""Snapshot RowBlocks through our own librdkafka binding (cdc/_rdproduce.c, cdc/log/block_producer.py).

Against the stack's Kafka: the block producer's records are confluent-kafka's (the same bytes, the
same partition for every key), a record the broker refuses fails the writer with a typed error and
no checkpoint passes it, and the writer never has records of both producers in flight at once (a
snapshot's rows are acknowledged before a streamed change of theirs is produced, and the other
way round). Each test uses both librdkafka copies in this one process: confluent-kafka's bundled
one (the writer's producer, the reads) and the system's (the block producer).
"""

from __future__ import annotations

import base64
import os
import re

import orjson
import pytest

from cdc import native
from cdc.errors import DeliveryError
from cdc.events import ChangeEvent, Op, SnapshotMarker
from cdc.log import block_producer
from cdc.log.base import TopicSettings
from cdc.log.kafka import KafkaLog
from cdc.log.partitioner import partition_for
from cdc.positions import Counter
from cdc.serde import EnvelopeEncoder
from tests.unit.test_row_block import TABLE, _block, _row_block

pytestmark = [pytest.mark.kafka,
              pytest.mark.skipif(block_producer._rdproduce is None, reason="cdc/_rdproduce.c was not built")]

KEYS = [1, 0, -7, 9_223_372_036_854_775_807, -922_337_203_685_477_580, *range(100, 2100)]
NOW = re.compile(rb'"op":"r","ts_ms":\d+')  # the envelope's own ts_ms: when it was made


@pytest.fixture
def log(kafka_bootstrap):
    instance = KafkaLog(kafka_bootstrap, TopicSettings(partitions=3))
    yield instance
    instance.close()


def _encoder(log: KafkaLog, topic: str, settings: TopicSettings | None = None) -> EnvelopeEncoder:
    encoder = EnvelopeEncoder("postgresql", "src", topic, lambda t: log.ensure_topic(t, settings))
    return encoder


def _published(log: KafkaLog, topic: str) -> dict[bytes, tuple[int, bytes, list]]:
    """key -> (partition, value with the envelope's making time taken out, headers)."""
    return {r.key: (r.partition, NOW.sub(b"", r.value), r.headers) for r in log.read_all(topic)}


def test_block_records_are_confluent_kafkas_bytes_in_the_same_partitions(log, kafka_topic):
    block = _block(KEYS)
    published = {}
    for name, ours in (("ours", True), ("confluent", False)):
        encoder = _encoder(log, f"{kafka_topic}.{name}")
        with native.choose(ours):
            writer = log.writer()
            writer.publish_events(encoder, _row_block(block), Counter(1))
            assert (writer._blocks is not None) is ours  # the block went through our producer, or not
            assert writer.flush(60) == Counter(1)
            writer.close()
        published[name] = _published(log, encoder.topic(TABLE))

    assert published["ours"] == published["confluent"]
    assert len(published["ours"]) == len(KEYS)
    for key, (partition, _, headers) in published["ours"].items():
        assert partition == partition_for(key, 3)  # murmur2, as the Java client and the embedded log
        assert headers == [("cdc.version", b"4242"), ("cdc.source", b"src")]  # the block's version


def test_a_block_record_the_broker_refuses_fails_the_writer_and_no_checkpoint_passes_it(log, kafka_topic):
    encoder = _encoder(log, kafka_topic, TopicSettings(partitions=3, extra={"max.message.bytes": "1000"}))
    writer = log.writer()
    writer.publish_events(encoder, _row_block(_block([1, 2])), Counter(1))
    assert writer.flush(60) == Counter(1)

    # Over the topic's limit even compressed (random text hardly shrinks), between two that fit.
    big = orjson.dumps({"id": 4, "note": base64.b64encode(os.urandom(1400)).decode()})
    rows = _block([3]) + b"4\t" + big + b"\t\n" + _block([5])
    writer.publish_events(encoder, _row_block(rows), Counter(2))
    with pytest.raises(DeliveryError) as caught:
        writer.flush(60)
    assert caught.value.retriable is False
    assert encoder.topic(TABLE) in str(caught.value) and "MSG_SIZE_TOO_LARGE" in str(caught.value)
    with pytest.raises(DeliveryError):  # the writer stays failed: checkpoint 2 is never safe
        writer.poll()
    writer.close()
    kept = {orjson.loads(r.key)["id"] for r in log.read_all(encoder.topic(TABLE))}
    assert {1, 2} <= kept and 4 not in kept  # (5 went or failed with 4, as their partitions fell)


def test_the_writer_switches_producers_only_when_the_one_it_leaves_is_acknowledged(log, kafka_topic):
    encoder = _encoder(log, kafka_topic)
    topic = encoder.topic(TABLE)
    writer = log.writer()
    change = ChangeEvent(Op.UPDATE, TABLE, {"id": 1}, None, {"id": 1, "note": "streamed"}, 5000, 1764000000000,
                         SnapshotMarker.FALSE, {"txId": 7, "lsn": 5000})

    writer.publish_events(encoder, [change._replace(key={"id": 0}, after={"id": 0}, version=10)])
    writer.publish_events(encoder, _row_block(_block(KEYS)))
    assert len(writer._producer) == 0  # the streamed change was acknowledged before the block went out

    writer.publish_events(encoder, [change], Counter(1))
    assert writer._blocks is None  # every block record acknowledged (and the producer closed) first
    assert writer.flush(60) == Counter(1)
    writer.close()

    newest = {}
    for record in log.read_all(topic):
        newest[record.key] = orjson.loads(record.value)["after"].get("note")
    assert newest[b'{"id":1}'] == "streamed"  # the change is after the snapshot's row of its key
    assert len(newest) == len(KEYS)


def _compacted(log: KafkaLog, topic: str) -> dict[str, dict]:
    """What compaction keeps: the last record of each key in its partition (no versions compared),
    rows only."""
    last: dict[bytes, bytes | None] = {}
    for record in sorted(log.read_all(topic), key=lambda r: (r.partition, r.offset)):
        last[record.key] = record.value
    out = {}
    for key, value in last.items():
        envelope = orjson.loads(value) if value is not None else None
        if envelope is not None and envelope["op"] != "d":
            out[key.decode()] = envelope["after"]
    return out


@pytest.mark.postgres
def test_a_snapshot_through_the_block_producer_then_the_stream_compacts_to_the_table(pg_dsn, kafka_bootstrap,
                                                                                    tmp_path, kafka_topic,
                                                                                    monkeypatch):
    """Reader processes, small chunks, changes to the snapshotted keys right after it: the last
    record of every key (what compaction keeps, whatever the versions) is the table's row."""
    from tests.integration.pg_capture import capturing, execute, pg_config, table_rows, wait_until

    execute(pg_dsn, "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, note text)",
            "INSERT INTO accounts SELECT g, 100, 'n' FROM generate_series(1, 5000) g")
    opened = []
    monkeypatch.setattr("cdc.log.kafka_writer.open_block_producer",
                        lambda config: opened.append(block_producer.open_block_producer(config)) or opened[-1])
    log = KafkaLog(kafka_bootstrap, TopicSettings(partitions=3))
    topic = f"{kafka_topic}.public.accounts"
    try:
        config = pg_config(pg_dsn, tmp_path, snapshot_chunk_pages=4, snapshot_workers=2)
        with capturing(config, log, kafka_topic) as capture:
            wait_until(lambda: capture.runner.stats.phase == "streaming", timeout=120, what="streaming",
                       capture=capture)
            execute(pg_dsn, "UPDATE accounts SET balance = balance + 1, note = 'streamed' WHERE id % 7 = 0",
                    "DELETE FROM accounts WHERE id % 11 = 0")
            expected = table_rows(pg_dsn, "accounts")
            wait_until(lambda: _compacted(log, topic) == expected, timeout=120, what="the compacted topic",
                       capture=capture)
        records = [orjson.loads(r.value) for r in log.read_all(topic) if r.value is not None]
        assert sum(r["op"] == "r" for r in records) == 5000
        assert opened and opened[0] is not None  # the snapshot's rows went through the block producer
    finally:
        log.close()
