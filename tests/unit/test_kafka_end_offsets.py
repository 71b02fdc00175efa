"""KafkaLog.end_offsets on a cluster whose brokers have not all applied a topic's creation yet:
UNKNOWN_TOPIC_OR_PART for a topic this log made is waited out (seen on the three-node cluster:
the source's first read of a topic it had just made stopped it with a permanent error, and the
broker asked for the topic list did not know the topic either). The broker is a fake: what is
tested is the decision, which no real cluster produces on demand."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc.errors import PermanentError
from cdc.log.kafka import KafkaLog


class Watermarks:
    """Answers UNKNOWN_TOPIC_OR_PART ``unknown`` times, then the offsets."""

    def __init__(self, unknown: int) -> None:
        self.unknown, self.calls = unknown, 0

    def get_watermark_offsets(self, tp, timeout, cached):
        self.calls += 1
        if self.calls <= self.unknown:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return (0, 42)

    def poll(self, timeout):
        return None


def _log(monkeypatch, broker: Watermarks) -> KafkaLog:
    log = KafkaLog("127.0.0.1:1", timeout=5)
    monkeypatch.setattr(log, "partitions", lambda topic, fresh=False: 1)
    monkeypatch.setattr(log, "_metadata_consumer", lambda: broker)
    monkeypatch.setattr(log, "_in_metadata", lambda topic: False)   # the listing broker lags too
    return log


def test_a_topic_this_log_made_is_waited_for(monkeypatch):
    broker = Watermarks(unknown=3)
    log = _log(monkeypatch, broker)
    log._made.add("t")
    assert log.end_offsets("t") == {("t", 0): 42}
    assert broker.calls == 4


def test_a_topic_nobody_here_made_and_the_metadata_lacks_is_an_error_at_once(monkeypatch):
    broker = Watermarks(unknown=3)
    log = _log(monkeypatch, broker)
    with pytest.raises(PermanentError, match=r"reading the end offset of t\[0\]"):
        log.end_offsets("t")
    assert broker.calls == 1
