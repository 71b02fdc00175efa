"""The plugin API: Source and Sink, each with a pydantic config model.

Plugins are found through entry points: ``cdc.sources`` and ``cdc.sinks`` map a ``type`` name to a
class. A plugin is built from its config and its saved position alone; nothing else is hidden in
its constructor.

Source lifecycle (all calls on one thread unless said otherwise)::

    source = SourceClass(config, position)   # position: the last one the runtime stored, or None
    source.start()                           # connect, check prerequisites, plan the snapshot
    while running:
        batch = source.poll(timeout)         # the next Batch, or None if nothing came in time
        ...publish batch.events to the log...
        source.commit(safe_position)         # everything up to it is durably in the log
    source.stop()                            # may be called from another thread to interrupt poll

``commit`` is the only place a source may advance the server (the PostgreSQL slot's flush LSN,
a MySQL purge horizon). The runtime calls it with positions that came from ``Batch.checkpoint``,
in order, and only after the log acknowledged every event before them and the offset store saved
the position. Resume follows the "after" rule: a source built with position P emits nothing that
was at or before P, and everything after it.

Sink lifecycle (Kafka Connect's put/flush/preCommit folded into one call: ``write`` returns only
once the batch is durable, and the runtime commits the consumer offsets right after)::

    sink = SinkClass(config)          # or SinkClass(config, generation): write into that generation
    sink.attach(context)              # the runtime's services, see SinkContext; before start()
    sink.start()                      # connect, create what is missing
    sink.write(events)                # durable when it returns; idempotent (events carry versions)
    sink.stop()                       # release connections; called once, after the last write

Threading: ``start``, ``write``, the generation methods and ``stop`` are called from one thread,
one at a time; a sink needs no locks of its own for them. Only a ``SelfDrivenSink``'s ``stop``
may come from another thread (to end ``run``).

Capabilities beyond ``write`` are declared by subclassing, and the runtime asks with
``isinstance``:

* ``RebuildableSink`` (a Protocol): the store has generations, so ``cdc rebuild`` and the ``rebuild`` schema
  policy can fill a new one from offset 0 while readers keep seeing the current one.
* ``BulkLoadableSink`` (a Protocol): a rebuild's first window, reduced to the newest version per
  key in memory (``cdc.bulk_window``), goes into the new generation in bulk (``bulk_load``).
* ``PipelinedSink`` (a Protocol): ``submit`` hands a batch's requests to the store and returns
  at once with a ``WriteCompletion``; the runtime keeps up to ``writes_in_flight`` of them (2-3)
  so the store always has work queued, and commits each batch's offsets, in batch order, only
  once its own completion succeeded (the rules are in its docstring).
* ``SelfDrivenSink``: the sink consumes the topics with its own machinery (Spark Structured
  Streaming keeps its offsets in its checkpoint); the runtime calls ``run`` instead of ``write``.

The plugin boundary: a plugin imports ``cdc.api`` and nothing else of the framework (a unit
test, tests/unit/test_plugin_boundary.py, checks the bundled sinks). What a plugin needs is
here or on the ``SinkContext`` it is handed:

* events: ``SinkEvent`` (the semantics are in its docstring), ``Op``;
* errors: ``CdcError``, ``RetriableError``, ``PermanentError``, ``ConfigError``,
  ``SchemaChangeError``, ``RebuildRequired``, ``ShapeMissingError`` (and ``ShapeNotYetPublished``,
  see ``Sink.shape_of``). ``err.retriable`` tells the runtime whether to back
  off and try again or to stop the connector with the message. In ``write`` a ``RetriableError``
  retries the same batch; any other error splits the batch to find the poison event; a
  ``SchemaChangeError`` is never poison (the table needs a decision), and ``RebuildRequired``
  starts a rebuild of a ``RebuildableSink``;
* database errors: ``servers`` (the package cdc/servers): ``servers.postgres`` (SQLSTATE) and
  ``servers.mysql`` (errno) classify a driver error by its code into the error tree, with a message
  that names the setting or grant to change: ``servers.postgres.wrap(err, what,
  setting=servers.setting_of("sink", name, "url"))``; ``servers.postgres.connect`` opens a
  connection and classifies its failure (checking the DSN first and asking libpq whether the
  server answers, since a failed connect has no SQLSTATE). The sources and the SQL sink classify
  through them, so a code means the same in every plugin;
* the context: stats counters, a logger that names the connector, the topic prefix, the schema
  of a topic, the topics' ``delete.retention.ms``, the dead-letter topic and writer, the log, the
  data topics matching the sink's globs, and the sources' stored checkpoints
  (``checkpoint_feed``: for a sink that tells readers how far each source is applied), and
  whether the runtime read a tombstone's delete (``delete_read``, for a tombstone without a
  version: a sink drops such a tombstone instead of resolving it against its store);
* for sinks that talk to Kafka or the log themselves: ``Log``, ``TopicSettings``,
  ``open_kafka_log``, ``schema_changes_topic``, ``SchemaBook`` (a topic's shapes read from the
  schema topic, as the runtime reads them), ``ConnectorStats``; for a launcher that runs a
  self-driven sink outside the daemon (spark-submit): ``load_sink_settings``, and
  ``stop_on_signals`` (SIGTERM/SIGINT as a stop request, safely: see its module); for a sink running
  Spark locally: ``spark_jars``; for a sink decoding ``avro`` records itself: ``avro_writer_schema``;
* for a sink that follows renames: ``earlier_names`` and ``renames_to_follow`` (cdc/renames.py:
  the renames of the shapes a table skips, chained);
* for a sink that reads Kafka itself: ``VERSION_HEADER``, the record header that carries each
  record's version (a tombstone's: its delete's; cdc/headers.py).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Iterable, Literal, Protocol, runtime_checkable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

import cdc.servers.mysql
import cdc.servers.postgres
from cdc import servers
from cdc.errors import (CdcError, ConfigError, PermanentError, RebuildRequired, RetriableError,
                        SchemaChangeError, ShapeMissingError, ShapeNotYetPublished)
from cdc.events import Batch, Op
from cdc.headers import VERSION as VERSION_HEADER
from cdc.log.base import Log, TopicSettings
from cdc.offsets import CheckpointFeed
from cdc.positions import Position
from cdc.renames import earlier_names, renames_to_follow
from cdc.runtime.schemas import SchemaBook
from cdc.runtime.stats import ConnectorStats
from cdc.runtime.stop_signals import stop_on_signals
from cdc.serde import schema_changes_topic
from cdc.sink_events import SinkEvent
from cdc.topics import INTERNAL_TOPICS_LOOKAHEAD, dead_letter_topic, internal_topic, table_topics
from cdc.units import human_bytes

try:  # for sinks that take rows as JSON bytes (Sink.raw_rows): their COPY text made in C
    from cdc._speedups import copy_rows as raw_copy_rows, unknown_names as raw_unknown_names
except ImportError:  # pragma: no cover - no compiler: the runtime decodes every row, none are raw
    raw_copy_rows = raw_unknown_names = None
from cdc.bulk_window import WindowPart
try:  # raw_copy_rows' lines with the key dropped and the version last (a bulk load's plain COPY)
    from cdc._window import columns_first as raw_columns_first
except ImportError:  # pragma: no cover - no compiler: no bulk loads either (cdc.bulk_window.AVAILABLE)
    raw_columns_first = None

__all__ = [
    "SnapshotMode", "PluginConfig", "RetryFailed", "SourceConfig", "SinkConfig", "ConfigPath", "resolve_config_path", "template_fields", "Source", "Sink", "RebuildableSink",
    "SelfDrivenSink", "DescribedSink", "SinkContext", "DeadLetterWriter", "ConnectorLogger",
    "SinkEvent", "Op", "Batch", "Position", "CheckpointFeed", "internal_topic", "INTERNAL_TOPICS_LOOKAHEAD",
    "VERSION_HEADER",
    "dead_letter_topic", "ensure_dead_letter_topic",
    "CdcError", "ConfigError", "PermanentError", "RebuildRequired", "RetriableError", "SchemaChangeError",
    "ShapeMissingError", "ShapeNotYetPublished",
    "servers",
    "Log", "TopicSettings", "ConnectorStats", "schema_changes_topic", "SchemaBook", "open_kafka_log",
    "earlier_names", "renames_to_follow",
    "load_sink_settings", "stop_on_signals", "spark_jars", "human_bytes", "raw_copy_rows", "raw_unknown_names", "avro_writer_schema",
    "BulkLoadableSink", "WindowPart", "raw_columns_first", "PipelinedSink", "WriteCompletion", "MaintainedSink",
]


def template_fields(template: str, allowed: Iterable[str]) -> list[str]:
    """The placeholders of a name template (``"{schema}.{table}"``) in order, for a config
    validator; ``ValueError`` if it does not parse, or names one outside ``allowed``."""
    import string

    allowed = list(allowed)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"not a valid template: {err}") from None
    fields = [name for _, name, _, _ in parsed if name is not None]
    unknown = set(fields) - set(allowed)
    if unknown or "" in fields:
        raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; use "
                         + ", ".join(f"{{{name}}}" for name in allowed))
    return fields


def resolve_config_path(path: Path, info: ValidationInfo) -> Path:
    """A relative path in a config file is relative to that file's directory, never to the
    directory the daemon happens to be started from. The loader passes the directory as
    ``context={"base_dir": ...}``; without one (a config built in code) the path stays as written."""
    path = Path(path).expanduser()
    base_dir = (info.context or {}).get("base_dir")
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    return path.resolve() if path.is_absolute() else path


# The type of every local path field of a config model (plugins' too): resolved as above.
ConfigPath = Annotated[Path, AfterValidator(resolve_config_path)]


class SnapshotMode(StrEnum):
    INITIAL = "initial"            # snapshot when there is no stored position, then stream
    INITIAL_ONLY = "initial_only"  # snapshot, then stop
    NEVER = "never"                # stream from the current log position, no snapshot
    ALWAYS = "always"              # snapshot at every start, then stream
    WHEN_NEEDED = "when_needed"    # snapshot when there is no usable position (none, or purged)


class RetryFailed(BaseModel):
    """How the daemon starts a connector again after a permanent error (one that no retry of the
    same call helps, but that can heal outside: a grant given, a database created, a lock freed,
    the config file corrected). Retriable errors are retried anyway, without limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=5, ge=0, description="starts after a permanent failure before the "
                                                           "connector stays failed (0: never restart it)")
    backoff: float = Field(default=30.0, gt=0, description="seconds before the first new start; doubles")
    backoff_max: float = Field(default=600.0, gt=0, description="longest wait between two starts")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before start number ``attempt`` (from 1) after a permanent failure."""
        return min(self.backoff * 2 ** (attempt - 1), self.backoff_max)


class PluginConfig(BaseModel):
    """Base of every plugin config: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="unique name of this connector")
    type: str
    unhealthy_after: float = Field(
        default=60.0, gt=0, description="seconds without progress (blocked, or retrying) after which "
                                        "/healthz answers 503; progress clears it")
    retry_failed: RetryFailed = Field(default_factory=RetryFailed,
                                      description="starting the connector again after a permanent error")


