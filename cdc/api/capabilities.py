"""Capabilities: what a plugin can do beyond the base contract, declared by naming the type among
its bases, and asked for by the runtime with ``isinstance`` / ``issubclass`` (never by looking
for a method). Each docstring states when the runtime calls it and on which thread.

Sinks: ``RebuildableSink`` (generations), ``BulkLoadableSink`` (a rebuild's windows in bulk),
``PipelinedSink`` (writes in flight), ``MaintainedSink`` (housekeeping between writes),
``SelfRebuildingSink`` (a self-driven sink's ``cdc rebuild``), ``SharedSink`` (group members that
each read everything and write their share), ``DescribedSink`` (what the store
holds, for ``cdc status``), ``ReadableSink`` (the rows it wrote, read back: ``cdc demo``, ``cdc
verify``). ``SelfDrivenSink`` is a base class (cdc/api/sink.py).

Sources: ``IncrementalSnapshotSource`` (tables read again while streaming, on request),
``SlotOwningSource`` (server-side state that outlives the source: ``cdc status``, ``cdc drop``),
``VerifiableSource`` (key ranges read at a known log position: ``cdc verify``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from cdc.api.config import SourceConfig
from cdc.errors import CdcError, ConfigError
from cdc.events import ChangeEvent
from cdc.positions import Position
from cdc.sink_event import SinkEvent, WindowPart

T = TypeVar("T")


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
    drop the old one. A ``switch_generation`` that raises a retriable error is called again
    (with a backoff, until it succeeds or the runner stops): it must resume where it stopped. A rebuild stopped half way leaves readers on the old generation; the next
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
    to the newest version per key (cdc/bulk_window.py) instead of writing batch by batch: a
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
class SelfRebuildingSink(Protocol):
    """A ``SelfDrivenSink`` that rebuilds its store itself, for ``cdc rebuild`` (declared by naming
    it among the sink's bases). ``request_rebuild()`` is called before ``run``, on the thread that
    then calls ``run``: that run first builds every table again from offset 0 of its topics and
    swaps each in atomically (readers see the old one until then), reporting the phase
    ``rebuilding``, then streams from its own position, reporting ``streaming``. Records the
    rebuild read and the streaming reads again must change nothing (version-guarded writes). A
    rebuild stopped half way leaves readers on the old store; the next one starts over."""

    @abstractmethod
    def request_rebuild(self) -> None: ...


@runtime_checkable
class DescribedSink(Protocol):
    """A sink that can say what its store holds, for ``cdc status``: ``describe()`` on a started
    sink returns one dict per store object (e.g. per OpenSearch index: its ``topic``, alias,
    generation, documents); the runtime adds each topic's consumer lag. Declared by naming it
    among the sink's bases."""

    @abstractmethod
    def describe(self) -> list[dict]: ...



@runtime_checkable
class SharedSink(Protocol):
    """A sink whose output for one record lies anywhere in its key space (a joined document
    changes with a row of any table in it), so with ``scale_out: group`` its members cannot
    split the topics' partitions: each member reads *every* record and writes only its share of
    the outputs. Declared by naming it among the sink's bases.

    The runtime (cdc/runtime/sink_shares.py), for such a sink with ``scale_out: group``:

    * reads every partition of the topics under ``reading_group(config)`` (one per member, stable
      across its restarts; also where ``cdc status`` and health measure the member's lag), starting where ``read_from(partitions)`` says: the positions the
      sink's own state holds (offset 0 for a partition it holds none of), so that a member whose
      state was lost reads everything again instead of trusting commits its state lacks;
    * shares the numbers 0..``share_count()``-1 among the running members through the group
      coordinator of the sink's own name (cooperative-sticky, as partitions are);
    * calls ``own(shares)`` with the shares this member writes from now on. A share gained is
      handed over only once this member has read and written the topics up to their ends as of
      the assignment (its state then holds everything the share's previous owner wrote from); a
      share lost is taken away after this member's writes in flight ended, and before the
      coordinator gives it to another member. ``own`` writes at most a slice of what waits in
      the shares gained, and returns True while some waits: the runtime calls it again with
      the same shares between batches until it returns False (so the member keeps serving
      the group). Taking shares away must do no I/O.

    ``own`` and ``read_from`` are called on the thread that calls ``write``; ``own`` raises as
    ``write`` does (a ``RetriableError`` is called again later with the same shares).
    """

    @abstractmethod
    def share_count(self) -> int: ...

    @classmethod
    @abstractmethod
    def reading_group(cls, config: Any) -> str: ...

    @abstractmethod
    def read_from(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]: ...

    @abstractmethod
    def own(self, shares: frozenset[int]) -> bool: ...



class StoredRow(NamedTuple):
    """A row as a sink's store holds it: ``key`` the key columns' values, ``row`` every column
    the sink wrote (in the store's own forms: a Redis hash holds text)."""

    key: tuple
    row: dict[str, Any]


def key_order(values: Sequence[Any]) -> tuple:
    """The order of keys every ``ReadableSink`` (and whoever compares with one) uses, the same in
    every store whatever form it keeps a value in: per column, numbers (and text that reads as
    one) by value, before any other value, compared as text; None first."""
    out: list[tuple[int, Decimal | int, str]] = []
    for value in values:
        if type(value) is int:  # the common key, without the round trip through text
            out.append((1, value, ""))
            continue
        if value is None:
            out.append((0, 0, ""))
            continue
        text = value.decode() if isinstance(value, bytes) else str(value)
        try:
            number = Decimal(text)
        except InvalidOperation:
            out.append((2, 0, text))
            continue
        out.append((1, number, "") if number.is_finite() else (2, 0, text))
    return tuple(out)


@runtime_checkable
class ReadableSink(Protocol):
    """A sink that can read back the rows it wrote, as it wrote them (``cdc demo`` compares them
    with the source; ``cdc verify`` compares them chunk by chunk). Declared by naming it
    among the sink's bases.

    ``start_reading()`` opens the store for the reads below and nothing else; ``stop()`` ends
    it. ``read_rows(topic, after=None, limit=None)`` on a sink so opened: the live rows of
    ``topic``'s table in the generation readers see, in ``key_order`` of their keys, those whose
    key comes after ``after`` (a key as ``StoredRow.key`` gives it; None: from the first), at most
    ``limit`` (None: all). Deleted rows are not returned. Called from one thread; it may read
    the whole table per call (the bundled sinks do), so a caller pages with large limits."""

    def start(self) -> None: ...

    def start_reading(self) -> None:
        """Open the store to read it, writing nothing and moving no position (``cdc verify``,
        which may run beside the sink). This default is ``start()``: a sink the runtime feeds
        writes only in ``write``. A ``SelfDrivenSink``, whose ``start`` begins consuming,
        overrides it."""
        self.start()

    def applied_offsets(self, topic: str) -> dict[int, int] | None:
        """Per partition of ``topic``, the offset below which the store holds every record: what
        ``cdc verify`` waits for before a second look. This default, None: the sink's consumer
        group's committed offsets say it. A sink that keeps its own position (a
        ``SelfDrivenSink``: Spark's checkpoint) answers from there; a partition it lacks has
        nothing applied."""
        return None

    @abstractmethod
    def read_rows(self, topic: str, after: tuple | None = None, limit: int | None = None) -> list[StoredRow]: ...

    def read_range(self, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
        """The live rows of ``topic`` whose key comes after ``after`` and not after ``upto`` (in
        ``key_order``; None: unbounded), in key order: one chunk of ``cdc verify``. This default
        reads the whole table per call; a sink overrides it with a read of the range alone."""
        return in_range(self.read_rows(topic), after, upto)

    def read_keys(self, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
        """The live rows of ``topic`` with these keys (as ``StoredRow.key`` gives them; a key the
        store lacks is left out), in key order: ``cdc verify``'s second look. This default reads
        the whole table; a sink overrides it with a read of those keys alone."""
        wanted = {key_order(key) for key in keys}
        return [row for row in page(self.read_rows(topic), None, None) if key_order(row.key) in wanted]

    def stored_forms(self, topic: str, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
        """What the store holds for source rows, in the forms ``read_rows`` gives back: each a
        (key, row) pair, the event's key object and its ``after`` as the sink receives them; the
        sink's column choice, renames and value mapping applied (``cdc verify`` compares the
        source this way). This default: the rows as they are."""
        return [StoredRow(tuple(key.values()), dict(row)) for key, row in rows]


def in_range(rows: list[StoredRow], after: tuple | None, upto: tuple | None) -> list[StoredRow]:
    """``rows`` (any order) as ``read_range`` answers: in key order, after ``after``, up to ``upto``."""
    rows = page(rows, after, None)
    if upto is None:
        return rows
    bound = key_order(upto)
    return [r for r in rows if key_order(r.key) <= bound]


def page(rows: list[StoredRow], after: tuple | None, limit: int | None) -> list[StoredRow]:
    """``rows`` (any order) as ``read_rows`` answers: in key order, after ``after``, ``limit`` at most."""
    rows = sorted(rows, key=lambda r: key_order(r.key))
    if after is not None:
        bound = key_order(after)
        rows = [r for r in rows if key_order(r.key) > bound]
    return rows if limit is None else rows[:limit]


@runtime_checkable
class IncrementalSnapshotSource(Protocol):
    """A source that reads tables again while streaming, on request (DBLog's watermarks:
    snapshot/incremental.py). Declared by naming it among the source's bases.

    ``request_snapshot(tables, where=None)`` on a started source (any thread) queues a snapshot
    of ``tables`` (only their rows matching the SQL condition ``where``) and returns the tables
    queued; ``ConfigError`` if one is not captured or the source cannot take them.
    ``signal_snapshot(config, tables, action="execute", where=None)`` (a classmethod: no source
    is built; the daemon answers ``cdc snapshot`` with it) asks a running source of ``config``, in
    any process, through the source's own log (a row in its signal table), so the request is
    ordered with the changes and survives restarts: ``execute`` a snapshot of ``tables``,
    ``stop`` the one of ``tables`` (of all if none is named), ``pause`` or ``resume`` it."""

    @abstractmethod
    def request_snapshot(self, tables: list[str], where: str | None = None) -> list[str]: ...

    @classmethod
    @abstractmethod
    def signal_snapshot(cls, config: Any, tables: list[str], action: str = "execute",
                        where: str | None = None) -> None: ...


@dataclass(frozen=True)
class SourceRead:
    """What a ``TableReader`` read: ``events``, the rows as ``r`` change events (what the source
    would publish for them), in key order; ``position``, a log position such that every change
    the read shows is at or before it, and every change it does not show is after it."""

    events: list[ChangeEvent]
    position: Position


class TableReader(Protocol):
    """A reader of a source's captured tables for ``cdc verify`` (``VerifiableSource``). Each call
    reads in one snapshot of the database, without table locks, and answers with the position
    that snapshot matches. Called from one thread; ``close()`` always."""

    def tables(self) -> list[str]:
        """The captured tables, as ``namespace.table``."""
        ...

    def read(self, table: str, after: tuple | None, limit: int) -> SourceRead:
        """The rows of ``table`` whose key comes after ``after`` (None: from the first), at most
        ``limit``, in the order of its key."""
        ...

    def read_keys(self, table: str, keys: Sequence[dict[str, Any]]) -> SourceRead:
        """The rows of ``table`` with these keys (record key objects); a key not there is left out."""
        ...

    def where_keys(self, table: str, keys: Sequence[dict[str, Any]]) -> str:
        """An SQL condition on ``table``'s rows that selects these keys (the ``where`` of an
        incremental snapshot that re-sends them: ``cdc verify --repair``)."""
        ...

    def close(self) -> None: ...


def captured_table(source: str, tables: Mapping[str, T], table: str) -> T:
    """``tables[table]``: what a ``TableReader`` of ``source`` knows of a table it captures; for
    any other table a ``ConfigError`` that lists what it does capture."""
    try:
        return tables[table]
    except KeyError:
        raise ConfigError(f"source {source} does not capture {table}; it captures: "
                          f"{', '.join(sorted(tables)) or 'no tables'}") from None


@runtime_checkable
class VerifiableSource(Protocol):
    """A source whose tables ``cdc verify`` can read beside the running capture (declared by
    naming it among the source's bases). ``open_reader(config)`` (a classmethod: no source is
    built) opens a ``TableReader`` on the server of ``config``; typed errors as the source's."""

    @classmethod
    @abstractmethod
    def open_reader(cls, config: Any) -> TableReader: ...


@dataclass(frozen=True)
class SlotListing:
    """What ``SlotOwningSource.list_slots`` found: ``rows``, one dict per slot on the servers
    asked (``kind: "slot"``, ``server``, ``name``, ``owner``: the configured source that uses it,
    None for an orphan, and what the server says of it); ``problems``, an error per server that
    could not be asked (``retriable``: it did not answer; else it refused, a setting to fix)."""

    rows: list[dict] = field(default_factory=list)
    problems: list[CdcError] = field(default_factory=list)


class SlotDrop(Protocol):
    """A planned ``cdc drop`` of a source's server-side state: ``plan`` says what will go (and,
    in parentheses, what stays or does not exist); ``drop()`` removes it; ``close()`` always."""

    plan: list[str]

    def drop(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class SlotOwningSource(Protocol):
    """A source that keeps state on its server that outlives it (a PostgreSQL replication slot
    holds WAL until it is dropped). Declared by naming it among the source's bases; both are
    classmethods (``cdc status`` and ``cdc drop`` build no source).

    ``list_slots(configs, timeout)``: every slot on the servers the sources of ``configs`` (all of
    this type) capture, each with its owner among them. ``plan_drop(config, timeout)``: what
    ``cdc drop`` removes for ``config``; ``ConfigError`` when it may not (the slot is in use). The
    runtime asks, resets the stored offset, then calls ``drop``: should that fail, the next start
    finds no position and snapshots afresh."""

    @classmethod
    @abstractmethod
    def list_slots(cls, configs: Sequence[SourceConfig], timeout: float) -> SlotListing: ...

    @classmethod
    @abstractmethod
    def plan_drop(cls, config: SourceConfig, timeout: float) -> SlotDrop: ...
