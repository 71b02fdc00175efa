"""Read-your-writes: which of a source's positions are fully applied to the store.

The signal is ``<namespace>:applied:<source>``, a version that only ever rises. It must mean
"every change of the source at or before this version is in the store", and the highest version
written is not that signal:

* several partitions are consumed in parallel, so partition 1 may be applied up to version 900
  while partition 0 still has 500 to go;
* even in one partition, versions are not in commit order: PostgreSQL versions are the LSNs of
  the change records, so a long transaction that began early has lower versions than a short one
  that committed before it, and is published after it.

So the sink publishes the version of the source's *stored checkpoint* instead. The runtime stores
a checkpoint only after the log acknowledged every event before it, and a checkpoint is a
transaction boundary in commit order (PostgreSQL: a commit's end LSN; MySQL: the binlog position
just past a commit, in the source's version encoding). When the sink learns of a stored
checkpoint C, it reads the end offsets E of its partitions *after* that (``observe``); once its
committed positions reach E in every partition (``covered``), everything up to C is in the log
before E, hence applied. An application that committed at position P (``pg_current_wal_lsn()``
after its commit, or the MySQL binlog position) waits until the applied version is >= P
(``wait.wait_for``). P is at or after its commit's end, so the wait is sufficient; the source's
heartbeats move C past WAL written by other databases when nothing captured changes.
"""

from __future__ import annotations

from dataclasses import dataclass

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Observation:
    version: int
    ends: dict[TopicPartition, int]


class AppliedTracker:
    """Stored checkpoints waiting for the sink's positions to pass the log ends read after them."""

    def __init__(self) -> None:
        self._pending: dict[str, list[Observation]] = {}
        self._published: dict[str, int] = {}

    def observe(self, source: str, version: int, ends: dict[TopicPartition, int]) -> None:
        """``version``: the source's stored checkpoint; ``ends``: end offsets read after it was stored."""
        if version <= self._published.get(source, -(1 << 63)):
            return
        queue = self._pending.setdefault(source, [])
        if queue and queue[-1].version >= version:
            return
        queue.append(Observation(version, dict(ends)))
        del queue[:-16]  # only the newest few matter; older ones are covered by them

    def covered(self, positions: dict[TopicPartition, int]) -> dict[str, int]:
        """Per source, the newest observed version whose ends ``positions`` (next offsets to read,
        everything before them durable in the store) have reached, if newer than the last one."""
        done: dict[str, int] = {}
        for source, queue in self._pending.items():
            reached = [o for o in queue if all(positions.get(tp, 0) >= end for tp, end in o.ends.items() if end)]
            if reached:
                best = max(o.version for o in reached)
                done[source] = best
                self._published[source] = best
                queue[:] = [o for o in queue if o.version > best]
        return done
