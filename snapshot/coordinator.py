"""Snapshot, then stream: the lifecycle every database source runs, written once.

``SnapshotCoordinator`` is an object a source composes with its database's halves (in the
manner of Debezium's coordinator, which is given its snapshot, streaming and incremental
sources), and ``CoordinatedSource`` the ``Source`` whose lifecycle is its coordinator's. The
halves (``DatabaseHalves``):

* ``prepare()``: connect, check the server, resolve the captured tables;
* ``resume_point(position)``: the position to stream from, or ``PositionLostError`` when the
  server no longer has the log after it;
* ``captured_names()``: the captured tables by name (``namespace.table``);
* ``open_snapshot(only)``: read connections inside one consistent snapshot, the chunks to read and
  how (an ``OpenedSnapshot``), and ``consistent``: the position the snapshot matches;
* ``open_stream(position, after_snapshot)``: a ``Stream`` from ``position`` (None: the server's
  current position);
* ``release()``: close what ``prepare`` opened.

The coordinator owns the rest:

Decision: ``snapshot/policy.py`` turns the mode and the stored position into a plan.

Progress marker: before the first snapshot row goes out, a batch whose checkpoint is a
``SnapshotProgress(stream_from)`` marker; ``poll`` returns no row until the runtime stored it
(``commit``). A crash from then on finds the marker at the next start: the snapshot did not
finish and is taken again (the policy), never mistaken for a finished one.

Handover: streaming starts where the topics may already be (``since``: a stored position, or an
unfinished snapshot's marker) when the source's log still has it (``keeps_log_before_snapshot``
and ``resume_point`` agrees), otherwise at the snapshot's consistent point. Streaming from the
earlier point replays the changes in between with versions below the snapshot's rows, so sinks
(which keep the highest version per key) end with the newer row, and a delete in between removes
a row the new snapshot no longer has. Where the earlier point is gone, rows deleted meanwhile are
removed by the runtime's stale-row deletes (cdc/runtime/stale_rows.py), and the log says so.

Backfill: at start the coordinator compares the captured tables with the ones its topics are
complete for (the ``TableBook`` the runtime hands the source in its ``SourceContext``, kept with
the offsets). Tables new since then are read alone (``open_snapshot(only=...)``), under a marker
naming them, and streaming resumes at the stored position; the source gives the backfill's rows a version between the changes it saw and
those it did not, so the changes streamed from the stored position never lose to it. The record
of complete tables is written at the first position stored after a snapshot or backfill ends
(``commit``), so a crash before that reads the new tables again rather than never.

Snapshot rows: the newest batch of them is held back until the next, so the last row of the
snapshot goes out marked ``last``, in the batch whose checkpoint (``stream_from``) ends the snapshot and
whose ``snapshot_end`` names every table read. Each table's shape goes out with the first batch.

Incremental snapshots: while streaming, tables asked for (``request_snapshot``, or a signal row)
are read again in chunks between watermarks (``snapshot/incremental.py``); the halves supply
``IncrementalReads`` (``write_signal``, ``chunk_readable``, ``read_chunk``, ...). A stored
``IncrementalProgress`` is unwrapped at start: the stream resumes at its position and the reading
after its last key.

Threading: all calls on the runtime's thread; ``stop`` and ``request_snapshot`` may come from
another one. Snapshot readers are threads of their own (snapshot/parallel.py) or processes
(snapshot/processes.py).
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from cdc.api import Source, TableBook
from cdc.errors import CdcError, ConfigError, PermanentError, PositionLostError
from cdc.events import Batch, RowBlock, SchemaChange, SnapshotEnd, SnapshotMarker
from cdc.positions import IncrementalProgress, Position, SnapshotProgress
from snapshot.incremental import IncrementalSnapshots, unwrap
from snapshot.parallel import ParallelSnapshot
from snapshot.policy import Plan, Step, policy_for
from snapshot.signals import SIGNALS, IncrementalReads, IncrementalSettings

WINDOW_POLL_SECONDS = 0.0  # the stream's poll timeout while an incremental snapshot's chunk is in flight


def close_quietly(resource) -> None:
    """Close ``resource`` (if any) on the way out: an error there would hide the reason for leaving."""
    if resource is not None:
        try:
            resource.close()
        except Exception:  # noqa: BLE001 - closing on the way out
            pass


class Stream(Protocol):
    """The streaming half: batches from the log, a position the runtime stored, closing."""

    def poll(self, timeout: float) -> Batch | None: ...

    def commit(self, position: Position) -> None: ...

    def close(self) -> None: ...


@dataclass
class OpenedSnapshot:
    """A snapshot ready to read: ``readers`` (each with ``close()``) are inside it already."""

    readers: list
    chunks: list
    read: Callable[[Any, Any, Callable[[list], None]], None]  # ParallelSnapshot's read(reader, chunk, emit)
    consistent: Position                   # the position the snapshot matches
    schema_changes: tuple[SchemaChange, ...]
    end: SnapshotEnd
    accept: Callable[[Any], list] = field(default=lambda item: item)  # a reader's item -> its events
    described: str = ""                    # for the log line
    # Readers already started with the chunks handed out (snapshot/processes.py), read instead
    # of a ParallelSnapshot over ``readers``; ``accept`` turns its items into events.
    pool: Any = None


class DatabaseHalves(Protocol):
    """What a source supplies to its coordinator (see the module docstring); all on the runtime's
    thread but ``release``, which ``stop`` may call from another one."""

    def prepare(self) -> None: ...

    def resume_point(self, position: Position) -> Position: ...

    def captured_names(self) -> frozenset[str]:
        """The captured tables, as ``namespace.table`` (str of their TableId)."""

    def open_snapshot(self, only: frozenset[str] | None = None) -> OpenedSnapshot:
        """A snapshot of every captured table, or (a backfill) of the tables named ``only``, whose
        rows must then not overwrite changes streamed from before it: their version is above every
        change the snapshot saw and below every change it did not."""

    def open_stream(self, position: Position | None, after_snapshot: bool) -> Stream:
        """``after_snapshot``: a snapshot just published every captured table's shape; if not,
        the stream announces the shapes it resumes with where its log does not (MySQL)."""

    def release(self) -> None: ...


class SnapshotCoordinator:
    """Drives ``halves`` through the lifecycle above for the source ``config`` names, from
    ``position`` (the stored one, or None). ``position_types``: the positions the source stores
    besides ``SnapshotProgress``, ``position_kind`` what to call them in errors;
    ``keeps_log_before_snapshot``: whether the log before a new snapshot stays readable (a binlog
    does; a PostgreSQL slot is created anew by its snapshot, so streaming can only start at the
    snapshot's point). ``log``: where its records go (the source's module, where its operators
    and tests look for them)."""

    def __init__(self, halves: DatabaseHalves, config, position: Position | None, *,
                 position_types: tuple[type, ...], position_kind: str, keeps_log_before_snapshot: bool = True,
                 log: logging.Logger | None = None) -> None:
        self.halves = halves
        self.config = config
        self.keeps_log_before_snapshot = keeps_log_before_snapshot
        # An incremental snapshot's progress wraps the stream's position (snapshot/incremental.py).
        self._incremental_progress = position if isinstance(position, IncrementalProgress) else None
        position = self.start_position = unwrap(position)
        if position is not None and not isinstance(position, (*position_types, SnapshotProgress)):
            raise PermanentError(f"source {config.name}: stored position {position} is not {position_kind} "
                                 "(was the source's type changed? reset its offset)")
        self.policy = policy_for(config.snapshot)
        self.log = log or logging.getLogger(__name__)
        self._phase = "starting"
        self._finished = False
        self._stopping = threading.Event()
        self.stream: Stream | None = None
        self.snapshot: ParallelSnapshot | None = None
        self._opened: OpenedSnapshot | None = None
        self._held: Any = None             # the newest snapshot item (events or a RowBlock), held back to mark the last row
        self._pending_changes: tuple = ()  # schema records for the next batch
        self._progress: SnapshotProgress | None = None
        self._progress_stored = False
        self._progress_sent = False
        self._snapshot_rows = 0
        self.stream_from: Position | None = None
        self._backfilling = False
        self.table_book: TableBook | None = None  # the runtime's, given to start()
        self._record_tables: frozenset[str] | None = None  # to record at the next position stored
        self._tables_at_end: frozenset[str] | None = None  # to record once the snapshot's end is stored
        self.incremental: IncrementalSnapshots | None = None  # made by start(), once the tables are known

    def _extra(self) -> dict:
        return {"connector": self.config.name, "phase": self._phase}

    # -- the Source contract, for CoordinatedSource ---------------------------------------------
    @property
    def phase(self) -> str:
        return self._phase

    @property
    def finished(self) -> bool:
        return self._finished

    def snapshot_chunks(self) -> tuple[int, int] | None:
        snapshot = self.snapshot
        return None if snapshot is None else (snapshot.tasks_done, snapshot.tasks_total)

    def start(self, table_book: TableBook | None = None) -> None:
        """``table_book``: which tables the topics are complete for (None: every table captured
        now counts as complete, and nothing is recorded)."""
        self.table_book = table_book
        halves = self.halves
        halves.prepare()
        current = halves.captured_names()
        # A source takes incremental snapshots when its config has their settings; its halves
        # then supply ``IncrementalReads`` (write_signal, chunk_readable, read_chunk, ...).
        settings = self.config
        if isinstance(settings, IncrementalSettings):
            reads = cast(IncrementalReads, halves)  # what such a source's halves supply, as said above
            self.incremental = IncrementalSnapshots(reads, settings.incremental_chunk_rows, self.config.name,
                                                    current, settings.incremental_chunk_pause_ms / 1000)
            if self._incremental_progress is not None:
                self.incremental.resume(self._incremental_progress)
        known = self.table_book.load() if self.table_book is not None else None
        if known != current:
            self._record_tables = current  # at the first position stored (see commit)
        plan = self.policy.on_start(self.start_position, current - known if known is not None else frozenset())
        if plan.step in (Step.STREAM, Step.BACKFILL) and plan.position is not None:
            try:
                position = halves.resume_point(plan.position)
            except PositionLostError as lost:
                plan = self.policy.on_lost(lost)
                self.log.warning("%s: taking a new snapshot", lost, extra=self._extra())
            else:
                if plan.step is Step.STREAM:
                    self._start_stream(position, after_snapshot=False)
                    return
                plan = replace(plan, position=position)
        if plan.step is Step.STREAM:
            self._start_stream(None, after_snapshot=False)
        elif plan.step is Step.FINISH:
            self._phase, self._finished = "finished", True
        else:
            # Not before the snapshot's end is stored: the topics are complete only then.
            self._record_tables, self._tables_at_end = None, current
            self._start_snapshot(plan)

    def poll(self, timeout: float) -> Batch | None:
        if self._finished or self._stopping.is_set():
            self._stopping.wait(timeout)
            return None
        if self.snapshot is not None:
            return self._poll_snapshot(timeout)
        stream = self.stream
        assert stream is not None  # start() began a snapshot or the stream; a finished source returned above
        try:
            incremental = self.incremental
            if incremental is None:
                return stream.poll(timeout)
            incremental.before_poll()
            if incremental.awaiting_high_watermark:
                # A chunk waits for its watermarks: hand over what came as soon as it came. A
                # binlog stream otherwise reads on past the high watermark's commit, blocked until
                # the next event or heartbeat: one chunk per heartbeat on a quiet server.
                timeout = min(timeout, WINDOW_POLL_SECONDS)
            batch = stream.poll(timeout)
            return None if batch is None else incremental.filter(batch)
        except PositionLostError as lost:
            if self._stopping.is_set():
                return None
            self._snapshot_after_loss(lost)
            return None
        except CdcError:
            if self._stopping.is_set():  # ``stop`` closed the stream under the read
                return None
            raise

    def commit(self, position: Position) -> None:
        """A stored snapshot marker lets the snapshot's rows go; a stream may advance its server."""
        if isinstance(position, SnapshotProgress):
            self._progress_stored = self._progress_stored or position == self._progress
            return
        if self._record_tables is not None and self.table_book is not None:
            self.table_book.save(self._record_tables)
            self._record_tables = None
        if self.stream is not None:
            self.stream.commit(unwrap(position))

    def request_snapshot(self, tables: list[str], where: str | None = None) -> list[str]:
        """Queue an incremental snapshot of ``tables`` (any thread; ``where``: only their rows
        matching that SQL condition); ConfigError if one is not captured or the source has no
        signal table. Taken while streaming."""
        if self.incremental is None:
            raise ConfigError(f"source {self.config.name} takes no incremental snapshots"
                              + ("" if self._phase != "starting" else " (or is not started yet)"))
        return self.incremental.request(tables, where)

    def incremental_snapshot(self) -> dict | None:
        return None if self.incremental is None else self.incremental.status()

    def stop(self) -> None:
        self._stopping.set()
        self._close_snapshot()
        close_quietly(self.stream)
        self.halves.release()

    # -- snapshot ----------------------------------------------------------------------------------
    def _snapshot_after_loss(self, lost: PositionLostError) -> None:
        """The position was lost while streaming (a slot invalidated or dropped over its budget):
        a new snapshot under ``snapshot: when_needed``, else ``lost`` is raised (the policy)."""
        plan = self.policy.on_lost(lost)
        self.log.warning("%s: taking a new snapshot", lost, extra=self._extra())
        close_quietly(self.stream)
        self.stream = None
        self._record_tables, self._tables_at_end = None, self.halves.captured_names()
        self._start_snapshot(plan)

    def _start_snapshot(self, plan: Plan) -> None:
        since = plan.position
        backfill = self._backfilling = plan.step is Step.BACKFILL
        self.log.info("taking a %s: %s", "backfill" if backfill else "snapshot", plan.why, extra=self._extra())
        self._phase = "snapshot"
        if backfill:
            pass  # start() checked that the stream can go on from there after the backfill
        elif since is not None and self.keeps_log_before_snapshot:
            try:
                since = self.halves.resume_point(since)
            except PositionLostError as err:
                self.log.warning("%s; streaming will start at the new snapshot: rows deleted since then may stay in "
                            "the topics until they are reset", err, extra=self._extra())
                since = None
        elif not self.keeps_log_before_snapshot:
            since = None
        opened = self._opened = self.halves.open_snapshot(plan.tables if backfill else None)
        self.stream_from = since or opened.consistent
        # Stored before any row goes out (``_poll_snapshot`` waits for its commit).
        self._progress = SnapshotProgress(self.stream_from,
                                          extra={"backfill": sorted(plan.tables)} if backfill else {})
        self._progress_stored = self.start_position == self._progress
        self._progress_sent = False
        self._pending_changes = opened.schema_changes
        self._snapshot_rows = 0
        self.snapshot = opened.pool or ParallelSnapshot(opened.readers, opened.chunks, opened.read,
                                                        name=f"{self.config.name}-snapshot")
        readers = opened.pool.count if opened.pool is not None else len(opened.readers)
        self.log.info("snapshot of %d tables in %d chunks, consistent at %s, %d readers%s; streaming will start "
                      "after %s", len(opened.end.tables), len(opened.chunks), opened.consistent, readers,
                      f" ({opened.described})" if opened.described else "", self.stream_from, extra=self._extra())

    def _poll_snapshot(self, timeout: float) -> Batch | None:
        if not self._progress_stored:
            if not self._progress_sent:
                self._progress_sent = True
                return Batch([], self._progress)
            self._stopping.wait(min(timeout, 0.05))  # until the runtime stored the marker
            return None
        snapshot, opened = self.snapshot, self._opened
        assert snapshot is not None and opened is not None  # both set by _start_snapshot, unset by _close_snapshot
        try:
            item = snapshot.next_batch(timeout)
        except StopIteration:
            return self._finish_snapshot(opened)
        if item is None:
            return None
        events = opened.accept(item)
        if not len(events):
            return None
        self._snapshot_rows += len(events)
        # The newest item is held back whole (a list of events or a RowBlock, which goes to the
        # log as it came), so the snapshot's very last row can still be marked ``last``.
        out, self._held = self._held, events
        return self._with_changes(Batch(out)) if out is not None else None

    def _finish_snapshot(self, opened: OpenedSnapshot) -> Batch:
        self._close_snapshot()
        events: list = []
        if self._held is not None:
            held, self._held = self._held, None
            if isinstance(held, RowBlock):
                rest, last = held.split_last()
                events = rest.events() if rest is not None else []
            else:
                events, last = held[:-1], held[-1]
            events.append(last._replace(snapshot=SnapshotMarker.LAST))
        self.log.info("snapshot done: %d rows; streaming from %s", self._snapshot_rows, self.stream_from,
                 extra=self._extra())
        self._record_tables = self._tables_at_end
        if self.policy.streams_after_snapshot:
            # A backfill published only its own tables' shapes: the stream announces them all.
            self._start_stream(self.stream_from, after_snapshot=not self._backfilling)
        else:
            self._phase, self._finished = "finished", True
        return self._with_changes(Batch(events, self.stream_from, snapshot_end=opened.end))

    def _with_changes(self, batch: Batch) -> Batch:
        changes, self._pending_changes = self._pending_changes, ()
        return batch.with_schema_changes(changes)

    def _close_snapshot(self) -> None:
        if self.snapshot is not None:
            self.snapshot.close()
            self.snapshot = None
        if self._opened is not None:
            if self._opened.pool is not None:
                close_quietly(self._opened.pool)
            for reader in self._opened.readers:
                reader.close()
            self._opened = None

    # -- streaming ---------------------------------------------------------------------------------
    def _start_stream(self, position: Position | None, after_snapshot: bool) -> None:
        self.stream = self.halves.open_stream(position, after_snapshot)
        self._phase = "streaming"


