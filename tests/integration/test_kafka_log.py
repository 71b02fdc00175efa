"""Kafka-specific behaviour of KafkaLog: delivery failures, topic configs, an unreachable broker."""

from __future__ import annotations

import os
import socket
import time

import pytest

from cdc.errors import DeliveryError, LogUnavailableError
from cdc.log.base import TopicSettings
from cdc.log.kafka import KafkaLog
from cdc.positions import Counter
from cdc.serde import Record
from tests.integration.pg_capture import kafka_log  # noqa: F401 - the fixture ``log``

pytestmark = pytest.mark.kafka


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_refused_record_fails_the_flush_and_no_checkpoint_passes_it(log, kafka_topic):
    log.ensure_topic(kafka_topic, TopicSettings(extra={"max.message.bytes": "1000"}))
    writer = log.writer()
    writer.publish([Record(kafka_topic, b'{"id": 1}', b'{"v": 1}')], Counter(1))
    assert writer.flush(30) == Counter(1)

    # Over the topic's limit even compressed (random bytes do not shrink).
    writer.publish([Record(kafka_topic, b'{"id": 2}', os.urandom(5000))], Counter(2))
    writer.publish([Record(kafka_topic, b'{"id": 3}', b'{"v": 3}')], Counter(3))
    with pytest.raises(DeliveryError) as caught:
        writer.flush(30)
    assert caught.value.retriable is False
    assert kafka_topic in str(caught.value) and "MSG_SIZE_TOO_LARGE" in str(caught.value)
    # The writer stays failed: it never reports checkpoint 2 or 3 as safe.
    with pytest.raises(DeliveryError):
        writer.poll()
    assert writer.outstanding == 0
    writer.close()
    assert [r.value for r in log.read_all(kafka_topic)][0] == b'{"v": 1}'


def test_the_topic_is_created_with_the_configured_compaction_settings(log, kafka_topic):
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    settings = TopicSettings(partitions=2, min_compaction_lag_ms=1234, delete_retention_ms=5678,
                             extra={"segment.ms": "600000"})
    log.ensure_topic(kafka_topic, settings)
    admin = AdminClient({"bootstrap.servers": log.bootstrap_servers})
    resource = ConfigResource(ResourceType.TOPIC, kafka_topic)
    configs = {k: v.value for k, v in admin.describe_configs([resource])[resource].result(30).items()}
    assert configs["cleanup.policy"] == "compact"
    assert configs["min.compaction.lag.ms"] == "1234"
    assert configs["delete.retention.ms"] == "5678"
    assert configs["segment.ms"] == "600000"
    assert log.partitions(kafka_topic) == 2
    # A second ensure_topic is answered from the cache, without the admin client.
    real, log._admin = log._admin, None
    try:
        log.ensure_topic(kafka_topic, settings)
    finally:
        log._admin = real


def test_the_tombstone_retention_of_a_topic_not_made_yet_is_unknown_not_an_error(log, kafka_topic):
    """A sink may start before its source made the topic: ``delete_retention_ms`` says None (the
    log does not say; it was a permanent error that stopped the sink), and the topic's own value
    once it exists."""
    assert log.delete_retention_ms(kafka_topic) is None
    log.ensure_topic(kafka_topic, TopicSettings(partitions=1, delete_retention_ms=4321))
    assert log.delete_retention_ms(kafka_topic) == 4321


def test_a_full_local_queue_slows_publish_down_without_losing_records(kafka_bootstrap, kafka_topic):
    small = KafkaLog(kafka_bootstrap, producer_config={"queue.buffering.max.messages": 100})
    small.ensure_topic(kafka_topic, TopicSettings(partitions=3))
    writer = small.writer()
    for batch in range(5):
        writer.publish([Record(kafka_topic, f'{{"id": {i}}}'.encode(), f'{{"batch": {batch}}}'.encode())
                        for i in range(1000)], Counter(batch))
    assert writer.flush(30) == Counter(4)
    writer.close()
    assert len(small.read_all(kafka_topic)) == 5000
    small.close()


def test_flush_with_the_broker_unreachable_fails_retriably_instead_of_hanging():
    dead = KafkaLog(f"127.0.0.1:{_closed_port()}", producer_config={"message.timeout.ms": 1500})
    writer = dead.writer()
    started = time.monotonic()
    writer.publish([Record("t_unreachable", b'{"id": 1}', b'{"v": 1}')], Counter(1))
    with pytest.raises((DeliveryError, LogUnavailableError)) as caught:
        writer.flush(20)
    assert caught.value.retriable is True
    assert time.monotonic() - started < 15
    writer.close()
    dead.close()


def test_topic_calls_with_the_broker_unreachable_raise_log_unavailable():
    dead = KafkaLog(f"127.0.0.1:{_closed_port()}")
    dead.timeout = 2.0
    started = time.monotonic()
    with pytest.raises(LogUnavailableError):
        dead.ensure_topic("t_unreachable")
    assert time.monotonic() - started < 10
    dead.close()


def test_a_stream_that_never_pauses_still_gets_safe_checkpoints(log, kafka_topic):
    """Acknowledgements are taken at drain points; a publisher that never lets the producer drain
    gets one forced (a flush) after barrier_interval, so its checkpoint keeps moving."""
    log.ensure_topic(kafka_topic, TopicSettings(partitions=3))
    writer = log.writer()
    writer._tracker.barrier_interval = 0.2
    value = b'{"v":"' + b"x" * 200 + b'"}'
    seen, seq = [], 0
    started = time.monotonic()
    while time.monotonic() - started < 2.0:
        seq += 1
        writer.publish([Record(kafka_topic, f'{{"id":{seq % 1000}}}'.encode(), value) for _ in range(200)],
                       Counter(seq))
        assert writer.outstanding > 0  # never drained by itself: the next publish follows at once
        safe = writer.poll()
        if safe is not None and (not seen or safe != seen[-1]):
            seen.append(safe)
    assert len(seen) >= 3, f"the safe checkpoint moved only {len(seen)} times in 2 s"
    assert all(a.seq < b.seq for a, b in zip(seen, seen[1:]))
    assert writer.flush(30) == Counter(seq)
    writer.close()


def test_partitions_added_by_hand_are_seen_and_a_truncate_reaches_them(log, kafka_topic, monkeypatch):
    from confluent_kafka.admin import AdminClient, NewPartitions

    import cdc.log.kafka as kafka

    log.ensure_topic(kafka_topic, TopicSettings(partitions=2))
    assert log.partitions(kafka_topic) == 2
    admin = AdminClient({"bootstrap.servers": log.bootstrap_servers})
    admin.create_partitions([NewPartitions(kafka_topic, 3)])[kafka_topic].result(30)
    assert log.partitions(kafka_topic) == 2  # the cache, within its time
    # A truncate's copies ask afresh: one lands in the added partition as well.
    writer = log.writer()
    writer.publish([Record(kafka_topic, b"{}", b'{"op": "t"}', to_all_partitions=True)], Counter(1))
    assert writer.flush(30) == Counter(1)
    writer.close()
    assert sorted(r.partition for r in log.read_all(kafka_topic)) == [0, 1, 2]
    # And past the cache's time every caller sees three (a member's end offsets, the shares' check).
    monkeypatch.setattr(kafka, "PARTITIONS_TTL_S", 0.0)
    assert log.partitions(kafka_topic) == 3
    assert sorted(p for _, p in log.end_offsets(kafka_topic)) == [0, 1, 2]
