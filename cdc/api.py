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

Sink lifecycle::

    sink = SinkClass(config)
    sink.start()
    sink.write(records)      # durable when it returns; idempotent (records carry versions)
    sink.stop()

Errors are ``cdc.errors`` types; ``err.retriable`` tells the runtime whether to back off and try
again or to stop the connector with the message.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from typing import Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from cdc.events import Batch
from cdc.sink_events import SinkEvent
from cdc.positions import Position


class SnapshotMode(StrEnum):
    INITIAL = "initial"            # snapshot when there is no stored position, then stream
    INITIAL_ONLY = "initial_only"  # snapshot, then stop
    NEVER = "never"                # stream from the current log position, no snapshot
    ALWAYS = "always"              # snapshot at every start, then stream
    WHEN_NEEDED = "when_needed"    # snapshot when there is no usable position (none, or purged)


class PluginConfig(BaseModel):
    """Base of every plugin config: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="unique name of this connector")
    type: str


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

    @property
    def finished(self) -> bool:
        """True when the source has nothing more to emit, ever (``initial_only`` after its snapshot)."""
        return False


class Sink(ABC):
    """A derived store kept in sync from topics. See the module docstring and cdc/sink_events.py.

    ``write`` gets events in log order per partition (a key's events are in one partition) and
    must be durable when it returns: the runtime commits the consumer offsets right after. It must
    be idempotent and never regress a key (a replay from offset 0 is always safe). Errors: a
    ``RetriableError`` makes the runtime retry the same batch after a backoff; any other error
    makes it split the batch to find the event that fails alone (a poison event).

    Generations, for ``cdc rebuild``: a sink writes into generation ``generation`` of its store
    (e.g. SQL tables ``<table>__g<N>`` behind a view ``<table>``). ``open_generation(n)`` makes an
    empty generation n to write into while readers keep seeing the current one;
    ``switch_generation(n)`` makes readers see n, atomically; ``drop_generation(m)`` retires one.
    A sink that cannot rebuild leaves them raising NotImplementedError.
    """

    config_model: ClassVar[type[SinkConfig]]

    def __init__(self, config: SinkConfig, generation: int | None = None) -> None:
        self.config = config
        self.generation = generation  # None: whatever generation readers see now
        # Set by the runtime before start(): (topic, version) -> the schema record (a dict as
        # written by cdc.serde.encode_schema_change) of the shape a row names in
        # ``source.schema_version``; version None: the newest shape of the topic. None when the
        # source publishes no shapes (then, and only then, a sink infers column types from values).
        # The runtime hands ``write`` batches in which each topic has one shape.
        self.schema_for: Callable[..., dict | None] = lambda topic, version=None: None

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def write(self, events: list[SinkEvent]) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def current_generation(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} cannot rebuild")

    def open_generation(self, generation: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot rebuild")

    def switch_generation(self, generation: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot rebuild")

    def drop_generation(self, generation: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot rebuild")
