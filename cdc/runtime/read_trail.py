"""Whether a tombstone's delete was read: the runner's answer to ``SinkContext.delete_read``.

The capture emits a delete and its tombstone as consecutive records of one partition
(cdc/serde.py ``put_record``). A tombstone carries no version, so a sink that meets one without
its delete in the same write resolves it against its store: it deletes the key if the store
holds it live. That is right only when the delete was never read (compacted away while the sink
lagged). If this sink read the delete, the delete is written with its own version (before, in
flight, or in the same batch written in parts), and whatever the store holds live for the key
now can only come from a LATER record: a run killed after writing past the tombstone but before
committing it, replayed with the batches cut elsewhere, or a failed pipelined write written again
after later ones. Resolving the tombstone then deletes that later row at its own version, and the
replay of the row (an equal version) is refused: the row is lost. So the sink asks first.

The record before a tombstone at offset ``c`` was read by this sink when:

* it is the record before the tombstone in its partition in the same batch, at ``c - 1``;
* the tombstone is the first record of its partition in the batch, the reader was at ``c``
  (no gap) and the last record of the partition read in an earlier batch of this pass is at
  ``c - 1``;
* or the pass started at ``c`` (``c > 0``): the offset it resumed from is a commit, made after a
  write of the records up to ``c - 1`` (a committed offset is always a record's offset plus one);
  that record is fetched from the log to see what it is (once per partition and pass at most).

It is the tombstone's delete when it is a delete (``op`` d) of the same key. Anything else (a gap
in the offsets, a record of another key, a poison record set aside, offset 0) says the delete
was not read: the sink resolves the tombstone as before.

Threading: ``note`` and ``committed`` run on the runner's thread, before the batch is handed to
the sink's thread and after its write settled; ``delete_read`` runs on the sink's thread. The
sets are replaced, never changed in place, except by ``add`` (atomic).
"""

from __future__ import annotations

from typing import Any, Callable

from cdc.events import Op
from cdc.log.base import LogRecord, TopicPartition
from cdc.sink_events import PoisonRecord, SinkEvent, decode_record

_DELETE = Op.DELETE


class ReadTrail:
    def __init__(self, fetch: Callable[[str, int, int], LogRecord | None]) -> None:
        self._fetch = fetch
        self._tails: dict[TopicPartition, SinkEvent] = {}  # the last event read per partition
        self._paired: set[tuple[str, int, int]] = set()   # tombstones whose delete was read
        self._resumed: dict[tuple[str, int, int], Any] = {}  # tombstones at a pass's start -> key

    def note(self, events: list[SinkEvent], start: dict[TopicPartition, int]) -> None:
        """A batch read: ``start[tp]`` is where the reader was in the partition before it (the
        committed offset at a pass's start)."""
        tails = self._tails
        last: dict[TopicPartition, SinkEvent] = {}
        for event in events:
            tp = (event.topic, event.partition)
            if event.op is None:
                offset = event.offset
                prev = last.get(tp)
                if prev is None and offset == start.get(tp, -1) and offset > 0:
                    prev = tails.get(tp)
                    if prev is None or prev.offset != offset - 1:  # a new pass: ask the log
                        self._resumed[(event.topic, event.partition, offset)] = event.key
                        prev = None
                if prev is not None and prev.offset == offset - 1 and prev.op is _DELETE and prev.key == event.key:
                    self._paired.add((event.topic, event.partition, offset))
            last[tp] = event
        tails.update(last)

    def delete_read(self, topic: str, partition: int, offset: int) -> bool:
        """Whether this sink read the delete of the tombstone at ``offset`` (see the module
        docstring); on the sink's thread."""
        where = (topic, partition, offset)
        if where in self._paired:
            return True
        key = self._resumed.get(where)
        if key is None:
            return False
        record = self._fetch(topic, partition, offset - 1)
        try:
            before = decode_record(record) if record is not None and record.offset == offset - 1 else None
        except PoisonRecord:
            before = None
        if before is not None and before.op is _DELETE and before.key == key:
            self._paired.add(where)
            return True
        return False

    def committed(self, ends: dict[TopicPartition, int]) -> None:
        """Forget the tombstones below the offsets committed (they are not written again)."""
        def kept(where: tuple[str, int, int]) -> bool:
            return where[2] >= ends.get((where[0], where[1]), -1)
        if self._paired:
            self._paired = {where for where in self._paired if kept(where)}
        if self._resumed:
            self._resumed = {where: key for where, key in self._resumed.items() if kept(where)}
