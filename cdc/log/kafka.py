"""The log on Apache Kafka, through confluent-kafka (librdkafka).

Threading: a ``KafkaLog`` may be shared between threads (its admin client and metadata consumer are
thread-safe librdkafka handles). A ``KafkaWriter`` is single-threaded: its failure reports run
inside ``poll``/``flush`` (and inside ``publish`` while it waits for room in the local queue) on the
caller's thread, which is what lets ``DeliveryTracker`` go without locks. A ``KafkaReader`` is one
``Consumer``, used by one thread at a time.

Producer settings (each overridable through ``producer_config``):

* ``enable.idempotence`` (which implies ``acks=all``, unbounded retries and at most 5 requests in
  flight per partition): retries never duplicate nor reorder a key's records, and a record counts
  as delivered only once every in-sync replica has it, so a checkpoint is never stored past a
  record a broker failure could lose.
* ``partitioner=murmur2_random``: the Java client's key hash, the one ``cdc.log.partitioner``
  computes, so the embedded log, Kafka Connect, Kafka Streams and we place a key alike.
* ``allow.auto.create.topics=false``: a topic comes from ``ensure_topic`` (compacted) or not at all;
  never from a broker's auto-creation with the default delete policy.
* ``linger.ms=10``, ``batch.size=1 MB``, ``batch.num.messages=10000``: a CDC stream arrives in
  bursts; 10 ms of waiting fills large batches (fewer requests, less broker CPU) while a backlog
  is read. When the source has caught up, the runner calls ``send_now`` and the records go at
  once, so a trickle of transactions does not wait for the linger (cdc/runtime/runner.py).
* ``queue.buffering.max.messages=200000`` / ``max.kbytes=256 MB``: the local queue bounds memory;
  when it is full ``produce`` raises ``BufferError`` and ``publish`` serves acknowledgements until
  there is room (that is the backpressure on the source).
* ``compression.type=lz4``: change events are repetitive JSON that shrinks several-fold; lz4 runs
  on librdkafka's threads (not the GIL-bound caller), and the bytes saved count on a real network
  and on the brokers' disks. On loopback it measured as fast as ``none``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTp
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from cdc.errors import CdcError, DeliveryError, LogUnavailableError, PermanentError, TopicConfigError
from cdc.events import ChangeEvent, RowBlock
from cdc.headers import Headers
from cdc.log.base import (
    GroupListener,
    GroupLog,
    GroupReader,
    Log,
    LogReader,
    LogRecord,
    LogWriter,
    TopicPartition,
    TopicSettings,
)
from cdc.log.block_producer import BlockProducer, open_block_producer
from cdc.log.delivery import DeliveryTracker
from cdc.log.kafka_bulk import KafkaBulkReader, open_bulk_reader
from cdc.log.kafka_errors import TRANSIENT, delivery_error, kafka_error, wrap
from cdc.log.kafka_logs import LOGGER as LIBRDKAFKA_LOGGER
from cdc.log.kafka_logs import on_error
from cdc.positions import Position
from cdc.serde import EmitError, EnvelopeEncoder, Record

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random",
    "allow.auto.create.topics": False, "linger.ms": 10, "batch.size": 1_000_000,
    "batch.num.messages": 10_000, "queue.buffering.max.messages": 200_000,
    "queue.buffering.max.kbytes": 262_144, "compression.type": "lz4",
}
# fetch.queue.backoff.ms: once its local queue is full (queued.min.messages), librdkafka waits this
# long before it fetches again (1 s by default), even if the queue was drained at once; a sink
# reading a backlog waited most of the time (bench/bootstrap.py through confluent-kafka: 26 s for
# 3.19M records, 12 s with 10 ms).
CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True,
    "allow.auto.create.topics": False, "fetch.queue.backoff.ms": 10,
}

# A commit refused because the member no longer owns what it commits: the group moved on (a
# rebalance it has not served yet, or it was thrown out). The new owner reads from the group's
# last commit, so dropping this one only means a replay, never a gap.
FENCED = frozenset({
    KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.FENCED_INSTANCE_ID, KafkaError.STALE_MEMBER_EPOCH, KafkaError.FENCED_MEMBER_EPOCH,
    KafkaError._ASSIGNMENT_LOST,
})


class KafkaLog(Log, GroupLog):
    """``timeout``: seconds an admin or metadata request may take (topic creation, listing, end
    offsets, committed offsets). It bounds how long any call blocks when the brokers cannot be
    reached, and so how long a worker can take to notice SIGTERM there."""

    def __init__(self, bootstrap_servers: str, defaults: TopicSettings | None = None, *,
                 producer_config: dict | None = None, consumer_config: dict | None = None,
                 timeout: float = 15.0) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.defaults = defaults or TopicSettings()
        self.timeout = timeout
        # librdkafka's log and error events through Python logging, repeats held back (kafka_logs).
        common = {"bootstrap.servers": bootstrap_servers, "logger": LIBRDKAFKA_LOGGER, "error_cb": on_error}
        self.producer_config = {**common, **PRODUCER_DEFAULTS, **(producer_config or {})}
        self.consumer_config = {**common, **CONSUMER_DEFAULTS, **(consumer_config or {})}
        self._admin = AdminClient({**common, "allow.auto.create.topics": False})
        self._checked: dict[str, str] = {}      # topics known to exist, with their cleanup policy
        self._partitions: dict[str, int] = {}   # partition counts (a topic's count only grows)
        self._meta: Consumer | None = None      # for watermarks
        self._lock = threading.Lock()
        self._open: weakref.WeakSet = weakref.WeakSet()

    # --- topics ---------------------------------------------------------------------------------

    def ensure_topic(self, topic: str, settings: TopicSettings | None = None) -> None:
        settings = settings or self.defaults
        if self._checked.get(topic) == settings.cleanup_policy:
            return
        if self._describe(topic) is None and self._create(topic, settings):
            self._checked[topic] = settings.cleanup_policy
            return
        policy = self._configs(topic)["cleanup.policy"].value or ""
        # A table's topic must compact (compact,delete does too); a delete topic must not.
        if ("compact" in policy.split(",")) != (settings.cleanup_policy == "compact"):
            raise TopicConfigError(
                f"topic {topic} has cleanup.policy={policy}; it must be {settings.cleanup_policy} (kafka-configs "
                f"--alter --entity-type topics --entity-name {topic} --add-config "
                f"cleanup.policy={settings.cleanup_policy})")
        self._checked[topic] = settings.cleanup_policy

    def cleanup_policy(self, topic: str) -> tuple[str, int | None] | None:
        if self._describe(topic) is None:
            return None
        configs = self._configs(topic)
        retention = configs.get("retention.ms")
        ms = int(retention.value) if retention is not None and retention.value is not None else -1
        return configs["cleanup.policy"].value or "", (None if ms < 0 else ms)

    def set_cleanup_policy(self, topic: str, policy: str, retention_ms: int | None) -> None:
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
            ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", str(-1 if retention_ms is None else retention_ms),
                        incremental_operation=AlterConfigOpType.SET)])
        with self._request(f"changing the cleanup policy of topic {topic}") as admin:
            admin.incremental_alter_configs([resource], request_timeout=self.timeout)[resource].result(self.timeout)
        self._checked.pop(topic, None)

    def _configs(self, topic: str) -> dict:
        """The topic's configs. A topic someone else just made may be in the metadata before the
        broker answering for configs knows it (UNKNOWN_TOPIC_OR_PART): asked again."""
        resource = ConfigResource(ResourceType.TOPIC, topic)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with self._request(f"reading the configs of topic {topic}") as admin:
                    future = admin.describe_configs([resource], request_timeout=self.timeout)[resource]
                    return future.result(self.timeout)
            except PermanentError as exc:
                cause = kafka_error(exc.__cause__) if exc.__cause__ is not None else None
                if (cause is None or cause.code() != KafkaError.UNKNOWN_TOPIC_OR_PART
                        or time.monotonic() > deadline):
                    raise
            time.sleep(0.1)

    def _create(self, topic: str, settings: TopicSettings) -> bool:
        """Create ``topic`` with the settings' policy; False when someone else created it meanwhile."""
        if settings.cleanup_policy == "compact":
            config = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(settings.min_compaction_lag_ms),
                      "delete.retention.ms": str(settings.delete_retention_ms), **settings.extra}
        else:
            retention = -1 if settings.retention_ms is None else settings.retention_ms
            config = {"cleanup.policy": settings.cleanup_policy, "retention.ms": str(retention), **settings.extra}
        new = NewTopic(topic, settings.partitions, settings.replication_factor, config=config)
        with self._request(f"creating topic {topic}") as admin:
            future = admin.create_topics([new], operation_timeout=self.timeout,
                                         request_timeout=self.timeout)[topic]
            try:
                future.result(self.timeout)
            except KafkaException as exc:
                code = getattr(kafka_error(exc), "code", lambda: None)()
                if code == KafkaError.TOPIC_ALREADY_EXISTS:
                    return False
                if code not in TRANSIENT:  # invalid config, replication factor, policy, ACLs
                    raise TopicConfigError(f"topic {topic} could not be created: {exc}") from exc
                raise
            # The controller has it; wait until the brokers' metadata shows every partition led.
            deadline = time.monotonic() + self.timeout
            while not self._led(admin.list_topics(topic=topic, timeout=self.timeout), topic):
                if time.monotonic() > deadline:
                    raise LogUnavailableError(f"topic {topic} was created but has no leaders yet")
                time.sleep(0.05)
        self._partitions[topic] = settings.partitions
        return True

    @staticmethod
    def _led(metadata: Any, topic: str) -> bool:
        meta = metadata.topics.get(topic)
        return (meta is not None and meta.error is None and bool(meta.partitions)
                and all(p.leader >= 0 for p in meta.partitions.values()))

    def _describe(self, topic: str) -> int | None:
        """The partition count of ``topic`` (cached), or None when it does not exist."""
        count = self._partitions.get(topic)
        if count is not None:
            return count
        with self._request(f"reading the metadata of {topic}") as admin:
            meta = admin.list_topics(topic=topic, timeout=self.timeout).topics.get(topic)
            if meta is not None and meta.error is not None:
                if meta.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    return None
                raise KafkaException(meta.error)
        if meta is None:
            return None
        self._partitions[topic] = count = len(meta.partitions)
        return count

    @contextmanager
    def _request(self, what: str) -> Iterator[AdminClient]:
        """An admin request: its failures as typed errors (librdkafka's log lines served first,
        so a connect failure among them is named in the error), then its log lines served."""
        try:
            yield self._admin
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            self._admin.poll(0)
            raise wrap(what, exc, self.bootstrap_servers) from exc
        finally:
            self._admin.poll(0)

    def delete_retention_ms(self, topic: str) -> int | None:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        with self._request(f"reading the configs of topic {topic}") as admin:
            configs = admin.describe_configs([resource], request_timeout=self.timeout)[resource].result(self.timeout)
        entry = configs.get("delete.retention.ms")
        return int(entry.value) if entry is not None and entry.value is not None else None

    def delete_topic(self, topic: str) -> None:
        with self._request(f"deleting topic {topic}") as admin:
            future = admin.delete_topics([topic], operation_timeout=self.timeout)[topic]
            try:
                future.result(timeout=self.timeout)
            except KafkaException as exc:
                if getattr(kafka_error(exc), "code", lambda: None)() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
        self._partitions.pop(topic, None)
        self._checked.pop(topic, None)

    def topics(self) -> list[str]:
        with self._request("listing topics") as admin:
            names = admin.list_topics(timeout=self.timeout).topics
        return sorted(name for name in names if not name.startswith("__"))  # not Kafka's internals

    def partitions(self, topic: str) -> int:
        count = self._describe(topic)
        if count is None:
            raise TopicConfigError(f"topic {topic} does not exist")
        return count

    def end_offsets(self, topic: str) -> dict[TopicPartition, int]:
        count = self.partitions(topic)
        meta = self._metadata_consumer()
        deadline = time.monotonic() + self.timeout
        out: dict[TopicPartition, int] = {}
        try:
            for p in range(count):
                while (topic, p) not in out:
                    try:
                        out[(topic, p)] = meta.get_watermark_offsets(KafkaTp(topic, p), self.timeout, False)[1]
                    except KafkaException as exc:
                        # NOT_LEADER_FOR_PARTITION and the like: a new topic or a leader election.
                        if kafka_error(exc).code() not in TRANSIENT or time.monotonic() > deadline:
                            raise wrap(f"reading the end offset of {topic}[{p}]", exc, self.bootstrap_servers) from exc
                        time.sleep(0.1)
        finally:
            meta.poll(0)  # serve librdkafka's log lines
        return out

    def _metadata_consumer(self) -> Consumer:
        with self._lock:
            if self._meta is None:
                self._meta = Consumer({**self.consumer_config, "group.id": f"cdc-meta-{uuid.uuid4().hex}"})
            return self._meta

    # --- writers and readers --------------------------------------------------------------------

    def writer(self) -> KafkaWriter:
        writer = KafkaWriter(self, self.producer_config)
        self._open.add(writer)
        return writer

    def reader(self, group: str | None = None) -> KafkaReader:
        config = {**self.consumer_config, "group.id": group or f"cdc-tmp-{uuid.uuid4().hex}"}
        reader = KafkaReader(Consumer(config), group, self.timeout)
        self._open.add(reader)
        return reader

    def bulk_reader(self) -> KafkaBulkReader | None:
        """A bulk load's reader (cdc.log.kafka_bulk), from the same consumer settings as ``reader``."""
        return open_bulk_reader(self.consumer_config, f"cdc-bulk-{uuid.uuid4().hex}")

    def member_reader(self, group: str) -> KafkaMemberReader:
        """A reader that joins ``group``: cooperative-sticky assignment unless ``consumer`` config
        names another, so a rebalance moves only the partitions that change owner and the others
        are read on without a pause."""
        config = {"partition.assignment.strategy": "cooperative-sticky", **self.consumer_config, "group.id": group}
        reader = KafkaMemberReader(Consumer(config), group, self.timeout)
        self._open.add(reader)
        return reader

    def group_members(self, group: str) -> int:
        with self._request(f"describing consumer group {group}") as admin:
            future = admin.describe_consumer_groups([group], request_timeout=self.timeout)[group]
            return len(future.result(self.timeout).members or ())

    def close(self) -> None:
        for handle in list(self._open):
            handle.close()
        with self._lock:
            if self._meta is not None:
                self._meta.close()
                self._meta = None


