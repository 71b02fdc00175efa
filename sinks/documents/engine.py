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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.api import Op, SinkEvent
from sinks.documents.plan import Plan
from sinks.documents.state import DocumentId, State

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Written:
    """One document for the target: its id (the root key's values), version, body (None: the
    document is deleted)."""

    document: str
    key: dict[str, Any]
    version: int
    body: dict[str, Any] | None


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
        self.counters = {"documents": 0, "deleted": 0, "oversized": 0, "rows": 0}

    def apply(self, events: Sequence[SinkEvent]) -> int:
        """Store ``events`` and put the documents they reach in the outbox; returns how many."""
        state = self.state
        reached: dict[DocumentId, tuple[int, tuple[str, int, int]]] = {}
        nexts: dict[tuple[str, int], int] = {}
        state.begin()
        try:
            for event in events:
                at = (event.topic, event.partition)
                nexts[at] = max(nexts.get(at, 0), event.offset + 1)
                table = self.tables.get(event.topic)
                if table is None:
                    continue
                for doc in self._apply(table, event):
                    version = event.version or 0
                    was = reached.get(doc)
                    if was is None or version >= was[0]:
                        reached[doc] = (version, (event.topic, event.partition, event.offset))
            state.bump(reached)
            state.advance(nexts)
            state.commit()
        except BaseException:
            state.rollback()
            raise
        return len(reached)

    def _apply(self, table: str, event: SinkEvent) -> set[DocumentId]:
        state, tplan = self.state, self.plan.tables[table]
        if event.op is Op.TRUNCATE:
            if event.version is None:
                return set()
            out: set[DocumentId] = set()
            for dead in state.truncate(table, event.version):
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
        row: dict[str, Any] | None = None
        if event.op in (Op.CREATE, Op.UPDATE, Op.READ):
            after = event.after
            row = orjson.loads(after) if isinstance(after, (bytes, bytearray, memoryview)) else dict(after or {})
            assert row is not None
        out = set() if old is None or old[1] or old[2] is None else state.documents_of(table, old[2])
        state.put(table, pk, version, row)
        self.counters["rows"] += 1
        if row is not None:
            out |= state.documents_of(table, row)
        return out

    def flush(self, write: Callable[[list[Written]], list[tuple[Written, str]]]) -> None:
        """Write the outbox (see the module docstring); ``write`` returns the documents the
        target refused for good, with its reason (set aside, as a dead letter each)."""
        pending = self.state.outbox()
        if not pending:
            return
        generation = self.state.seed_from()
        if generation is not None and self.seed is not None:  # versions go on from the generation readers see
            need = self.state.unseeded((doc, doc_id) for doc, doc_id, _, _ in pending)
            if need:
                self.state.seed(need, self.seed(generation, [(doc, self._key(doc, doc_id)) for doc, doc_id in need]))
                pending = self.state.outbox()
        with self.state.reading():
            out = self._assemble(pending)
        for written, reason in write(out):
            self._set_aside(*self._origin(pending, written), written.document, written.key,
                            f"document {written.document} refused by the target: {reason}")
        self.counters["documents"] += sum(1 for w in out if w.body is not None)
        self.counters["deleted"] += sum(1 for w in out if w.body is None)
        self.state.written((doc, doc_id, version) for doc, doc_id, version, _ in pending)

    def _assemble(self, pending: list[tuple[str, bytes, int, tuple[str, int, int]]]) -> list[Written]:
        out: list[Written] = []
        for doc, doc_id, version, (topic, part, off) in pending:
            key = self._key(doc, doc_id)
            body = self.state.assemble(doc, doc_id)
            if body is not None:
                size = len(orjson.dumps(body))
                if size > self.max_bytes:
                    self._set_aside(topic, part, off, doc, key, f"document {doc}/{orjson.dumps(list(key.values())).decode()}"
                                    f": {size} bytes, more than max_document_bytes {self.max_bytes}; set aside, "
                                    f"written as deleted until a change makes it fit")
                    self.counters["oversized"] += 1
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
