"""Whether a tombstone's delete was read: the runner's answer to ``SinkContext.delete_read``.

The capture emits a delete and its tombstone as consecutive records of one partition
(cdc/serde.py ``put_record``). A tombstone carries its delete's version in a header
(cdc/headers.py) and a sink applies it as that delete; this is for tombstones written before
records had headers. Such a tombstone carries no version, so a sink that meets one without
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
  (no gap) and the last record of the partition in the batch read before is at ``c - 1``;
* or the reader was at ``c`` (``c > 0``) and no batch kept ends there: the pass resumed there
  from a commit, made after a write of the records up to ``c - 1`` (a committed offset is always
  a record's offset plus one); that record is fetched from the log to see what it is (when the
  sink asks: about once per partition and pass).

It is the tombstone's delete when it is a delete (``op`` d) of the same key. Anything else (a gap
in the offsets, a record of another key, a poison record, offset 0) says the delete was not read,
and so does a delete this runner sent to the dead letters (by itself or the sink, ``set_aside``)
before the sink asks: the sink resolves the tombstone as before. Not seen: a pipelined write that
asks before an earlier write's delete fails alone, and a delete set aside by the run whose
commit this one resumed from;
then the delete, refused for good, is lost with its tombstone.

Threading: ``note`` and ``committed`` run on the runner's thread, before the batch is handed to
the sink's thread and after its write settled; ``delete_read`` runs on the sink's thread; a lock
keeps them apart (a fetch from the log is made outside it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cdc.events import Op
from cdc.log.base import LogRecord, TopicPartition
from cdc.sink_events import PoisonRecord, SinkEvent, decode_record

_DELETE = Op.DELETE


def _before(events: list[SinkEvent], at: int, topic: str, partition: int) -> SinkEvent | None:
    """The last event of the partition in ``events[:at]``."""
    for index in range(at - 1, -1, -1):
        event = events[index]
        if event.partition == partition and event.topic == topic:
            return event
    return None


class _Batch:
    """A batch noted: its events, where the reader was per partition before it and after it."""

    __slots__ = ("events", "start", "ends", "_where")

    def __init__(self, events: list[SinkEvent], start: dict[TopicPartition, int],
                 ends: dict[TopicPartition, int]) -> None:
        self.events, self.start, self.ends = events, start, ends
        self._where: dict[tuple[str, int, int], int] | None = None

    def holds(self, tp: TopicPartition, offset: int) -> bool:
        return self.start.get(tp, offset + 1) <= offset < self.ends.get(tp, offset)

    def position(self, topic: str, partition: int, offset: int) -> int | None:
        """The index of the event at ``offset`` (an index of the batch made at the first question)."""
        if self._where is None:
            self._where = {(e.topic, e.partition, e.offset): at for at, e in enumerate(self.events)}
        return self._where.get((topic, partition, offset))


class ReadTrail:
    """Nothing is done per event on the hot path: a batch is only kept (until it is committed) and
    looked at when the sink asks about one of its tombstones."""

    def __init__(self, fetch: Callable[[str, int, int], LogRecord | None]) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()  # note and committed (runner's thread) against delete_read (sink's)
        self._batches: list[_Batch] = []  # oldest first: the uncommitted ones and the last committed
        self._committed: dict[TopicPartition, int] = {}
        self._answers: dict[tuple[str, int, int], bool] = {}
        self._set_aside: set[tuple[str, int, int]] = set()  # records sent to the dead letters

    def note(self, events: list[SinkEvent], start: dict[TopicPartition, int], ends: dict[TopicPartition, int],
             settled: dict[TopicPartition, int] | None = None) -> None:
        """A batch read: ``start[tp]`` is where the reader was in the partition before it (the
        committed offset at a pass's start), ``ends[tp]`` after it; ``settled``: the runner's
        positions (the batches below them are let go, see ``committed``)."""
        if settled:
            self.committed(settled)
        if ends:
            with self._lock:
                self._batches.append(_Batch(events, start, ends))

    def forget(self) -> None:
        """Reading starts over from offset 0 (a rebuild): nothing noted counts any more."""
        with self._lock:
            self._batches, self._committed, self._answers, self._set_aside = [], {}, {}, set()

    def let_go(self) -> None:
        """Partitions left this member and every write ended: the batches kept go (a partition
        gone is never committed here again, so ``committed`` would keep its batches for good). A
        tombstone at the first offset read after this is answered from the log, as at a start."""
        with self._lock:
            self._batches = []

    def set_aside(self, topic: str, partition: int, offset: int) -> None:
        """The record at ``offset`` went to the dead letters: a delete there was not applied."""
        with self._lock:
            self._set_aside.add((topic, partition, offset))
            self._answers.pop((topic, partition, offset + 1), None)

    def committed(self, ends: dict[TopicPartition, int]) -> None:
        """Offsets committed: the batches below them are not written again; the newest of them
        stays (the record before the next batch's first tombstone may be its last)."""
        with self._lock:
            self._committed.update(ends)
            committed = self._committed
            done = [b for b in self._batches if all(end <= committed.get(tp, -1) for tp, end in b.ends.items())]
            if len(done) > 1:
                drop = {id(b) for b in done[:-1]}
                self._batches = [b for b in self._batches if id(b) not in drop]
            self._answers = {where: answer for where, answer in self._answers.items()
                             if where[2] >= committed.get((where[0], where[1]), -1)}
            self._set_aside = {where for where in self._set_aside
                               if where[2] >= committed.get((where[0], where[1]), -1) - 1}

    def delete_read(self, topic: str, partition: int, offset: int) -> bool:
        """Whether this sink read the delete of the tombstone at ``offset`` (see the module
        docstring); on the sink's thread."""
        where = (topic, partition, offset)
        with self._lock:
            answer = self._answers.get(where)
            if answer is not None:
                return answer
            if (topic, partition, offset - 1) in self._set_aside:
                return False
            key, prev, ask_log = self._record_before(topic, partition, offset)
        if ask_log:
            record = self._fetch(topic, partition, offset - 1)
            try:
                prev = decode_record(record) if record is not None and record.offset == offset - 1 else None
            except PoisonRecord:
                prev = None
        answer = prev is not None and prev.offset == offset - 1 and prev.op is _DELETE and prev.key == key
        with self._lock:
            self._answers[where] = answer
        return answer

    def _record_before(self, topic: str, partition: int, offset: int
                       ) -> tuple[Any, SinkEvent | None, bool]:
        """(the tombstone's key, the event read just before it in its partition if a batch kept
        holds it, whether to ask the log instead); under the lock."""
        tp = (topic, partition)
        batches = self._batches
        for newest in range(len(batches) - 1, -1, -1):
            batch = batches[newest]
            if batch.holds(tp, offset):
                break
        else:
            return None, None, False  # not a tombstone of a batch read: nothing known
        at = batch.position(topic, partition, offset)
        if at is None:
            return None, None, False
        key = batch.events[at].key
        prev = _before(batch.events, at, topic, partition)
        if prev is not None or offset != batch.start.get(tp) or offset == 0:
            return key, prev, False  # in the batch, or a gap before it
        for older in range(newest - 1, -1, -1):  # the reader was at the tombstone: read before it
            if batches[older].ends.get(tp) == offset:
                prev = _before(batches[older].events, len(batches[older].events), topic, partition)
                if prev is not None and prev.offset == offset - 1:
                    return key, prev, False
                break
        return key, None, True
