"""Where a sink's runner reads: its topics, their partitions, how far it has read and committed.

Two offsets per partition:

* ``positions``: where the group's commits stand, as this runner knows them: everything below
  is in the store. While streaming only ``commit`` moves them, after the write of what it covers
  succeeded; a rebuild moves them as its new generation fills (and commits only at its switch).
* ``ahead``: where the reader is, past the commits (batches read whose writes are in flight). A
  partition assigned again keeps its read position, so a batch read ahead of its commit is not
  read twice. When a write fails, ``drop_ahead`` forgets them: what was read past the failed
  batch is read again from the commits (at the next assignment, or a restart).

Reads go through the log's bulk reader where it has one (Kafka: cdc.log.kafka_bulk): a batch
comes as one bytes object and each record becomes its SinkEvent in one C loop
(``decode_packed``), without a confluent-kafka Message and a LogRecord per record. That reader
joins no group and commits nothing: the group's reader still says where to start
(``committed``) and commits each batch's offsets after its write, but is never assigned, so it
fetches nothing. A group member (``scale_out: group``, sink_group.py) needs its reader's polls
for the group's assignments: it reads through that reader. A record that cannot be decoded goes
to ``poison`` (sink_writing.py) as it is read.

Idle (``caught_up``): a poll that read nothing is progress (caught up) only if every partition
is read to the log's end: an empty poll alone proves nothing (a reader assigned nothing polls
nothing for ever, which is how a sink once sat idle after `cdc rebuild` with its health green).
It is checked at most every ``IDLE_CHECK_S``; a partition read to an end whose last offsets were
compacted away has that end committed, so its lag reads 0.

Threading: the runner's thread, except ``trail.delete_read`` (the sink's, read_trail.py).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from cdc.api.stats import ConnectorStats
from cdc.log.base import GroupLog, Log, LogRecord, TopicPartition
from cdc.runtime.read_trail import ReadTrail
from cdc.runtime.sink_group import GroupMembership, HandOver
from cdc.sink_events import SinkEvent, decode_batch, decode_packed
from cdc.topics import table_topics

log = logging.getLogger(__name__)

IDLE_CHECK_S = 2.0   # an idle sink compares where it stands with the log's ends at most this often
STALL_WARN_S = 30.0  # reading nothing for this long while behind is said in the log, once

# (topic, partition, offset, reason, record): a record that cannot be decoded (SinkWriter.poison)
Poison = Callable[[str, int, int, str, LogRecord], None]


def fetch_record(log_: Log, topic: str, partition: int, offset: int) -> LogRecord | None:
    """The record at topic[partition]@offset, or None when the log no longer holds it."""
    reader = log_.reader()
    try:
        reader.assign({(topic, partition): offset})
        for record in reader.poll(1, 5.0):
            if record.offset == offset:
                return record
    finally:
        reader.close()
    return None


class SinkReading:
    """The readers of one run (``open`` to ``close``) and the offsets, which outlive runs."""

    def __init__(self, log_: Log, group: str, config: Any, stats: ConnectorStats, *, poison: Poison,
                 raw_rows: Callable[[], bool],
                 starts: Callable[[list[TopicPartition]], dict[TopicPartition, int]] | None = None) -> None:
        self.log = log_
        # Where a partition not read yet is read from: the group's commits, or what ``starts``
        # says (a shared sink's own state: sink_shares.py).
        self.starts = starts
        self.group = group
        self.config = config
        self.stats = stats
        self._poison = poison
        self._raw_rows = raw_rows  # asked at each batch: a sink may decide it once started
        self.positions: dict[TopicPartition, int] = {}
        self.ahead: dict[TopicPartition, int] = {}
        self.trail = ReadTrail(functools.partial(fetch_record, log_))  # which tombstones' deletes were read
        self.reader: Any = None  # the group's reader (a GroupReader for a member)
        self.membership: GroupMembership | None = None  # while streaming as a group member
        self.batch_bytes = 0  # bytes of record values of the batch read last (cdc_bytes_total)
        self._packed: Any = None  # the log's bulk reader, where it has one (not for a member)
        self._packed_start: dict[TopicPartition, int] | None = None  # assigned at its next poll
        self._idle_next = 0.0
        self._idle_since: float | None = None
        self._stall_warned = False

    def _extra(self) -> dict:
        return {"connector": self.stats.name, "phase": self.stats.phase}

    # -- readers ---------------------------------------------------------------------------------
    def open(self, hand_over: HandOver | None = None) -> None:
        """The readers of a run: with ``hand_over``, as a member of the group (sink_group.py;
        ``hand_over`` runs inside a poll when partitions leave); else the group's reader, and
        the bulk reader where the log has one."""
        if hand_over is not None:
            assert isinstance(self.log, GroupLog)  # SinkRunner refuses scale_out: group on any other log
            self.reader = self.log.member_reader(self.group)
            self.membership = GroupMembership(self.reader, self.group, self.stats, hand_over)
        else:
            self.reader = self.log.reader(self.group)
            self._packed = self.log.bulk_reader()

    def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.close()
        packed, self._packed, self._packed_start = self._packed, None, None
        if packed is not None:
            packed.close()
        self.membership = None

    # -- topics and assignment -------------------------------------------------------------------
    def matching_topics(self) -> list[str]:
        return table_topics(self.log.topics(), self.config.topics)

    def ends(self) -> dict[TopicPartition, int]:
        """The end offsets of every partition of the matching topics."""
        ends: dict[TopicPartition, int] = {}
        for topic in self.matching_topics():
            ends.update(self.log.end_offsets(topic))
        return ends

    def follow(self, from_start: bool, *, fresh: bool = False) -> None:
        """Read the matching topics: subscribe as a group member, or assign every partition."""
        if self.membership is not None:
            self.membership.follow(self.matching_topics())
        else:
            self._assign(self.matching_topics(), from_start, fresh=fresh)

    def _assign(self, topics: list[str], from_start: bool, *, fresh: bool = False) -> None:
        """Read the partitions of ``topics`` not read yet, from the group's committed offsets
        (offset 0 when ``from_start``). ``fresh``: the reader was just opened and reads nothing
        yet, so it is assigned even when no partition is new (positions kept from a rebuild
        before the streaming: without this, the streaming after `cdc rebuild` read nothing for
        ever)."""
        new = []
        for topic in topics:
            for tp in self.log.end_offsets(topic):
                if tp not in self.positions:
                    new.append(tp)
        if not new and self.positions and not fresh:
            return
        committed = {} if from_start else (self.starts or self.reader.committed)(new)
        for tp in new:
            self.positions[tp] = committed.get(tp) or 0
        # Partitions already read keep their read position: a batch read ahead of its commit is
        # not read twice.
        self.assign_from({**self.positions, **self.ahead})

    def assign_from(self, start: dict[TopicPartition, int]) -> None:
        """Read from ``start`` on: through the bulk reader if open (assigned at its next poll, so
        one that is never polled, as in a windowed rebuild, fetches nothing), else the reader."""
        if self._packed is not None:
            self._packed_start = dict(start)
        else:
            self.reader.assign(start)

    def start_over(self, targets: dict[TopicPartition, int]) -> None:
        """Read ``targets``' partitions from offset 0 (a rebuild): nothing read or noted counts."""
        self.positions = {tp: 0 for tp in targets}
        self.ahead = {}
        self.trail.forget()
        self.assign_from(dict(self.positions))

    def go_on_to(self, targets: dict[TopicPartition, int]) -> None:
        """A rebuild's fill goes on to later ends: from the positions reached, partitions new
        since (a topic made meanwhile) from offset 0."""
        for tp in targets:
            self.positions.setdefault(tp, 0)
        self.ahead = {}
        self.assign_from(dict(self.positions))

    def forget(self, gone: set[TopicPartition]) -> None:
        """Partitions ``gone`` left this member, their writes settled: what was read there goes."""
        for tp in gone:
            self.ahead.pop(tp, None)
            self.positions.pop(tp, None)
        self.trail.let_go()

    def drop_ahead(self) -> None:
        """A write failed: what was read past it is read again from the commits."""
        self.ahead = {}

    # -- reading and committing ------------------------------------------------------------------
    def batch(self) -> tuple[list[SinkEvent], dict[TopicPartition, int]]:
        """The next batch, decoded (C where built; a sink with raw_rows gets upserts' rows as JSON
        bytes), and the offsets past it per partition; ``batch_bytes`` its values' bytes."""
        ends: dict[TopicPartition, int] = {}
        raw_rows = self._raw_rows()
        config = self.config
        if self._packed is not None:
            if self._packed_start is not None:
                self._packed.assign(self._packed_start)
                self._packed_start = None
            batch = self._packed.poll(config.batch_size, config.batch_wait_ms / 1000)
            events, poisons, self.batch_bytes = decode_packed(batch, ends, raw_rows)
        else:
            records = self.reader.poll(config.batch_size, config.batch_wait_ms / 1000)
            if self.membership is not None:
                records = self.membership.keep(records)
            events, poisons, self.batch_bytes = decode_batch(records, ends, raw_rows)
        for record, err in poisons:
            self._poison(record.topic, record.partition, record.offset, str(err), record)
        ahead, positions = self.ahead, self.positions
        self.trail.note(events, {tp: ahead.get(tp, positions.get(tp, 0)) for tp in ends}, ends, positions)
        ahead.update(ends)
        return events, ends

    def commit(self, ends: dict[TopicPartition, int]) -> None:
        """Commit ``ends`` (a member: of the partitions it still owns): their writes succeeded."""
        if self.membership is not None:
            ends = self.membership.owned_only(ends)
        self.reader.commit(ends)
        self.positions.update(ends)

    def commit_positions(self) -> None:
        """Commit every position (a rebuild's, at its switch)."""
        self.reader.commit(dict(self.positions))

    def covers(self, ends: dict[TopicPartition, int], targets: dict[TopicPartition, int]) -> bool:
        """True when the positions after a write up to ``ends`` reach every target end."""
        positions = self.positions
        return all(max(ends.get(tp, 0), positions.get(tp, 0)) >= end for tp, end in targets.items())

    def reached(self, targets: dict[TopicPartition, int]) -> bool:
        return all(self.positions.get(tp, 0) >= end for tp, end in targets.items())

    def written_to(self, targets: dict[TopicPartition, int]) -> bool:
        """True when everything up to ``targets`` is written and committed: per partition the
        commits reach the target, or nothing read there is in flight and the reader stands at or
        past it (what lies between was compacted away, or set aside)."""
        positions, ahead = self.positions, self.ahead
        behind = {tp: end for tp, end in targets.items() if positions.get(tp, 0) < end}
        if not behind:
            return True
        if any(ahead.get(tp, 0) > positions.get(tp, 0) for tp in behind):
            return False
        stands = self._standing()
        return all(stands.get(tp, 0) >= end for tp, end in behind.items())

    def done(self, targets: dict[TopicPartition, int]) -> int:
        """How many of the records up to ``targets`` are behind the positions."""
        return sum(min(self.positions.get(tp, 0), end) for tp, end in targets.items())

    # -- idle ------------------------------------------------------------------------------------
    def not_idle(self) -> None:
        """A batch was read: no stall to time."""
        self._idle_since = None

    def caught_up(self) -> dict[TopicPartition, int] | None:
        """After a poll that read nothing: None unless the check is due and every partition is
        read to the log's end (then the runner counts progress); else the ends past compacted
        gaps to commit (partitions whose last records are gone), maybe none."""
        now = time.monotonic()
        if now < self._idle_next:
            return None
        self._idle_next = now + IDLE_CHECK_S
        ends: dict[TopicPartition, int] = {}
        for topic in {topic for topic, _ in self.positions}:
            ends.update(self.log.end_offsets(topic))
        stands = self._standing()
        behind = {tp: (at, ends[tp]) for tp in self.positions
                  if tp in ends and ends[tp] > (at := max(self.positions[tp], stands.get(tp, 0)))}
        if behind:
            self._idle_since = self._idle_since or now
            if now - self._idle_since > STALL_WARN_S and not self._stall_warned:
                self._stall_warned = True
                (tp, (at, end)), *_ = sorted(behind.items())
                log.warning("read nothing for %.0fs although the log holds records past where the sink stands "
                            "(%s[%d] at %d of %d, %d partitions behind); counted as no progress", now - self._idle_since,
                            tp[0], tp[1], at, end, len(behind), extra=self._extra())
            return None
        self._idle_since, self._stall_warned = None, False
        return {tp: at for tp, at in stands.items()
                if tp in self.positions and at > self.positions[tp] and at >= self.ahead.get(tp, 0)}

    def _standing(self) -> dict[TopicPartition, int]:
        """Where the reader stands per partition, past compacted gaps (the bulk reader: the ends
        it saw)."""
        if self._packed is not None:
            return {tp: at for tp, at in self._packed.ends.items() if tp in self.positions}
        out = {}
        for tp in self.positions:
            try:
                out[tp] = self.reader.position(tp)
            except KeyError:  # not assigned (the embedded reader): it stands nowhere
                pass
        return out
