"""The interface of the log, shared by Kafka and the embedded log.

Semantics both implementations keep:

* A topic has N partitions; a record goes to the partition chosen by the hash of its key (the
  same key always lands in the same partition, so per-key order holds), or to every partition
  when ``Record.to_all_partitions`` (truncates).
* Topics are log-compacted: eventually only the latest record per key remains, and a tombstone
  (null value) is removed once it is older than ``delete_retention_ms``. Offsets never change.
* Consumer groups store, per (topic, partition), the next offset to read.
* A record carries headers (cdc/headers.py: ``Record.headers`` in, ``LogRecord.headers`` out, in
  the order written); a record written without any (or before the log kept them) reads with None.
* Group membership (the log hands a group's partitions out among the readers that subscribe to
  it, and moves them on rebalance) is a capability: a log that has it is a ``GroupLog``. Kafka
  has it; the embedded log (one machine, one process per group) does not.

Threading: a Log may be shared between threads; a LogWriter and a LogReader are each used by one
thread at a time.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from cdc.errors import DeliveryError, LogUnavailableError
from cdc.events import ChangeEvent
from cdc.headers import Headers
from cdc.positions import Position
from cdc.serde import EmitError, EnvelopeEncoder, Record


@dataclass(frozen=True, slots=True)
class TopicSettings:
    partitions: int = 1
    replication_factor: int | None = None    # None: the cluster's default.replication.factor
    min_insync_replicas: int | None = None   # None: the cluster's min.insync.replicas
    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = 86_400_000  # a day: how long a tombstone outlives the key
    extra: dict[str, str] = field(default_factory=dict)  # more Kafka topic configs (segment.ms ...)
    # "compact" for every table's topic; "delete" for a topic that keeps every record until it is
    # older than ``retention_ms`` (None: for ever), such as a sink's dead letters.
    cleanup_policy: str = "compact"
    retention_ms: int | None = None


def internal_settings(log: object, **settings: Any) -> TopicSettings:
    """Settings for a topic the framework keeps for itself (offsets, dead letters, shares): the
    replication of the log's table topics, the rest from ``settings``."""
    defaults = getattr(log, "defaults", None) or TopicSettings()
    return TopicSettings(replication_factor=defaults.replication_factor,
                         min_insync_replicas=defaults.min_insync_replicas, **settings)


class LogRecord(NamedTuple):
    """A record read back from the log. A tuple: readers make one per record (a frozen dataclass
    cost about 1.5 µs each on a sink's hot path, a tuple a tenth of that)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers | None = None  # cdc/headers.py: [(name, value bytes or None)], None for none


TopicPartition = tuple[str, int]


class LogWriter(ABC):
    """Publishes records and reports which checkpoint is safe.

    ``publish`` hands records (any iterable, counted as it is consumed) to the log and returns
    without waiting; ``poll``/``flush`` serve
    acknowledgements and return the newest checkpoint whose records, and all before them, the log
    has acknowledged (``None`` until there is one). A delivery that failed raises
    ``DeliveryError`` from ``poll``/``flush``; no checkpoint past it is ever returned.
    """

    @abstractmethod
    def publish(self, records: Iterable[Record], checkpoint: Position | None = None) -> None: ...

    def publish_events(self, encoder: EnvelopeEncoder, events: list[ChangeEvent],
                       checkpoint: Position | None = None) -> None:
        """``publish`` the records of ``events`` as ``encoder`` makes them. A writer with a faster
        way (producing each record as it is encoded) overrides this."""
        try:
            records = encoder.encode(events)
        except EmitError as exc:
            error = DeliveryError(f"{exc}: nothing of this batch was published", retriable=False)
            self.fail(error)
            raise error from exc.cause
        self.publish(records, checkpoint)

    @abstractmethod
    def fail(self, error: DeliveryError) -> None:
        """Record that a batch failed: no checkpoint is safe from now on (``poll``/``flush`` raise)."""

    @abstractmethod
    def poll(self) -> Position | None: ...

    @abstractmethod
    def flush(self, timeout: float = 30.0) -> Position | None:
        """Wait until every published record is acknowledged (or ``timeout``; then raise DeliveryError)."""

    def send_now(self, timeout: float) -> None:  # noqa: B027 (optional: a writer that batches nothing needs none)
        """The publisher has nothing more for now: send what waits to be batched with later
        records at once, and serve acknowledgements for up to ``timeout`` seconds. Unlike
        ``flush`` it never raises for records still unacknowledged after that. A writer that
        holds nothing back (each publish written before it returns) needs nothing here."""

    @property
    @abstractmethod
    def outstanding(self) -> int:
        """Records published and not yet acknowledged."""

    @property
    def holding(self) -> bool:
        """A drain point is due and not reached: publish nothing more until ``poll`` reaches it
        (else a stream that never pauses might never get one, and its checkpoint never move)."""
        return False

    @abstractmethod
    def close(self) -> None: ...


class LogReader(ABC):
    """Reads assigned partitions in offset order, as a member of ``group`` (for committed offsets)."""

    @abstractmethod
    def assign(self, start: dict[TopicPartition, int]) -> None:
        """Read these partitions from these offsets (0 = the beginning)."""

    @abstractmethod
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]: ...

    @abstractmethod
    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``poll`` will return from ``tp`` (past compacted gaps)."""

    @abstractmethod
    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Store, for the group, the next offset to read per partition (durably, synchronously)."""

    @abstractmethod
    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]: ...

    @abstractmethod
    def close(self) -> None: ...


class GroupListener(Protocol):
    """Told, on the member's reading thread (inside ``poll`` or ``close``), which partitions it
    gained or gives up. ``revoked`` returns only when the member is done with them: what it
    commits there is the last word on them from this member. ``lost``: the partitions are
    someone else's already (the member was thrown out of the group), so a commit would be
    refused and nothing can be handed over."""

    def assigned(self, partitions: list[TopicPartition]) -> None: ...

    def revoked(self, partitions: list[TopicPartition], lost: bool) -> None: ...


class GroupReader(LogReader):
    """A reader that is a member of its group: the log assigns it partitions of the topics it
    subscribes to, each from the group's committed offset (the start when none)."""

    @abstractmethod
    def subscribe(self, topics: list[str], listener: GroupListener) -> None:
        """Read these topics as one member of the group (called again: the new list replaces the
        old, and the group rebalances)."""