class SourceConfig(PluginConfig):
    tables: list[str] = Field(default_factory=lambda: ["*"],
                              description="tables to capture, as schema.table globs")
    snapshot: SnapshotMode = SnapshotMode.INITIAL
    max_batch_events: int = Field(default=4096, ge=1, description="events per batch at most")


class SinkConfig(PluginConfig):
    topics: list[str] = Field(min_length=1, description="topics to consume, as globs")
    batch_size: int = Field(default=2000, ge=1, description="events per write at most")
    batch_wait_ms: int = Field(default=200, ge=0, description="how long to gather a batch")
    on_poison: Literal["dead_letter", "stop"] = Field(
        default="dead_letter", description="a record that fails even alone: set aside, or stop the sink")
    dead_letter_topic: str | None = Field(default=None, description="default: <prefix>.dead-letter.<name>")
    dead_letter_retention_hours: float | None = Field(
        default=720.0, gt=0, description="how long the dead-letter topic keeps each letter (null: for ever); "
                                         "the topic is not compacted, so every letter stays until then")
    schema_wait: float = Field(
        default=300.0, gt=0, description="seconds to wait for a schema version that rows name and the "
                                         "schema topic does not hold; then the sink stops at that row")
    scale_out: Literal["single", "group"] = Field(
        default="single", description="single: one process reads every partition of the topics; group: "
                                      "every process running this sink joins one Kafka consumer group and "
                                      "the partitions are shared among them (Kafka only; no rebuilds)")
    bulk_window_mb: int = Field(
        default=512, ge=1, description="a rebuild or bootstrap of a sink that bulk-loads (BulkLoadableSink) "
                                       "reduces the history to the newest version per key in memory, in "
                                       "windows of at most this many MiB (keys, newest rows, the window's "
                                       "tables; about 200 MiB per million keys of 100-byte rows); a history "
                                       "with more takes several windows, each loaded before the next is read")


