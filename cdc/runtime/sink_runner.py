"""Drive one sink: consume its topics, write batches, commit offsets only after the write.

The rule everything else rests on: ``sink.write(batch)`` returns only once the batch is durable
in the store (or its poison events are set aside); only then are the group's offsets committed.
A crash in between replays the batch: sinks are idempotent and version-guarded, so a replay
never regresses a key. The next batch is read and decoded while the sink writes the current one
(on the sink's own thread, sink_thread.py), but offsets are committed in batch order, each only
after its own write succeeded; a batch read ahead of a write that failed is dropped uncommitted
and read again.

The runner coordinates the parts, each behind its own interface:

* sink_reading.py: the topics, the readers (the log's bulk reader where it has one), the
  positions read and committed, and whether an empty poll means caught up;
* sink_writing.py: one batch into the store, with retries (``RetriableError``: the same batch
  again, the reader held back) and poison isolation (halves until the event that fails alone,
  set aside in the dead letters, dead_letters.py, or the sink stopped);
* write_pipeline.py: the writes in flight, settled in batch order (several for a
  ``PipelinedSink``);
* sink_rebuild.py and window_fill.py: a new generation from offset 0, readers switched once it
  has caught up (``rebuild()``, or when the sink raises ``RebuildRequired``);
* sink_group.py: one member of the sink's consumer group (``scale_out: group``), and what
  happens on a rebalance (``_hand_over``); sink_shares.py: the same for a ``SharedSink``, whose
  members each read everything and write their share.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from cdc.api import MaintainedSink, PipelinedSink, SharedSink, Sink
from cdc.api.stats import ConnectorStats
from cdc.errors import ConfigError, PermanentError, RebuildRequired
from cdc.log.base import GroupLog, Log, TopicPartition
from cdc.runtime.contexts import RuntimeSinkContext
from cdc.runtime.dead_letters import DeadLetters
from cdc.runtime.gc_tuning import tune_gc
from cdc.runtime.schemas import SchemaBook
from cdc.runtime.sink_group import refuse_unless_alone
from cdc.runtime.sink_reading import SinkReading, fetch_record
from cdc.runtime.sink_rebuild import Rebuilds
from cdc.runtime.sink_shares import Shares
from cdc.runtime.sink_thread import SinkThread
from cdc.runtime.sink_writing import SinkWriter
from cdc.runtime.write_pipeline import InFlight, PendingWrite
from cdc.topics import dead_letter_topic, shares_topic

log = logging.getLogger(__name__)

TOPIC_REFRESH_S = 5.0
MAX_WRITES_IN_FLIGHT = 3  # a PipelinedSink's writes submitted and not completed (each holds its batch)


class SinkRunner:
    """One thread; ``stop_event`` may be set from anywhere."""

    def __init__(self, sink: Sink, log_: Log, topic_prefix: str, *, group: str | None = None,
                 stats: ConnectorStats | None = None, report: Callable[[ConnectorStats], None] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.sink = sink
        self.log = log_
        self.prefix = topic_prefix
        self.config = config = sink.config
        self.name = config.name
        self.scale_out = getattr(config, "scale_out", "single") == "group"
        # A shared sink's member reads everything under a group of its own; the group of the
        # sink's name divides its shares (sink_shares.py).
        shared = sink if self.scale_out and isinstance(sink, SharedSink) else None
        self.shared = shared is not None
        self.group = group or (shared.reading_group(config) if shared is not None else self.name)
        self.shares: Shares | None = None
        self.stats = stats or ConnectorStats(self.name, "sink")
        # Reports come from the reading thread and from the sink's (a write that retries).
        report_lock, report_to = threading.Lock(), report or (lambda stats: None)

        def locked_report(stats: ConnectorStats) -> None:
            with report_lock:
                report_to(stats)
        self.report = locked_report
        if self.scale_out and not isinstance(log_, GroupLog):
            raise ConfigError(f"sink {self.name}: scale_out: group needs a log with consumer groups (Kafka); "
                              f"{type(log_).__name__} has none")
        self.dead_letter_topic = config.dead_letter_topic or dead_letter_topic(topic_prefix, self.name)
        self.schemas = SchemaBook(log_, topic_prefix)
        self.letters = DeadLetters(log_, self.dead_letter_topic, self.name, config.dead_letter_retention_hours)
        self.sink_thread = SinkThread(self.name)
        self.writer = SinkWriter(sink, self.stats, self.report, set_aside=self.dead_letter,
                                 fetch=functools.partial(fetch_record, log_), dead_letter_topic=self.dead_letter_topic)
        self.reading = SinkReading(log_, self.group, config, self.stats, poison=self.writer.poison,
                                   raw_rows=lambda: getattr(sink, "raw_rows", False),
                                   starts=self._read_from if self.shared else None)
        self.rebuilds = Rebuilds(sink, self.sink_thread, self.reading, self.writer, self.stats, self.report, progress,
                                 refuse_unless_alone=self._refuse_unless_alone)
        self.progress = progress
        self._writes = self._in_flight(1)  # the writes in flight (a revocation waits for them); see run()

    def _extra(self) -> dict:
        return {"connector": self.name, "phase": self.stats.phase}

    def context(self) -> RuntimeSinkContext:
        """What the sink gets from the runtime (see cdc.api.SinkContext)."""
        return RuntimeSinkContext(self.name, self.prefix, stats=self.stats, schema_for=self.schema_for,
                                  shapes_between=self.schemas.shapes_between,
                                  delete_retention_ms=self.log.delete_retention_ms,
                                  dead_letter_topic=self.dead_letter_topic, dead_letter=self.dead_letter,
                                  log=self.log, delete_read=self.reading.trail.delete_read)

    def matching_topics(self) -> list[str]:
        return self.reading.matching_topics()

    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        return self.schemas.schema_for(topic, version)

    def dead_letter(self, topic: str, partition: int, offset: int, reason: str,
                    key: bytes | None = None, value: bytes | None = None, *, missing: bool = False) -> None:
        """Set one record aside on the dead-letter topic, durably, with why (the sink's context
        hands this to the sink as ``dead_letter``); ``missing``: the record could not be read back.
        A letter always fits the topic (a large value is referenced, not copied): see dead_letters."""
        self.reading.trail.set_aside(topic, partition, offset)  # a delete set aside does not answer its tombstone
        self.letters.send(topic, partition, offset, reason, key, value, missing=missing)

    # -- a run -----------------------------------------------------------------------------------
    def run(self, stop_event: threading.Event, *, from_start: bool = False,
            until_caught_up: bool = False, rebuild_first: bool = False) -> None:
        """Consume until ``stop_event``; ``from_start`` reads from offset 0 (a bootstrap);
        ``until_caught_up`` returns once the topics' ends as of the start are written;
        ``rebuild_first`` rebuilds the store into a new generation, then streams on from where
        the rebuild ended, with the same started sink and readers (the daemon's `cdc rebuild`)."""
        reading = self.reading
        self._open(stop_event)
        try:
            self.sink_thread.call(self.sink.start)
            self._writes = self._in_flight(self._writes_in_flight())
            tune_gc()  # see cdc/runtime/gc_tuning.py: the batches in flight are walked again and again otherwise
            member = self.scale_out and not (from_start or until_caught_up)
            if self.scale_out and not member:
                self._refuse_unless_alone("a bootstrap")
            reading.open(self._hand_over if member and not self.shared else None)
            # A run that rebuilds first is not streaming yet: the supervisor takes this process's
            # first "streaming" for the end of the rebuild (`cdc rebuild` then says it is done).
            self.stats.phase = "rebuilding" if rebuild_first else "streaming"
            self.report(self.stats)
            reading.follow(from_start, fresh=True)
            if rebuild_first:
                self.rebuilds.until_done(self._writes, stop_event)
                self.report(self.stats)  # "streaming" again: the supervisor sees the rebuild done
            # A shared sink's member joins the division of shares once it has caught up with the
            # log as it found it (a restart, a lost state): no share waits for it meanwhile.
            join_at = reading.ends() if member and self.shared else None
            targets = reading.ends() if until_caught_up else None
            refreshed = last_report = time.monotonic()
            while not stop_event.is_set():
                try:
                    if join_at is not None and reading.written_to(join_at):
                        join_at = None
                        self._share()
                    if self.shares is not None:
                        self.shares.poll()
                    self._step()
                    if targets is not None and self._writes and reading.covers(self._writes.newest.ends, targets):
                        self._settle_all()  # the last batch: no need to read past the ends
                except RebuildRequired as err:  # a SchemaChangeError the policy answers with a rebuild
                    self._writes.drain()  # ended already (nothing past the failure is committed)
                    if reading.membership is not None or self.shares is not None:
                        raise PermanentError(
                            f"{err}: sink {self.name} runs as a member of group {self.group} (scale_out: group), "
                            f"and a rebuild cannot be split among members: stop every member, run `cdc rebuild` "
                            f"for the sink, then start them again") from err
                    log.warning("%s: rebuilding the store", err, extra=self._extra())
                    self.rebuilds.until_done(self._writes, stop_event)
                now = time.monotonic()
                if now - refreshed > TOPIC_REFRESH_S:
                    reading.follow(from_start)
                    refreshed = now
                if targets is not None:
                    if self.progress:
                        self.progress(reading.done(targets), sum(targets.values()))
                    if reading.reached(targets):
                        break
                if now - last_report > 1.0:
                    self.stats.lag_seconds = None
                    self.report(self.stats)
                    last_report = now
            try:  # stopping: the writes in flight are finished and committed
                self._settle_all()
            except RebuildRequired as err:  # not now: the next start meets the batch again
                log.warning("%s: stopping; the store is rebuilt at the next start", err, extra=self._extra())
            self.stats.phase = "stopped"
        finally:
            try:
                # An error elsewhere: let the writes end, commit nothing (nor when closing the
                # reader revokes its partitions).
                self._writes.drain()
                shares, self.shares = self.shares, None
                try:
                    if shares is not None:
                        shares.close()
                finally:
                    reading.close()
                    self.sink_thread.call(self.sink.stop)
            finally:
                self.sink_thread.close()
                self.letters.close()
                self.report(self.stats)

    def rebuild(self, stop_event: threading.Event) -> None:
        """The foreground rebuild of ``cdc rebuild``."""
        self._open(stop_event)
        try:
            self.sink_thread.call(self.sink.start)
            self._writes = self._in_flight(self._writes_in_flight())
            tune_gc()
            self.reading.open()
            try:
                self.rebuilds.rebuild(self._writes, stop_event)
            finally:
                self.reading.close()
                self.sink_thread.call(self.sink.stop)
        finally:
            self.sink_thread.close()

    def _open(self, stop_event: threading.Event) -> None:
        self.writer.stopping = stop_event
        self.sink_thread.open()
        self.sink.attach(self.context())

    def _step(self) -> None:
        """Read (and decode) a batch while the writes in flight run; then settle the oldest until
        there is room for it (``_writes``), hand it to the sink's thread, and commit the writes
        settled, in order. An error of a write is raised here, before anything past it is
        committed; the batch read meanwhile is dropped (the next assignment or a restart reads it
        again)."""
        reading, writes = self.reading, self._writes
        events, ends = reading.batch()
        # Nothing read (caught up), or only poison records: everything in flight settles first.
        settled = writes.make_room(everything=not events)
        if events and self.shares is not None and self.shares.stale():
            # A member that waited long for its writes (or was stopped) hears first whether its
            # shares moved meanwhile: a revocation then settles what is in flight, in order.
            self._commit_settled(settled)
            self.shares.poll()
        if events:
            # The next write goes out before the previous ones' offsets are committed: the commit
            # is a round trip to the log, and the store would wait for it. Commits stay in batch
            # order, each after its own write succeeded (no poll, so no revocation, comes between).
            writes.hand(events, ends, reading.batch_bytes)
        self._commit_settled(settled)
        if events:
            reading.not_idle()
        elif ends:  # only poison records, set aside already
            self._commit(ends, 0)
        else:
            self._idle()

    def _commit_settled(self, settled: list[PendingWrite]) -> None:
        """Commit the writes ``make_room`` settled, in order (each once)."""
        try:
            for pending in settled:
                self._commit_write(pending)
        except BaseException:
            self._writes.drain()  # let them end; nothing past the failed commit is committed
            self.reading.drop_ahead()
            raise

    def _idle(self) -> None:
        """A poll read nothing: progress only once caught up (SinkReading.caught_up); then a
        ``MaintainedSink`` does its upkeep."""
        tails = self.reading.caught_up()
        if tails is None:
            return
        if isinstance(self.sink, MaintainedSink):
            self.sink_thread.call(self.sink.maintain)
        if tails:
            self._commit(tails, 0)
        else:
            self.stats.progressed()  # caught up

    def _settle_all(self) -> None:
        """Wait for every write in flight and commit each, in order (once: a revocation may have)."""
        for pending in self._writes.make_room(everything=True):
            self._commit_write(pending)

    def _commit_write(self, pending: PendingWrite) -> None:
        """Commit the offsets of ``pending``, whose write succeeded (once)."""
        if pending.settled:
            return
        pending.settled = True
        self._commit(pending.ends, pending.events)
        self.stats.bytes += pending.nbytes

    def _commit(self, ends: dict[TopicPartition, int], events: int) -> None:
        self.reading.commit(ends)
        self.stats.events += events
        self.stats.progressed()  # written and committed

    def _hand_over(self, gone: set[TopicPartition], lost: bool) -> None:
        """Partitions ``gone`` leave this member (see sink_group.py): the writes in flight end
        and, unless they were lost, their offsets are committed; what was read past them is
        dropped."""
        if lost:  # someone else's already: a commit would be refused; the owner replays them
            self._writes.drain()
        else:
            self._settle_all()
        self.reading.forget(gone)

    def _share(self) -> None:
        """Join the division of a shared sink's shares (sink_shares.py)."""
        sink = self.sink
        assert isinstance(sink, SharedSink)
        count = self.sink_thread.call(sink.share_count)
        self.shares = Shares(self.log, shares_topic(self.prefix, self.name), count, self.name, self.stats,
                             settle=self._settle_all, own=self._own, ends=self.reading.ends,
                             reached=self.reading.written_to)
        self.shares.open()

    def _own(self, shares: frozenset[int]) -> bool:
        sink = self.sink
        assert isinstance(sink, SharedSink)
        return bool(self.sink_thread.call(sink.own, shares))

    def _read_from(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        sink = self.sink
        assert isinstance(sink, SharedSink)
        return self.sink_thread.call(sink.read_from, partitions)

    def _refuse_unless_alone(self, what: str) -> None:
        if self.scale_out:
            assert isinstance(self.log, GroupLog)  # __init__ refuses scale_out: group on any other log
            # A shared sink's members are those of the group dividing its shares.
            refuse_unless_alone(self.log, self.name if self.shared else self.group, self.name, what)

    def _in_flight(self, depth: int) -> InFlight:
        return InFlight(self.sink_thread, self.writer, depth, dropped=self.reading.drop_ahead)

    def _writes_in_flight(self) -> int:
        """How many writes may be in flight at once: a PipelinedSink's own bound (at most 3: each
        holds a batch), else one."""
        sink = self.sink
        if not isinstance(sink, PipelinedSink):
            return 1
        return max(1, min(MAX_WRITES_IN_FLIGHT, int(self.sink_thread.call(lambda: sink.writes_in_flight))))
