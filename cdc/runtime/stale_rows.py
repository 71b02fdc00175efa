"""Stale rows after a snapshot that was taken again.

When a snapshot is taken again (the first one crashed before its end was stored, the slot was
lost, ``snapshot: always``), the topics still hold the rows the earlier snapshot and stream
published. A row deleted in between is in the topic but not in the new snapshot, and no stream
will ever say it is gone. So while a snapshot runs into a topic that already had records, the
runner notes the keys the snapshot publishes; before the snapshot's last batch (whose checkpoint
ends it) it reads the topic up to where it ended when the snapshot began, and publishes a delete
(version: the snapshot's) for every key whose newest record there is a row the new snapshot did
not have. The source names every table the snapshot read (``Batch.snapshot_end``), so a table
that became empty in between gets its deletes too. Topics that were empty at the start cost
nothing.

This is the runtime's side of a repeated snapshot, not the source's: it reads the topics, and a
source never touches the log (it only names, in ``snapshot_end``, what its snapshot read).
"""

from __future__ import annotations

import logging
import time

import orjson

from cdc.events import Batch, ChangeEvent, Op, RowBlock, SnapshotMarker, TableId
from cdc.log.base import Log
from cdc.sink_events import decode_key, decode_value

log = logging.getLogger(__name__)


class _Tracked:
    __slots__ = ("table", "ends", "keys", "version")

    def __init__(self, table: TableId, ends: dict, version: int) -> None:
        self.keys: set[bytes | None] = set()
        self.table, self.ends, self.version = table, ends, version


class StaleRows:
    def __init__(self, log_: Log, topic_of, record_key=None) -> None:
        self.log = log_
        self.topic_of = topic_of  # TableId -> topic name
        # event -> its record key's bytes in the log's format (the encoder's ``record_key``)
        self.record_key = record_key or (lambda event: orjson.dumps(event.key))
        self.tracked: dict[str, _Tracked | None] = {}

    def observe(self, events: list[ChangeEvent]) -> None:
        """Note the keys of the snapshot events in ``events``."""
        record_key = self.record_key
        last_table, entry = None, None
        of_snapshot = (SnapshotMarker.TRUE, SnapshotMarker.LAST)
        if type(events) is RowBlock:  # one table: its rows are made into events only if it is tracked
            topic = self.topic_of(events.table)
            entry = self.tracked[topic] if topic in self.tracked else self._track(topic, events.table, events.version)
            if entry is None:
                return
        for event in events:
            table = event.table
            if table is not last_table:  # by identity: a TableId hash runs Python code
                last_table = table
                topic = self.topic_of(table)
                entry = self.tracked[topic] if topic in self.tracked else self._track(topic, table, event.version)
            # None: the topic was empty when the snapshot began, nothing there can be stale.
            if entry is not None and event.snapshot in of_snapshot:
                entry.keys.add(record_key(event))

    def cover(self, tables: tuple[TableId, ...], version: int) -> None:
        """The snapshot that ends read ``tables``: a table it found empty left no event to note,
        yet every row an earlier attempt left in its topic is stale. Nothing of this snapshot is
        in such a topic, so its end offsets now are where the earlier records end."""
        for table in tables:
            topic = self.topic_of(table)
            if topic not in self.tracked:
                self._track(topic, table, version)

    def _track(self, topic: str, table: TableId, version: int) -> _Tracked | None:
        """Start tracking ``topic`` from its end offsets now; None when it is empty."""
        ends = self.log.end_offsets(topic) if topic in self.log.topics() else {}
        entry = self.tracked[topic] = _Tracked(table, ends, version) if sum(ends.values()) else None
        return entry

    def before_publish(self, batch: Batch) -> list[ChangeEvent]:
        """The deletes to publish before ``batch``: none until the batch that ends a snapshot,
        then one per stale row (see the module docstring). Notes the batch's snapshot keys."""
        events = batch.events
        # An incremental snapshot's rows (``incremental``) are no part of it: it deletes nothing.
        snapshot_rows = bool(events) and events[0].snapshot in (SnapshotMarker.TRUE, SnapshotMarker.LAST)
        if snapshot_rows:
            self.observe(events)
        end = batch.snapshot_end
        if end is None and not (snapshot_rows and self.snapshot_ends(events)):
            return []
        if end is not None:
            self.cover(end.tables, end.version)
        return self.deletes()

    def snapshot_ends(self, events: list[ChangeEvent]) -> bool:
        """Whether ``events`` hold a snapshot's last row. It is the last snapshot event, so only
        streamed events can follow it: look from the end."""
        for event in reversed(events):
            if event.snapshot in (SnapshotMarker.TRUE, SnapshotMarker.LAST):
                return event.snapshot is SnapshotMarker.LAST
        return False

    def deletes(self) -> list[ChangeEvent]:
        """Deletes for the rows the earlier snapshot or stream left that the new one lacks."""
        out: list[ChangeEvent] = []
        now = int(time.time() * 1000)
        for topic, entry in self.tracked.items():
            if entry is None:
                continue
            newest: dict[bytes | None, bool] = {}  # key -> is its newest record a row?
            for record in self.log.read_all(topic):
                if record.offset >= entry.ends.get((record.topic, record.partition), 0):
                    continue
                if record.value is None:
                    newest[record.key] = False
                else:
                    newest[record.key] = decode_value(record.value)["op"] not in ("d", "t")
            stale = [key for key, alive in newest.items() if alive and key not in entry.keys]
            for key in stale:
                key_value = decode_key(key)  # in the json format's forms, whatever the log's format
                out.append(ChangeEvent(Op.DELETE, entry.table, key_value, key_value, None, entry.version, now,
                                       SnapshotMarker.TRUE, {"resnapshot": True}))
            if stale:
                log.warning("%s: %d rows of an earlier snapshot are gone from the new one: deleting them",
                            topic, len(stale))
        self.tracked.clear()
        return out
