"""The log on Apache Kafka, through confluent-kafka (librdkafka): topics and their settings here,
writing in ``kafka_writer``, reading in ``kafka_reader``.

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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTp
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from cdc.errors import LogUnavailableError, PermanentError, TopicConfigError
from cdc.log.base import GroupLog, Log, TopicPartition, TopicSettings
from cdc.log.kafka_bulk import KafkaBulkReader, open_bulk_reader
from cdc.log.kafka_errors import TRANSIENT, kafka_error, wrap
from cdc.log.kafka_logs import LOGGER as LIBRDKAFKA_LOGGER
from cdc.log.kafka_logs import on_error
from cdc.log.kafka_reader import KafkaMemberReader, KafkaReader
from cdc.log.kafka_writer import KafkaWriter

__all__ = ["KafkaLog", "KafkaWriter", "KafkaReader", "KafkaMemberReader", "PRODUCER_DEFAULTS", "CONSUMER_DEFAULTS"]

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

PARTITIONS_TTL_S = 30.0  # how long a topic's partition count is taken from the cache


class NoSuchTopic(PermanentError):
    """A topic the cluster does not have (its configs asked for)."""


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
        common: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": LIBRDKAFKA_LOGGER, "error_cb": on_error}
        self.producer_config = {**common, **PRODUCER_DEFAULTS, **(producer_config or {})}
        self.consumer_config = {**common, **CONSUMER_DEFAULTS, **(consumer_config or {})}
        self._admin = AdminClient({**common, "allow.auto.create.topics": False})
        self._checked: dict[str, str] = {}      # topics known to exist, with their cleanup policy
        # partition counts, and when each was read: a topic's count only grows, and partitions added
        # by hand are seen within PARTITIONS_TTL_S (a truncate's copies ask afresh)
        self._partitions: dict[str, tuple[int, float]] = {}
        self._meta: Consumer | None = None      # for watermarks
        self._made: set[str] = set()            # topics this log created
        self._lock = threading.Lock()
        self._open: weakref.WeakSet = weakref.WeakSet()

    # --- topics ---------------------------------------------------------------------------------

    def ensure_topic(self, topic: str, settings: TopicSettings | None = None) -> None:
        settings = settings or self.defaults
        if self._checked.get(topic) == settings.cleanup_policy:
            return
        if self._describe(topic) is None and self._create(topic, settings):
            self._checked[topic] = settings.cleanup_policy
            self._made.add(topic)
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
        # The controller took it; a broker answering for configs applies it from the metadata a
        # moment later (a read at once saw the old policy, on a loaded machine): wait for it.
        deadline = time.monotonic() + self.timeout
        while self.cleanup_policy(topic) != (policy, retention_ms) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _configs(self, topic: str) -> dict:
        """The topic's configs. A topic someone else just made may be in the metadata before the
        broker answering for configs knows it (UNKNOWN_TOPIC_OR_PART): asked again while the
        metadata has it; a topic not there either is ``NoSuchTopic``."""
        resource = ConfigResource(ResourceType.TOPIC, topic)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with self._request(f"reading the configs of topic {topic}") as admin:
                    future = admin.describe_configs([resource], request_timeout=self.timeout)[resource]
                    return future.result(self.timeout)
            except PermanentError as exc:
                cause = kafka_error(exc.__cause__) if exc.__cause__ is not None else None
                if cause is None or cause.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
                if not self._in_metadata(topic):
                    raise NoSuchTopic(f"{exc}: the cluster has no topic {topic}") from exc
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def _in_metadata(self, topic: str) -> bool:
        # All topics: a request naming the topic could have a broker create it.
        with self._request("listing topics") as admin:
            found = admin.list_topics(timeout=self.timeout).topics.get(topic)
        return found is not None and found.error is None

    def _create(self, topic: str, settings: TopicSettings) -> bool:
        """Create ``topic`` with the settings' policy; False when someone else created it meanwhile."""
        if settings.cleanup_policy == "compact":
            config = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(settings.min_compaction_lag_ms),
                      "delete.retention.ms": str(settings.delete_retention_ms), **settings.extra}
        else:
            retention = -1 if settings.retention_ms is None else settings.retention_ms
            config = {"cleanup.policy": settings.cleanup_policy, "retention.ms": str(retention), **settings.extra}
        if settings.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(settings.min_insync_replicas)
        # -1: the cluster's default.replication.factor
        new = NewTopic(topic, settings.partitions, settings.replication_factor or -1, config=config)
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
        self._partitions[topic] = (settings.partitions, time.monotonic())
        return True

    @staticmethod
    def _led(metadata: Any, topic: str) -> bool:
        meta = metadata.topics.get(topic)
        return (meta is not None and meta.error is None and bool(meta.partitions)
                and all(p.leader >= 0 for p in meta.partitions.values()))

    def _describe(self, topic: str, fresh: bool = False) -> int | None:
        """The partition count of ``topic`` (cached for PARTITIONS_TTL_S unless ``fresh``), or None
        when it does not exist."""
        cached = self._partitions.get(topic)
        if cached is not None and not fresh and time.monotonic() - cached[1] < PARTITIONS_TTL_S:
            return cached[0]
        with self._request(f"reading the metadata of {topic}") as admin:
            meta = admin.list_topics(topic=topic, timeout=self.timeout).topics.get(topic)
            if meta is not None and meta.error is not None:
                if meta.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    return None
                raise KafkaException(meta.error)
        if meta is None:
            return None
        count = len(meta.partitions)
        self._partitions[topic] = (count, time.monotonic())
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
        """None for a topic not made yet (a sink may start before its source): the log does not say."""
        try:
            configs = self._configs(topic)
        except NoSuchTopic:
            return None
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

    def replication_warnings(self, prefix: str) -> list[str]:
        """What puts records at risk on a cluster of several brokers: the config's
        ``replication_factor: 1``, and topics of ``prefix`` with one replica (one broker's loss
        loses their records). Nothing on a single broker."""
        with self._request("reading the cluster's metadata") as admin:
            metadata = admin.list_topics(timeout=self.timeout)
        brokers = len(metadata.brokers)
        if brokers < 2:
            return []
        warnings = []
        if self.defaults.replication_factor == 1:
            warnings.append(f"log.kafka.replication_factor is 1 on a cluster of {brokers} brokers: each topic "
                            f"created lives on one broker; leave it unset (the cluster's "
                            f"default.replication.factor) or set 3")
        single = sorted(name for name, topic in metadata.topics.items()
                        if name.startswith(prefix + ".") and topic.partitions
                        and min(len(p.replicas) for p in topic.partitions.values()) == 1)
        if single:
            shown = ", ".join(single[:5]) + (f" and {len(single) - 5} more" if len(single) > 5 else "")
            warnings.append(f"{len(single)} topic(s) have one replica on a cluster of {brokers} brokers, so losing "
                            f"that broker loses their records: {shown} (add replicas with "
                            f"kafka-reassign-partitions)")
        return warnings

    def partitions(self, topic: str, fresh: bool = False) -> int:
        """``topic``'s partition count; ``fresh``: read from the cluster now, not from the cache."""
        count = self._describe(topic, fresh)
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
                        # UNKNOWN_TOPIC_OR_PART for a topic this log made or the metadata lists: a
                        # broker of a cluster that has not applied the topic's creation yet (a
                        # source's first read; the broker listing topics may not know it either).
                        err = kafka_error(exc)
                        settling = (err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                                    and (topic in self._made or self._in_metadata(topic)))
                        if (err is None or (err.code() not in TRANSIENT and not settling)
                                or time.monotonic() > deadline):
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
