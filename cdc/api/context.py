"""What the runtime hands a sink: ``SinkContext``, a protocol the runtime implements
(cdc/runtime/contexts.py), and the services on it.

A sink is built from its config alone; the runtime then calls ``sink.attach(context)`` before
``start``. Everything a sink needs from the framework at run time comes through the context:
the shapes of its topics, dead letters, stats, the log client, and, for a sink that reads the
log with its own machinery (a ``SelfDrivenSink``), a way to open a Kafka log, to read the schema
topic, to make its dead-letter topic, to look up Avro writer schemas and the Spark jars.

A sink built alone (tests, tools) has ``standalone_sink_context(name)``: no log, no shapes, no
dead-letter writer, and the services refuse by name; for the real services outside the daemon a
tool builds the runtime's context (``cdc.runtime.contexts.sink_context``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from cdc.api.stats import ConnectorStats
from cdc.errors import PermanentError
from cdc.topics import dead_letter_topic

# (topic, partition, offset, reason, key, value): set one record aside on the dead-letter topic,
# durably, with why. key and value are the record's bytes as read (None: unknown or a tombstone).
DeadLetterWriter = Callable[[str, int, int, str, "bytes | None", "bytes | None"], None]

TopicPartition = tuple[str, int]


class ConnectorLogger(logging.LoggerAdapter):
    """A logger whose records carry ``connector`` (and the current ``phase``) for the log format."""

    def __init__(self, logger: logging.Logger, connector: str, stats: ConnectorStats | None = None) -> None:
        super().__init__(logger, {"connector": connector})
        self._stats = stats

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = {"connector": self.extra["connector"]} if self.extra is not None else {}
        if self._stats is not None:
            extra["phase"] = self._stats.phase
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return msg, kwargs


class LogReader(Protocol):
    """The part of a log reader a plugin uses: a consumer group's committed offsets."""

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]: ...

    def close(self) -> None: ...


class LogClient(Protocol):
    """The part of the framework's log client (Kafka or embedded) a plugin may use. Thread-safe."""

    def topics(self) -> list[str]: ...

    def end_offsets(self, topic: str) -> dict[TopicPartition, int]: ...

    def reader(self, group: str | None = None) -> LogReader: ...

    def delete_retention_ms(self, topic: str) -> int | None: ...

    def close(self) -> None: ...


class CheckpointFeed(Protocol):
    """The sources' stored checkpoints as they move: ``poll()`` answers ``{source name: version}``
    for each source whose stored checkpoint rose since the last poll (a transaction boundary
    every event before which the log had acknowledged when it was stored). One thread; close it."""

    def poll(self, timeout: float = 0.05) -> dict[str, int]: ...

    def close(self) -> None: ...


class SchemaLookup(Protocol):
    """The shapes of a deployment's topics, read from its schema topic (see
    ``SinkContext.schema_for``); ``refresh`` reads what the schema topic gained. One thread."""

    def schema_for(self, topic: str, version: int | None = None) -> dict | None: ...

    def shapes_between(self, topic: str, after: int, before: int) -> list[dict]: ...

    def refresh(self) -> None: ...


@dataclass(frozen=True)
class NativeCodecs:
    """Compiled helpers the runtime has (cdc/_copytext.c, cdc/_window.c), for sinks that take rows
    as JSON bytes (``Sink.raw_rows``); each None where they were not built (no compiler), and in a
    standalone context: a sink then takes its Python path.

    ``copy_rows(pairs, names, kinds, nested_text, decoded)``: the COPY text lines of (key JSON,
    event) pairs whose rows are JSON bytes (sinks/sql/copy_rows.py says the format);
    ``unknown_names(rows, known, loads)``: the member names of JSON rows outside ``known``;
    ``columns_first(text)``: ``copy_rows``' lines with the key dropped and the version last."""

    copy_rows: Callable[..., bytes] | None = None
    unknown_names: Callable[..., set] | None = None
    columns_first: Callable[[bytes], bytes] | None = None


