"""A ``SharedSink`` as one member of its group (``scale_out: group``; cdc/api/capabilities.py).

A joined document changes with a row of any of its tables, wherever that row's partition is, so
members of a document sink cannot divide the topics' partitions as other sinks do
(sink_group.py). Instead every member reads every partition, under a reading group of its own
(``SharedSink.reading_group``) and from the positions its own state holds
(``SharedSink.read_from``), and the group coordinator of the sink's name divides the sink's
*shares* among the running members: the partitions of ``<prefix>.member-shares.<sink>``, a topic
nobody writes, one partition per share, assigned cooperative-sticky as any other. A member
writes the outputs of the shares it owns; the others it keeps in its state for later.

The hand-over, which is what makes a share's outputs never go back or stay stale:

* **A share lost** (``revoked``, inside this reader's poll on the runner's thread, before the
  coordinator gives it away): the writes in flight end (their offsets committed unless the share
  was lost outright), then ``own`` without it. Nothing of the share is written by this member
  after the revocation completes. A member killed outright wrote nothing after it died, and the
  coordinator waits ``session.timeout.ms`` before it gives its shares away.
* **A share gained** (``assigned``): the log's end offsets at that moment are noted, and the share
  is handed to the sink (``own`` with it) only once this member has written and committed up to
  them (``SinkReading.written_to``: a partition whose last records were compacted away counts
  once the reader stands past them). Its state then holds every record the previous owner read
  before it let the share go, so what this member writes of the share is as new as what was
  written before it; the sink raises its versions above those the store holds
  (sinks/documents). Until then the share's outputs wait, none lost: the sink keeps what it did
  not write. ``own`` writes what waited a slice at a time and says whether more waits; it is
  called again between batches until nothing does, so the member keeps serving the group.
* **Joining**: a member subscribes only once it has written up to the log's ends as it found
  them at its start (the runner), so a restarted member, or one that lost its state and reads
  everything again, takes no share that would wait for it meanwhile.

A member parted from the group without knowing it (stalled past ``session.timeout.ms``, or a write
retried for longer than ``max.poll.interval.ms``) learns of it at its next poll of this reader,
which comes before each batch it hands the sink. The write it was in may land after the new
owner began; a document it seeds and writes then may show its older content until that
document's next change, whose version (the source's) is above both members' (the limit is in
sinks/opensearch/README.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc.api.stats import ConnectorStats
from cdc.errors import ConfigError, RetriableError
from cdc.log.base import GroupLog, GroupReader, Log, TopicPartition, internal_settings

log = logging.getLogger(__name__)

OWN_RETRY_S = 5.0  # an ``own`` that failed retriably is called again after this long
SESSION_MS = 45_000  # librdkafka's session.timeout.ms, where the consumer config sets none


class Shares:
    """The member's place in the division of shares: ``poll`` on the runner's thread, between
    batches; ``settle()`` ends the writes in flight and commits them (a member commits to a
    group of its own, so a lost share changes nothing of that);
    ``own(shares)`` hands the owned shares to the sink (on its thread); ``reached(ends)``: True
    once the member's commits reach ``ends``; ``ends()``: the topics' end offsets now."""

    def __init__(self, log_: Log, topic: str, count: int, group: str, stats: ConnectorStats, *,
                 settle: Callable[[], None], own: Callable[[frozenset[int]], bool],
                 ends: Callable[[], dict[TopicPartition, int]],
                 reached: Callable[[dict[TopicPartition, int]], bool]) -> None:
        assert isinstance(log_, GroupLog)  # SinkRunner refuses scale_out: group on any other log
        self.log, self.topic, self.count, self.group, self.stats = log_, topic, count, group, stats
        self._settle, self._own, self._ends, self._reached = settle, own, ends, reached
        self.owned: frozenset[int] = frozenset()   # what the sink writes
        self.gained: dict[int, dict[TopicPartition, int]] = {}  # share -> the ends to reach first
        self.handed: frozenset[int] | None = None  # what the sink was last told (None: never)
        self.more = False  # the sink still writes what waited in shares gained (own again)
        self._retry_at = 0.0
        self.reader: GroupReader | None = None
        self._closing = False
        # The group was last served (polled) then. Past a third of the session the coordinator may
        # have given this member's shares away (a stall: a write that took long, a stopped process).
        session_ms = getattr(log_, "consumer_config", {}).get("session.timeout.ms", SESSION_MS)
        self.lease_s = int(session_ms) / 3000
        self.polled_at = time.monotonic()

    def _extra(self) -> dict:
        return {"connector": self.stats.name, "phase": self.stats.phase}

    def open(self) -> None:
        self.log.ensure_topic(self.topic, internal_settings(self.log, partitions=self.count))
        found = self.log.partitions(self.topic)
        if found != self.count:  # members would place documents in shares nobody is given
            raise ConfigError(f"sink {self.stats.name}: {self.topic} has {found} partitions and the sink's "
                              f"shares say {self.count}: stop every member, delete the topic (it holds no "
                              f"records) and start them with one shares setting")
        assert isinstance(self.log, GroupLog)
        self.reader = self.log.member_reader(self.group)
        self.reader.subscribe([self.topic], self)

    def close(self) -> None:
        """Leave the group (the runner's writes have ended): its revocation asks nothing more of
        the sink, which stops."""
        reader, self.reader = self.reader, None
        self._closing = True
        if reader is not None:
            reader.close()

    # -- GroupListener ---------------------------------------------------------------------------
    def assigned(self, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        ends = self._ends()
        for _, share in partitions:
            self.gained[share] = ends
        log.info("group %s: assigned shares %s; they are written once this member has read up to the topics' "
                 "ends", self.group, sorted(share for _, share in partitions), extra=self._extra())

    def revoked(self, partitions: list[TopicPartition], lost: bool) -> None:
        gone = {share for _, share in partitions}
        for share in gone:
            self.gained.pop(share, None)
        if not gone & self.owned or self._closing:
            return
        try:
            self._settle()
        finally:  # even when a write failed: nothing of these shares is written from here on
            self.owned = self.owned - gone
            self._hand(self.owned, must=True)
        log.info("group %s: %s shares %s (%d owned)", self.group, "lost" if lost else "revoked", sorted(gone),
                 len(self.owned), extra=self._extra())

    # -- the runner's loop -----------------------------------------------------------------------
    def poll(self) -> None:
        """Serve the coordinator (assignments, revocations, heartbeats), then hand over the shares
        gained whose ends this member reached."""
        assert self.reader is not None
        self.reader.poll(1, 0)  # nobody writes the topic: this only serves the group
        self.polled_at = time.monotonic()
        ready = {share for share, ends in self.gained.items() if self._reached(ends)} if self.gained else set()
        if ready:
            for share in ready:
                del self.gained[share]
            self.owned = self.owned | ready
            log.info("group %s: this member writes shares %s from now on (%d owned)", self.group, sorted(ready),
                     len(self.owned), extra=self._extra())
        if ready or self.more or (self.handed != self.owned and time.monotonic() >= self._retry_at):
            self._hand(self.owned, must=False)
        self.stats.details["shares_owned"] = len(self.owned)
        self.stats.details["shares_waiting"] = len(self.gained)

    def stale(self) -> bool:
        """Whether the group was served so long ago that the shares may have moved: the runner
        polls again before it hands the sink another batch, so that a member that stalled learns
        of a revocation before it writes (a write in flight when the stall began is not fenced:
        the store has no fencing token to refuse it by)."""
        return time.monotonic() - self.polled_at > self.lease_s

    def _hand(self, shares: frozenset[int], *, must: bool) -> None:
        """``own(shares)``; a retriable failure is tried again later (``must``: a revocation, where
        the sink must stop writing the shares gone now: raised)."""
        try:
            self.more = self._own(shares)
            self.handed = shares
        except RetriableError as err:
            if must:
                raise
            self.handed, self.more = None, False
            self._retry_at = time.monotonic() + OWN_RETRY_S
            log.warning("group %s: handing shares to the sink failed (%s); trying again in %.0fs", self.group, err,
                        OWN_RETRY_S, extra=self._extra())