class Source(ABC):
    """A database log, read into batches of change events. See the module docstring."""

    config_model: ClassVar[type[SourceConfig]]
    connector: ClassVar[str]  # the envelope's source.connector: "postgresql", "mysql", ...

    def __init__(self, config: SourceConfig, position: Position | None) -> None:
        self.config = config
        self.start_position = position

    @property
    def phase(self) -> str:
        """What the source is doing now, for status and metrics: "starting", "snapshot", "streaming"."""
        return "starting"

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def poll(self, timeout: float) -> Batch | None: ...

    @abstractmethod
    def commit(self, position: Position) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def lag(self) -> float | None:
        """Seconds between now and the commit time of the newest change emitted (None: unknown)."""
        return None

    def retained_log_bytes(self) -> int | None:
        """Bytes of log the server keeps for this source (a PostgreSQL slot's retained WAL); None: unknown."""
        return None

    def snapshot_chunks(self) -> tuple[int, int] | None:
        """(chunks done, chunks in all) of the snapshot under way; None when none is. The runtime
        adds the rows and an ETA for status and metrics."""
        return None

    def incremental_snapshot(self) -> dict | None:
        """The incremental snapshot under way (tables, table, after_key, rows); None when none is.
        Called on the polling thread, about once a second."""
        return None

    @property
    def finished(self) -> bool:
        """True when the source has nothing more to emit, ever (``initial_only`` after its snapshot)."""
        return False


