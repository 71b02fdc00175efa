"""Incremental snapshots while streaming: the watermark algorithm of Netflix's DBLog paper.

A table is read again, in primary-key order, a chunk at a time, while the stream goes on. For each
chunk:

1. a low watermark row is written into the source's signal table (``write_signal``: it commits,
   so the stream will bring it back in log order; ``_open_window``);
2. once the source says a read sees every change before the watermark (``chunk_readable``: at once
   on MySQL; on PostgreSQL when the transactions older than it ended, the stream going on
   meanwhile), the chunk is read: the rows after the previous chunk's last key, at most
   ``chunk_size``; then a high watermark row is written (``_read_chunk``).

The stream then goes on (``filter``). Between the two watermarks, every streamed change of the
chunk's table removes the changed key from the chunk: the stream has the newer row (or its
delete). At the high watermark the chunk's remaining rows go out as snapshot reads (``op: r``,
``source.snapshot: incremental``), placed in the stream right there. Streaming never pauses for more than one chunk's read.

Versions. A chunk row carries the version the source gave its low watermark: a log position at
or below the low watermark's own (PostgreSQL: the WAL insert position just before it; MySQL: the
binlog position before it). A chunk row that is emitted saw no change of its key inside the
window, so the change it shows committed before the low watermark; every change it does not show
commits after the chunk's read, and has a higher version:

* MySQL writes the binlog in commit order, so that is true as is;
* PostgreSQL numbers a change by where it was written, not where its transaction committed: a
  transaction open across the window could have written before the low watermark and commit after
  the high one. So the chunk is read only once every transaction begun before the low watermark
  has ended (``chunk_readable``; the stream goes on meanwhile): the ones that commit then fall
  inside the window (and win over the chunk); every later one writes after the low watermark.

So no sink that keeps the highest version per key lets a chunk row overwrite a newer change.

Progress: while a snapshot runs, every checkpoint the stream gives is wrapped as an
``IncrementalProgress`` (the stream's position, the tables still to read, the last key of the
last chunk emitted). The runtime stores it like any position once everything before it is
delivered, so the chunk cursor is durable with the offsets; after a crash the stream resumes at
its position and the reading after the stored key (the chunk in flight is read again).

Requests: ``request(tables)`` (from ``cdc snapshot``, through the daemon's API, on any thread) or
a row the user inserts into the signal table: ``type`` ``execute-snapshot``, ``data``
``{"data-collections": ["public.orders"]}`` (Debezium's signal shape). A request the stream
brings is stored with the checkpoint after it, so a crash never loses or repeats it.

The signal table's own rows never reach a topic.

Threading: ``request`` and ``status`` from any thread; everything else on the source's thread.

The signal table's names, the settings and what a source supplies (``IncrementalReads``) are in
``signals``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, overload

from cdc.errors import CdcError, ConfigError
from cdc.events import Batch, ChangeEvent, Op, SnapshotMarker, TableId
from cdc.positions import IncrementalProgress, Position
from snapshot.signals import CLOSE, EXECUTE, OPEN, PAUSE, RESUME, STOP, IncrementalReads, conditions_of, signal_of

log = logging.getLogger(__name__)

INCREMENTAL_READ = SnapshotMarker.INCREMENTAL  # source.snapshot of a chunk row, as Debezium marks it


def key_of(event: ChangeEvent) -> tuple:
    """An event's key as a tuple in key order (how the chunk cursor is stored)."""
    key = event.key
    assert key is not None  # a row of a captured table: a table without a key is refused (the sources' catalogs)
    return tuple(key.values())


@dataclass
class ChunkWindow:
    """One chunk from its low watermark on: the keys the stream changed since (``changed``),
    and, once read, its ``rows`` by key. The read may come after some of the window's changes
    (PostgreSQL waits for older transactions first): the changed keys are kept, not just popped."""

    signal_id: str
    table: str
    after: tuple | None          # the key the chunk reads after
    version: int                 # the low watermark's: the chunk rows'
    rows: dict[tuple, ChangeEvent] | None = None  # None: not read yet
    last_key: tuple | None = None  # the last key read (the cursor after this chunk)
    complete: bool = False       # fewer rows than asked: the table ends with this chunk
    opened: bool = False         # the stream brought the low watermark
    changed: set = field(default_factory=set)
    truncated: bool = False

    def see(self, event: ChangeEvent) -> None:
        if not self.opened or str(event.table) != self.table:
            return
        if event.op is Op.TRUNCATE:
            self.truncated = True
        else:
            self.changed.add(key_of(event))

    def remaining(self) -> list[ChangeEvent]:
        """The rows no change inside the window touched, as incremental reads."""
        if self.truncated:
            return []
        changed, rows = self.changed, self.rows
        assert rows is not None  # the close watermark is written after the chunk was read
        return [e._replace(snapshot=INCREMENTAL_READ) for key, e in rows.items() if key not in changed]


