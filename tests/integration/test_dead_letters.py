"""Dead letters on Kafka: a poison record larger than the broker's default message size is set
aside (as a reference to where it lies), and the sink goes on writing the records after it."""

from __future__ import annotations

import os
import threading

import orjson
import pytest

from cdc.events import ChangeEvent, Op
from cdc.log.base import TopicSettings
from cdc.log.kafka import KafkaLog
from cdc.positions import Counter
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import EnvelopeEncoder
from tests.integration.test_sink_runner import TABLE, RecordingSink, _committed, _config

pytestmark = pytest.mark.kafka

BIG = 3 * 1024 * 1024  # over the broker's ~1 MB default message size


@pytest.fixture
def log(kafka_bootstrap):
    # The operator raised the producer's limit so that large rows can be published at all.
    instance = KafkaLog(kafka_bootstrap, producer_config={"message.max.bytes": 8_000_000})
    yield instance
    instance.close()


def _publish_creates(log, prefix: str, count: int) -> str:
    """Creates of ids 0 .. count-1 in TABLE's topic of ``prefix`` (made here); returns the topic."""
    topic = TABLE.topic(prefix)
    log.ensure_topic(topic)
    events = [ChangeEvent(Op.CREATE, TABLE, {"id": i}, None, {"id": i}, i + 1, 0) for i in range(count)]
    writer = log.writer()
    writer.publish(EnvelopeEncoder("test", "src", prefix).encode(events), Counter(1))
    writer.flush(30)
    writer.close()
    return topic


