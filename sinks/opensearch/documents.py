"""Rows -> document bodies, and a batch -> the newest action per document.

A ``TableLayout`` holds one table's column selection (``include``/``exclude``) and renames, from
the first ``tables:`` entry whose glob matches ``schema.table`` (MySQL: ``db.table``).

``reduce`` keeps, per (alias, _id), only the newest action of a batch: an upsert or a delete by
its ``version``, so one bulk request never carries two writes of a document. A tombstone (the
null record after a delete) with a version (its delete's, from its header) is that delete. One
without (written before records had headers) is dropped when the batch holds the key's delete;
alone, it is kept as a ``Tombstone`` action, resolved against the index (see tombstones.py). A
truncate keeps its version per table: everything older in the batch is dropped.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from cdc import native
from cdc.api import Op
from sinks.opensearch.config import IndexOptions
from sinks.opensearch.naming import MAX_ID_BYTES, document_id

_NO_OPTIONS = IndexOptions()


@dataclass(frozen=True, slots=True)
class TableLayout:
    options: IndexOptions

    @classmethod
    def for_table(cls, tables: dict[str, IndexOptions], qualified: str) -> TableLayout:
        for pattern, options in tables.items():
            if fnmatch.fnmatchcase(qualified, pattern):
                return cls(options)
        return cls(_NO_OPTIONS)

    @property
    def identity(self) -> bool:
        """Whether the document is the row as it is (no include, exclude or rename)."""
        options = self.options
        return options.include is None and not options.exclude and not options.rename

    def keeps(self, column: str) -> bool:
        options = self.options
        return (options.include is None or column in options.include) and column not in options.exclude

    def field_names(self, columns: list[str]) -> dict[str, str]:
        """column -> field name, for the columns the document keeps."""
        return {c: self.options.rename.get(c, c) for c in columns if self.keeps(c)}

    def raw_fields(self) -> tuple | None:
        """The layout for rows as JSON bytes (lines.encode's ``fields``): None when the row is the
        document, else (keep_unknown, column names as UTF-8, their fields as JSON strings or None
        for left out), the columns ``body`` treats by name."""
        if self.identity:
            return None
        options = self.options
        named = dict.fromkeys([*(options.include or ()), *options.exclude, *options.rename])
        fields = tuple(None if not self.keeps(c) else orjson.dumps(options.rename.get(c, c)) for c in named)
        return options.include is None, tuple(c.encode("utf-8", "surrogatepass") for c in named), fields

    def body(self, row: dict[str, Any]) -> dict[str, Any]:
        options = self.options
        if options.include is None and not options.exclude and not options.rename:
            return row
        rename = options.rename
        return {rename.get(c, c): v for c, v in row.items() if self.keeps(c)}


# The actions are tuples: a batch makes one per document, and a frozen dataclass cost about 1 µs
# each where a tuple costs a tenth of that. They differ by class (isinstance), not by fields.
class Upsert(NamedTuple):
    doc_id: str
    version: int
    row: dict[str, Any]
    event: Any


class Delete(NamedTuple):
    doc_id: str
    version: int
    event: Any


class Tombstone(NamedTuple):
    """The key's latest record is a delete, version unknown (a tombstone without a version header,
    whose delete was compacted away)."""

    doc_id: str
    floor: int | None   # the newest version this batch wrote for the key before it, if any
    event: Any


Action = Upsert | Delete | Tombstone


@dataclass(slots=True)
class TopicActions:
    topic: str
    first: Any                                  # an event of the topic (for its source block)
    actions: dict[str, Action]
    truncate: int | None = None                 # the newest truncate's version in the batch


def reduce(events: list) -> dict[str, TopicActions]:
    """topic -> its newest action per document, in the order of the batch. Where setup.py built
    it, ``_lines.c`` runs this loop in C for the common batch (inserts, updates, deletes and
    tombstones keyed by one int or text column) and hands any other batch back to this one, the
    reference (tests/unit/test_opensearch_lines.py compares them)."""
    if _lines is not None and native.enabled() and type(events) is list:
        out = _lines.reduce(events, TopicActions, Op.TRUNCATE, Op.DELETE, Upsert, Delete, Tombstone, MAX_ID_BYTES)
        if out is not None:
            return out
    return _reduce(events)


def _reduce(events: list) -> dict[str, TopicActions]:
    out: dict[str, TopicActions] = {}
    new = tuple.__new__
    for event in events:
        topic = out.get(event.topic)
        if topic is None:
            topic = out[event.topic] = TopicActions(event.topic, event, {})
        op = event.op
        if op is Op.TRUNCATE:
            topic.truncate = event.version if topic.truncate is None else max(topic.truncate, event.version)
            topic.actions = {k: a for k, a in topic.actions.items()
                             if isinstance(a, Tombstone) or a.version >= event.version}
            continue
        doc_id = document_id(event.key)
        previous = topic.actions.get(doc_id)
        if op is None and event.version is None:
            if isinstance(previous, Delete):
                continue
            floor = previous.version if isinstance(previous, Upsert) else (
                previous.floor if isinstance(previous, Tombstone) else None)
            topic.actions[doc_id] = Tombstone(doc_id, floor, event)
            continue
        if topic.truncate is not None and event.version < topic.truncate:
            continue
        if previous is not None and not isinstance(previous, Tombstone) and previous.version >= event.version:
            continue
        if op is Op.DELETE or op is None:  # a tombstone with a version: its delete's
            topic.actions[doc_id] = new(Delete, (doc_id, event.version, event))
        else:
            topic.actions[doc_id] = new(Upsert, (doc_id, event.version, event.after or {}, event))
    return out


_lines = native.load("sinks.opensearch._lines")  # the same loop in C
