"""The documents' engine: a batch of change events into the state, then the documents it changed
written to the target (the design's sections 2 and 3; docs in the sinks' READMEs).

``apply`` runs one transaction: per event, in the order of the log, the row is stored if its
version beats the one the state has for its key (deletes are remembered, so a replay, a
restart or a late older record changes nothing), and every document the row was part of before
the change or is part of after it is *reached*. Each reached document's register then rises to
max(R + 1, the highest version that reached it), and the document enters the outbox at that
version; the next offset of each partition is stored in the same transaction.

``flush`` then assembles each outbox document from the state and hands them to the target's
``write`` with their versions (external versioning: a target keeps the highest, so nothing goes
back), and takes the written ones out of the outbox. A rebuild first seeds each document's
register above the version the generation readers see holds of it, so across the switch no
document goes back. A document whose root row is gone is written
as a deletion at its version. One larger than ``max_document_bytes`` is set aside (a dead letter
naming it and its size) and written as a deletion, never truncated. A kill -9 between ``apply``
and ``flush`` leaves the outbox, flushed at the next start.

Why versions never go back and one version has one content: a change to any row a document is
built from reaches the document (reach inverts assembly's navigation), so it raises the register;
two assemblies at one register read the same rows, and a later one reads later rows.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.api import Op, RetriableError, SinkEvent
from sinks.documents.plan import Plan
from sinks.documents.state import DocumentId, State, at_of

log = logging.getLogger(__name__)
DRAIN_SLICE = 20_000  # documents of shares gained written per ``drain`` (a few seconds)


Refused = list[tuple["Written", str]]
# A target's write of documents: what it refused for good (with why), or a function waiting for that.
Write = Callable[[list["Written"]], "Refused | Callable[[], Refused]"]


@dataclass(frozen=True)
class Written:
    """One document for the target: its id (the root key's values), version, body (its JSON
    object; None: the document is deleted)."""

    document: str
    key: dict[str, Any]
    version: int
    body: bytes | None

    def parsed(self) -> dict[str, Any] | None:
        return None if self.body is None else orjson.loads(self.body)


class Engine:
    def __init__(self, plan: Plan, state: State, max_bytes: int,
                 delete_read: Callable[[str, int, int], bool] = lambda topic, partition, offset: False,
                 dead_letter: Callable[..., None] | None = None,
                 seed: Callable[[int, list[tuple[str, dict[str, Any]]]], list[int | None]] | None = None) -> None:
        self.plan, self.state, self.max_bytes = plan, state, max_bytes
        # The versions a generation of the target holds, for documents (a rebuild's seeding).
        self.seed = seed
        self.tables = plan.topics()
        self.delete_read, self.dead_letter = delete_read, dead_letter
        # Since the start: documents written, written deleted, set aside as too large; row changes stored.
        self.counters = {"documents_written": 0, "documents_deleted": 0, "documents_set_aside": 0, "rows_stored": 0}
        self.building = state.building()
        # A member of a group (sinks/documents/shared.py): the shares whose documents ``flush``
        # writes (None: every document), the shares gained whose waiting documents ``drain``
        # writes first, in slices, and the generation whose versions each document's first
        # write after its share was gained is seeded above (the one it writes).
        self.owned: frozenset[int] | None = None
        self.draining: frozenset[int] = frozenset()
        self._sending: set[tuple[str, bytes, int]] = set()  # outbox entries whose write is in flight
        self.seed_shared: int | None = None

    def own(self, shares: frozenset[int], generation: int) -> None:
        """A member of a group writes the documents of ``shares`` from now on (shared.py). After
        a share is gained, each document's first write is seeded above the version generation
        ``generation`` of the target holds (its previous owner counted its own registers)."""
        held = (self.owned or frozenset()) | self.draining
        gained = shares - held
        if self.owned is None or gained:
            self.state.unseed()
        self.draining = (self.draining & shares) | gained
        self.owned = ((self.owned or frozenset()) & shares) - self.draining
        self.seed_shared = generation

    def drain(self, write: Write, most: int = DRAIN_SLICE) -> bool:
        """Write at most ``most`` of the documents waiting in the shares gained (``own``); once
        none waits, those shares are written as the others are. True while some wait."""
        if self.draining and not self.flush(write, min(2000, most), draining=True, most=most):
            assert self.owned is not None
            self.owned, self.draining = self.owned | self.draining, frozenset()
        return bool(self.draining)

    def apply(self, events: Sequence[SinkEvent]) -> int:
        """Store ``events`` and put the documents they reach in the outbox; returns how many.
        While the state is building (a new generation's load, ``finish_building``), only store."""
        state = self.state
        reached: dict[DocumentId, tuple[int, tuple[str, int, int]]] = {}
        nexts: dict[tuple[str, int], int] = {}
        apply_run = self._load_run if self.building else self._apply_run
        try:
            state.begin()
            try:
                run: list[tuple[str, SinkEvent]] = []
                for event in events:
                    at = (event.topic, event.partition)
                    nexts[at] = max(nexts.get(at, 0), event.offset + 1)
                    table = self.tables.get(event.topic)
                    if table is None:
                        continue
                    if event.op is Op.TRUNCATE or event.version is None or (
                            self.building and (event.source or {}).get("unchanged_toast")):
                        apply_run(run, reached)  # rare: one at a time, in order
                        run = []
                        for doc in self._apply(table, event):
                            _note(reached, doc, event)
                    else:
                        run.append((table, event))
                apply_run(run, reached)
                if self.building:
                    reached.clear()  # every document is written once, when the load ends
                state.bump(reached)
                state.advance(nexts)
                state.commit()
            except BaseException:
                state.rollback()
                raise
        except sqlite3.Error as err:  # the state's file: disk full, locked, unreadable
            raise RetriableError(f"documents state {state.path}: {err}") from err
        return len(reached)

    def _apply_run(self, run: list[tuple[str, SinkEvent]], reached: dict) -> None:
        """Versioned changes, set at a time: each key's last change of the run, if newer than the
        state's row. A document whose assembly differs between the state before the run (S0) and
        after it (S1) reads, in S0, some row the run changed (else it would read the same rows in
        S1); so the documents each changed row belonged to in S0, and those it belongs to in S1,
        are all the run reaches (reach inverts assembly in one state). A key changed many times
        in a batch (a product in thousands of orders) is walked twice, not twice per change."""
        if not run:
            return
        state = self.state
        last: dict[tuple[str, bytes], SinkEvent] = {}
        for table, event in run:
            pk = self.plan.tables[table].key_of(event.key or {})
            if pk is not None:
                last[(table, pk)] = event  # the log's order per key: the last one is the newest
        state.prefetch(last)
        changes: list[tuple[str, bytes, SinkEvent, dict[str, Any] | None]] = []
        for (table, pk), event in last.items():
            version = event.version
            assert version is not None
            old = state.row(table, pk)
            if old is not None and old[0] >= version:
                continue  # a replay, or older than what the state has
            watermark = state.truncated(table)
            if watermark is not None and version < watermark:
                continue
            was = None if old is None or old[1] else old[2]
            if was is not None:
                for doc in state.documents_of(table, was):  # S0
                    _note(reached, doc, event)
            changes.append((table, pk, event, _row(event, was)))
        state.put_many([(table, pk, event.version or 0, row, at_of(event.partition, event.offset))
                        for table, pk, event, row in changes])
        self.counters["rows_stored"] += len(changes)
        for table, _, event, row in changes:
            if row is not None:
                for doc in state.documents_of(table, row):  # S1
                    _note(reached, doc, event)

    def _load_run(self, run: list[tuple[str, SinkEvent]], reached: dict) -> None:
        """A building state's versioned changes: stored where newer than the state's row of
        their key, decided by the statement itself (nothing read first, nothing reached)."""
        if not run:
            return
        state, tables = self.state, self.plan.tables
        by_table: dict[str, list[tuple[Any, ...]]] = {}
        encoders: dict[str, Callable[..., tuple[Any, ...]]] = {}
        for table, event in run:
            pk = tables[table].key_of(event.key or {})
            version = event.version
            assert version is not None
            if pk is None:
                continue
            watermark = state.truncated(table)
            if watermark is not None and version < watermark:
                continue
            encode = encoders.get(table)
            if encode is None:
                encode = encoders[table] = state.encoder(table)
                by_table[table] = []
            # No unchanged_toast here (apply() routes those events to _apply): the row as it came.
            by_table[table].append(encode(pk, version, _after(event), at_of(event.partition, event.offset)))
        for table, values in by_table.items():
            self.counters["rows_stored"] += state.load(table, values)

    def finish_building(self) -> int:
        """The load is over: every document into the outbox (the next ``flush`` writes them)."""
        if not self.building:
            return 0
        try:
            count = self.state.finish_building()
        except sqlite3.Error as err:
            raise RetriableError(f"documents state {self.state.path}: {err}") from err
        self.building = False
        return count

    def _apply(self, table: str, event: SinkEvent) -> set[DocumentId]:
        state, tplan = self.state, self.plan.tables[table]
        if event.op is Op.TRUNCATE:
            # One without a version (a record from before versions): everything the state holds
            # of the table is older than it.
            at = event.version if event.version is not None else state.newest(table) + 1
            out: set[DocumentId] = set()
            for dead in state.truncate(table, at):
                if not self.building:  # a building state reaches nothing (its indexes are not made yet)
                    out |= state.documents_of(table, dead)
            return out
        pk = tplan.key_of(event.key or {})
        if pk is None:
            return set()
        version = event.version
        old = state.row(table, pk)
        if version is None:  # a tombstone from before records had headers (cdc/sink_event.py)
            if old is None or old[1] or self.delete_read(event.topic, event.partition, event.offset):
                return set()
            version = old[0]
        elif old is not None and old[0] >= version:
            return set()  # a replay, or older than what the state has
        watermark = state.truncated(table)
        if watermark is not None and version < watermark:
            return set()
        was = None if old is None or old[1] else old[2]
        row = _row(event, was)
        out = set() if was is None or self.building else state.documents_of(table, was)
        state.put(table, pk, version, row, at_of(event.partition, event.offset))
        self.counters["rows_stored"] += 1
        if row is not None and not self.building:
            out |= state.documents_of(table, row)
        return out

    def flush(self, write: Write, chunk: int = 2000, *, draining: bool = False, most: int | None = None) -> bool:
        """Write the outbox (see the module docstring), ``chunk`` documents at a time: a
        member's, those of its shares (``draining``: of the shares it gained, at most about
        ``most``; returns True when some are left). ``write`` returns the documents the target
        refused for good, with its reason (set aside, as a dead letter each), or a function that
        waits for the write and returns them: the next chunk is assembled while the target takes
        one (chunks hold different documents)."""
        return self._flush(write, chunk, self.draining if draining else self.owned, most, hold=False)[0]

    def submit(self, write: Write, chunk: int = 2000) -> Callable[[], None] | None:
        """``flush`` up to the last chunk handed to ``write``: returns what waits for it (None:
        nothing was written). A document whose write is in flight is not written again meanwhile;
        it leaves the outbox when that write ends."""
        return self._flush(write, chunk, self.owned, None, hold=True)[1]

    def _flush(self, write: Write, chunk: int, owned: frozenset[int] | None, most: int | None,
               hold: bool) -> tuple[bool, Callable[[], None] | None]:
        after: DocumentId | None = None
        waiting: Callable[[], None] | None = None
        started, more = 0, False
        try:
            while True:
                if most is not None and started >= most:
                    more = bool(self.state.outbox(1, after, owned))
                    break
                pending = self.state.outbox(chunk, after, owned)
                if not pending:
                    break
                generation = self.state.seed_from()
                if generation is None:
                    generation = self.seed_shared
                if generation is not None and self.seed is not None:  # versions go on from what the target holds
                    need = self.state.unseeded((doc, doc_id) for doc, doc_id, _, _ in pending)
                    if need:
                        self.state.seed(need, self.seed(generation, [(doc, self._key(doc, doc_id))
                                                                     for doc, doc_id in need]))
                        pending = self.state.outbox(chunk, after, owned)  # the same, at their seeded versions
                after = (pending[-1][0], pending[-1][1])
                if self._sending:
                    pending = [p for p in pending if (p[0], p[1], p[2]) not in self._sending]
                    if not pending:
                        continue
                started += len(pending)
                previous, waiting = waiting, self._start(pending, write)
                if previous is not None:
                    previous()
        except BaseException:
            if waiting is not None:  # the chunk in flight ends first; the error raised is the first one
                try:
                    waiting()
                except Exception:  # noqa: BLE001 - logged; the first error goes on
                    log.exception("documents: a write in flight failed too")
            raise
        if hold:
            return more, waiting
        if waiting is not None:
            waiting()
        return more, None

    def _start(self, pending: list[tuple[str, bytes, int, tuple[str, int, int]]], write: Write) -> Callable[[], None]:
        """``pending`` assembled and handed to ``write``; returns what ends it (waits for the
        target, sets the refused aside, takes the written out of the outbox)."""
        try:
            with self.state.reading():
                built = self.state.assembled((doc, doc_id) for doc, doc_id, _, _ in pending)
                self.state.warm((doc, doc_id) for doc, doc_id, _, _ in pending if (doc, doc_id) not in built)
                out = self._assemble(pending, built)
        except sqlite3.Error as err:
            raise RetriableError(f"documents state {self.state.path}: {err}") from err
        sending = {(doc, doc_id, version) for doc, doc_id, version, _ in pending}
        answer = write(out)
        self._sending |= sending

        def end() -> None:
            try:
                refused = answer() if callable(answer) else answer
                for written, reason in refused:
                    self._set_aside(*self._origin(pending, written), written.document, written.key,
                                    f"document {written.document} refused by the target: {reason}")
                self.counters["documents_written"] += sum(1 for w in out if w.body is not None)
                self.counters["documents_deleted"] += sum(1 for w in out if w.body is None)
                self.state.written(sending)
            finally:  # written, or left in the outbox for the next flush
                self._sending -= sending
        return end

    def _assemble(self, pending: list[tuple[str, bytes, int, tuple[str, int, int]]],
                  built: dict[DocumentId, bytes | None]) -> list[Written]:
        """``pending``'s documents: as ``built`` (by SQL, state.assembled) or assembled here."""
        out: list[Written] = []
        for doc, doc_id, version, (topic, part, off) in pending:
            key = self._key(doc, doc_id)
            try:
                body = built[(doc, doc_id)] if (doc, doc_id) in built else self.state.assemble(doc, doc_id)
            except sqlite3.Error:
                raise
            except Exception as err:  # noqa: BLE001 - this document alone: set aside, the others written
                self._set_aside(topic, part, off, doc, key, f"document {doc}/{orjson.dumps(list(key.values())).decode()}"
                                f" could not be assembled ({type(err).__name__}: {err}); left as it was, until "
                                f"a change of it assembles")
                continue
            if body is not None:
                size = len(body)
                if size > self.max_bytes:
                    self._set_aside(topic, part, off, doc, key, f"document {doc}/{orjson.dumps(list(key.values())).decode()}"
                                    f": {size} bytes, more than max_document_bytes {self.max_bytes}; set aside, "
                                    f"written as deleted until a change makes it fit")
                    self.counters["documents_set_aside"] += 1
                    body = None
            out.append(Written(doc, key, version, body))
        return out

    def _key(self, doc: str, doc_id: bytes) -> dict[str, Any]:
        root = self.plan.nodes[self.plan.roots[doc]]
        return dict(zip(self.plan.tables[root.table].key, orjson.loads(doc_id), strict=True))

    def _origin(self, pending: list, written: Written) -> tuple[str, int, int]:
        for doc, doc_id, _, origin in pending:
            if doc == written.document and self._key(doc, doc_id) == written.key:
                return origin
        return "", -1, -1

    def _set_aside(self, topic: str, part: int, off: int, doc: str, key: dict[str, Any], reason: str) -> None:
        log.warning("documents: %s", reason)
        if self.dead_letter is not None:
            self.dead_letter(topic, part, off, reason, key=orjson.dumps({"document": doc, "id": key}))


def _after(event: SinkEvent) -> Mapping[str, Any] | None:
    """The row an event leaves as it carries it (None: the key is deleted)."""
    if event.op not in (Op.CREATE, Op.UPDATE, Op.READ):
        return None
    after = event.after
    return orjson.loads(after) if isinstance(after, (bytes, bytearray, memoryview)) else (after or {})


def _row(event: SinkEvent, was: dict[str, Any] | None) -> dict[str, Any] | None:
    """The row an event leaves (None: the key is deleted). Columns the source names in
    ``source.unchanged_toast`` (a large value an update left as it was, which the source had no
    copy of) keep the value the state has."""
    after = _after(event)
    if after is None:
        return None
    row = dict(after)
    unchanged = (event.source or {}).get("unchanged_toast")
    if unchanged and was is not None:
        for column in unchanged:
            if column not in row and column in was:
                row[column] = was[column]
    return row


def _note(reached: dict, doc: DocumentId, event: SinkEvent) -> None:
    """``doc`` is reached by ``event``: its highest version so far, and the record it came from."""
    version = event.version or 0
    was = reached.get(doc)
    if was is None or version >= was[0]:
        reached[doc] = (version, (event.topic, event.partition, event.offset))
