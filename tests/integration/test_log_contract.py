"""The log contract, run against both implementations: real Kafka and the embedded SQLite log."""

from __future__ import annotations

import time
import uuid

import pytest

from cdc.errors import TopicConfigError
from cdc.log.base import Log, TopicSettings
from cdc.log.partitioner import partition_for
from cdc.positions import Counter
from cdc.serde import Record


def _fast_compaction() -> TopicSettings:
    # Kafka compacts closed segments only: roll them quickly and clean at the slightest dirt.
    return TopicSettings(partitions=3, delete_retention_ms=100, min_compaction_lag_ms=0,
                         extra={"segment.ms": "200", "min.cleanable.dirty.ratio": "0.001",
                                "max.compaction.lag.ms": "200"})


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def log(request, tmp_path) -> Log:
    if request.param == "embedded":
        from cdc.log.embedded import EmbeddedLog

        instance = EmbeddedLog(tmp_path / "log")
    else:
        from cdc.log.kafka import KafkaLog

        instance = KafkaLog(request.getfixturevalue("kafka_bootstrap"))
    yield instance
    instance.close()


@pytest.fixture
def topic() -> str:
    return f"t_{uuid.uuid4().hex[:10]}.public.items"


def _make_plain_topic(log: Log, name: str) -> None:
    """A topic with cleanup.policy=delete, made behind the log's back."""
    if type(log).__name__ == "EmbeddedLog":
        log.create_topic_unchecked(name, TopicSettings(), cleanup_policy="delete")
    else:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": log.bootstrap_servers})
        admin.create_topics([NewTopic(name, 1, 1, config={"cleanup.policy": "delete"})])[name].result(30)


def _records(topic: str, n: int, keys: int, start: int = 0) -> list[Record]:
    return [Record(topic, f'{{"id": {i % keys}}}'.encode(), f'{{"v": {i}}}'.encode())
            for i in range(start, start + n)]


def test_ensure_topic_creates_a_compacted_topic_once(log, topic):
    log.ensure_topic(topic, TopicSettings(partitions=3))
    log.ensure_topic(topic, TopicSettings(partitions=3))  # idempotent
    assert topic in log.topics()
    assert log.partitions(topic) == 3
    assert set(log.end_offsets(topic)) == {(topic, 0), (topic, 1), (topic, 2)}


def test_an_existing_topic_that_is_not_compacted_is_reported(log, topic):
    _make_plain_topic(log, topic)
    with pytest.raises(TopicConfigError, match=topic):
        log.ensure_topic(topic)


def test_records_are_partitioned_by_key_and_read_back_in_order(log, topic):
    log.ensure_topic(topic, TopicSettings(partitions=3))
    writer = log.writer()
    records = _records(topic, 300, keys=20)
    writer.publish(records, Counter(1))
    assert writer.flush(30) == Counter(1)
    assert writer.outstanding == 0
    writer.close()

    back = log.read_all(topic)
    assert len(back) == 300
    for record in back:
        assert record.partition == partition_for(record.key, 3)
    # Within a key, the values come back in the order they were published.
    by_key: dict[bytes, list[bytes]] = {}
    for record in back:
        by_key.setdefault(record.key, []).append(record.value)
    expected: dict[bytes, list[bytes]] = {}
    for record in records:
        expected.setdefault(record.key, []).append(record.value)
    assert by_key == expected


def test_a_record_for_all_partitions_lands_in_each(log, topic):
    log.ensure_topic(topic, TopicSettings(partitions=3))
    writer = log.writer()
    writer.publish([Record(topic, b"{}", b'{"op": "t"}', to_all_partitions=True)], Counter(1))
    assert writer.flush(30) == Counter(1)
    writer.close()
    assert sorted(r.partition for r in log.read_all(topic)) == [0, 1, 2]


