"""``cdc verify``: compare a sink's store with the source database, table by table, chunk by chunk.

The source side is read through the source plugin (``cdc.api.VerifiableSource``: a ``TableReader``
reads a key range in one snapshot, without table locks, and says at which log position), at most
``rows_per_s`` rows a second. Each row becomes what the sink receives for it (the event's key and
``after``, as the JSON envelope carries them) and then what the store holds for it
(``ReadableSink.stored_forms``: the sink's own column choice, renames and value mapping). The store
side is read through the sink (``ReadableSink.read_range``): the keys after the previous chunk's
last key up to this chunk's last (the last chunk: to the end), so the chunks cover every key the
store holds. Per chunk, the two sides are compared whole (both are in this process's memory
anyway, so comparing them says what a digest of each would, without hashing either): first the
rows as each side gives them (``equal_as_given``: most chunks end here, without a canonical form
made of any value), then, if those differ, as canonical rows by key (verify_compare.py). Only a
chunk that differs in that form too is compared key by key. Bounds are in ``key_order``; a source
that orders its keys otherwise (text under a collation) reads chunks whose keys may fall outside
them: such a key is a candidate that its second look clears, so this costs looks, never a false
report.

No false alarms under a live writer. A chunk read at position P can differ from a store that is
correct: the store may not have applied the log up to P yet, or may already hold changes after P.
So a key that differs is only a candidate. It gets up to ``looks`` second looks (and one more
that can only confirm a difference), each:

1. wait until the store has applied the log past P (the position of the last source read of the
   key; every change that read shows is at or before it): the source's stored offset (which the
   runtime saves only once the log holds every change before it) has reached P, and then the sink's committed offsets (which it commits only
   once its store holds the writes) have reached the topic's end offsets as they were then;
2. read the candidates in the store;
3. read them again in the source, in one snapshot, at position Q; Q is the next look's P.

A key equal now is dropped. A key whose source row at Q is the one it had at P, and whose store
row differs from it, is steady: had no change of the key committed between the two source reads,
the store read between them, after the store applied everything up to P, should have held that
row. Equal rows at P and Q do not prove that, though: a key changed and changed back meanwhile (a
row deleted, inserted and deleted again), with the store read while it held the middle row, looks
steady too. So a steady key is reported only when the next look
finds it steady again with the same store row: that store read came after the store applied
everything up to Q, the change back included, so the middle row could only be there again if the
key made the same detour once more and the read caught it at the same moment. A key whose source
row changed is looked at again; one not reported after ``looks`` looks (and the one more that may
confirm a steady key) is unsettled: not decided, not different. An idle source stores a new
offset at its next heartbeat (``heartbeat_interval``), so a look may wait that long. What a wait
cannot bring (a sink that is not running, a source whose offset does not move within
``settle_timeout``) ends the looks: the keys not equal then are unsettled too (the store may only
be behind), and the report says the store did not settle.

Chunk digests. Where the source and the store can both digest a table in their databases
(``cdc.api.digest``: PostgreSQL or MariaDB/MySQL into a PostgreSQL or MariaDB/MySQL target,
tables keyed by one integer column), a range of ``DIGESTED_CHUNKS`` chunks is first compared by
its two digests, a few numbers crossing; only a range whose digests differ is read as rows, chunk
by chunk, and compared as above, so what decides a reported key is the same. ``--rows`` compares
every chunk's rows.

Threading: one thread, but for the store's digests, which run on a second thread beside the
source's digest of the next chunk; each of the reader and the sink is used by one thread at a
time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from cdc.api import ReadableSink, SourceRead, StoredRow, TableReader, key_order
from cdc.api.digest import DigestingReader, DigestingSink, DigestPlan
from cdc.positions import IncrementalProgress, MySqlPosition, PgLsn, Position, SnapshotProgress
from cdc.runtime.verify_compare import (
    Finding,
    Row,
    TableReport,
    by_key,
    canonical_key,
    canonical_row,
    compare,
    equal_as_given,
    same_row,
)

log = logging.getLogger(__name__)


# A digest covers this many chunks (``Options.chunk``) of rows: fewer round trips per row, and a
# range whose digests differ costs the reading of its rows, chunk by chunk.
DIGESTED_CHUNKS = 10


class Settle(Protocol):
    """Waits until the store applied the log past a source position (see the module docstring)."""

    def wait(self, position: Position, topic: str, timeout: float | None = None) -> bool:
        """True once applied; False when it could not be seen within the timeout (``timeout``
        seconds where given, else the settle's own)."""
        ...


@dataclass(frozen=True)
class Options:
    chunk: int = 10_000
    rows_per_s: float | None = None
    looks: int = 3
    shown: int = 10
    digests: bool = True  # chunks compared by digests where both databases compute them


class Pacer:
    """Keeps the source reads at ``rows_per_s`` at most (None: no limit)."""

    def __init__(self, rows_per_s: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rows_per_s, self.clock, self.sleep = rows_per_s, clock, sleep
        self.start: float | None = None
        self.rows = 0

    def took(self, rows: int) -> None:
        if self.rows_per_s is None:
            return
        now = self.clock()
        if self.start is None:
            self.start = now
        self.rows += rows
        ahead = self.rows / self.rows_per_s - (now - self.start)
        if ahead > 0:
            self.sleep(ahead)


class Verifier:
    def __init__(self, reader: TableReader, sink: ReadableSink, topic_prefix: str, settle: Settle,
                 options: Options = Options()) -> None:
        self.reader, self.sink, self.prefix, self.settle, self.options = reader, sink, topic_prefix, settle, options
        self.pacer = Pacer(options.rows_per_s)
        # Record key objects of the keys reported (for --repair), and each table's key columns.
        self._source_keys: dict[tuple, dict[str, Any]] = {}
        self._key_names: dict[str, list[str]] = {}

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{table}"

    def table(self, table: str) -> TableReport:
        """Verify one table (``namespace.table``, as the reader names it)."""
        began = time.monotonic()
        topic = self.topic(table)
        report = TableReport(table, topic, shown=self.options.shown)
        after: tuple | None = None
        plan = self._digest_plan(table, topic)
        rows_until: int | None = None  # a digested range that differed: its rows are compared up to this key
        rows_pending = False
        while True:
            if plan is not None and not rows_pending:
                state, after, rows_until = self._digests(table, topic, plan, after, report)
                if state == "done":
                    break
                if state == "cannot":  # the source cannot digest this table: rows from here on
                    plan = None
                rows_pending = True  # "rows": the range's rows are compared chunk by chunk below
            read = self._read(self.reader.read(table, after, self.options.chunk))
            pairs, stored = self._stored(table, topic, read)
            at = _last(stored)
            last = None if at is None else canonical_key(stored[at].key)
            end = len(read.events) < self.options.chunk
            store_rows = self.sink.read_range(topic, after, None if end else last)
            report.chunks += 1
            if equal_as_given(stored, store_rows):  # the module docstring
                report.rows += len({row.key for row in stored})
                report.store_rows += len({row.key for row in store_rows})
            else:
                source, keys = self._canonical(pairs, stored, [canonical_key(row.key) for row in stored])
                store = by_key(store_rows)
                report.rows += len(source)
                report.store_rows += len(store)
                if source != store:
                    report.chunks_differing += 1
                    self._second_looks(table, topic, source, store, keys, read.position, report)
            if end or at is None:
                break
            after = tuple(pairs[at][0].values())
            if rows_until is not None and int(after[0]) >= rows_until:
                rows_pending = False
        report.seconds = time.monotonic() - began
        return report

    def _digest_plan(self, table: str, topic: str) -> DigestPlan | None:
        reader = self.reader
        if not self.options.digests or not isinstance(self.sink, DigestingSink) \
                or not isinstance(reader, DigestingReader):
            return None
        plan = self.sink.digest_plan(topic)
        if plan is not None and plan.store != reader.database:  # different databases: canonical texts
            plan = replace(plan, store="") if plan.canonical else None
        return plan

    def _digests(self, table: str, topic: str, plan: DigestPlan, after: tuple | None,
                 report: TableReport) -> tuple[str, tuple | None, int | None]:
        """Ranges of ``DIGESTED_CHUNKS`` chunks compared by the databases' digests
        (cdc/api/digest.py) from the key ``after`` on, the store digesting one while the source
        digests the next: ("done", None, None) at the end; ("rows", key, last) where the digests
        of the range after ``key`` up to ``last`` (None: to the end) differ, whose rows are then
        compared; ("cannot", key, None) when the source cannot digest the table."""
        reader, sink, chunk = self.reader, self.sink, self.options.chunk * DIGESTED_CHUNKS
        if not isinstance(reader, DigestingReader) or not isinstance(sink, DigestingSink):
            return "cannot", after, None
        start = None if after is None else int(after[0])
        source = reader.digest(table, plan, start, chunk)
        with ThreadPoolExecutor(1, thread_name_prefix="cdc-verify-store") as pool:
            while True:
                if source is None:
                    return "cannot", after, None
                self.pacer.took(source.digest.rows)
                end = source.digest.rows < chunk or source.last is None
                stored = pool.submit(sink.digest_range, topic, plan, start, None if end else source.last)
                following = None if end else reader.digest(table, plan, source.last, chunk)
                store = stored.result()
                if store != source.digest:
                    log.debug("verify %s: the digests of the rows after %s differ: comparing them", table, after)
                    return "rows", after, None if end else source.last
                report.chunks += 1
                report.chunks_digested += 1
                report.rows += source.digest.rows
                report.store_rows += store.rows
                if end:
                    return "done", None, None
                after, start, source = (source.last,), source.last, following

    def recheck(self, table: str, keys: Sequence[tuple], deadline: float | None = None) -> TableReport:
        """Look at ``keys`` (canonical keys a pass of this verifier reported) again: the source
        and the store read now, then the looks of any that differ (``--repair``'s check), which
        wait for the store no later than ``deadline`` (``time.monotonic()``) where given."""
        began = time.monotonic()
        topic = self.topic(table)
        report = TableReport(table, topic, shown=self.options.shown)
        read = self._read(self.reader.read_keys(table, [self.key_object(table, k) for k in keys]))
        source, found = self._source_side(table, topic, read)
        store = by_key(self.sink.read_keys(topic, [_values(found, k) for k in keys]))
        report.chunks, report.rows, report.store_rows = 1, len(source), len(store)
        if source != store:
            report.chunks_differing = 1
            self._second_looks(table, topic, source, store, found, read.position, report, deadline)
        report.seconds = time.monotonic() - began
        return report

    def _read(self, done: SourceRead) -> SourceRead:
        self.pacer.took(len(done.events))
        return done

    def _source_side(self, table: str, topic: str,
                     read: SourceRead) -> tuple[dict[tuple, Row], dict[tuple, dict[str, Any]]]:
        """The rows read, as the store should hold them (canonical key -> row), and canonical key
        -> the record key object (its values are what the store and the source are asked with)."""
        pairs, stored = self._stored(table, topic, read)
        return self._canonical(pairs, stored, [canonical_key(row.key) for row in stored])

    def _stored(self, table: str, topic: str,
                read: SourceRead) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[StoredRow]]:
        """The (record key object, row) of each event read, and each as the store should hold it."""
        pairs = [(dict(event.key or {}), _plain(event.after)) for event in read.events]
        if pairs and table not in self._key_names:
            self._key_names[table] = list(pairs[0][0])
        return pairs, self.sink.stored_forms(topic, pairs)

    @staticmethod
    def _canonical(pairs: list[tuple[dict[str, Any], dict[str, Any]]], stored: list[StoredRow],
                   canon: list[tuple]) -> tuple[dict[tuple, Row], dict[tuple, dict[str, Any]]]:
        rows, keys = {}, {}
        for (key, _), row, at in zip(pairs, stored, canon):
            rows[at] = canonical_row(row.row)
            keys[at] = key
        return rows, keys

    def _second_looks(self, table: str, topic: str, source: dict[tuple, Row], store: dict[tuple, Row],
                      keys: dict[tuple, dict[str, Any]], position: Position, report: TableReport,
                      deadline: float | None = None) -> None:
        """The keys of a chunk that differs, looked at again (the module docstring); the waits
        for the store end by ``deadline`` where given."""
        candidates = compare(source, store).keys
        before = {k: source.get(k) for k in candidates}  # each key's source row at ``position``
        steady: dict[tuple, Row | None] = {}  # key -> its store row at the last look, which found it steady
        now_source, now_store = source, store
        for look in range(self.options.looks + 1):  # the last one can only confirm
            if not candidates:
                return
            settled = self.settle.wait(position, topic) if deadline is None else \
                self.settle.wait(position, topic, max(0.0, deadline - time.monotonic()))
            if not settled:
                report.settled = False
                break
            now_store = by_key(self.sink.read_keys(topic, [_values(keys, k) for k in candidates]))
            read = self._read(self.reader.read_keys(table, [self.key_object(table, k) for k in candidates]))
            now_source, more = self._source_side(table, topic, read)
            keys.update(more)
            moving: list[tuple] = []
            found: dict[tuple, Row | None] = {}
            for k in candidates:
                if same_row(now_source.get(k), now_store.get(k)):
                    continue
                if now_source.get(k) != before[k]:
                    moving.append(k)
                elif k in steady and same_row(steady[k], now_store.get(k)):  # the same at two looks: it differs
                    self._report(report, k, now_source.get(k), now_store.get(k))
                    if k in keys:  # for --repair
                        self._source_keys[k] = keys[k]
                elif look < self.options.looks:
                    found[k] = now_store.get(k)
                    moving.append(k)
                else:
                    moving.append(k)
            log.debug("verify %s: look %d: %d keys still moving, %d to confirm", table, look + 1,
                      len(moving) - len(found), len(found))
            before = {k: now_source.get(k) for k in moving}
            candidates, position, steady = moving, read.position, found
        for k in candidates:  # still moving after every look, or the store did not settle
            report.add("unsettled", Finding(list(k), _dict(now_source.get(k)), _dict(now_store.get(k))))
            if k in keys:
                self._source_keys[k] = keys[k]

    def key_object(self, table: str, key: tuple) -> dict[str, Any]:
        """A canonical key of ``table`` as a record key object: the source's own where this
        verifier looked at it; else (a store-only key) made from the table's key columns."""
        if key in self._source_keys:
            return self._source_keys[key]
        names = self._key_names.get(table)
        if names is None or len(names) != len(key):
            names = [f"key{i}" for i in range(len(key))]
        return {name: _number_or_text(value) for name, value in zip(names, key)}

    @staticmethod
    def _report(report: TableReport, key: tuple, source: Row | None, store: Row | None) -> None:
        report.add(_kind(source, store), Finding(list(key), _dict(source), _dict(store)))


def _last(rows: list[StoredRow]) -> int | None:
    """The index of the row whose key is last in ``key_order`` (None: no rows)."""
    if not rows:
        return None
    single = [row.key[0] for row in rows if len(row.key) == 1]
    if len(single) == len(rows) and set(map(type, single)) == {int}:  # the common key, in C-level steps
        return single.index(max(single))
    canon = [canonical_key(row.key) for row in rows]
    return max(range(len(canon)), key=lambda i: key_order(canon[i]))


def _kind(source: Row | None, store: Row | None) -> str:
    return "missing" if store is None else "extra" if source is None else "different"


def _values(keys: dict[tuple, dict[str, Any]], key: tuple) -> tuple:
    """A key as the store is asked for it: the source's values; a store-only key as it spells it."""
    found = keys.get(key)
    return key if found is None else tuple(found.values())


def _plain(after: Any) -> dict[str, Any]:
    """An event's ``after`` as the sink receives it: the JSON envelope's object (a source may
    hand it over as JSON bytes already, an ``orjson.Fragment``)."""
    return orjson.loads(orjson.dumps(after)) if after is not None else {}


def _dict(row: Row | None) -> dict | None:
    return None if row is None else dict(row)


def _number_or_text(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return value
    return value


def reached(stored: Position | None, at: Position) -> bool | None:
    """Whether the source's stored offset ``stored`` is at or past ``at``; None when the two
    cannot be compared (a kind of position this does not know)."""
    while isinstance(stored, (IncrementalProgress, SnapshotProgress)):
        if isinstance(stored, SnapshotProgress):
            return False  # a snapshot in progress: nothing after it is in the log yet
        stored = stored.at
    if stored is None:
        return False
    if isinstance(stored, PgLsn) and isinstance(at, PgLsn):
        return stored.lsn >= at.lsn
    if isinstance(stored, MySqlPosition) and isinstance(at, MySqlPosition):
        return (stored.file_index, stored.pos) >= (at.file_index, at.pos)
    return None


class LogSettle:
    """``Settle`` through the log: the source's stored offset, then the sink's committed offsets
    against the topic's ends (what ``cdc status`` shows as consumer lag); for a sink that keeps
    its own position (``store``'s ``ReadableSink.applied_offsets`` answers), its offsets."""

    def __init__(self, log_: Any, prefix: str, source: str, sink: str, timeout: float = 60.0,
                 poll: float = 0.2, store: ReadableSink | None = None) -> None:
        from cdc.offsets import OffsetStore

        self.log, self.source, self.sink, self.timeout, self.poll = log_, source, sink, timeout, poll
        self.store = store
        self.offsets = OffsetStore(log_, prefix)
        self.reader = log_.reader(sink)

    def wait(self, position: Position, topic: str, timeout: float | None = None) -> bool:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            answer = reached(self.offsets.load(self.source), position)
            if answer is None or answer:
                break
            if time.monotonic() >= deadline:
                log.warning("verify: the stored offset of source %s did not reach %s within %.0fs",
                            self.source, position, timeout)
                return False
            time.sleep(self.poll)
        try:
            ends = self.log.end_offsets(topic)
        except Exception:  # noqa: BLE001 - no topic yet: nothing to apply
            return True
        while True:
            committed = self._committed(topic, ends)
            if all((committed.get(tp) or 0) >= end for tp, end in ends.items()):
                return True
            if time.monotonic() >= deadline:
                log.warning("verify: sink %s did not apply %s up to its ends within %.0fs (is it running?)",
                            self.sink, topic, timeout)
                return False
            time.sleep(self.poll)

    def _committed(self, topic: str, ends: dict) -> dict:
        applied = self.store.applied_offsets(topic) if self.store is not None else None
        if applied is None:
            return self.reader.committed(list(ends))
        return {tp: applied.get(tp[1]) for tp in ends}

    def close(self) -> None:
        self.reader.close()
        self.offsets.close()


def verify_tables(verifier: Verifier, tables: Sequence[str]) -> list[TableReport]:
    return [verifier.table(table) for table in tables]