class ConnectorLogger(logging.LoggerAdapter):
    """A logger whose records carry ``connector`` (and the current ``phase``) for the log format."""

    def __init__(self, logger: logging.Logger, connector: str, stats: ConnectorStats | None = None) -> None:
        super().__init__(logger, {"connector": connector})
        self._stats = stats

    def process(self, msg, kwargs):
        extra = {"connector": self.extra["connector"]}
        if self._stats is not None:
            extra["phase"] = self._stats.phase
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return msg, kwargs


# (topic, partition, offset, reason, key, value): set one record aside on the dead-letter topic,
# durably, with why. key and value are the record's bytes as read (None: unknown or a tombstone).
DeadLetterWriter = Callable[[str, int, int, str, "bytes | None", "bytes | None"], None]


def ensure_dead_letter_topic(log: Log, topic: str, retention_hours: float | None) -> None:
    """Make a sink's dead-letter topic (not compacted: every letter kept for ``retention_hours``),
    or bring an existing one to that (cdc/runtime/dead_letters.py), for a sink that writes its
    letters itself. Letters are keyed by ``{"topic", "partition", "offset"}`` of their record."""
    from cdc.runtime.dead_letters import ensure_topic

    ensure_topic(log, topic, None if retention_hours is None else int(retention_hours * 3_600_000))


def _no_dead_letter(name: str) -> DeadLetterWriter:
    def refuse(topic: str, partition: int, offset: int, reason: str, key=None, value=None) -> None:
        raise PermanentError(f"sink {name}: no dead-letter writer outside the runtime; the record at "
                             f"{topic}[{partition}]@{offset} fails: {reason}")
    return refuse