class SinkContext(Protocol):
    """What the runtime gives a sink besides its config: handed in by ``Sink.attach`` before
    ``start``. Every method may be called from the sink's thread (the one calling ``write``);
    ``stats`` is read by the runtime's reporting from that same thread.

    ``schema_for(topic, version=None)`` is the schema record of the shape that rows name in
    ``source.schema_version`` (``version``; None: the newest shape of the topic), a dict::

        {"source": ..., "db": ..., "schema": ... or None, "table": ..., "version": ...,
         "ts_ms": ..., "ddl": ..., "columns": [{"name": ..., "type": <the source's type>,
                                                "key": bool, "nullable": bool}, ...]}

    or None when the source publishes none (then, and only then, a sink infers column types from
    the values). A version the schema topic does not hold yet raises ``ShapeNotYetPublished``, a
    ``RetriableError`` (the source publishes a shape before its rows; the same batch comes
    again); a sink asks through ``Sink.shape_of(event)``, which bounds that wait. The runtime hands
    ``write`` batches in which each topic has one shape, so a sink changes a table between
    writes, before the first row of a new shape (docs/architecture.md, "Schema changes"). It may
    read the log: call it when a topic's shape matters (once per write and topic), not per event.

    ``shapes_between(topic, after, before)`` lists the topic's schema records with ``after <
    version < before``, oldest first: the shapes a table following shape ``after`` skips when the
    rows it gets next name ``before``. A sink that follows renames chains theirs (``earlier_names``,
    ``renames_to_follow``), since a column's ``renamed_from`` names it in the shape just before
    (rows of the shape between may all be in another partition, read later).

    ``delete_retention_ms(topic)`` is the topic's ``delete.retention.ms`` (how long a tombstone
    stays readable after compaction), or None when the log does not say: a sink that remembers
    deletes may forget them after that long. ``dead_letter(...)`` sets a record aside (see
    ``DeadLetterWriter``) on ``dead_letter_topic``; the runtime already does that for events that
    fail alone, so a sink calls it only for records it decides to skip itself. ``log`` is the
    framework's log client when the runtime drives the sink (None for a ``SelfDrivenSink``, which
    reads the topics itself: ``log_config`` is the config file's ``log`` section to find them).

    ``topics_matching(globs)`` lists the log's table topics that match ``globs`` (the framework's
    own topics left out), as the runtime consumes them. ``checkpoint_feed()`` opens a
    ``CheckpointFeed`` over the sources' stored checkpoints (None without a log). With the end
    offsets of the sink's topics read after it, that tells when everything of a source up to that
    version is applied (sinks/redis/applied.py).

    ``delete_read(topic, partition, offset)``, for a tombstone without a version (written before
    records had headers; one with a version is its delete, cdc/sink_event.py), says whether this
    sink read the delete of the tombstone at ``offset`` (the record at ``offset - 1``, a delete of
    the same key: the capture emits the two consecutively) in the same pass of reading or in the
    earlier one whose commit this pass resumed from. Then the delete is (or is being) written
    with its own version, and a sink must NOT resolve the tombstone against its store: anything
    live there for the key comes from a later record (a replay after a crash between a write and
    its commit, batches cut differently), which the tombstone would delete for good. False: the
    delete was never read (compacted away, set aside as poison), and the sink deletes the key if
    it still holds it. Without a runtime it answers False (resolve, as before).

    ``native``: the compiled helpers (``NativeCodecs``).

    For a sink that reads the log with its own machinery (any thread, thread-safe):
    ``open_kafka_log(bootstrap_servers, producer_config=, consumer_config=)`` a ``LogClient`` on
    those brokers (close it); ``schema_book(log, prefix)`` a ``SchemaLookup`` over that log's
    schema topic, as the runtime reads it; ``ensure_dead_letter_topic(log, topic,
    retention_hours)`` makes a dead-letter topic (not compacted: every letter kept for
    ``retention_hours``; None: for ever) or brings an existing one to that, letters keyed by
    ``{"topic", "partition", "offset"}`` of their record; ``avro_writer_schema(registry_url,
    schema_id)`` the writer schema of an ``avro`` record (Confluent's framing: byte 0, then the id)
    as (its Avro JSON text without logical types, the Connect schema it stands for), cached per
    process, ``SchemaRegistryError`` if the registry lacks the id or cannot be reached
    (retriable then); ``spark_jars()`` the Kafka source, Delta and spark-avro jars a local Spark
    session needs, resolved into the cache once.
    """

    # Read-only for a sink: properties, so a frozen dataclass (StandaloneSinkContext) is one too.
    @property
    def name(self) -> str: ...
    @property
    def topic_prefix(self) -> str: ...
    @property
    def stats(self) -> ConnectorStats: ...
    @property
    def logger(self) -> ConnectorLogger: ...
    @property
    def dead_letter_topic(self) -> str: ...
    @property
    def log(self) -> LogClient | None: ...
    @property
    def log_config(self) -> Any: ...
    @property
    def native(self) -> NativeCodecs: ...

    def schema_for(self, topic: str, version: int | None = None) -> dict | None: ...

    def shapes_between(self, topic: str, after: int, before: int) -> list[dict]: ...

    def delete_retention_ms(self, topic: str) -> int | None: ...

    def dead_letter(self, topic: str, partition: int, offset: int, reason: str,
                    key: bytes | None = None, value: bytes | None = None) -> None: ...

    def delete_read(self, topic: str, partition: int, offset: int) -> bool: ...

    def topics_matching(self, globs: Iterable[str]) -> list[str]: ...

    def checkpoint_feed(self) -> CheckpointFeed | None: ...

    def open_kafka_log(self, bootstrap_servers: str, *, producer_config: dict | None = None,
                       consumer_config: dict | None = None) -> LogClient: ...

    def schema_book(self, log: LogClient, prefix: str) -> SchemaLookup: ...

    def ensure_dead_letter_topic(self, log: LogClient, topic: str, retention_hours: float | None) -> None: ...

    def avro_writer_schema(self, registry_url: str, schema_id: int) -> tuple[str, dict]: ...

    def spark_jars(self) -> list[str]: ...


