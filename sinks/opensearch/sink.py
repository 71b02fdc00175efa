"""``type: opensearch``: keep one OpenSearch index per table in sync with its topic.

Threading: one thread calls ``start``, ``write``, the generation methods and ``stop``; they
block on OpenSearch. ``write`` runs up to ``bulk_concurrency`` bulk requests at once on a pool of
its own.

A write (see cdc/sink_event.py for the semantics it implements):

1. ``documents.reduce``: the newest action per (topic, _id).
2. Per topic, its index (``indexes.IndexCatalog``): created on first sight with the mapping made
   from the table's schema record, behind its alias; a newer schema record adds new fields live;
   a change the mapping cannot follow, or a change of the user's mappings/settings, is handled
   by ``schema_policy`` (``rebuild`` by default: ``RebuildRequired``, and the runtime rebuilds
   into a new generation).
3. A truncate clears the index of documents older than its version and remembers the version.
4. Tombstone records without a delete in the batch are resolved against the index (mget),
   unless the runtime read their delete (``SinkContext.delete_read``; see tombstones.py).
5. The bulk items and their NDJSON, made in one pass (lines.py; C where built; there a row the
   runtime left as its JSON bytes, ``raw_rows``, becomes its document without a dict), a
   request's worth at a time, each sent as soon as it is made (bulk.py ``sending``: the node
   indexes the first requests while the rest is encoded), after every topic's index is
   prepared: versioned ``index`` items. The write has returned once every item is written,
   refused as not newer (409, counted), or refused for good; OpenSearch acknowledges a bulk item
   only once it is in the translog, which is fsynced per request by default, so it is durable.
   A document refused for good (a mapping error) goes to the dead-letter topic alone, with
   OpenSearch's reason (``context.dead_letter``; the record's value is the event re-encoded);
   the rest of the batch is written. With ``on_poison: stop`` the write raises instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import orjson

from cdc.api import (
    DescribedSink,
    MaintainedSink,
    PermanentError,
    PipelinedSink,
    ReadableSink,
    RebuildableSink,
    RetriableError,
    Sink,
    SinkEvent,
    StoredRow,
    page,
)
from sinks.documents.declaration import not_kept_yet
from sinks.opensearch.bulk import BulkWriter, Item, Sending
from sinks.opensearch.client import make_client
from sinks.opensearch.config import OpenSearchSinkConfig
from sinks.opensearch.documents import Tombstone, reduce
from sinks.opensearch.errors import shown, translating
from sinks.opensearch.generations import Generations
from sinks.opensearch.indexes import IndexCatalog
from sinks.opensearch.lines import RAW as RAW_ROWS
from sinks.opensearch.lines import encode as encode_items
from sinks.opensearch.reading import key_of
from sinks.opensearch.reading import read_keys as _read_keys
from sinks.opensearch.reading import read_range as _read_range
from sinks.opensearch.reading import stored_forms as _stored_forms
from sinks.opensearch.tombstones import live_versions, purge, retention_hours, tombstone_body

log = logging.getLogger(__name__)


def _envelope(event: SinkEvent) -> bytes:
    """The event as an envelope again, for the dead letters (the record's own bytes are not kept;
    a row left as JSON bytes, ``raw_rows``, is decoded first, so the envelope is the same either way)."""
    after = orjson.loads(event.after) if type(event.after) is bytes else event.after
    return orjson.dumps({"before": event.before, "after": after, "op": event.op, "ts_ms": event.ts_ms,
                         "source": event.source})


class OpenSearchSink(Sink, RebuildableSink, DescribedSink, PipelinedSink, MaintainedSink, ReadableSink):
    """See the module docstring. Generations: ``current_generation``, ``open_generation``,
    ``switch_generation``, ``drop_generation`` (generations.py)."""

    config_model = OpenSearchSinkConfig
    # `cdc bootstrap` fills a new generation and switches the aliases once it caught up, so
    # readers never query a half-filled index.
    bootstrap_by_rebuild = True
    # Upserts' rows may come as their JSON bytes (cdc.api.Sink.raw_rows) where the C loop of
    # lines.py makes documents from them: no dict per row, in the runtime or here.
    raw_rows = RAW_ROWS

    @classmethod
    def class_for(cls, config: Any) -> type[Sink]:
        if getattr(config, "documents", None) is not None:
            from sinks.opensearch.doc_sink import OpenSearchDocumentSink

            return OpenSearchDocumentSink
        return cls

    def __init__(self, config: OpenSearchSinkConfig, generation: int | None = None) -> None:
        super().__init__(config, generation)
        not_kept_yet(config.name, config.documents)
        self.config: OpenSearchSinkConfig = config
        # The parts do no I/O until start(): the client connects on its first request.
        self.client = make_client(config)
        self.key_fields: dict[str, str] = {}  # for cdc verify's ranges (reading.py)
        self.generations = Generations(self.client, config.name)
        self.catalog = IndexCatalog(self.client, config, self.generations, lambda *args: self.schema_for(*args))
        self.bulk = BulkWriter(self.client, max_docs=config.bulk_max_docs, max_bytes=config.bulk_max_bytes,
                               concurrency=config.bulk_concurrency, what=f"opensearch sink {config.name}",
                               hosts=config.hosts)
        self.counters = {"written": 0, "conflicts": 0, "refused": 0}
        self._running = False
        self._next_drop_check = 0.0
        self._next_purge = 0.0

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        config = self.config
        with self._errors("start"):
            self.generations.load()
        self.bulk.open()
        self._running = True
        log.info("opensearch sink %s: started on %s, writing generation %s", config.name, shown(config.hosts),
                 self.generation if self.generation is not None else f"{self.generations.state.current} (current)")

    def stop(self) -> None:
        if self._running:
            self._running = False
            self.bulk.close()
            self.client.close()

    def _started(self) -> None:
        if not self._running:
            raise PermanentError(f"opensearch sink {self.config.name}: not running (call start() first)")

    def _writing(self) -> int:
        return self.generation if self.generation is not None else self.generations.state.current

    # --- writing --------------------------------------------------------------------------------

    def write(self, events: list[SinkEvent]) -> None:
        if not events:
            return
        self._started()
        with self._errors("write"):
            sending, count = self._send(reduce(events), self._writing())
        self._finish(sending, count)

    def submit(self, events: list[SinkEvent]) -> SubmittedWrite | None:
        """``write`` up to the requests handed to the bulk pool (cdc.api.PipelinedSink); None,
        having sent nothing, unless the batch is a plain write: every topic's index prepared
        already in the shape the rows name, no truncate, and no tombstone to resolve against the
        index (its mget reads what the writes before it left: those must have landed, and a
        batch written again after a later one must not read the later one's documents). A
        tombstone whose delete the runtime read (``_delete_read``: in this batch, one before it,
        a batch cut between the two records included) needs nothing: that delete is written with
        its version, as when both are in one batch (``documents.reduce``)."""
        if not events:
            return SubmittedWrite(self, None, 0)
        self._started()
        generation = self._writing()
        with self._errors("write"):
            reduced = reduce(events)
            for topic, changes in reduced.items():
                self.shape_of(changes.first)  # the shape the rows name is there (or the wait is over)
                if changes.truncate is not None or not self.catalog.ready(topic, changes.first.source, generation):
                    return None
                lone = [action for action in changes.actions.values() if type(action) is Tombstone]
                if not all(self._delete_read(action) for action in lone):
                    return None
                for action in lone:
                    del changes.actions[action.doc_id]
            submitted = SubmittedWrite(self, *self._send(reduced, generation))
        return submitted

    def _delete_read(self, action: Tombstone) -> bool:
        """Whether the runtime read the delete of this lone tombstone (cdc.api.SinkContext.
        delete_read): then that delete is written with its own version, and a live document the
        index holds for the key came from a later record, which the tombstone must not delete."""
        event = action.event
        return self.context.delete_read(event.topic, event.partition, event.offset)

    @property
    def writes_in_flight(self) -> int:
        return self.config.writes_in_flight

    def _send(self, reduced: dict, generation: int) -> tuple[Sending, int]:
        """The write's requests handed to the bulk pool (see the module docstring); returns them
        with how many documents they carry."""
        items: list[Item] = []
        lines: list[bytes] = []
        # Every topic's index is ready (and a schema change answered) before any document is sent.
        targets = []
        for topic, changes in reduced.items():
            self.shape_of(changes.first)  # the shape the rows name is there (or the wait is over)
            target = self.catalog.prepare(topic, changes.first.source, generation,
                                          following=self.generation is None)
            if changes.truncate is not None:
                self.catalog.truncate(target, changes.truncate)
            targets.append((target, list(changes.actions.values())))
        # Encoded a request's worth at a time, each part sent as soon as it is made: the node
        # indexes the first requests while the rest is encoded, instead of waiting for the
        # whole write's NDJSON (bench/opensearch_sink.py).
        sending = self.bulk.sending(sum(len(actions) for _, actions in targets))
        step = sending.max_docs
        try:
            for target, actions in targets:
                # Upserts and deletes with their NDJSON in one pass (C where built); the
                # tombstones come back: they are resolved against the index first.
                layout = target.layout
                floor = target.truncated_before
                body_of, fields = None if layout.identity else layout.body, layout.raw_fields()
                rest = []
                for start in range(0, len(actions), step):
                    made = len(items)
                    rest += encode_items(actions[start:start + step], target.index, floor, body_of, items, lines,
                                         fields)
                    sending.add(items[made:], lines[made:])
                rest = [action for action in rest if not self._delete_read(action)]
                if rest:
                    made = len(items)
                    live = live_versions(self.client, target.index, [a.doc_id for a in rest])
                    for action in rest:
                        if action.doc_id in live:
                            version = max(live[action.doc_id], action.floor or 0)
                            item = Item(target.index, action.doc_id, version, tombstone_body(version),
                                        action.event, "external_gte")
                            items.append(item)
                            lines.append(item.encode())
                    sending.add(items[made:], lines[made:])
        except BaseException:
            sending.abandon()
            raise
        return sending, len(items)

    def _finish(self, sending: Sending, count: int, *, pipelined: bool = False) -> None:
        """Wait for a write's requests (sent again while refused for now, see bulk.py); the
        documents refused for good go to the dead letters. ``pipelined``: later writes may be in
        flight, so refused documents (whose answer may be a mapping change) raise instead, and
        the runtime writes the batch again with ``write`` once nothing is in flight."""
        with self._errors("write"):
            outcome = sending.finish()
        self.counters["written"] += outcome.written
        self.counters["conflicts"] += outcome.conflicts
        if outcome.refused:
            if pipelined:
                item, reason = outcome.refused[0]
                raise RetriableError(f"opensearch sink {self.config.name}: {item.index}: OpenSearch refused "
                                     f"{len(outcome.refused)} of {count} documents (_id {item.doc_id}: {reason}); "
                                     f"the batch is written again on its own")
            self._set_aside(outcome.refused, count)
        self._maintain()

    def _set_aside(self, refused: list, total: int) -> None:
        """Documents OpenSearch refuses for good: unless the table's schema moved meanwhile (then
        the policy answers, not the documents), each goes to the dead letters with the reason."""
        self.counters["refused"] += len(refused)
        self.catalog.check_refused({item.index for item, _ in refused})
        if self.config.on_poison == "stop":
            item, reason = refused[0]
            raise PermanentError(f"opensearch sink {self.config.name}: {item.index}: OpenSearch refused "
                                 f"{len(refused)} of {total} documents; _id {item.doc_id}: {reason}")
        stats = self.context.stats
        for item, reason in refused:
            event: SinkEvent = item.event
            why = f"OpenSearch refused _id {item.doc_id} in {item.index}: {reason}"
            log.error("opensearch sink %s: %s[%d]@%d: %s; sent to %s", self.config.name, event.topic,
                      event.partition, event.offset, why, self.context.dead_letter_topic)
            self.context.dead_letter(event.topic, event.partition, event.offset, why, orjson.dumps(event.key),
                                     _envelope(event))
            stats.errors += 1
            stats.last_error = why

    def maintain(self) -> None:
        """While caught up (cdc.api.MaintainedSink): a retired generation is dropped when due even
        if no write comes."""
        self._started()
        self._maintain()

    def _maintain(self) -> None:
        """Drop retired generations when due (checked every minute while one waits); purge old
        tombstones (every tenth of their retention, at most hourly)."""
        now = time.monotonic()
        with self._errors("maintenance"):
            if self.generations.state.retired and now >= self._next_drop_check:
                self._next_drop_check = now + 60.0
                self.generations.drop_due()
            if self.generation is None and now >= self._next_purge:
                self._next_purge = now + 3600.0
                for topic, index in self.catalog.current_indexes():
                    hours = self._tombstone_hours(topic)
                    self._next_purge = min(self._next_purge, now + hours * 360.0)
                    if (purged := purge(self.client, index, hours)):
                        log.info("opensearch sink %s: %s: purged %d tombstones older than %s h",
                                 self.config.name, index, purged, hours)

    def _tombstone_hours(self, topic: str) -> float:
        configured = self.config.tombstone_retention_hours
        return retention_hours(configured, None if configured is not None else self.context.delete_retention_ms(topic))

    # --- generations ----------------------------------------------------------------------------

    def current_generation(self) -> int:
        if not self._running:
            return self.generations.state.current  # stopped: the last one known (cdc rebuild prints it)
        with self._errors("current_generation"):
            return self.generations.load().current

    def open_generation(self, generation: int) -> None:
        self._started()
        with self._errors(f"open_generation({generation})"):
            self.generations.open(generation)
        self.catalog.forget()
        self.generation = generation

    def switch_generation(self, generation: int) -> None:
        self._started()
        with self._errors(f"switch_generation({generation})"):
            self.generations.switch(generation, lambda alias, topic: self.catalog.create_empty(
                alias, topic, generation), lambda alias, topic: self.catalog.finish_fill(alias, topic, generation))
        self.catalog.forget()
        self.generation = None  # from now on: follow the current generation (this one)

    def drop_generation(self, generation: int) -> None:
        self._started()
        with self._errors(f"drop_generation({generation})"):
            self.generations.drop(generation, self.config.drop_old_generation_after_s)
        if self.generation == generation:
            self.generation = None

    # --- status ---------------------------------------------------------------------------------

    def describe(self) -> list[dict]:
        """Per index: alias, generation, concrete index, documents readers see, tombstones kept."""
        self._started()
        with self._errors("describe"):
            return self.catalog.describe()

    def read_rows(self, topic: str, after: tuple | None = None, limit: int | None = None) -> list[StoredRow]:
        """The documents readers see for ``topic`` (cdc.api.ReadableSink), each keyed as its
        ``_id`` spells the key (naming.document_id: a composite key's values; a key too long for
        an ``_id`` reads as its digest)."""
        self._started()
        with self._errors("read_rows"):
            documents = self.catalog.documents(topic)
        return page([StoredRow(key_of(doc_id), row) for doc_id, row in documents], after, limit)

    def read_range(self, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
        """One chunk of ``cdc verify`` (cdc.api.ReadableSink; reading.py says what it costs)."""
        self._started()
        with self._errors("read_range"):
            return _read_range(self, topic, after, upto)

    def read_keys(self, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
        self._started()
        with self._errors("read_keys"):
            return _read_keys(self, topic, keys)

    def stored_forms(self, topic: str, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
        return _stored_forms(self, topic, rows)

    # --- errors ---------------------------------------------------------------------------------

    def _errors(self, what: str) -> AbstractContextManager[None]:
        return translating(f"opensearch sink {self.config.name}: {what}", self.config.hosts)


class SubmittedWrite:
    """A write submitted (``OpenSearchSink.submit``): ``wait`` on the sink's thread, after later
    writes may have been submitted, returns once every request of it has (cdc.api.WriteCompletion)."""

    def __init__(self, sink: OpenSearchSink, sending: Sending | None, count: int) -> None:
        self.sink, self.sending, self.count = sink, sending, count

    def wait(self) -> None:
        sending, self.sending = self.sending, None
        if sending is not None:
            self.sink._finish(sending, self.count, pipelined=True)
