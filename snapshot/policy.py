"""The snapshot decision: one small policy per ``snapshot:`` mode.

At start a source has a stored position (``None``, a streaming position, or the
``SnapshotProgress`` marker of a snapshot that never finished). The policy turns that into a
``Plan``: take a snapshot (and say where the topics may already be: ``since``), stream from a
position, or do nothing. When the stored position can no longer be streamed from (a lost
replication slot, a purged binlog) the policy says whether a new snapshot heals it.

  stored                  initial / initial_only     when_needed        always       never
  None                    snapshot                   snapshot           snapshot     stream from now
  a position              stream (initial_only:      stream             snapshot     stream
                          finished)
  unfinished snapshot     snapshot again             snapshot again     snapshot     stream from its point
  position lost           PositionLostError          snapshot           -            PositionLostError
  a position, and tables  backfill the new tables    backfill           snapshot     stream
  new to the config       (initial_only: finished)
  unfinished backfill     backfill them again        backfill again     snapshot     stream from its point

A backfill is a snapshot of the new tables only; streaming then resumes at the stored position.

Pure logic, no I/O: tests/unit/test_snapshot_policy.py covers the table above.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cdc.api import SnapshotMode
from cdc.positions import Position, SnapshotProgress


class Step(Enum):
    SNAPSHOT = "snapshot"
    BACKFILL = "backfill"   # a snapshot of ``tables`` only, then streaming from ``position``
    STREAM = "stream"
    FINISH = "finish"


@dataclass(frozen=True, slots=True)
class Plan:
    """``SNAPSHOT``: ``position`` is where the topics may already be (None: nowhere known);
    ``STREAM``: where to stream from (None: the server's current position)."""

    step: Step
    position: Position | None
    why: str
    tables: frozenset[str] = frozenset()  # BACKFILL: the tables to read


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    mode: SnapshotMode

    @property
    def snapshots_on_every_start(self) -> bool:
        return self.mode is SnapshotMode.ALWAYS

    @property
    def snapshots_when_lost(self) -> bool:
        return self.mode is SnapshotMode.WHEN_NEEDED

    @property
    def streams_after_snapshot(self) -> bool:
        return self.mode is not SnapshotMode.INITIAL_ONLY

    def on_start(self, stored: Position | None, new_tables: frozenset[str] = frozenset()) -> Plan:
        """``new_tables``: captured tables the topics are not known to be complete for."""
        mode = self.mode
        if isinstance(stored, SnapshotProgress):
            # Its marker was stored before any of its rows went out: the topics may hold some.
            if mode is SnapshotMode.NEVER:
                return Plan(Step.STREAM, stored.at, "an unfinished snapshot's point (snapshot: never)")
            backfill = frozenset(stored.extra.get("backfill", ()))
            if backfill and mode is not SnapshotMode.ALWAYS:
                return Plan(Step.BACKFILL, stored.at, f"the backfill of {', '.join(sorted(backfill))} did not "
                            "finish", backfill | new_tables)
            return Plan(Step.SNAPSHOT, stored.at, f"the snapshot consistent at {stored.at} did not finish")
        if mode is SnapshotMode.ALWAYS:
            return Plan(Step.SNAPSHOT, stored, "snapshot: always")
        if stored is None:
            if mode is SnapshotMode.NEVER:
                return Plan(Step.STREAM, None, "no stored position (snapshot: never)")
            return Plan(Step.SNAPSHOT, None, "no stored position")
        if mode is SnapshotMode.INITIAL_ONLY:
            return Plan(Step.FINISH, stored, "the initial snapshot is done (snapshot: initial_only)")
        if new_tables and mode is not SnapshotMode.NEVER:
            return Plan(Step.BACKFILL, stored, f"tables new to the source: {', '.join(sorted(new_tables))}",
                        new_tables)
        return Plan(Step.STREAM, stored, "a stored position")

    def on_lost(self, lost: Exception) -> Plan:
        """The stored position cannot be streamed from (``lost``, a PositionLostError): a new
        snapshot where the mode allows one, else ``lost`` is raised."""
        if self.snapshots_when_lost:
            return Plan(Step.SNAPSHOT, None, f"{lost} (snapshot: when_needed)")
        raise lost


def policy_for(mode: SnapshotMode) -> SnapshotPolicy:
    return SnapshotPolicy(mode)