def _outside_runtime(name: str, what: str) -> PermanentError:
    return PermanentError(f"sink {name}: {what} needs the runtime's context (a sink built alone has none; "
                          f"tools build one with cdc.runtime.contexts.sink_context)")


@dataclass(frozen=True)
class StandaloneSinkContext:
    """A ``SinkContext`` with no runtime behind it: what a sink built alone has until ``attach``."""

    name: str
    topic_prefix: str = "cdc"
    stats: ConnectorStats = None  # type: ignore[assignment]  # set from the name
    logger: ConnectorLogger = None  # type: ignore[assignment]  # set from the name
    dead_letter_topic: str = ""
    log: LogClient | None = None
    log_config: Any = None
    native: NativeCodecs = NativeCodecs()

    def __post_init__(self) -> None:
        if self.stats is None:
            object.__setattr__(self, "stats", ConnectorStats(self.name, "sink"))
        if not self.dead_letter_topic:
            object.__setattr__(self, "dead_letter_topic", dead_letter_topic(self.topic_prefix, self.name))
        if self.logger is None:
            object.__setattr__(self, "logger", ConnectorLogger(logging.getLogger(f"cdc.sink.{self.name}"),
                                                               self.name, self.stats))

    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        return None

    def shapes_between(self, topic: str, after: int, before: int) -> list[dict]:
        return []

    def delete_retention_ms(self, topic: str) -> int | None:
        return None

    def dead_letter(self, topic: str, partition: int, offset: int, reason: str,
                    key: bytes | None = None, value: bytes | None = None) -> None:
        raise PermanentError(f"sink {self.name}: no dead-letter writer outside the runtime; the record at "
                             f"{topic}[{partition}]@{offset} fails: {reason}")

    def delete_read(self, topic: str, partition: int, offset: int) -> bool:
        return False

    def topics_matching(self, globs: Iterable[str]) -> list[str]:
        return []

    def checkpoint_feed(self) -> CheckpointFeed | None:
        return None

    def open_kafka_log(self, bootstrap_servers: str, *, producer_config: dict | None = None,
                       consumer_config: dict | None = None) -> LogClient:
        raise _outside_runtime(self.name, "opening a Kafka log")

    def schema_book(self, log: LogClient, prefix: str) -> SchemaLookup:
        raise _outside_runtime(self.name, "reading the schema topic")

    def ensure_dead_letter_topic(self, log: LogClient, topic: str, retention_hours: float | None) -> None:
        raise _outside_runtime(self.name, "making a dead-letter topic")

    def avro_writer_schema(self, registry_url: str, schema_id: int) -> tuple[str, dict]:
        raise _outside_runtime(self.name, "reading the schema registry")

    def spark_jars(self) -> list[str]:
        raise _outside_runtime(self.name, "resolving the Spark jars")


def standalone_sink_context(name: str, topic_prefix: str = "cdc") -> StandaloneSinkContext:
    """A context with only a name: a usable one for a sink built alone (tests, tools)."""
    return StandaloneSinkContext(name, topic_prefix)