def signal_snapshot(config, tables: list[str], action: str, where: str | None,
                    send: Callable[[Any, str, str, dict], None]) -> None:
    """``IncrementalSnapshotSource.signal_snapshot`` for a source whose ``send(config, signal_id,
    kind, data)`` writes one row to the signal table of ``config``'s database (a connection of
    its own): the row its stream brings back as a request (snapshot/incremental.py)."""
    if not getattr(config, "signal_table", None):
        raise ConfigError(f"source {config.name} has no signal_table: incremental snapshots write their "
                          "watermarks there (set signal_table in its config)")
    outside = [t for t in tables if not any(fnmatch.fnmatchcase(t, glob) for glob in config.tables)]
    if outside:
        raise ConfigError(f"source {config.name} does not capture {', '.join(outside)} (tables: "
                          f"{', '.join(config.tables)})")
    kind = SIGNALS.get(action)
    if kind is None:
        raise ConfigError(f"no snapshot action {action!r}; actions: {', '.join(SIGNALS)}")
    data: dict = {"data-collections": list(tables), "type": "incremental"}
    if where is not None:
        if action != "execute" or not tables:
            raise ConfigError("a condition (--where) goes with the tables to snapshot")
        data["additional-conditions"] = [{"data-collection": t, "filter": where} for t in tables]
    send(config, f"snapshot-{uuid.uuid4().hex}", kind, data)


class CoordinatedSource(Source):
    """A ``Source`` whose lifecycle is its ``SnapshotCoordinator``'s: the subclass makes
    ``self.coordinator`` in its ``__init__`` (with itself, or another object, as the halves)
    and keeps its own state; the coordinator keeps the lifecycle's."""

    coordinator: SnapshotCoordinator

    @property
    def phase(self) -> str:
        return self.coordinator.phase

    @property
    def finished(self) -> bool:
        return self.coordinator.finished

    def start(self) -> None:
        self.coordinator.start(self.context.table_book)

    def poll(self, timeout: float) -> Batch | None:
        return self.coordinator.poll(timeout)

    def commit(self, position: Position) -> None:
        self.coordinator.commit(position)

    def stop(self) -> None:
        self.coordinator.stop()

    def snapshot_chunks(self) -> tuple[int, int] | None:
        return self.coordinator.snapshot_chunks()

    def incremental_snapshot(self) -> dict | None:
        return self.coordinator.incremental_snapshot()

    def request_snapshot(self, tables: list[str], where: str | None = None) -> list[str]:
        """Queue an incremental snapshot (``IncrementalSnapshotSource``); see the coordinator's."""
        return self.coordinator.request_snapshot(tables, where)