@dataclass(frozen=True)
class SinkContext:
    """What the runtime gives a sink besides its config: handed in by ``Sink.attach`` before
    ``start``. Every callable here may be called from the sink's thread (the one calling
    ``write``); ``stats`` is read by the runtime's reporting from that same thread.

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
    ``renames_to_follow``), since a column's ``renamed_from`` names it in the shape just before (rows of the shape between may all be in
    another partition, read later).

    ``delete_retention_ms(topic)`` is the topic's ``delete.retention.ms`` (how long a tombstone
    stays readable after compaction), or None when the log does not say: a sink that remembers
    deletes may forget them after that long. ``dead_letter(...)`` sets a record aside (see
    ``DeadLetterWriter``) on ``dead_letter_topic``; the runtime already does that for events that
    fail alone, so a sink calls it only for records it decides to skip itself. ``log`` is the
    framework's log client when the runtime drives the sink (None for a ``SelfDrivenSink``, which
    reads the topics itself: ``log_config`` is the config file's ``log`` section to find them).

    ``topics_matching(globs)`` lists the log's table topics that match ``globs`` (the framework's
    own topics left out), as the runtime consumes them. ``checkpoint_feed()`` opens a
    ``CheckpointFeed`` over the sources' stored checkpoints (None without a log): its ``poll()``
    answers ``{source name: version}`` for each source whose stored checkpoint rose since the last
    poll, a transaction boundary every event before which the log had acknowledged when it was
    stored. With the end offsets of the sink's topics read after it, that tells when everything of
    a source up to that version is applied (sinks/redis/applied.py). Use it from one thread.

    ``delete_read(topic, partition, offset)``, for a tombstone without a version (written before
    records had headers; one with a version is its delete, cdc/sink_events.py), says whether this
    sink read the delete of the tombstone at ``offset`` (the record at ``offset - 1``, a delete of the same key: the capture
    emits the two consecutively) in the same pass of reading or in the earlier one whose commit
    this pass resumed from. Then the delete is (or is being) written with its own version, and a
    sink must NOT resolve the tombstone against its store: anything live there for the key comes
    from a later record (a replay after a crash between a write and its commit, batches cut
    differently), which the tombstone would delete for good. False: the delete was never read
    (compacted away, set aside as poison), and the sink deletes the key if it still holds it
    (cdc/sink_events.py). Without a runtime it answers False (resolve, as before).
    """

    name: str
    topic_prefix: str = "cdc"
    stats: ConnectorStats | None = None
    schema_for: Callable[..., dict | None] = lambda topic, version=None: None
    shapes_between: Callable[[str, int, int], list[dict]] = lambda topic, after, before: []
    delete_retention_ms: Callable[[str], int | None] = lambda topic: None
    dead_letter_topic: str = ""
    dead_letter: DeadLetterWriter | None = None
    log: Log | None = None
    log_config: Any = None
    logger: ConnectorLogger = field(default=None)  # type: ignore[assignment]
    delete_read: Callable[[str, int, int], bool] = lambda topic, partition, offset: False

    def __post_init__(self) -> None:
        # Defaults that depend on the name: a context built with only a name is a usable one.
        if self.stats is None:
            object.__setattr__(self, "stats", ConnectorStats(self.name, "sink"))
        if not self.dead_letter_topic:
            object.__setattr__(self, "dead_letter_topic", dead_letter_topic(self.topic_prefix, self.name))
        if self.dead_letter is None:
            object.__setattr__(self, "dead_letter", _no_dead_letter(self.name))
        if self.logger is None:
            object.__setattr__(self, "logger", ConnectorLogger(logging.getLogger(f"cdc.sink.{self.name}"),
                                                               self.name, self.stats))

    def topics_matching(self, globs: Iterable[str]) -> list[str]:
        if self.log is None:
            return []
        return table_topics(self.log.topics(), globs)

    def checkpoint_feed(self) -> CheckpointFeed | None:
        return None if self.log is None else CheckpointFeed(self.log, self.topic_prefix)