def test_an_oversized_poison_record_is_referenced_and_the_sink_goes_on(log, kafka_topic):
    prefix = kafka_topic  # a fresh prefix per test: its own table topic and dead-letter topic
    topic = TABLE.topic(prefix)
    log.ensure_topic(topic, TopicSettings(extra={"max.message.bytes": str(8_000_000)}))
    # Random text does not compress below the limit; id 13 is the poison, then valid records.
    blob = os.urandom(BIG // 2).hex()
    events = [ChangeEvent(Op.CREATE, TABLE, {"id": i}, None,
                          {"id": i, "v": blob if i == 13 else "small"}, i + 1, 0) for i in range(20)]
    writer = log.writer()
    writer.publish(EnvelopeEncoder("test", "src", prefix).encode(events), Counter(1))
    writer.flush(60)
    writer.close()
    # The dead-letter topic as a broker with Kafka's default message.max.bytes (1048588) makes
    # it (the dev broker allows 16 MB, which would hide the problem).
    log.ensure_topic(f"{prefix}.dead-letter.rec", TopicSettings(extra={"max.message.bytes": "1048588"}))

    config = _config().model_copy(update={"topics": [f"{prefix}.*"]})
    sink = RecordingSink(config, poison_ids={13})
    runner = SinkRunner(sink, log, prefix)
    runner.run(threading.Event(), until_caught_up=True)

    # Every valid record is written, and the group's offsets passed the poison record.
    assert set(sink.generations[1]) == {orjson.dumps({"id": i}) for i in range(20) if i != 13}
    ends, committed = _committed(log, topic)
    assert committed == ends
    [letter] = [orjson.loads(r.value) for r in log.read_all(f"{prefix}.dead-letter.rec")]
    assert letter["value_stored"] == "reference" and letter["value"] is None
    assert letter["topic"] == topic and letter["size"] > BIG
    assert orjson.loads(letter["key"]) == {"id": 13} and "cannot store id 13" in letter["reason"]
    # The reference leads to the record itself.
    [original] = [r for r in log.read_all(topic) if r.offset == letter["offset"]
                  and r.partition == letter["partition"]]
    assert orjson.loads(original.value)["after"]["id"] == 13


def test_a_small_poison_record_is_copied_inline(log, kafka_topic):
    prefix = kafka_topic
    _publish_creates(log, prefix, 5)
    sink = RecordingSink(_config().model_copy(update={"topics": [f"{prefix}.*"]}), poison_ids={3})
    SinkRunner(sink, log, prefix).run(threading.Event(), until_caught_up=True)
    [letter] = [orjson.loads(r.value) for r in log.read_all(f"{prefix}.dead-letter.rec")]
    assert letter["value_stored"] == "inline" and orjson.loads(letter["value"])["after"] == {"id": 3}


def test_the_dead_letter_topic_is_created_with_a_size_limit_every_letter_fits(log, kafka_topic):
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from cdc.runtime import dead_letters

    prefix = kafka_topic
    _publish_creates(log, prefix, 3)
    sink = RecordingSink(_config().model_copy(update={"topics": [f"{prefix}.*"]}), poison_ids={1})
    SinkRunner(sink, log, prefix).run(threading.Event(), until_caught_up=True)
    resource = ConfigResource(ResourceType.TOPIC, f"{prefix}.dead-letter.rec")
    admin = AdminClient({"bootstrap.servers": log.bootstrap_servers})
    configs = admin.describe_configs([resource])[resource].result(30)
    assert int(configs["max.message.bytes"].value) == dead_letters.TOPIC_MAX_MESSAGE_BYTES


def test_a_dead_letter_the_broker_refuses_stops_the_sink_before_its_offset_is_committed(log, kafka_topic):
    """The offset past a poison record is committed only once its letter is acknowledged: a
    letter the broker refuses (here: a dead-letter topic someone made with a tiny message limit)
    stops the sink with the delivery error, and the group stays before the poison record."""
    from cdc.errors import DeliveryError

    prefix = kafka_topic
    topic = _publish_creates(log, prefix, 6)
    log.ensure_topic(f"{prefix}.dead-letter.rec", TopicSettings(partitions=1, extra={"max.message.bytes": "64"}))
    poison = next(r.offset for r in log.read_all(topic) if orjson.loads(r.value)["after"]["id"] == 3)

    sink = RecordingSink(_config().model_copy(update={"topics": [f"{prefix}.*"]}), poison_ids={3})
    with pytest.raises(DeliveryError) as raised:
        SinkRunner(sink, log, prefix).run(threading.Event(), until_caught_up=True)

    assert "MSG_SIZE_TOO_LARGE" in str(raised.value) and not raised.value.retriable
    reader = log.reader("rec")
    committed = reader.committed([(topic, 0)]).get((topic, 0))
    reader.close()
    assert committed is None or committed <= poison
    assert log.read_all(f"{prefix}.dead-letter.rec") == []


def test_a_dead_letter_refused_once_is_delivered_when_retried_after_the_cause_is_fixed(log, kafka_topic):
    """A sink that sets records aside itself retries a letter the broker refused a moment ago;
    the runner's letter writer must not keep that first failure for good."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from cdc.errors import DeliveryError

    prefix = kafka_topic
    dlq = f"{prefix}.dead-letter.rec"
    log.ensure_topic(dlq, TopicSettings(partitions=1, extra={"max.message.bytes": "64"}))
    sink = RecordingSink(_config().model_copy(update={"topics": [f"{prefix}.*"]}))
    runner = SinkRunner(sink, log, prefix)
    with pytest.raises(DeliveryError, match="MSG_SIZE_TOO_LARGE"):
        runner.dead_letter(TABLE.topic(prefix), 0, 7, "PermanentError: refused", b'{"id": 7}', b"{}")

    resource = ConfigResource(ResourceType.TOPIC, dlq, incremental_configs=[
        ConfigEntry("max.message.bytes", "1048588", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": log.bootstrap_servers})
    admin.incremental_alter_configs([resource])[resource].result(30)

    runner.dead_letter(TABLE.topic(prefix), 0, 7, "PermanentError: refused", b'{"id": 7}', b"{}")
    [letter] = [orjson.loads(r.value) for r in log.read_all(dlq)]
    assert letter["offset"] == 7 and letter["reason"] == "PermanentError: refused"


def _policy(log_, topic: str) -> tuple[str, int | None]:
    return log_.cleanup_policy(topic)


def test_every_letter_is_kept_though_two_share_a_row_key_and_an_old_compacted_topic_is_changed(log, kafka_topic):
    """Two bad records of one row key (at two offsets) and one of another table with that key:
    three letters, three keys, in a topic that is not compacted. A dead-letter topic an earlier
    version made compacted is changed, its letters kept, to the configured retention."""
    from cdc.runtime.sink_runner import SinkRunner as Runner

    prefix = kafka_topic
    dlq = f"{prefix}.dead-letter.rec"
    log.ensure_topic(dlq, TopicSettings(partitions=1))  # compacted, as before
    writer = log.writer()
    writer.publish([dead_letters_record(dlq)])
    writer.flush(30)
    writer.close()
    topic = TABLE.topic(prefix)
    other = f"{prefix}.public.other"
    for name in (topic, other):
        log.ensure_topic(name)
    events = [ChangeEvent(Op.CREATE, TABLE, {"id": 50}, None, {"id": 50, "v": 1}, 1, 0),
              ChangeEvent(Op.UPDATE, TABLE, {"id": 50}, None, {"id": 50, "v": 2}, 2, 0)]
    other_table = type(TABLE)(TABLE.db, TABLE.schema, "other")
    events.append(ChangeEvent(Op.CREATE, other_table, {"id": 50}, None, {"id": 50, "v": 3}, 3, 0))
    writer = log.writer()
    writer.publish(EnvelopeEncoder("test", "src", prefix).encode(events), Counter(1))
    writer.flush(30)
    writer.close()
    config = _config().model_copy(update={"topics": [f"{prefix}.*"], "dead_letter_retention_hours": 48.0})
    Runner(RecordingSink(config, poison_ids={50}), log, prefix).run(threading.Event(), until_caught_up=True)
    assert _policy(log, dlq) == ("delete", 48 * 3_600_000)
    letters = log.read_all(dlq)
    assert letters[0].key == b"earlier" and len(letters) == 4, letters
    assert len({r.key for r in letters[1:]}) == 3
    assert sorted((orjson.loads(r.key)["topic"], orjson.loads(r.value)["key"]) for r in letters[1:]) == [
        (topic, '{"id":50}'), (topic, '{"id":50}'), (other, '{"id":50}')]


def dead_letters_record(dlq: str):
    from cdc.serde import Record

    return Record(dlq, b"earlier", b'{"reason": "set aside by an earlier version"}')
