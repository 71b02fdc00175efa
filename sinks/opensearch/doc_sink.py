"""``type: opensearch`` with ``documents:``: joined documents, one index per document behind an
alias of the document's name (sinks/documents/engine.py keeps them; the README says what it
guarantees).

A write: the batch into the state (one SQLite transaction: rows, the documents' registers, the
outbox, the offsets), then the outbox's documents assembled and bulk-written with
``version_type=external`` at their register, a deleted one as a tombstone document (hidden by the
alias filter, as the table sink's deletes: tombstones.py). OpenSearch keeps the highest version,
so a replay never moves a document back.

Generations: a rebuild opens ``<name>__g<N>`` and a state file of its own, whose registers start
from the current generation's so that versions keep growing across the switch; the switch moves
the aliases (generations.py); dropping a generation deletes its indexes and its state file. A
state file that is missing or behind the offsets the sink's group committed (its directory lost)
cannot say which documents the skipped records changed: the sink asks for a rebuild
(``RebuildRequired``), which fills a new generation from the compacted topics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import orjson

from cdc.api import (
    DescribedSink,
    MaintainedSink,
    PermanentError,
    PipelinedSink,
    RebuildableSink,
    Sink,
    SinkEvent,
)
from sinks.documents.engine import Engine, Written
from sinks.documents.keeper import Keeper
from sinks.documents.plan import NodePlan, Plan
from sinks.documents.shared import SharedDocuments
from sinks.opensearch.bulk import BulkWriter, Item, action_line
from sinks.opensearch.client import make_client
from sinks.opensearch.config import OpenSearchSinkConfig
from sinks.opensearch.errors import shown, translating
from sinks.opensearch.generations import Generations
from sinks.opensearch.indexes import FILLING_REFRESH, refresh_back, with_refresh
from sinks.opensearch.mapping import META_PROPERTIES, VERSION_FIELD, field_mapping
from sinks.opensearch.naming import document_id, generation_index
from sinks.opensearch.tombstones import purge, retention_hours, tombstone_body

log = logging.getLogger(__name__)


class OpenSearchDocumentSink(Sink, RebuildableSink, DescribedSink, MaintainedSink, PipelinedSink, SharedDocuments):
    config_model = OpenSearchSinkConfig
    bootstrap_by_rebuild = True

    def __init__(self, config: OpenSearchSinkConfig, generation: int | None = None) -> None:
        super().__init__(config, generation)
        self.config: OpenSearchSinkConfig = config
        self.client = make_client(config)
        self.generations = Generations(self.client, config.name)
        self.bulk = BulkWriter(self.client, max_docs=config.bulk_max_docs, max_bytes=config.bulk_max_bytes,
                               concurrency=config.bulk_concurrency, what=f"opensearch sink {config.name}",
                               hosts=config.hosts)
        self.keeper = Keeper(config.name, config, lambda: self.context, self._held_versions)
        self.indexes: set[int] = set()   # generations whose indexes exist
        self.counters = {"written": 0, "conflicts": 0, "refused": 0}
        self._running = False
        self._next_purge = 0.0

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        with self._errors("start"):
            self.generations.load()
        self.bulk.open()
        self._running = True
        log.info("opensearch sink %s: started on %s, keeping documents %s", self.config.name,
                 shown(self.config.hosts), ", ".join(d.name for d in self.config.documents or []))

    def stop(self) -> None:
        if self._running:
            self._running = False
            self.keeper.close()
            self.bulk.close()
            self.client.close()

    def maintain(self) -> None:
        """While caught up (cdc.api.MaintainedSink): tombstone documents of deleted documents
        older than ``tombstone_retention_hours`` (default: the root topic's delete.retention.ms)
        are deleted, every tenth of it and at most hourly. A replay cannot bring one back: the
        state remembers the delete and refuses older rows, and a document written again gets a
        version above every one before it (a log position, past the tombstone's by far more than
        the one the purge's own delete adds while OpenSearch keeps it, ``index.gc_deletes``)."""
        now = time.monotonic()
        plan = self.keeper.plan
        if self.generation is not None or plan is None or now < self._next_purge:
            return
        self._next_purge = now + 3600.0
        configured = self.config.tombstone_retention_hours
        with self._errors("maintenance"):
            for document in self.config.documents or []:
                topic = plan.tables[plan.nodes[plan.roots[document.name]].table].topic
                hours = retention_hours(configured, None if configured is not None
                                        else self.context.delete_retention_ms(topic))
                self._next_purge = min(self._next_purge, now + hours * 360.0)
                index = generation_index(document.name, self.generations.state.current)
                if (purged := purge(self.client, index, hours)):
                    log.info("opensearch sink %s: %s: purged %d tombstone documents older than %s h",
                             self.config.name, index, purged, hours)

    def _writing(self) -> int:
        return self.generation if self.generation is not None else self.generations.state.current

    def _readers(self) -> int:
        return self.generations.state.current

    # --- writing --------------------------------------------------------------------------------

    def write(self, events: list[SinkEvent]) -> None:
        if not self._running:
            raise PermanentError(f"opensearch sink {self.config.name}: not running (call start() first)")
        generation = self._writing()
        engine = self.keeper.apply(events, generation, self.generations.state.current, self.generation is not None, self.shape_of,
                                   self.config.schema_policy)
        self._flush(engine, generation)
        self.keeper.report(generation)

    def submit(self, events: list[SinkEvent]) -> Submitted | None:
        """``write`` up to the last chunk of documents handed to the bulk writer
        (cdc.api.PipelinedSink): the next batch is stored and its documents assembled while
        OpenSearch indexes this one's. None (a barrier, then ``write``) while the generation's
        indexes are not made yet. Nothing is lost to a kill meanwhile: a document leaves the
        state's outbox only once its write ended."""
        if not self._running:
            raise PermanentError(f"opensearch sink {self.config.name}: not running (call start() first)")
        generation = self._writing()
        if generation not in self.indexes:
            return None
        engine = self.keeper.apply(events, generation, self.generations.state.current, self.generation is not None,
                                   self.shape_of, self.config.schema_policy)
        with self._errors("write"):
            waiting = engine.submit(lambda docs: self._send(docs, generation))
        self.keeper.report(generation)
        return Submitted(self, waiting)

    @property
    def writes_in_flight(self) -> int:
        return self.config.writes_in_flight

    def _flush(self, engine: Engine, generation: int, drain: bool = False) -> bool:
        with self._errors("write"):
            self._ensure_indexes(generation)
            if drain:
                return engine.drain(lambda docs: self._send(docs, generation))
            engine.flush(lambda docs: self._send(docs, generation))
        return False

    def _ensure_indexes(self, generation: int) -> None:
        if generation in self.indexes:
            return
        plan = self.keeper.make_plan()
        for document in self.config.documents or []:
            root = plan.nodes[plan.roots[document.name]]
            properties = {**self._properties(plan, root), **META_PROPERTIES}
            for path, mapping in document.mappings.items():
                _place(properties, path.split("."), mapping)
            settings = dict(document.settings)
            if generation != self.generations.state.current:  # filled unread: refreshed at the switch
                settings = with_refresh(settings, FILLING_REFRESH)
            body = {"settings": settings, "mappings": {"properties": properties}}
            self.generations.ensure_index(document.name, plan.tables[root.table].topic, generation, body)
        self.indexes.add(generation)

    def _properties(self, plan: Plan, node: NodePlan) -> dict[str, Any]:
        assert self.keeper.shapes is not None
        shape = self.keeper.shapes.of(node.table)
        out = {node.rename.get(c.name, c.name): field_mapping(c.type)
               for c in (shape.columns if shape else ()) if node.shows(c.name)}
        for number in node.below:
            below = plan.nodes[number]
            assert below.field is not None
            kind = "nested" if below.nested else "object"
            out[below.field] = {"type": kind, "properties": self._properties(plan, below)}
        return out

    def _held_versions(self, generation: int, docs: list[tuple[str, dict[str, Any]]]) -> list[int | None]:
        """The version generation ``generation`` holds of each document (None: none)."""
        out: list[int | None] = []
        with self._errors("reading the versions of the documents readers see"):
            for start in range(0, len(docs), 1000):
                part = docs[start:start + 1000]
                answer = self.client.mget(body={"docs": [
                    {"_index": generation_index(doc, generation), "_id": document_id(key), "_source": False}
                    for doc, key in part]}, filter_path="docs.found,docs._version,docs.error.type")
                # Every entry keeps "found" or "error" (a missing index): one per document asked.
                answered = answer.get("docs", [])
                if len(answered) != len(part):
                    raise PermanentError(f"opensearch sink {self.config.name}: _mget answered {len(answered)} "
                                         f"documents for {len(part)}")
                out += [found.get("_version") if found.get("found") else None for found in answered]
        return out

    def _send(self, docs: list[Written], generation: int) -> Callable[[], list[tuple[Written, str]]]:
        """The bulk requests of ``docs`` sent; returns what waits for them (the engine assembles
        the next documents meanwhile)."""
        items, lines = [], []
        for doc in docs:
            index, doc_id = generation_index(doc.document, generation), document_id(doc.key)
            if doc.body is None:
                item = Item(index, doc_id, doc.version, tombstone_body(doc.version), doc)
            else:
                item = _item(index, doc_id, doc.version, doc.body, doc)
            items.append(item)
            lines.append(item.encode())
        sending = self.bulk.sending(len(items))
        try:
            sending.add(items, lines)
        except BaseException:
            sending.abandon()
            raise

        def finish() -> list[tuple[Written, str]]:
            with self._errors("write"):
                outcome = sending.finish()
            self.counters["written"] += outcome.written
            self.counters["conflicts"] += outcome.conflicts
            self.counters["refused"] += len(outcome.refused)
            if outcome.refused and self.config.on_poison == "stop":
                item, reason = outcome.refused[0]
                raise PermanentError(f"opensearch sink {self.config.name}: {item.index}: OpenSearch refused "
                                     f"_id {item.doc_id}: {reason}")
            return [(item.event, reason) for item, reason in outcome.refused]
        return finish

    # --- generations ----------------------------------------------------------------------------

    def current_generation(self) -> int:
        if not self._running:
            return self.generations.state.current
        with self._errors("current_generation"):
            return self.generations.load().current

    def open_generation(self, generation: int) -> None:
        with self._errors(f"open_generation({generation})"):
            self.generations.open(generation)
        self.keeper.opened(generation)
        self.indexes.discard(generation)
        self.generation = generation

    def switch_generation(self, generation: int) -> None:
        """Every document written into ``generation``, then the aliases moved. Called again
        after a retriable error (the runtime's rebuild), it resumes: the outbox keeps what is
        not written yet."""
        engine = self.keeper.finish(generation, self.generations.state.current)
        with self._errors(f"switch_generation({generation}): writing its documents"):
            self._ensure_indexes(generation)
            engine.flush(lambda docs: self._send(docs, generation))
        with self._errors(f"switch_generation({generation})"):
            self.generations.switch(generation, lambda alias, topic: None, self._finish_fill)
        self.keeper.switched(generation)
        self.generation = None

    def _finish_fill(self, alias: str, topic: str) -> None:
        """Before readers see it, a generation's index takes the document's refresh_interval
        again (None: OpenSearch's default); it was written without periodic refreshes."""
        assert self.generations.state.open is not None
        document = next(d for d in self.config.documents or [] if d.name == alias)
        refresh_back(self.client, generation_index(alias, self.generations.state.open), dict(document.settings))

    def drop_generation(self, generation: int) -> None:
        with self._errors(f"drop_generation({generation})"):
            self.generations.drop(generation, self.config.drop_old_generation_after_s)
        self.keeper.dropped(generation)
        self.indexes.discard(generation)
        if self.generation == generation:
            self.generation = None

    # --- status ---------------------------------------------------------------------------------

    def describe(self) -> list[dict]:
        """Per document: alias, generation, documents readers see, and the state's rows and bytes."""
        generation = self.current_generation()
        figures = self.keeper.figures(generation)
        out = []
        with self._errors("describe"):
            for document in self.config.documents or []:
                counted = self.client.count(index=document.name, params={"ignore": 404})
                out.append({"alias": document.name, "index": generation_index(document.name, generation),
                            "generation": generation, "documents": counted.get("count"), **figures})
        return out

    def _errors(self, what: str) -> AbstractContextManager[None]:
        return translating(f"opensearch sink {self.config.name}: {what}", self.config.hosts)


class Submitted:
    """A submitted write (cdc.api.WriteCompletion): ``wait`` ends its last chunk."""

    def __init__(self, sink: OpenSearchDocumentSink, waiting: Callable[[], None] | None) -> None:
        self.sink, self.waiting = sink, waiting

    def wait(self) -> None:
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            with self.sink._errors("write"):
                waiting()


def _item(index: str, doc_id: str, version: int, body: bytes, doc: Written) -> Item:
    """The bulk item of an assembled document: its JSON with the version field spliced in, not
    parsed again (a document that has a field of that name already gets it replaced)."""
    if _VERSION_KEY in body:
        return Item(index, doc_id, version, {**orjson.loads(body), VERSION_FIELD: version}, doc)
    field = b"%b:%d}" % (_VERSION_KEY, version)
    source = b"{" + field if body == b"{}" else body[:-1] + b"," + field
    return Item(index, doc_id, version, {}, doc, line=action_line(index, doc_id, version) + source + b"\n")


_VERSION_KEY = orjson.dumps(VERSION_FIELD)


def _place(properties: dict[str, Any], path: list[str], mapping: dict[str, Any]) -> None:
    """A user's mapping at a dotted path, over the generated one."""
    for part in path[:-1]:
        properties = properties.setdefault(part, {"type": "object", "properties": {}}).setdefault("properties", {})
    properties[path[-1]] = mapping