class KafkaWriter(LogWriter):
    """Publishes through one idempotent producer; acknowledgements are taken in bulk at drain
    points (see ``cdc.log.delivery``), so librdkafka reports only failures back to Python.

    Snapshot rows that come as a ``RowBlock`` go through a second producer, our own binding
    (cdc/log/block_producer.py), a block per call, where it is built and the encoder writes such
    rows as lines (the json format). It is made at the first block and closed once drained. Two
    producers keep no order between them, so the writer switches between them only when the one
    it leaves holds nothing unacknowledged: before a block goes out, every record of the
    confluent-kafka producer is acknowledged (a streamed change before a new snapshot's rows), and
    before any other record goes out, every record of the blocks is (the snapshot's rows before
    the stream's changes of the same keys: otherwise compaction could keep an older snapshot row
    over a newer change). A failed block record fails the writer like any failed record.
    """

    close_timeout = 5.0  # seconds close() waits for records in flight
    drain_wait = 1.0     # seconds per wait while switching producers (until all is acknowledged or failed)

    def __init__(self, log: KafkaLog, config: dict[str, Any], barrier_interval: float = 1.0) -> None:
        self._log = log
        self._config = config
        self._tracker: DeliveryTracker[Position] = DeliveryTracker(barrier_interval)
        self._producer: Producer | None = Producer(
            {**config, "on_delivery": self._on_failure, "delivery.report.only.error": True})
        self._produce = positional_produce(self._producer.produce)  # (topic, value, key, headers)
        self._blocks: BlockProducer | None = None  # while a snapshot's RowBlocks are in flight
        self._no_blocks = False                    # no block producer to be had with this config

    def _on_failure(self, err: KafkaError, msg: Any) -> None:
        self._tracker.failed(delivery_error(err, msg.topic(), msg.partition()))

    def publish(self, records: Iterable[Record], checkpoint: Position | None = None) -> None:
        """Produce ``records`` (any iterable; change events go through ``publish_events``)."""
        producer = self._producer
        if producer is None:
            raise DeliveryError("publish on a closed writer", retriable=False)
        self._drain_blocks()
        produce = self._produce
        try:
            for record in records:
                topic, key, value, everywhere, headers = record
                try:
                    if everywhere:
                        self._produce_everywhere(topic, value, key, headers)
                        continue
                    try:
                        produce(topic, value, key, headers)
                    except BufferError:
                        self._produce_when_room(topic, value, key, headers)
                except DeliveryError:
                    raise
                except Exception as exc:
                    # Refused: fail it, so that nothing past it is ever safe, and say so now.
                    raise self._refuse(exc, topic) from exc
        except DeliveryError:
            raise
        except Exception as exc:
            # The iterable failed (a value that cannot be encoded): the rest of the batch never
            # comes, so its checkpoint must never become safe.
            error = DeliveryError(f"a record could not be made: {type(exc).__name__}: {exc}", retriable=False)
            self._tracker.failed(error)
            raise
        self._tracker.published(checkpoint)

    def publish_events(self, encoder: EnvelopeEncoder, events: list[ChangeEvent],
                       checkpoint: Position | None = None) -> None:
        """Encode and produce in one loop: the encoder calls ``produce`` itself for each record
        (see ``EnvelopeEncoder.emit``)."""
        producer = self._producer
        if producer is None:
            raise DeliveryError("publish on a closed writer", retriable=False)
        if type(events) is RowBlock and encoder.row_blocks_as_lines:
            blocks = self._block_producer()
            if blocks is not None:
                self._publish_block(encoder, events, blocks, checkpoint)
                return
        self._drain_blocks()
        try:
            encoder.emit(events, self._produce, self._produce_when_room, self._produce_everywhere)
        except EmitError as exc:
            # Nothing past the failed record was produced, and nothing after it may become safe.
            cause = exc.cause
            if isinstance(cause, DeliveryError):  # already recorded (_produce_everywhere)
                raise cause from cause.__cause__
            raise self._refuse(cause, exc.topic or "?") from cause
        self._tracker.published(checkpoint)

    def fail(self, error: DeliveryError) -> None:
        self._tracker.failed(error)

    # --- RowBlocks through the block producer ----------------------------------------------------

    def _block_producer(self) -> BlockProducer | None:
        if self._blocks is None and not self._no_blocks:
            self._blocks = open_block_producer(self._config)
            self._no_blocks = self._blocks is None
        return self._blocks

    def _publish_block(self, encoder: EnvelopeEncoder, rows: RowBlock, blocks: BlockProducer,
                       checkpoint: Position | None) -> None:
        producer = self._producer
        while len(producer):  # the confluent-kafka producer's records first (see the class docstring)
            producer.flush(self.drain_wait)
        self._tracker.safe()  # one of them failed: raise it now, before anything past it goes out
        try:
            encoder.emit_row_block(rows, blocks.produce_rows)
        except EmitError as exc:
            cause = exc.cause
            if isinstance(cause, DeliveryError):  # refused by librdkafka
                self.fail(cause)
                raise cause from cause.__cause__
            raise self._refuse(cause, exc.topic or "?") from cause
        self._block_failures(blocks)
        self._tracker.published(checkpoint)

    def _block_failures(self, blocks: BlockProducer) -> None:
        """Record (and raise) the first block record that was not acknowledged, if one was."""
        error = blocks.error()
        if error is not None:
            self.fail(error)
            raise error

    def _drain_blocks(self) -> None:
        """Every block record acknowledged (or failed: raised) before any other record goes out;
        then the block producer is closed. librdkafka fails a record after ``message.timeout.ms``,
        so this wait ends."""
        blocks = self._blocks
        if blocks is None:
            return
        while blocks.flush(self.drain_wait):
            self._block_failures(blocks)
        self._block_failures(blocks)
        self._blocks = None
        blocks.close(0)

    def _produce_when_room(self, topic: str, value: bytes | None, key: bytes | None, headers: Headers | None = None,
                           partition: int = -1) -> None:
        """The local queue is full: serve acknowledgements until it has room (the backpressure)."""
        producer = self._producer
        while True:
            producer.poll(0.1)
            try:
                return producer.produce(topic, value, key, partition, None, None, 0, headers)
            except BufferError:
                continue

    def _produce_everywhere(self, topic: str, value: bytes | None, key: bytes, headers: Headers | None = None) -> None:
        """One copy of a record to each partition of ``topic`` (a truncate)."""
        try:
            count = self._log.partitions(topic)
        except CdcError as exc:
            error = DeliveryError(f"delivery to {topic} failed: {exc}", retriable=exc.retriable)
            self._tracker.failed(error)
            raise error from exc
        for partition in range(count):
            try:  # produce's arguments in their places, as positional_produce gives them
                self._producer.produce(topic, value, key, partition, None, None, 0, headers)
            except BufferError:
                self._produce_when_room(topic, value, key, headers, partition)

    def _refuse(self, exc: BaseException, topic: str) -> DeliveryError:
        """Record in the tracker that a record for ``topic`` could not be made or was refused by
        ``produce``; the error to raise."""
        err = kafka_error(exc)
        if err is not None:
            error = delivery_error(err, topic, None)
        else:
            error = DeliveryError(f"a record for {topic} failed: {type(exc).__name__}: {exc}; the batch is not "
                                  "published", retriable=False)
        self.fail(error)
        return error

    def poll(self) -> Position | None:
        """The safe checkpoint; a drain point when nothing is outstanding, and a forced one (a
        flush) when the stream has not paused for ``barrier_interval`` seconds."""
        producer, tracker, blocks = self._producer, self._tracker, self._blocks
        if blocks is not None:
            blocks.poll()
            self._block_failures(blocks)
        if producer is not None:
            producer.poll(0)
            if len(producer) == 0 and (blocks is None or blocks.outstanding == 0):
                tracker.drained()
            elif tracker.barrier_due():
                return self.flush()
        return tracker.safe()

    def flush(self, timeout: float = 30.0) -> Position | None:
        producer, tracker, blocks = self._producer, self._tracker, self._blocks
        left = producer.flush(timeout) if producer is not None else 0
        if blocks is not None:  # at most one of the two holds records (see the class docstring)
            left += blocks.flush(timeout)
            error = blocks.error()
            if error is not None:
                tracker.failed(error)
        if not left:
            tracker.drained()
        safe = tracker.safe()  # a failed delivery outranks the timeout
        if left:
            raise DeliveryError(f"{left} records not acknowledged within {timeout:g}s "
                                f"(broker slow or unreachable?)", retriable=True)
        return safe

    def send_now(self, timeout: float) -> None:
        """librdkafka's flush sends every partition's batch regardless of ``linger.ms`` while it
        runs; it returns once all are acknowledged, or after ``timeout`` with some in flight."""
        producer, blocks = self._producer, self._blocks
        if blocks is not None and blocks.outstanding:
            if blocks.flush(timeout) == 0 and blocks.error() is None:
                self._tracker.drained()  # the other producer holds nothing while blocks are out
        elif producer is not None and len(producer) and producer.flush(timeout) == 0:
            self._tracker.drained()

    @property
    def outstanding(self) -> int:
        blocks = self._blocks.outstanding if self._blocks is not None else 0
        return (len(self._producer) if self._producer is not None else 0) + blocks

    def close(self) -> None:
        blocks, self._blocks = self._blocks, None
        if blocks is not None:  # whatever it drops never becomes safe
            blocks.close(self.close_timeout)
        producer, self._producer, self._produce = self._producer, None, None
        if producer is None:
            return
        # Give records in flight a moment; whatever is left is dropped, and so never becomes safe.
        if producer.flush(self.close_timeout):
            producer.purge()
            producer.poll(0)
        producer.close()


