"""The log contract, run against both implementations: real Kafka and the embedded SQLite log."""

from __future__ import annotations

import time
import uuid

import pytest

from cdc.errors import DeliveryError, TopicConfigError
from cdc.events import ChangeEvent, Op, TableId
from cdc.log.base import Log, TopicSettings
from cdc.log.partitioner import partition_for
from cdc.positions import Counter
from cdc.serde import EnvelopeEncoder, Record


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


def _events(topic: str, rows: list) -> list[ChangeEvent]:
    prefix, schema, table = topic.split(".")
    table_id = TableId(prefix, schema, table)
    out = []
    for i, row in enumerate(rows):
        op = Op.DELETE if i % 4 == 3 else Op.CREATE
        out.append(ChangeEvent(op=op, table=table_id, key={"id": i % 3},
                               before=row if op is Op.DELETE else None, after=None if op is Op.DELETE else row,
                               version=i + 1, ts_ms=1))
    return out


def test_events_are_published_as_the_encoder_makes_them(log, topic):
    """publish_events (encoding and producing in one loop) writes exactly ``encode``'s records:
    tombstones after deletes, a truncate in every partition."""
    log.ensure_topic(topic, TopicSettings(partitions=3))
    events = _events(topic, [{"id": i % 3, "v": i} for i in range(10)])
    events.append(events[0]._replace(op=Op.TRUNCATE, key={}, after=None, version=99))
    writer = log.writer()
    writer.publish_events(EnvelopeEncoder("test", "src", topic.split(".")[0]), events, Counter(1))
    assert writer.flush(30) == Counter(1)
    writer.close()

    expected = EnvelopeEncoder("test", "src", topic.split(".")[0]).encode(events, now_ms=0)
    assert sum(1 for r in expected if r.value is None) == 2  # two deletes, two tombstones
    back = log.read_all(topic)
    assert len(back) == len(expected) + 2  # the truncate once per partition
    truncates = [r for r in back if r.key == b"{}"]
    assert sorted(r.partition for r in truncates) == [0, 1, 2]

    def strip(value):  # the envelope's own ts_ms is the time of encoding
        return None if value is None else {k: v for k, v in decode(value).items() if k != "ts_ms"}

    from cdc.serde import decode

    got_by_key: dict[bytes, list] = {}
    for r in back:
        if r.key != b"{}":
            got_by_key.setdefault(r.key, []).append(strip(r.value))
    want_by_key: dict[bytes, list] = {}
    for r in expected:
        if not r.to_all_partitions:
            want_by_key.setdefault(r.key, []).append(strip(r.value))
    assert got_by_key == want_by_key
    for r in back:
        assert r.key == b"{}" or r.partition == partition_for(r.key, 3)


def test_an_event_that_cannot_be_encoded_fails_its_batch_and_every_later_checkpoint(log, topic):
    log.ensure_topic(topic, TopicSettings(partitions=2))
    writer = log.writer()
    writer.publish_events(EnvelopeEncoder("test", "src", topic.split(".")[0]),
                          _events(topic, [{"v": 1}, {"v": 2}]), Counter(1))
    assert writer.flush(30) == Counter(1)
    bad = _events(topic, [{"v": 3}, {"v": object()}, {"v": 5}])  # the second row is no JSON
    with pytest.raises(DeliveryError, match=topic) as raised:
        writer.publish_events(EnvelopeEncoder("test", "src", topic.split(".")[0]), bad, Counter(2))
    assert not raised.value.retriable
    # Nothing after the failure is ever safe: not this batch, not a later one.
    with pytest.raises(DeliveryError):
        writer.publish_events(EnvelopeEncoder("test", "src", topic.split(".")[0]),
                              _events(topic, [{"v": 6}]), Counter(3))
        writer.flush(30)
    writer.close()


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


def test_a_delete_topic_keeps_every_record_of_a_key_and_its_policy_can_be_changed(log, topic):
    """The dead letters' kind of topic: not compacted, so records sharing a key all stay; a
    compacted one can be turned into it (and a compacted topic is refused where delete is asked)."""
    settings = TopicSettings(partitions=1, cleanup_policy="delete", retention_ms=3_600_000)
    log.ensure_topic(topic, settings)
    log.ensure_topic(topic, settings)  # idempotent
    assert log.cleanup_policy(topic) == ("delete", 3_600_000)
    with pytest.raises(TopicConfigError, match=topic):
        log.ensure_topic(topic)  # asked compacted
    writer = log.writer()
    writer.publish([Record(topic, b"same", f"{i}".encode()) for i in range(5)], Counter(1))
    writer.flush(30)
    writer.close()
    log.compact(topic)
    assert [r.value for r in log.read_all(topic)] == [b"0", b"1", b"2", b"3", b"4"]

    other = topic + "_c"
    log.ensure_topic(other)
    assert log.cleanup_policy(other)[0] == "compact"
    log.set_cleanup_policy(other, "delete", None)
    assert log.cleanup_policy(other) == ("delete", None)
    log.ensure_topic(other, TopicSettings(cleanup_policy="delete"))
    assert log.cleanup_policy(topic + "_missing") is None


def test_the_embedded_log_expires_records_of_a_delete_topic_past_its_retention(tmp_path):
    from cdc.log.embedded import EmbeddedLog

    log = EmbeddedLog(tmp_path / "log")
    try:
        log.ensure_topic("letters", TopicSettings(cleanup_policy="delete", retention_ms=60_000))
        writer = log.writer()
        writer.publish([Record("letters", b"k", b"old")], None)
        writer.flush()
        writer.close()
        log.compact("letters")
        assert len(log.read_all("letters")) == 1  # younger than the retention
        log.set_cleanup_policy("letters", "delete", 1)
        time.sleep(0.01)
        log.compact("letters")
        assert log.read_all("letters") == [] and log.end_offsets("letters") == {("letters", 0): 1}
    finally:
        log.close()


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