def has_table(events: list[ChangeEvent], table: TableId) -> bool:
    """Whether an event of ``table`` is among ``events``. On every streamed batch: events of one
    table share their TableId object, so an identity check skips the dataclass comparison (about
    700 ns an event, measured) for all but the first of a run."""
    last = None
    for event in events:
        current = event[1]  # .table, without the namedtuple's property call
        if current is last:
            continue
        last = current
        if current == table:
            return True
    return False


class IncrementalSnapshots:
    def __init__(self, reads: IncrementalReads, chunk_size: int, name: str, known: frozenset[str],
                 pause_s: float = 0.0) -> None:
        self.reads, self.chunk_size, self.name = reads, chunk_size, name
        self.pause_s = pause_s
        self._next_chunk_at = 0.0          # time.monotonic() before which no chunk is opened (the pause)
        self.known = known                 # the captured tables, by name
        self.tables: tuple[str, ...] = ()  # still to read; the first is being read
        self.filters: dict[str, str] = {}  # table -> the SQL condition its rows are read with
        self.paused = False                # no chunk is opened while paused (the open one finishes)
        self.last_key: tuple | None = None
        self.rows = 0                      # rows emitted by the snapshot running now
        self.window: ChunkWindow | None = None
        self._pace = _Pace()               # chunks of the table read now, for status and its ETA
        self._requests: list[tuple[str, str | None]] = []
        self._lock = threading.Lock()

    def _extra(self) -> dict:
        return {"connector": self.name, "phase": "incremental snapshot"}

    # -- requests, any thread -----------------------------------------------------------------------
    def request(self, tables: list[str], where: str | None = None) -> list[str]:
        """Queue ``tables`` for reading (``where``: only their rows matching that SQL condition);
        ConfigError naming any that is not captured."""
        unknown = [t for t in tables if t not in self.known]
        if unknown:
            raise ConfigError(f"source {self.name} does not capture {', '.join(unknown)} (captured: "
                              f"{', '.join(sorted(self.known)) or 'nothing'})")
        if self.reads.signal_table is None:
            raise ConfigError(f"source {self.name} has no signal_table: incremental snapshots write their "
                              "watermarks there (set signal_table in its config)")
        with self._lock:
            self._requests.extend((table, where) for table in tables)
        return list(tables)

    def status(self) -> dict | None:
        tables, window = self.tables, self.window
        queued = [t for t, _ in self._requests]
        if not tables and not queued:
            return None
        table = tables[0] if tables else None
        return {"tables": list(tables) + [t for t in queued if t not in tables],
                "table": table, "after_key": self.last_key, "rows": self.rows,
                "chunk_open": window is not None, "paused": self.paused,
                "where": self.filters.get(table) if table else None,
                "chunks_done": self._pace.chunks, "eta_seconds": None if self.paused else self._pace.eta()}

    # -- the source's thread ------------------------------------------------------------------------
    def resume(self, progress: IncrementalProgress) -> None:
        self.tables, self.last_key, self.rows = progress.tables, progress.last_key, progress.rows
        self.filters, self.paused = dict(progress.filters), progress.paused
        if self.tables:
            self._pace.start(self._estimate(self.tables[0], self.filters.get(self.tables[0])), self.rows)
            if self.paused:
                self._pace.pause()
        log.info("resuming the incremental snapshot of %s after key %s (%d rows read before)%s",
                 ", ".join(self.tables), self.last_key, self.rows, " (paused)" if self.paused else "",
                 extra=self._extra())

    def before_poll(self) -> None:
        """Take queued requests; read the next chunk if none is waiting for its watermarks."""
        with self._lock:
            requests, self._requests = self._requests, []
        for table, where in requests:
            self._add(table, where)
        if self.tables and self.window is None and not self.paused and time.monotonic() >= self._next_chunk_at:
            self._open_window()
        window = self.window
        if window is not None and window.rows is None and self.reads.chunk_readable():
            self._read_chunk(window)

    @property
    def awaiting_high_watermark(self) -> bool:
        """A chunk is read and its high watermark written: the stream brings it back soon."""
        return self.window is not None and self.window.rows is not None

    def _add(self, table: str, where: str | None = None) -> None:
        if table not in self.known:
            log.warning("ignoring a snapshot request for %s: not captured", table, extra=self._extra())
            return
        if where is not None:
            refused = self.reads.filter_error(table, where)
            if refused is not None:
                log.error("ignoring the snapshot request for %s: its condition %r is refused: %s", table, where,
                          refused, extra=self._extra())
                return
        if table in self.tables and self.filters.get(table) == where:
            if table in self.tables[1:] or self.last_key is None:
                return  # already to be read from its start, the same rows
        if self.tables and self.tables[0] == table:  # read again from its start, with the new condition
            self.window, self.last_key, self.rows = None, None, 0
            self._pace.start(self._estimate(table, where))
        elif table not in self.tables:
            if not self.tables:
                self.rows = 0
                self._pace.start(self._estimate(table, where))
            self.tables += (table,)
        if where is None:
            self.filters.pop(table, None)
        else:
            self.filters[table] = where
        log.info("incremental snapshot of %s requested%s", table, f" (rows where {where})" if where else "",
                 extra=self._extra())

    def _estimate(self, table: str, where: str | None) -> int | None:
        """Rows the table is expected to give (None under a condition: statistics cannot say)."""
        if where is not None:
            return None
        try:
            return self.reads.estimate_rows(table)
        except CdcError as err:  # only the ETA needs it
            log.warning("no row estimate for %s (%s): status shows no ETA", table, err, extra=self._extra())
            return None

    def _open_window(self) -> None:
        table, after = self.tables[0], self.last_key
        signal_id = uuid.uuid4().hex
        data = {"table": table, "after": list(after) if after is not None else None}
        version = self.reads.write_signal(f"{signal_id}-open", OPEN, data)
        self.window = ChunkWindow(signal_id, table, after, version)

    def _read_chunk(self, window: ChunkWindow) -> None:
        rows = self.reads.read_chunk(window.table, window.after, self.chunk_size, window.version,
                                     self.filters.get(window.table))
        data = {"table": window.table, "after": list(window.after) if window.after is not None else None}
        self.reads.write_signal(f"{window.signal_id}-close", CLOSE, data)
        window.rows = {key_of(e): e for e in rows}
        window.last_key = key_of(rows[-1]) if rows else window.after
        window.complete = len(rows) < self.chunk_size
        log.debug("chunk of %s after %s: %d rows read", window.table, window.after, len(rows), extra=self._extra())

    def filter(self, batch: Batch) -> Batch:
        """The batch without signal rows, with each closed chunk's rows where its high watermark
        was, and its checkpoint carrying the snapshot's progress."""
        signal_table = self.reads.signal_table
        window = self.window
        if signal_table is None or (window is None and not self.tables and
                                    not has_table(batch.events, signal_table) and
                                    not any(c.table == signal_table for c in batch.schema_changes)):
            return batch
        out: list[ChangeEvent] = []
        for event in batch.events:
            if event.table != signal_table:
                if window is not None:
                    window.see(event)
                out.append(event)
                continue
            signal = signal_of(event)
            if signal is None:
                continue
            signal_id, kind, data = signal
            if window is not None and signal_id == f"{window.signal_id}-open":
                window.opened = True
            elif window is not None and signal_id == f"{window.signal_id}-close" and window.opened:
                out.extend(window.remaining())
                self._chunk_done(window)
                window = self.window = None
            elif kind == EXECUTE:
                self._execute(data)
                window = self.window
            elif kind == STOP:
                self._stop(data)
                window = self.window
            elif kind in (PAUSE, RESUME):
                self._pause(kind == PAUSE)
        checkpoint = batch.checkpoint
        if checkpoint is not None and self.tables:
            checkpoint = IncrementalProgress(checkpoint, self.tables, self.last_key, self.rows,
                                             tuple(sorted(self.filters.items())), self.paused)
        schema_changes = tuple(c for c in batch.schema_changes if c.table != signal_table)
        return Batch(out, checkpoint, schema_changes, batch.snapshot_end)

    def _chunk_done(self, window: ChunkWindow) -> None:
        rows = window.rows
        assert rows is not None  # the close watermark is written after the chunk was read
        self.rows += len(rows) - len(window.changed & rows.keys())
        self._pace.chunk_done(self.rows)
        if window.complete:
            log.info("incremental snapshot of %s done: %d rows", window.table, self.rows, extra=self._extra())
            self.filters.pop(window.table, None)
            self.tables, self.last_key = self.tables[1:], None
            if self.tables:
                self.rows = 0
                self._pace.start(self._estimate(self.tables[0], self.filters.get(self.tables[0])))
            else:
                self.paused = False  # a pause holds the snapshot it was asked for, not the next one
        else:
            self.last_key = window.last_key
            self._next_chunk_at = time.monotonic() + self.pause_s

    def _execute(self, data: dict[str, Any]) -> None:
        tables = data.get("data-collections") or []
        if data.get("type", "incremental") != "incremental" or not isinstance(tables, list):
            log.warning("ignoring signal %s: only incremental snapshots of a list of data-collections are "
                        "taken", data, extra=self._extra())
            return
        conditions = conditions_of(data)
        if conditions is None:
            log.error("ignoring signal %s: additional-conditions must be a list of {data-collection, filter}",
                      data, extra=self._extra())
            return
        for table in tables:
            self._add(str(table), conditions.get(str(table)))

    def _stop(self, data: dict[str, Any]) -> None:
        tables = data.get("data-collections") or list(self.tables)
        current = self.tables[0] if self.tables else None
        self.tables = tuple(t for t in self.tables if t not in tables)
        for table in tables:
            self.filters.pop(table, None)
        if current in tables:
            self.window, self.last_key = None, None
            if self.tables:
                self.rows = 0
                self._pace.start(self._estimate(self.tables[0], self.filters.get(self.tables[0])))
        if not self.tables:
            self.paused = False
        log.info("incremental snapshot of %s stopped by a signal", ", ".join(tables), extra=self._extra())

    def _pause(self, paused: bool) -> None:
        if paused == self.paused:
            return
        if paused and not self.tables:
            log.warning("ignoring a pause: no incremental snapshot is under way", extra=self._extra())
            return
        self.paused = paused
        if paused:
            self._pace.pause()
        else:
            self._pace.resume()
        log.info("incremental snapshot %s%s", "paused" if paused else "resumed",
                 f" ({', '.join(self.tables)} to read)" if self.tables else "", extra=self._extra())