class Sink(ABC):
    """A derived store kept in sync from topics. See the module docstring and cdc/sink_events.py.

    ``write`` gets events in log order per partition (a key's events are in one partition) and
    must be durable when it returns: the runtime commits the consumer offsets right after. It must
    be idempotent and never regress a key (a replay from offset 0 is always safe). Errors: a
    ``RetriableError`` makes the runtime retry the same batch after a backoff; any other error
    makes it split the batch to find the event that fails alone (a poison event).

    ``generation``: the generation of the store to write into (see ``RebuildableSink``); None:
    whatever generation readers see now. A sink without generations ignores it.
    """

    config_model: ClassVar[type[SinkConfig]]
    #: ``cdc bootstrap`` fills a new generation and switches readers to it once it caught up,
    #: instead of writing into the one readers see (for a ``RebuildableSink`` whose readers must
    #: never see a partly filled store, e.g. a search index).
    bootstrap_by_rebuild: ClassVar[bool] = False
    #: True (read before each batch): the runtime may hand an upsert's ``after`` as the JSON bytes
    #: of the row object, undecoded, when the record is a plain ``json`` envelope (see
    #: ``cdc.sink_events.decode_records``). A sink that writes rows without looking at most of
    #: their values (the SQL sink's COPY into PostgreSQL) skips building a dict per row.
    raw_rows: bool = False

    def __init__(self, config: SinkConfig, generation: int | None = None) -> None:
        self.config = config
        self.generation = generation  # None: whatever generation readers see now
        # Until the runtime attaches its own: a context with no log and no schemas, so a sink
        # built alone (tests, tools) works.
        self.context = SinkContext(config.name)

    def attach(self, context: SinkContext) -> None:
        """Take the runtime's services; called once, before ``start``."""
        self.context = context

    @property
    def schema_for(self) -> Callable[..., dict | None]:
        """Shorthand for ``context.schema_for``; assigning it replaces the context's (tools, tests)."""
        return self.context.schema_for

    @schema_for.setter
    def schema_for(self, schema_for: Callable[..., dict | None]) -> None:
        self.context = dataclasses.replace(self.context, schema_for=schema_for)

    def shape_of(self, event: SinkEvent) -> dict | None:
        """The schema record ``event`` names in ``source.schema_version`` (the topic's newest when
        it names none; None when the source publishes no shapes). Call it with the first event of a
        topic in a write (a write has one shape per topic).

        A named version the schema topic does not hold raises ``ShapeNotYetPublished`` (retriable:
        the runtime retries the batch) until it has been missing for ``config.schema_wait``
        seconds, then ``ShapeMissingError`` naming the event's topic, partition, offset, table and
        the version: the sink stops there and its offset is never committed past the row."""
        version = event.source.get("schema_version") if event.source else None
        try:
            return self.context.schema_for(event.topic, version)
        except ShapeNotYetPublished as err:
            if err.waited < self.config.schema_wait:
                raise
            where = f"{event.topic}[{event.partition}]@{event.offset}"
            table = ".".join(p for p in (event.source.get("db"), event.source.get("schema"),
                                         event.source.get("table")) if p)
            raise ShapeMissingError(
                f"sink {self.config.name}: the row at {where} (table {table}) names schema version "
                f"{version}, which {schema_changes_topic(self.context.topic_prefix)} has not delivered in "
                f"{err.waited:.0f}s (schema_wait); the sink stopped before it and committed nothing past "
                f"it. Check that the capture daemon publishing these rows writes its shapes to that topic "
                f"(the same topic_prefix), then start the sink again", topic=event.topic,
                partition=event.partition, offset=event.offset, table=table, version=version) from err

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def write(self, events: list[SinkEvent]) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...