class GroupLog(ABC):
    """The capability of sharing a group's partitions among several processes."""

    @abstractmethod
    def member_reader(self, group: str) -> GroupReader: ...

    @abstractmethod
    def group_members(self, group: str) -> int:
        """How many readers are members of ``group`` now."""


class Log(ABC):
    @abstractmethod
    def ensure_topic(self, topic: str, settings: TopicSettings | None = None) -> None:
        """Create ``topic`` with the settings' cleanup policy (compacted unless they say
        otherwise) if it is missing. An existing topic of another policy raises
        ``TopicConfigError`` naming the topic and its cleanup policy."""

    @abstractmethod
    def cleanup_policy(self, topic: str) -> tuple[str, int | None] | None:
        """``(cleanup.policy, retention.ms)`` of ``topic`` (None for a retention without end),
        or None when the topic does not exist."""

    @abstractmethod
    def set_cleanup_policy(self, topic: str, policy: str, retention_ms: int | None) -> None:
        """Change an existing topic's cleanup policy and retention (None: keep records for
        ever). From ``compact`` to ``delete`` nothing is lost at once; records older than the
        retention go at the log's next cleaning."""

    @abstractmethod
    def delete_topic(self, topic: str) -> None:
        """Delete ``topic``, its records and its groups' offsets (no error if it does not exist)."""

    @abstractmethod
    def topics(self) -> list[str]: ...

    @abstractmethod
    def partitions(self, topic: str, fresh: bool = False) -> int:
        """``topic``'s partition count (TopicConfigError if it does not exist); ``fresh``: not from
        a cache the log keeps (a truncate goes to every partition, added ones too)."""

    @abstractmethod
    def end_offsets(self, topic: str) -> dict[TopicPartition, int]:
        """Per partition, the offset the next record will get (the high-water mark);
        ``TopicConfigError`` when the topic does not exist."""

    @abstractmethod
    def writer(self) -> LogWriter: ...

    @abstractmethod
    def reader(self, group: str | None = None) -> LogReader: ...

    @abstractmethod
    def close(self) -> None: ...

    def delete_retention_ms(self, topic: str) -> int | None:
        """How long ``topic`` keeps a tombstone (None: unknown)."""
        return None

    def bulk_reader(self):
        """A reader for bulk loads that hands out batches packed in one bytes object
        (cdc.log.kafka_bulk), or None: the log has none, and bulk loads read through ``reader``."""
        return None

    def compact(self, topic: str) -> None:  # noqa: B027 (optional: Kafka's broker compacts on its own)
        """Ask for compaction now. The embedded log runs it; Kafka's broker cleans on its own."""

    def read_all(self, topic: str, timeout: float = 30.0,
                 start: dict[TopicPartition, int] | None = None,
                 ends: dict[TopicPartition, int] | None = None) -> list[LogRecord]:
        """Every record of ``topic`` up to its current end (or ``ends``), in (partition, offset)
        order; from ``start`` per partition when given (a reader that keeps up with a topic)."""
        ends = self.end_offsets(topic) if ends is None else ends
        start = start or {}
        reader = self.reader()
        try:
            reader.assign({tp: min(start.get(tp, 0), end) for tp, end in ends.items()})
            out: list[LogRecord] = []
            deadline = time.monotonic() + timeout
            while any(reader.position(tp) < end for tp, end in ends.items()):
                if time.monotonic() > deadline:
                    raise LogUnavailableError(f"reading {topic} to its end took over {timeout:.0f}s")
                for record in reader.poll(10_000, 0.2):
                    if record.offset < ends[(record.topic, record.partition)]:
                        out.append(record)
            out.sort(key=lambda r: (r.partition, r.offset))
            return out
        finally:
            reader.close()
