"""A sink as one member of a Kafka consumer group (``scale_out: group``).

Several processes run the same sink; each joins the group named after the sink, and the group
coordinator shares the topics' partitions among them (cooperative-sticky: a rebalance moves only
the partitions that change owner). Each partition is read from the group's committed offset by
exactly one member at a time, and a key lives in one partition, so per-key order holds as with
one process.

What happens to a partition that leaves a member, in this order (``revoked``, which runs inside
the reader's ``poll`` on the runner's thread, before the coordinator gives the partition away):

1. The writes in flight (write_pipeline.py) are waited for and each that succeeded has its
   offsets committed, in order: the new owner starts right after them. If one failed, the error
   is raised and nothing from it on is committed: the new owner writes it again.
2. Records read ahead for the partition (the batch being read, past the write in flight) are
   dropped uncommitted, and the member forgets its read position there: the new owner reads
   them from the commit.
3. Only then does the revocation complete.

A *lost* partition (the member was thrown out of the group: it stalled past
``session.timeout.ms``, or the network parted it) is someone else's already: its commit would be
refused, so the member only waits for its writes and drops the rest. Such a write may land after the
new owner's writes of the same keys; the sinks' version guard (a write carrying an older
``source.version`` than the store holds is ignored) is what keeps such a late write from
regressing a row. A member killed outright commits nothing more; the new owner replays from the
group's last commit, which sinks already take (idempotent writes).

A rebuild or a bootstrap reads every partition from offset 0 and cannot be split among members:
it runs only while no member is in the group, as one process reading everything
(``refuse_unless_alone``).

Topics that appear later are picked up by subscribing again to the matching topics every few
seconds (the sink's globs select topics, and the log's own topics are left out, which a regular
expression subscription could not say as plainly).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cdc.api.stats import ConnectorStats
from cdc.errors import ConfigError
from cdc.log.base import GroupLog, GroupReader, LogRecord, TopicPartition

log = logging.getLogger(__name__)

# (partitions gone, lost): settle the writes in flight (committing them unless lost) and forget
# what was read past them; the runner's (sink_runner.py).
HandOver = Callable[[set[TopicPartition], bool], None]


class GroupMembership:
    """The runner's ``GroupListener``: which partitions this member owns, and the hand-over."""

    def __init__(self, reader: GroupReader, group: str, stats: ConnectorStats, hand_over: HandOver) -> None:
        self.reader = reader
        self.group = group
        self.stats = stats
        self.hand_over = hand_over
        self.owned: set[TopicPartition] = set()
        self.topics: list[str] = []
        self.rebalances = 0

    def _extra(self) -> dict:
        return {"connector": self.stats.name, "phase": self.stats.phase}

    def follow(self, topics: list[str]) -> None:
        """Subscribe to ``topics`` when they differ from the subscription (a new topic matched)."""
        if topics and topics != self.topics:
            self.reader.subscribe(topics, self)
            self.topics = list(topics)

    def assigned(self, partitions: list[TopicPartition]) -> None:
        self.owned.update(partitions)
        self.rebalances += 1
        log.info("group %s: assigned %d partitions (%d owned): %s", self.group, len(partitions),
                 len(self.owned), _names(partitions), extra=self._extra())

    def revoked(self, partitions: list[TopicPartition], lost: bool) -> None:
        gone = set(partitions)
        try:
            self.hand_over(gone, lost)
        finally:
            self.owned -= gone
            self.rebalances += 1
        log.info("group %s: %s %d partitions (%d owned): %s", self.group, "lost" if lost else "revoked",
                 len(partitions), len(self.owned), _names(partitions), extra=self._extra())

    def keep(self, records: list[LogRecord]) -> list[LogRecord]:
        """``records`` of partitions this member still owns (a poll that served a revocation may
        have gathered records of the revoked partitions before it)."""
        owned = self.owned
        if all((r.topic, r.partition) in owned for r in records):
            return records
        return [r for r in records if (r.topic, r.partition) in owned]

    def owned_only(self, ends: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        return {tp: offset for tp, offset in ends.items() if tp in self.owned}


def refuse_unless_alone(log_: GroupLog, group: str, sink: str, what: str) -> None:
    """Refuse ``what`` (reading every partition from offset 0) while members of ``group`` run."""
    members = log_.group_members(group)
    if members:
        raise ConfigError(f"sink {sink} (scale_out: group): {what} reads every partition from offset 0 "
                          f"and cannot be split among members, and group {group} has {members} running: "
                          f"stop every member first (one killed outright counts until the group's session timeout "
                          f"passes), then start them again once it is done")


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in sorted(partitions)[:8]) + (" ..." if len(partitions) > 8 else "")