@runtime_checkable
class RebuildableSink(Protocol):
    """A sink whose store has generations, for ``cdc rebuild`` and the ``rebuild`` schema policy.
    A sink declares it by naming it among its bases (``class SqlSink(Sink, RebuildableSink)``);
    being a Protocol, ``isinstance`` also accepts a sink that has the four methods.

    A sink writes into generation ``generation`` of its store (e.g. SQL tables ``<table>__g<N>``
    behind a view ``<table>``). ``current_generation()`` is the one readers see;
    ``open_generation(n)`` makes an empty generation n and writes into it from then on, while
    readers keep seeing the current one; ``switch_generation(n)`` makes readers see n, atomically;
    ``drop_generation(m)`` retires one. The runtime calls them on the thread that calls ``write``:
    open, write every event from offset 0 up to the topics' ends, switch, commit the offsets,
    drop the old one. A rebuild stopped half way leaves readers on the old generation; the next
    ``open_generation`` of the same number starts it empty again.
    """

    @abstractmethod
    def current_generation(self) -> int: ...

    @abstractmethod
    def open_generation(self, generation: int) -> None: ...

    @abstractmethod
    def switch_generation(self, generation: int) -> None: ...

    @abstractmethod
    def drop_generation(self, generation: int) -> None: ...


@runtime_checkable
class BulkLoadableSink(Protocol):
    """A ``RebuildableSink`` that can load a rebuild's windows in bulk (declared by naming it
    among the sink's bases). A rebuild then reads the topics from offset 0 into windows reduced
    to the newest version per key (``cdc.bulk_window``) instead of writing batch by batch: a
    window whose keys the generation being written does not hold yet (the first one, and on Kafka
    each partition's first one: a key lives in one partition) goes to ``bulk_load`` part by part
    (each key is in one part; the parts of a window have disjoint keys); any other window, and
    any part ``bulk_load`` declines or fails, goes through ``write`` as events (version-guarded,
    as always). Calls of both may alternate within one rebuild.

    ``bulk_load(part)`` writes the part durably (upserts as rows, deletes remembered, the truncate
    watermark kept; tombstones need nothing in a generation that held none of the keys) and
    returns True, or returns False without writing anything (e.g. a target without a bulk path).
    If it raises, nothing of the part may be written: the runtime writes the part through
    ``write`` instead. Called on the thread that calls ``write``. ``bulk_loads`` (read once the
    sink started): False makes a rebuild write batch by batch, as for any other sink.
    """

    @property
    @abstractmethod
    def bulk_loads(self) -> bool: ...

    @abstractmethod
    def bulk_load(self, part: WindowPart) -> bool: ...


class WriteCompletion(Protocol):
    """What ``PipelinedSink.submit`` returns: ``wait()`` returns once the batch is durable (what
    ``write`` returning means), or raises what ``write`` would have raised."""

    def wait(self) -> None: ...


@runtime_checkable
class PipelinedSink(Protocol):
    """A sink whose write can return once its requests are *submitted* (declared by naming it
    among the sink's bases), so that the store is never idle between two writes: while it works
    through one batch's requests, the sink reduces and encodes the next.

    ``submit(events)`` does what ``write`` does up to handing the requests over and returns a
    ``WriteCompletion``; or returns None, having done nothing, when the batch is not a plain write
    (its store objects are to be made or changed first: a new index, a mapping to update, a
    truncate, anything whose order relative to the writes before it matters). The runtime then
    waits until every write in flight completed (a barrier) and writes the batch with ``write``,
    before it submits anything after it. ``writes_in_flight`` (read once the sink started): how
    many submitted writes the runtime keeps uncompleted at most (1: none overlap).

    The runtime's side (cdc/runtime/sink_runner.py): ``submit``, ``wait`` and every other call on
    the sink stay on the sink's one thread, in that order: a batch's completion is waited for
    after later batches were submitted, never before its own submission. Offsets are committed
    strictly in batch order, a batch's only once its own completion succeeded. A failed completion
    (or a ``submit`` that raised) commits nothing past it: every write in flight is waited for,
    the batch goes through ``write`` with the usual retries, poison isolation and dead letters,
    and the later batches whose completion failed are written again; those that succeeded are
    committed after it. So a sink that pipelines must take a batch applied *after* a later one
    without regressing anything: its writes are version-guarded per key, including deletes (a
    write whose version is not newer than the stored one is a no-op). Stops, rebuilds,
    generation calls and a revocation wait for every write in flight first.
    """

    @property
    @abstractmethod
    def writes_in_flight(self) -> int: ...

    @abstractmethod
    def submit(self, events: list[SinkEvent]) -> WriteCompletion | None: ...


