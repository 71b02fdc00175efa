"""A batch of sink events, reduced to at most one action per (topic, key).

Events arrive in log order per partition, and a key's events are all in one partition, so a key's
versions increase along the batch. Only the newest version of a key can matter (every write is
guarded by version), so the reduction keeps it and drops the rest before any SQL runs: one
statement row per key, which is also what ``ON CONFLICT DO UPDATE`` needs (it refuses to touch a
row twice in one statement).

Per key the result is one of:

* an upsert (the newest event is r/c/u),
* a delete (the newest event is d, or a tombstone with a version: its delete's, from its header,
  cdc.api.SinkEvent): remembered, and the row removed (``soft_delete``: marked) if its version is
  older; a row at a newer version (inserted again after the delete) stays, whatever was replayed,
* a tombstone without a version (written before records had headers: the key's last record in
  the batch is such a tombstone, and the runtime did not read its delete: ``delete_read``): the
  row is removed whatever its version; if a delete came before it, that delete is kept as well,
  to be remembered. One whose delete was read (in this batch,
  an earlier one, or the run whose commit this one resumed from) is dropped: the delete does the
  work, guarded by its version, and a row the table holds at a newer version comes from a later
  record (a replay after a crash between a write and its commit). Removing it, or marking it
  deleted at its own version (``soft_delete``), would lose it: the replayed row, at an equal
  version, is refused (cdc.api.SinkContext.delete_read).

A truncate is table-wide: the newest truncate version of the batch becomes the table's watermark,
and the upserts and deletes under it are dropped later (in ``sink``), against the stored watermark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from cdc.api import Op, SinkEvent

# Only a tombstone written before records had headers has none (the runtime's decoding,
# cdc/sink_events.py); reduce_events keeps those apart, in ``tombstones``.
_NO_VERSION = "a change event without a version"


def version_of(change: SinkEvent) -> int:
    """The version of a change (an upsert or delete of ``TopicChanges``: every one has one)."""
    version = change.version
    assert version is not None, _NO_VERSION
    return version


@dataclass(slots=True)
class TopicChanges:
    topic: str
    first: SinkEvent              # the first event with a source block (names the table)
    upserts: dict[bytes, SinkEvent] = field(default_factory=dict)
    deletes: dict[bytes, SinkEvent] = field(default_factory=dict)
    tombstones: dict[bytes, dict[str, Any]] = field(default_factory=dict)  # key_json -> key
    truncate: int | None = None                                # the newest truncate's version

    def __len__(self) -> int:
        return len(self.upserts) + len(self.deletes) + len(self.tombstones)

    def split(self, parts: int) -> list[TopicChanges]:
        """The changes in ``parts`` pieces with no key in two of them (a key's upsert, delete and
        tombstone stay together), for applying the pieces at once on several connections. A
        truncate is table-wide: the caller splits only changes without one."""
        pieces = [TopicChanges(self.topic, self.first) for _ in range(parts)]
        for name in ("upserts", "deletes", "tombstones"):
            into = [getattr(piece, name) for piece in pieces]
            for key, value in getattr(self, name).items():
                into[hash(key) % parts][key] = value
        return pieces

    def materialize(self) -> None:
        """Decode the upserts' rows the runtime left as JSON bytes (``SqlSink.raw_rows``): for the
        paths that read values one by one (types inferred from values, renamed columns, other
        dialects, naming a bad value)."""
        loads = orjson.loads
        for key, event in self.upserts.items():
            if event.after.__class__ is bytes:
                self.upserts[key] = event._replace(after=loads(event.after))


def reduce_events(events: list[SinkEvent], delete_read=lambda topic, partition, offset: False
                  ) -> dict[str, TopicChanges]:
    """Per topic, the newest action per key (see the module docstring); ``delete_read`` is the
    runtime's ``SinkContext.delete_read``."""
    by_topic: dict[str, TopicChanges] = {}
    newest_by_topic: dict[str, dict[bytes, SinkEvent]] = {}
    dumps = orjson.dumps
    truncate_op, delete_op = Op.TRUNCATE, Op.DELETE
    changes: TopicChanges | None = None
    newest: dict[bytes, SinkEvent] = {}
    tombstones: dict[bytes, dict[str, Any]] = {}
    for event in events:
        if changes is None or event.topic != changes.topic:  # batches come in runs of one topic: look it up once per run
            topic = event.topic
            changes = by_topic.get(topic)
            if changes is None:
                changes = by_topic[topic] = TopicChanges(topic, event)
                newest_by_topic[topic] = {}
            newest, tombstones = newest_by_topic[topic], changes.tombstones
        if not changes.first.source and event.source:
            changes.first = event  # a tombstone has no source block to name the table
        op, version = event.op, event.version
        if op is truncate_op:
            assert version is not None, _NO_VERSION
            if changes.truncate is None or version > changes.truncate:
                changes.truncate = version
            continue
        key = dumps(event.key)
        if op is None:
            if version is None:
                if not delete_read(event.topic, event.partition, event.offset):
                    tombstones[key] = event.key
                continue
            event = event._replace(op=delete_op)  # versioned: its delete, guarded like one
        assert version is not None, _NO_VERSION
        before = newest.get(key)
        if before is None or version > version_of(before):
            newest[key] = event
            if tombstones:
                tombstones.pop(key, None)
    for topic, changes in by_topic.items():
        upserts, deletes, tombstones = changes.upserts, changes.deletes, changes.tombstones
        for key, event in newest_by_topic[topic].items():
            if event.op is delete_op:
                deletes[key] = event
            elif key not in tombstones:
                upserts[key] = event
    return by_topic