def positional_produce(produce: Callable[..., None]) -> Callable[..., None]:
    """``produce(topic, value, key, headers=None)`` for confluent-kafka's ``Producer.produce``,
    whose positional arguments are (topic, value, key, partition, callback, on_delivery,
    timestamp, headers): the headers in their place, the others at their defaults (any
    partition, the producer's delivery callback, now). A keyword costs about 0.45 us a record
    there (its argument parser makes a str for every keyword it looks up), a tenth of a record's
    encoding and producing. In C where ``cdc/_speedups.c`` is built; this is the reference."""
    if _speedups is not None and USE_SPEEDUPS:
        return _speedups.produce_positionally(produce)

    def positional(topic: str, value: bytes | None, key: bytes | None, headers: Headers | None = None) -> None:
        return produce(topic, value, key, -1, None, None, 0, headers)
    return positional


def log_records(messages: list, start: int, out: list[LogRecord]) -> int:
    """Append the records of ``messages[start:]`` to ``out`` up to the first message that carries
    an error; return its index (``len(messages)`` if none). Where setup.py built it,
    ``cdc/_speedups.c`` runs this loop in C (tests/unit/test_sink_decode_batch.py compares the
    two); this Python loop is the reference."""
    if _speedups is not None and USE_SPEEDUPS and type(messages) is list:
        return _speedups.log_records(messages, start, out, LogRecord)
    append, new = out.append, tuple.__new__
    for at in range(start, len(messages)):
        msg = messages[at]
        if msg.error() is not None:
            return at
        append(new(LogRecord, (msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                               msg.timestamp()[1], msg.headers())))
    return len(messages)


USE_SPEEDUPS = True  # tests turn it off to compare the two loops
try:  # the same loop in C, built by setup.py where a compiler is found
    from cdc import _speedups
except ImportError:  # pragma: no cover - a build without a compiler
    _speedups = None


class KafkaReader(LogReader):
    def __init__(self, consumer: Consumer, group: str | None, timeout: float) -> None:
        self._consumer: Consumer | None = consumer
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
            if err.code() == KafkaError._PARTITION_EOF:
                self._eof[(msg.topic(), msg.partition())] = msg.offset()
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
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


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