@runtime_checkable
class MaintainedSink(Protocol):
    """A sink with housekeeping of its own that must not wait for the next write (dropping a
    retired generation when its delay is over, purging old delete markers): declared by naming
    it among the sink's bases. ``maintain()`` is called on the sink's thread while the sink is
    caught up (nothing in flight), at most every few seconds; it returns quickly and raises as
    ``write`` does."""

    @abstractmethod
    def maintain(self) -> None: ...


@runtime_checkable
class DescribedSink(Protocol):
    """A sink that can say what its store holds, for ``cdc status``: ``describe()`` on a started
    sink returns one dict per store object (e.g. per OpenSearch index: its ``topic``, alias,
    generation, documents); the runtime adds each topic's consumer lag. Declared by naming it
    among the sink's bases."""

    @abstractmethod
    def describe(self) -> list[dict]: ...


class SelfDrivenSink(Sink):
    """A sink that consumes the topics itself and owns its position (e.g. a Spark streaming query
    and its checkpoint). The runtime attaches the context and calls ``run``, never ``write``.

    ``run(stop_event, report)`` starts, runs until ``stop_event`` is set (or the sink has nothing
    more to do), stops, and returns; ``report(stats)`` is to be called about once a second.
    ``stop`` may be called from another thread. Errors as for ``write``: a ``RetriableError``
    makes the runtime restart it after a backoff, any other ``CdcError`` stops the connector.
    """

    runs_itself: ClassVar[bool] = True  # the older spelling of isinstance(sink, SelfDrivenSink)
    # The log formats (``log.format``) it decodes itself, past the runtime's decoding; the runtime
    # refuses to start it on a log of another format.
    formats: ClassVar[tuple[str, ...]] = ("json",)

    @abstractmethod
    def run(self, stop_event: threading.Event, *,
            report: Callable[[ConnectorStats], None] | None = None) -> None: ...

    def write(self, events: list[SinkEvent]) -> None:
        raise PermanentError(f"sink {self.config.name} ({self.config.type}) reads its topics itself: "
                             f"run it with run()")


def open_kafka_log(bootstrap_servers: str, *, producer_config: dict | None = None,
                   consumer_config: dict | None = None) -> Log:
    """A ``Log`` client on the Kafka brokers ``bootstrap_servers`` (for a self-driven sink that
    reads Kafka with its own machinery but needs the framework's log client too). Close it."""
    from cdc.log.kafka import KafkaLog

    return KafkaLog(bootstrap_servers, producer_config=producer_config, consumer_config=consumer_config)


def load_sink_settings(config_path: str, sink_name: str) -> tuple[SinkConfig, Any]:
    """(the sink's config, the file's ``log`` section) from a config file, for a launcher that runs
    a sink outside the daemon. Raises ``KeyError`` for an unknown sink, ``CdcError`` for a bad file."""
    from cdc.config import load_config

    config = load_config(config_path)
    return config.sink(sink_name), config.log


def avro_writer_schema(registry_url: str, schema_id: int) -> tuple[str, dict]:
    """The writer schema of an ``avro`` record (Confluent's framing: byte 0, then ``schema_id``)
    from the schema registry at ``registry_url`` (cached per process): its Avro JSON text without
    Avro's logical types (a reader then yields the encoded ints and bytes, the forms a Connect
    JSON payload has), and the Connect schema it stands for (the names that say how to convert
    each field). ``CdcError`` (``SchemaRegistryError``) if the registry has no such id or cannot
    be reached (retriable then)."""
    import orjson

    from cdc.formats.avro import registry_for, strip_logical_types
    from cdc.formats.avro_schema import to_connect

    avro = registry_for(registry_url).schema(schema_id)
    return orjson.dumps(strip_logical_types(avro)).decode(), to_connect(avro)


def spark_jars() -> list[str]:
    """The Kafka source, Delta and spark-avro jars a local Spark session needs, resolved into the
    cache once."""
    from cdc.dev.jars import spark_jars as resolve

    return resolve()
