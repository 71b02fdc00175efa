"""The source side of the plugin API: ``Source`` and the ``SourceContext`` the runtime hands it.

Lifecycle (all calls on one thread unless said otherwise)::

    source = SourceClass(config, position)   # position: the last one the runtime stored, or None
    source.attach(context)                   # the runtime's services (SourceContext); before start()
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

A source never talks to the log: the runtime publishes its batches, and deletes the rows a
repeated snapshot no longer has (it names the tables it read in ``Batch.snapshot_end``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

from cdc.api.config import SourceConfig
from cdc.api.context import ConnectorLogger
from cdc.api.stats import ConnectorStats
from cdc.events import Batch
from cdc.positions import Position


class TableBook(Protocol):
    """Which tables a source's topics are complete for, stored with its offsets by the runtime
    (``load``: None when nothing was recorded yet). A snapshot coordinator records the tables
    after a snapshot or backfill, and backfills a captured table missing from the record
    (snapshot/coordinator.py). Called on the source's thread."""

    def load(self) -> frozenset[str] | None: ...

    def save(self, tables: frozenset[str]) -> None: ...


class SourceContext(Protocol):
    """What the runtime gives a source besides its config and position (``Source.attach``):
    its name, the stats it reports through (``stats.phase`` is the source's ``phase``), a logger
    naming the connector, and the ``table_book`` kept with its offsets."""

    # Read-only for a source: properties, so a frozen dataclass (the runtime's) is one too.
    @property
    def name(self) -> str: ...
    @property
    def stats(self) -> ConnectorStats: ...
    @property
    def logger(self) -> ConnectorLogger: ...
    @property
    def table_book(self) -> TableBook: ...


class _NoTableBook:
    """Nothing recorded, nothing kept: every table captured now counts as complete."""

    def load(self) -> frozenset[str] | None:
        return None

    def save(self, tables: frozenset[str]) -> None:
        pass


class StandaloneSourceContext:
    """A ``SourceContext`` with no runtime behind it: what a source built alone has until
    ``attach``; tests hand a ``table_book`` of their own."""

    def __init__(self, name: str, table_book: TableBook | None = None) -> None:
        self.name = name
        self.stats = ConnectorStats(name, "source")
        self.logger = ConnectorLogger(logging.getLogger(f"cdc.source.{name}"), name, self.stats)
        self.table_book: TableBook = table_book or _NoTableBook()


class Source(ABC):
    """A database log, read into batches of change events. See the module docstring."""

    config_model: ClassVar[type[SourceConfig]]
    connector: ClassVar[str]  # the envelope's source.connector: "postgresql", "mysql", ...

    def __init__(self, config: SourceConfig, position: Position | None) -> None:
        self.config = config
        self.start_position = position
        # Until the runtime attaches its own: a source built alone (tests, tools) works.
        self.context: SourceContext = StandaloneSourceContext(config.name)

    def attach(self, context: SourceContext) -> None:
        """Take the runtime's services; called once, before ``start``."""
        self.context = context

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