class _Pace:
    """Chunks done of the table read now and, with the database's estimate of its rows, an ETA
    from its rate so far (time spent paused does not count)."""

    def __init__(self) -> None:
        self.start(None)

    def start(self, estimate: int | None, rows_before: int = 0) -> None:
        """``rows_before``: rows of the table read before a restart (not timed here)."""
        self.estimate, self.chunks, self.rows, self.rows_before = estimate, 0, rows_before, rows_before
        self.reading = 0.0                    # seconds spent on this table up to the last chunk done
        self._since: float | None = time.monotonic()  # when the time not yet in ``reading`` began; None: paused

    def pause(self) -> None:
        if self._since is not None:
            self.reading += time.monotonic() - self._since
            self._since = None

    def resume(self) -> None:
        self._since = time.monotonic()

    def chunk_done(self, rows: int) -> None:
        self.chunks, self.rows = self.chunks + 1, rows
        if self._since is not None:
            now = time.monotonic()
            self.reading, self._since = self.reading + now - self._since, now

    def eta(self) -> float | None:
        timed = self.rows - self.rows_before
        if not self.estimate or timed <= 0:
            return None
        return round(max(self.estimate - self.rows, 0) * self.reading / timed, 1)


@overload
def unwrap(position: Position) -> Position: ...


@overload
def unwrap(position: None) -> None: ...


def unwrap(position: Position | None) -> Position | None:
    """The stream's own position inside a stored progress record."""
    return position.at if isinstance(position, IncrementalProgress) else position
