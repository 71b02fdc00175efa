"""Reading the Kafka log: ``KafkaReader`` (one consumer, assigned partitions) and
``KafkaMemberReader`` (a member of a consumer group), and the loop that turns confluent-kafka's
messages into ``LogRecord``s.

The consumer's settings are ``cdc.log.kafka.CONSUMER_DEFAULTS``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTp

from cdc import native
from cdc.errors import CdcError, PermanentError
from cdc.log.base import GroupListener, GroupReader, LogReader, LogRecord, TopicPartition
from cdc.log.kafka_errors import TRANSIENT, kafka_error, wrap

log = logging.getLogger(__name__)

# A commit refused because the member no longer owns what it commits: the group moved on (a
# rebalance it has not served yet, or it was thrown out). The new owner reads from the group's
# last commit, so dropping this one only means a replay, never a gap.
FENCED = frozenset({
    KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.FENCED_INSTANCE_ID, KafkaError.STALE_MEMBER_EPOCH, KafkaError.FENCED_MEMBER_EPOCH,
    KafkaError._ASSIGNMENT_LOST,
})


def log_records(messages: list, start: int, out: list[LogRecord]) -> int:
    """Append the records of ``messages[start:]`` to ``out`` up to the first message that carries
    an error; return its index (``len(messages)`` if none). Where setup.py built it,
    ``cdc/_records.c`` runs this loop in C (tests/unit/test_sink_decode_batch.py compares the
    two); this Python loop is the reference."""
    if _records is not None and native.enabled() and type(messages) is list:
        return _records.log_records(messages, start, out, LogRecord)
    append, new = out.append, tuple.__new__
    for at in range(start, len(messages)):
        msg = messages[at]
        if msg.error() is not None:
            return at
        append(new(LogRecord, (msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                               msg.timestamp()[1], msg.headers())))
    return len(messages)


_records = native.load("cdc._records")  # the same loop in C


class KafkaReader(LogReader):
    def __init__(self, consumer: Consumer, group: str | None, timeout: float) -> None:
        self._consumer = consumer
        self._closed = False
        self._group = group
        self._timeout = timeout
        self._start: dict[TopicPartition, int] = {}
        self._eof: dict[TopicPartition, int] = {}  # where each partition's end was seen
        self._error: CdcError | None = None        # held back until the records before it are out

    def assign(self, start: dict[TopicPartition, int]) -> None:
        self._start = dict(start)
        self._eof = {}
        self._consumer.assign([KafkaTp(t, p, offset) for (t, p), offset in start.items()])

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        try:
            messages = self._consumer.consume(min(max_records, 1_000_000), timeout)  # librdkafka's cap
        except KafkaException as exc:
            raise wrap("reading the log", exc) from exc
        out: list[LogRecord] = []
        at = 0
        while (at := log_records(messages, at, out)) < len(messages):
            msg = messages[at]  # the first message from `at` on that carries an error
            at += 1
            err = msg.error()
            assert err is not None  # log_records stops only at a message that carries an error
            if err.code() == KafkaError._PARTITION_EOF:
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                assert topic is not None and partition is not None and offset is not None  # an end names its place
                self._eof[(topic, partition)] = offset
            elif err.code() in TRANSIENT and not err.fatal():
                log.debug("kafka consumer: %s (librdkafka retries)", err)
            elif err.code() == KafkaError._MAX_POLL_EXCEEDED:
                # A group member that did not poll for max.poll.interval.ms (a write that took
                # that long) has left its group; its partitions are revoked as lost, and this poll
                # joins again. Not an error of the log: the member goes on.
                log.warning("kafka consumer: %s; joining the group again", err.str())
            else:
                error = wrap(f"reading {msg.topic()}[{msg.partition()}]", KafkaException(err))
                if not out:
                    raise error
                self._error = error
                break
        return out

    def position(self, tp: TopicPartition) -> int:
        try:
            offset = self._consumer.position([KafkaTp(tp[0], tp[1])])[0].offset
        except KafkaException as exc:
            raise wrap(f"reading the position in {tp[0]}[{tp[1]}]", exc) from exc
        if offset < 0:  # OFFSET_INVALID (-1001): nothing fetched yet, so the assigned start
            offset = self._start.get(tp, 0)
        # At the end of a partition whose last offsets were compacted away, the end is the position.
        return max(offset, self._eof.get(tp, offset))

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self._group is None:
            raise PermanentError("this reader has no consumer group: make it with log.reader(group) to commit")
        if not offsets:
            return
        try:
            result = self._consumer.commit(
                offsets=[KafkaTp(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
        except KafkaException as exc:
            raise wrap(f"committing offsets of group {self._group}", exc) from exc
        for tp in result or ():
            if tp.error is not None:
                error = KafkaException(tp.error)
                raise wrap(f"committing {tp.topic}[{tp.partition}] for group {self._group}", error) from error

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        wanted = [KafkaTp(t, p) for t, p in partitions]
        if not wanted:
            return {}
        try:
            result = self._consumer.committed(wanted, timeout=self._timeout)
        except KafkaException as exc:
            raise wrap(f"reading the committed offsets of group {self._group}", exc) from exc
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in result}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close()


class KafkaMemberReader(KafkaReader, GroupReader):
    """A member of a consumer group (``subscribe``): the group coordinator assigns partitions.
    The listener is called inside ``poll`` and ``close``, on the reading thread; librdkafka
    completes the (incremental) assignment or revocation once the listener returns."""

    def subscribe(self, topics: list[str], listener: GroupListener) -> None:
        def tps(partitions) -> list[TopicPartition]:
            return [(tp.topic, tp.partition) for tp in partitions]

        try:
            self._consumer.subscribe(
                list(topics),
                on_assign=lambda consumer, partitions: listener.assigned(tps(partitions)),
                on_revoke=lambda consumer, partitions: listener.revoked(tps(partitions), False),
                on_lost=lambda consumer, partitions: listener.revoked(tps(partitions), True))
        except KafkaException as exc:
            raise wrap(f"subscribing group {self._group} to {len(topics)} topics", exc) from exc

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """As ``KafkaReader.commit``; a commit the group refuses because the partitions moved on
        is dropped with a warning (see ``FENCED``): the rebalance is served at the next poll."""
        try:
            super().commit(offsets)
        except CdcError as exc:
            cause = kafka_error(exc.__cause__) if exc.__cause__ is not None else None
            if cause is None or cause.code() not in FENCED:
                raise
            log.warning("group %s refused a commit of %d partitions (%s): they moved to another member, "
                        "which reads them again from the group's last commit", self._group, len(offsets),
                        cause.name())