def test_the_safe_checkpoint_is_the_last_one_fully_acknowledged(log, topic):
    log.ensure_topic(topic, TopicSettings(partitions=2))
    writer = log.writer()
    writer.publish(_records(topic, 50, 5), Counter(10))
    writer.publish(_records(topic, 50, 5, start=50), None)  # mid-transaction: no checkpoint
    assert writer.flush(30) == Counter(10)
    writer.publish(_records(topic, 10, 5, start=100), Counter(11))
    assert writer.flush(30) == Counter(11)
    writer.publish([], Counter(12))  # a heartbeat: nothing to deliver, the checkpoint advances
    assert writer.flush(30) == Counter(12)
    writer.close()


def test_group_offsets_are_stored_and_resumed(log, topic):
    log.ensure_topic(topic, TopicSettings(partitions=1))
    writer = log.writer()
    writer.publish(_records(topic, 10, 10), Counter(1))
    writer.flush(30)
    writer.close()

    group = f"g_{uuid.uuid4().hex[:8]}"
    reader = log.reader(group)
    reader.assign({(topic, 0): 0})
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 4 and time.monotonic() < deadline:
        got += reader.poll(4 - len(got), 0.5)
    assert [r.offset for r in got] == [0, 1, 2, 3]
    reader.commit({(topic, 0): 4})
    assert reader.committed([(topic, 0)]) == {(topic, 0): 4}
    reader.close()

    again = log.reader(group)
    assert again.committed([(topic, 0)]) == {(topic, 0): 4}
    again.assign({(topic, 0): 4})
    rest = []
    deadline = time.monotonic() + 30
    while len(rest) < 6 and time.monotonic() < deadline:
        rest += again.poll(100, 0.5)
    assert [r.offset for r in rest] == [4, 5, 6, 7, 8, 9]
    assert again.position((topic, 0)) == 10
    again.close()
    assert log.end_offsets(topic) == {(topic, 0): 10}


def test_compaction_keeps_the_latest_record_per_key_and_drops_old_tombstones(log, topic):
    log.ensure_topic(topic, _fast_compaction())
    writer = log.writer()
    for round_ in range(5):
        writer.publish(_records(topic, 40, keys=40, start=round_ * 40), None)
    doomed = [f'{{"id": {i}}}'.encode() for i in range(10)]
    writer.publish([Record(topic, key, None) for key in doomed], Counter(1))
    assert writer.flush(30) == Counter(1)
    writer.close()

    tick_key = b'{"id": "tick"}'

    def latest_per_key() -> bool:
        records = [r for r in log.read_all(topic) if r.key != tick_key]
        keys = [r.key for r in records]
        return len(keys) == len(set(keys)) == 30 and not any(r.value is None for r in records)

    deadline = time.monotonic() + 120
    while not latest_per_key():
        assert time.monotonic() < deadline, "compaction did not converge"
        # Kafka cleans closed segments only; a fresh write to every partition rolls each active
        # segment once it is older than segment.ms.
        time.sleep(0.5)
        tick = log.writer()
        tick.publish([Record(topic, tick_key, b"{}", to_all_partitions=True)], None)
        tick.flush(30)
        tick.close()
        log.compact(topic)
    survivors = {r.key: r.value for r in log.read_all(topic) if r.key != tick_key}
    assert set(survivors) == {f'{{"id": {i}}}'.encode() for i in range(10, 40)}
    # Each survivor holds its last value: the fifth round wrote v = 160 + id.
    for key, value in survivors.items():
        i = int(key.decode().split(":")[1].rstrip("}"))
        assert value == f'{{"v": {160 + i}}}'.encode()


def test_delete_topic_removes_it_and_its_records(log, topic):
    log.ensure_topic(topic, TopicSettings(partitions=2))
    writer = log.writer()
    writer.publish(_records(topic, 10, 5), Counter(1))
    writer.flush(30)
    writer.close()
    log.delete_topic(topic)
    deadline = time.monotonic() + 30
    while topic in log.topics():
        assert time.monotonic() < deadline, "the topic is still listed"
        time.sleep(0.1)
    log.delete_topic(topic)  # deleting a missing topic is not an error
