"""Drive one sink: consume its topics, write batches, commit offsets only after the write.

Correctness rests on three rules:

1. ``sink.write(batch)`` returns only once the batch is durable in the store; only then are the
   group's offsets committed. A crash in between replays the batch: sinks are idempotent and
   version-guarded, so a replay never regresses a key. The next batch is read and decoded while
   the sink writes the current one (on the sink's own thread, ``sink_thread``), but offsets are
   committed in batch order, each only after its own write succeeded; a batch read ahead of a
   write that failed is dropped uncommitted and read again. A ``PipelinedSink`` keeps several
   writes submitted and uncompleted (``write_pipeline``): a batch's offsets are committed, in
   batch order, only once its own completion succeeded, and a failed one is written again the
   usual way (rules 2 and 3) after every write in flight ended, nothing past it committed before.
2. A ``RetriableError`` retries the *same* batch after a backoff (0.5 s doubling to 30 s): the
   offsets stay where they are, so nothing is skipped. The reader does not advance meanwhile:
   that is the backpressure.
3. Any other error splits the batch in halves until the event that fails alone is found: that
   poison event goes to the dead-letter topic with the reason (``on_poison: dead_letter``; a
   letter always fits that topic, see ``dead_letters``), or stops the sink (``stop``). The events
   around it are written.

A rebuild (``rebuild()``, or automatically when the sink raises ``RebuildRequired``) writes a new
generation of the store from offset 0 while readers keep seeing the current one, and switches
readers once the new one has caught up with the topics' ends as of the start of the rebuild. For a
``BulkLoadableSink`` it reads the history into windows reduced to the newest version per key
(``cdc.bulk_window``), partition after partition, and loads each window whose keys the new
generation does not hold yet in bulk, while the next is read (``_fill_in_windows``).

Reads: through the log's bulk reader where it has one (Kafka: ``cdc.log.kafka_bulk``, a batch as
one bytes object decoded by ``decode_packed``), the group's reader then only saying where to start
and committing after each write (``_open_packed``); else, and as a group member, through the
group's reader itself.

With ``scale_out: group`` the runner is one member of the sink's consumer group and reads only the
partitions the group assigns it; ``sink_group`` states what happens on a rebalance. A rebuild or a
bootstrap reads every partition from offset 0 and cannot be split among members: it runs only
while no member is in the group, as one process reading everything (``_alone``).
"""

from __future__ import annotations

import fnmatch
import logging
import sys
import threading
import time
from typing import Callable


from cdc import bulk_window
from cdc.api import BulkLoadableSink, MaintainedSink, PipelinedSink, RebuildableSink, Sink, SinkContext
from cdc.bulk_window import NewestWindow
from cdc.errors import CdcError, ConfigError, PermanentError, RebuildRequired, SchemaChangeError
from cdc.log.base import GroupLog, Log, LogRecord, TopicPartition
from cdc.runtime import dead_letters
from cdc.runtime.gc_tuning import tune_gc
from cdc.runtime.read_trail import ReadTrail
from cdc.runtime.sink_group import GroupMembership
from cdc.runtime.schemas import SchemaBook
from cdc.runtime.sink_thread import PendingWrite, SinkThread
from cdc.runtime.write_pipeline import InFlight
from cdc.runtime.stats import ConnectorStats
from cdc.runtime.window_loads import WindowLoads
from cdc.schema_order import split_by_schema
from cdc.sink_events import SinkEvent, decode_batch, decode_packed

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0
TOPIC_REFRESH_S = 5.0
IDLE_CHECK_S = 2.0   # an idle sink compares where it stands with the log's ends at most this often
STALL_WARN_S = 30.0  # reading nothing for this long while behind is said in the log, once
POISON_RUN_LIMIT = 50  # events failing alone in a row, none written between, before the sink stops
MAX_WRITES_IN_FLIGHT = 3  # a PipelinedSink's writes submitted and not completed (each holds its batch)
BULK_POLL_RECORDS = 50_000  # records per read of a bulk rebuild (no write waits on them)
BULK_ADD_RECORDS = 5_000    # records added to a window between checks of its size
BULK_PART_KEYS = 100_000    # keys per part of a window handed to the sink (Python objects held at once)
BULK_STAGES = 8             # a bulk read in about this many stages of whole partitions at most
BULK_STAGE_RECORDS = 10_000  # records (offsets) of a stage at least: no stage switch for a few records


class SinkRunner:
    """One thread; ``stop_event`` may be set from anywhere."""

    def __init__(self, sink: Sink, log_: Log, topic_prefix: str, *, group: str | None = None,
                 stats: ConnectorStats | None = None, report: Callable[[ConnectorStats], None] | None = None,
                 progress: Callable[[int, int], None] | None = None, read_ahead: bool = True) -> None:
        self.sink = sink
        self.log = log_
        self.prefix = topic_prefix
        self.config = sink.config
        self.name = sink.config.name
        self.group = group or self.name
        self.stats = stats or ConnectorStats(self.name, "sink")
        # Reports come from the reading thread and from the sink's (a write that retries).
        report_lock, report_to = threading.Lock(), report or (lambda stats: None)

        def locked_report(stats: ConnectorStats) -> None:
            with report_lock:
                report_to(stats)
        self.report = locked_report
        self.progress = progress
        self.read_ahead = read_ahead  # False: read only after each write (for comparisons in bench/)
        self.packed_reads = True  # False: reads go through reader() even where the log has a bulk reader (bench/)
        self.staged_reads = True  # False: a bulk load reads all partitions at once, then loads (bench/)
        # The log's bulk reader, where it has one, fetches for run() (unless scale_out) and rebuild():
        # see _open_packed. ``reader`` then only says where to start and commits the group's offsets.
        self._packed = None
        self._packed_start: dict[TopicPartition, int] | None = None  # assigned at its next poll
        self.dead_letter_topic = self.config.dead_letter_topic or f"{topic_prefix}.dead-letter.{self.name}"
        self.positions: dict[TopicPartition, int] = {}
        self._batch_bytes = 0  # bytes of record values of the batch read last (cdc_bytes_total)
        self._bytes_of: dict = {}  # a write in flight -> the bytes of its records
        self.schemas = SchemaBook(log_, topic_prefix)
        self._dlq_writer = None
        self._dlq_lock = threading.Lock()  # letters come from both threads
        self._stop: threading.Event | None = None
        self._read: dict[TopicPartition, int] = {}  # where the reader is, ahead of the commits
        self._trail = ReadTrail(self._fetch)  # which tombstones' deletes were read (read_trail.py)
        self._sink_thread: SinkThread | None = None
        self.scale_out = getattr(self.config, "scale_out", "single") == "group"
        if self.scale_out and not isinstance(log_, GroupLog):
            raise ConfigError(f"sink {self.name}: scale_out: group needs a log with consumer groups (Kafka); "
                              f"{type(log_).__name__} has none")
        self._membership: GroupMembership | None = None  # while streaming as a group member
        self._writes = InFlight(self, 1)  # the writes in flight (a revocation waits for them); see run()
        self._idle_next = 0.0  # see _idle
        self._poisons_in_row = 0  # events set aside since the last write that succeeded (see _poison)
        self._idle_since: float | None = None
        self._stall_warned = False

    def _extra(self) -> dict:
        return {"connector": self.name, "phase": self.stats.phase}

    def context(self) -> SinkContext:
        """What the sink gets from the runtime (see cdc.api.SinkContext)."""
        return SinkContext(self.name, self.prefix, stats=self.stats, schema_for=self.schema_for,
                           shapes_between=self.schemas.shapes_between,
                           delete_retention_ms=self.log.delete_retention_ms,
                           dead_letter_topic=self.dead_letter_topic, dead_letter=self.dead_letter,
                           log=self.log, delete_read=self._trail.delete_read)

    # -- topics, schemas -------------------------------------------------------------------------
    def matching_topics(self) -> list[str]:
        internal = (".offsets", ".schema-changes")
        return sorted(t for t in self.log.topics()
                      if any(fnmatch.fnmatchcase(t, g) for g in self.config.topics)
                      and not t.endswith(internal) and ".dead-letter." not in t)

    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        return self.schemas.schema_for(topic, version)

    def _assign(self, reader, topics: list[str], from_start: bool, *, fresh: bool = False) -> None:
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
        committed = {} if from_start else reader.committed(new)
        for tp in new:
            self.positions[tp] = committed.get(tp) or 0
        # Partitions already read keep their read position: a batch read ahead of its commit is
        # not read twice.
        self._assign_reader(reader, {**self.positions, **self._read})

    def _open_packed(self) -> None:
        """Fetch through the log's bulk reader (cdc.log.kafka_bulk), where it has one: a batch
        comes as one bytes object and each record becomes its SinkEvent in one C loop
        (``decode_packed``), without a confluent-kafka Message and a LogRecord per record (about
        1.1 us of the ~7 a document of bench/opensearch_sink.py's client). That reader joins no
        group and commits nothing: the group's reader (``log.reader(group)``) still says where
        to start (``committed``) and commits each batch's offsets after its write, exactly as
        when it fetched itself, but is never assigned, so it fetches nothing. A group member
        (scale_out: group) needs its reader's polls for the group's assignments: it reads
        through it."""
        if self.packed_reads and self._membership is None:
            self._packed = self.log.bulk_reader()

    def _close_packed(self) -> None:
        packed, self._packed, self._packed_start = self._packed, None, None
        if packed is not None:
            packed.close()

    def _assign_reader(self, reader, start: dict[TopicPartition, int]) -> None:
        """Read from ``start`` on: through the bulk reader if open (assigned at its next poll, so
        one that is never polled, as in a windowed rebuild, fetches nothing), else ``reader``."""
        if self._packed is not None:
            self._packed_start = dict(start)
        else:
            reader.assign(start)

    # -- writing ---------------------------------------------------------------------------------
    def _wait(self, seconds: float) -> bool:
        """Sleep unless stopping; True when the runner should stop."""
        return self._stop.wait(seconds) if self._stop is not None else (time.sleep(seconds) or False)

    def _write(self, events: list[SinkEvent]) -> None:
        backoff = BACKOFF_FIRST
        phase = self.stats.phase if self.stats.phase != "retrying" else "streaming"
        while True:
            try:
                self.sink.write(events)
                self._poisons_in_row = 0
                if self.stats.phase == "retrying":
                    self.stats.progressed(phase)  # recovered: the health shows it at once
                    self.report(self.stats)
                return
            except SchemaChangeError:  # not the event's fault: the whole table needs a decision
                raise
            except CdcError as err:
                if not err.retriable:
                    break
                self.stats.failed_attempt(err)  # phase "retrying", with the error, its time, the count
                self.report(self.stats)
                log.warning("write failed (%s); retrying in %.1fs", err, backoff, extra=self._extra())
                if self._wait(backoff):
                    raise
                backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception:  # noqa: BLE001 - not retriable: look for the poison event below
                break
        self._isolate(events)

    def _isolate(self, events: list[SinkEvent]) -> None:
        """Write ``events``, setting aside (or stopping at) each one that fails even alone."""
        if len(events) > 1:
            middle = len(events) // 2
            for half in (events[:middle], events[middle:]):
                try:
                    self.sink.write(half)
                    self._poisons_in_row = 0
                except SchemaChangeError:
                    raise
                except CdcError as err:
                    if err.retriable:
                        self._write(half)  # back to retrying
                    else:
                        self._isolate(half)
                except Exception:  # noqa: BLE001
                    self._isolate(half)
            return
        [event] = events
        try:
            self.sink.write([event])
            self._poisons_in_row = 0
        except SchemaChangeError:
            raise
        except Exception as err:  # noqa: BLE001 - this one is the poison
            self._poison(event.topic, event.partition, event.offset, f"{type(err).__name__}: {err}")

    def _poison(self, topic: str, partition: int, offset: int, reason: str,
                record: LogRecord | None = None) -> None:
        where = f"{topic}[{partition}]@{offset}"
        self.stats.errors += 1
        self.stats.last_error = f"poison event at {where}: {reason}"
        self.stats.last_error_at = time.time()
        if self.config.on_poison == "stop":
            raise PermanentError(f"sink {self.name}: the event at {where} fails even alone: {reason}")
        self._poisons_in_row += 1
        if self._poisons_in_row > POISON_RUN_LIMIT:
            # Every event failing, one after another, is the sink or its store, not the events:
            # setting them all aside would empty the topics into the dead letters.
            raise PermanentError(f"sink {self.name}: {self._poisons_in_row} events in a row failed even alone, "
                                 f"the last at {where}: {reason}. That is the sink or its store, not the events; "
                                 f"stopped here, nothing past {where} is committed")
        log.error("event at %s fails even alone (%s): sent to %s", where, reason, self.dead_letter_topic,
                  extra=self._extra())
        if record is None:
            record = self._fetch(topic, partition, offset)
        self.dead_letter(topic, partition, offset, reason, record.key if record else None,
                         record.value if record else None, missing=record is None)

    def dead_letter(self, topic: str, partition: int, offset: int, reason: str,
                    key: bytes | None = None, value: bytes | None = None, *, missing: bool = False) -> None:
        """Set one record aside on the dead-letter topic, durably, with why (the sink's context
        hands this to the sink as ``dead_letter``); ``missing``: the record could not be read back.
        A letter always fits the topic (a large value is referenced, not copied): see dead_letters."""
        self._trail.set_aside(topic, partition, offset)  # a delete set aside does not answer its tombstone
        with self._dlq_lock:
            if self._dlq_writer is None:
                hours = self.config.dead_letter_retention_hours
                dead_letters.ensure_topic(self.log, self.dead_letter_topic,
                                          None if hours is None else int(hours * 3_600_000))
                self._dlq_writer = self.log.writer()
            try:
                self._dlq_writer.publish([dead_letters.dead_letter(
                    self.dead_letter_topic, sink=self.name, topic=topic, partition=partition, offset=offset,
                    reason=reason, key=key, value=value, missing=missing)])
                self._dlq_writer.flush(30)
            except BaseException:
                # A writer keeps its first delivery error for good; a sink that retries the letter
                # (the broker was away a moment) needs a fresh one, or it fails forever.
                writer, self._dlq_writer = self._dlq_writer, None
                try:
                    writer.close()
                except Exception:  # noqa: BLE001 - the delivery error is the one worth raising
                    log.debug("closing the failed dead-letter writer", exc_info=True)
                raise

    def _fetch(self, topic: str, partition: int, offset: int) -> LogRecord | None:
        reader = self.log.reader()
        try:
            reader.assign({(topic, partition): offset})
            for record in reader.poll(1, 5.0):
                if record.offset == offset:
                    return record
        finally:
            reader.close()
        return None

    # -- the loop --------------------------------------------------------------------------------
    def _batch(self, reader) -> tuple[list[SinkEvent], dict[TopicPartition, int]]:
        ends: dict[TopicPartition, int] = {}
        raw_rows = getattr(self.sink, "raw_rows", False)
        if self._packed is not None:
            if self._packed_start is not None:
                self._packed.assign(self._packed_start)
                self._packed_start = None
            batch = self._packed.poll(self.config.batch_size, self.config.batch_wait_ms / 1000)
            events, poisons, self._batch_bytes = decode_packed(batch, ends, raw_rows)
        else:
            records = reader.poll(self.config.batch_size, self.config.batch_wait_ms / 1000)
            if self._membership is not None:
                records = self._membership.keep(records)
            # Decoded in one loop (C where built); a sink with raw_rows gets upserts' rows as JSON bytes.
            events, poisons, self._batch_bytes = decode_batch(records, ends, raw_rows)
        for record, err in poisons:
            self._poison(record.topic, record.partition, record.offset, str(err), record)
        read, positions = self._read, self.positions
        self._trail.note(events, {tp: read.get(tp, positions.get(tp, 0)) for tp in ends}, ends, positions)
        read.update(ends)
        return events, ends

    def _write_in_shape(self, events: list[SinkEvent]) -> None:
        """One write per run of events with one shape per topic (cdc/schema_order.py)."""
        for part in split_by_schema(events):
            if part:
                self._write(part)

    def _sink_call(self, fn: Callable, *args):
        """``fn(*args)`` on the sink's thread (all sink calls are made there), waited for."""
        return self._sink_thread.call(fn, *args) if self._sink_thread is not None else fn(*args)

    def _step(self, reader) -> None:
        """Read (and decode) a batch while the writes in flight run; then settle the oldest until
        there is room for it (``_writes``), hand it to the sink's thread, and commit the writes
        settled, in order. An error of a write is raised here, before anything past it is
        committed; the batch read meanwhile is dropped (the next assignment or a restart reads it
        again)."""
        events, ends = self._batch(reader)
        writes = self._writes
        # Nothing read (caught up), or only poison records: everything in flight settles first.
        settled = writes.make_room(everything=not events)
        if events:
            # The next write goes out before the previous ones' offsets are committed: the commit
            # is a round trip to the log, and the store would wait for it. Commits stay in batch
            # order, each after its own write succeeded (no poll, so no revocation, comes between).
            writes.hand(events, ends, self._batch_bytes)
        try:
            for pending in settled:
                self._commit_write(reader, pending)
        except BaseException:
            writes.drain()  # let them end; nothing past the failed commit is committed
            self._read = {}
            raise
        if events:
            self._idle_since = None
            if not self.read_ahead:
                self._settle_all(reader)
        elif ends:  # only poison records, set aside already
            self._commit(reader, ends, 0)
        else:
            self._idle(reader)

    def _idle(self, reader) -> None:
        """A poll read nothing. That is progress (caught up) only if every partition is read to
        the log's end: an empty poll alone proves nothing (a reader assigned nothing polls nothing
        for ever, which is how a sink once sat idle after `cdc rebuild` with its health green).
        Checked at most every ``IDLE_CHECK_S``; a partition read to an end whose last offsets
        were compacted away has its end committed, so its lag reads 0."""
        now = time.monotonic()
        if now < self._idle_next:
            return
        self._idle_next = now + IDLE_CHECK_S
        ends: dict[TopicPartition, int] = {}
        for topic in {topic for topic, _ in self.positions}:
            ends.update(self.log.end_offsets(topic))
        stands = self._standing(reader)
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
            return
        self._idle_since, self._stall_warned = None, False
        if isinstance(self.sink, MaintainedSink):
            self._sink_call(self.sink.maintain)
        tails = {tp: at for tp, at in stands.items()
                 if tp in self.positions and at > self.positions[tp] and at >= self._read.get(tp, 0)}
        if tails:
            self._commit(reader, tails, 0)
        else:
            self.stats.progressed()  # caught up

    def _standing(self, reader) -> dict[TopicPartition, int]:
        """Where the reader stands per partition, past compacted gaps (the packed reader: the
        ends it saw)."""
        if self._packed is not None:
            return {tp: at for tp, at in self._packed.ends.items() if tp in self.positions}
        out = {}
        for tp in self.positions:
            try:
                out[tp] = reader.position(tp)
            except KeyError:  # not assigned (the embedded reader): it stands nowhere
                pass
        return out

    def _settle_all(self, reader) -> None:
        """Wait for every write in flight and commit each, in order (once: a revocation may have)."""
        for pending in self._writes.make_room(everything=True):
            self._commit_write(reader, pending)

    def _commit_write(self, reader, pending: PendingWrite) -> None:
        """Commit the offsets of ``pending``, whose write succeeded (once)."""
        if pending.settled:
            return
        pending.settled = True
        nbytes = self._bytes_of.pop(pending.future, 0)
        self._commit(reader, pending.ends, pending.events)
        self.stats.bytes += nbytes

    def _commit(self, reader, ends: dict[TopicPartition, int], events: int) -> None:
        if self._membership is not None:
            ends = self._membership.owned_only(ends)
        reader.commit(ends)
        self.positions.update(ends)
        self.stats.events += events
        self.stats.progressed()  # written and committed

    def run(self, stop_event: threading.Event, *, from_start: bool = False,
            until_caught_up: bool = False, rebuild_first: bool = False) -> None:
        """Consume until ``stop_event``; ``from_start`` reads from offset 0 (a bootstrap);
        ``until_caught_up`` returns once the topics' ends as of the start are written;
        ``rebuild_first`` rebuilds the store into a new generation, then streams on from where
        the rebuild ended, with the same started sink and readers (the daemon's `cdc rebuild`)."""
        self._stop = stop_event
        self._sink_thread = SinkThread(self.name)
        self.sink.attach(self.context())
        reader = None
        try:
            self._sink_call(self.sink.start)
            self._writes = InFlight(self, self._writes_in_flight())
            tune_gc()  # see cdc/runtime/gc_tuning.py: the batches in flight are walked again and again otherwise
            if self.scale_out and not (from_start or until_caught_up):
                reader = self.log.member_reader(self.group)
                self._membership = GroupMembership(self, reader)
            else:
                if self.scale_out:
                    self._alone("a bootstrap")
                reader = self.log.reader(self.group)
                self._open_packed()
            self.stats.phase = "streaming"
            self.report(self.stats)
            self._follow(reader, from_start, fresh=True)
            if rebuild_first:
                self._rebuild_until_done(reader, stop_event)
                self.report(self.stats)  # "streaming" again: the supervisor sees the rebuild done
            targets = self._ends() if until_caught_up else None
            refreshed = last_report = time.monotonic()
            while not stop_event.is_set():
                try:
                    self._step(reader)
                    if targets is not None and self._writes and self._covers(self._writes.newest, targets):
                        self._settle_all(reader)  # the last batch: no need to read past the ends
                except RebuildRequired as err:  # a SchemaChangeError the policy answers with a rebuild
                    self._writes.drain()  # ended already (nothing past the failure is committed)
                    if self._membership is not None:
                        raise PermanentError(
                            f"{err}: sink {self.name} runs as a member of group {self.group} (scale_out: group), "
                            f"and a rebuild cannot be split among members: stop every member, run `cdc rebuild` "
                            f"for the sink, then start them again") from err
                    log.warning("%s: rebuilding the store", err, extra=self._extra())
                    self._rebuild_until_done(reader, stop_event)
                now = time.monotonic()
                if now - refreshed > TOPIC_REFRESH_S:
                    self._follow(reader, from_start)
                    refreshed = now
                if targets is not None:
                    done = sum(min(self.positions.get(tp, 0), end) for tp, end in targets.items())
                    if self.progress:
                        self.progress(done, sum(targets.values()))
                    if all(self.positions.get(tp, 0) >= end for tp, end in targets.items()):
                        break
                if now - last_report > 1.0:
                    self.stats.lag_seconds = None
                    self.report(self.stats)
                    last_report = now
            try:  # stopping: the writes in flight are finished and committed
                self._settle_all(reader)
            except RebuildRequired as err:  # not now: the next start meets the batch again
                log.warning("%s: stopping; the store is rebuilt at the next start", err, extra=self._extra())
            self.stats.phase = "stopped"
        finally:
            try:
                # An error elsewhere: let the writes end, commit nothing (nor when closing the
                # reader revokes its partitions).
                self._writes.drain()
                if reader is not None:
                    reader.close()
                self._close_packed()
                self._membership = None
                self._sink_call(self.sink.stop)
            finally:
                self._sink_thread.close()
                self._sink_thread = None
                if self._dlq_writer is not None:
                    self._dlq_writer.close()
                self.report(self.stats)

    def _follow(self, reader, from_start: bool, *, fresh: bool = False) -> None:
        """Read the matching topics: subscribe as a group member, or assign every partition."""
        if self._membership is not None:
            self._membership.follow(self.matching_topics())
        else:
            self._assign(reader, self.matching_topics(), from_start, fresh=fresh)

    def _hand_over(self, reader, gone: set[TopicPartition], lost: bool) -> None:
        """Partitions ``gone`` leave this member (see ``sink_group``): the writes in flight end
        and, unless they were lost, their offsets are committed; what was read past them is
        dropped."""
        if lost:  # someone else's already: a commit would be refused; the owner replays them
            self._writes.drain()
        else:
            self._settle_all(reader)
        for tp in gone:
            self._read.pop(tp, None)
            self.positions.pop(tp, None)
        self._trail.let_go()

    def _alone(self, what: str) -> None:
        """Refuse ``what`` (reading every partition from offset 0) while members of the group run."""
        members = self.log.group_members(self.group)
        if members:
            raise ConfigError(f"sink {self.name} (scale_out: group): {what} reads every partition from offset 0 "
                              f"and cannot be split among members, and group {self.group} has {members} running: "
                              f"stop every member first (one killed outright counts until the group's session timeout "
                              f"passes), then start them again once it is done")

    def _writes_in_flight(self) -> int:
        """How many writes may be in flight at once: a PipelinedSink's own bound (at most 3: each
        holds a batch), else one."""
        sink = self.sink
        if not isinstance(sink, PipelinedSink):
            return 1
        return max(1, min(MAX_WRITES_IN_FLIGHT, int(self._sink_call(lambda: sink.writes_in_flight))))

    def _covers(self, pending: PendingWrite, targets: dict[TopicPartition, int]) -> bool:
        """True when the positions after ``pending`` reach every target end."""
        return all(max(pending.ends.get(tp, 0), self.positions.get(tp, 0)) >= end for tp, end in targets.items())

    def _ends(self) -> dict[TopicPartition, int]:
        ends: dict[TopicPartition, int] = {}
        for topic in self.matching_topics():
            ends.update(self.log.end_offsets(topic))
        return ends

    # -- rebuilds --------------------------------------------------------------------------------
    def _rebuild(self, reader, stop_event: threading.Event) -> None:
        """A new generation from offset 0; readers switch to it once it has caught up."""
        sink = self.sink
        if not isinstance(sink, RebuildableSink):
            raise PermanentError(f"sink {self.name} ({self.config.type}) cannot rebuild: its store has no "
                                 f"generations")
        if self.scale_out:
            self._alone("a rebuild")
        old = self._sink_call(sink.current_generation)
        new = old + 1
        self.stats.phase = "rebuilding"
        self.report(self.stats)
        self._sink_call(sink.open_generation, new)
        targets = self._ends()
        self.positions = {tp: 0 for tp in targets}
        self._read = {}
        self._trail.forget()
        self._assign_reader(reader, dict(self.positions))
        began = time.monotonic()
        if isinstance(sink, BulkLoadableSink) and bulk_window.AVAILABLE and self._sink_call(lambda: sink.bulk_loads):
            self._fill_in_windows(reader, stop_event, targets, new, old)
        else:
            self._fill_in_batches(reader, stop_event, targets, new, old)
        # Streaming after the rebuild (run()) goes on from where the fill ended, not from offset 0
        # (a windowed fill reads through a bulk reader of its own).
        self._assign_reader(reader, dict(self.positions))
        self._sink_call(sink.switch_generation, new)
        reader.commit(dict(self.positions))
        self._sink_call(sink.drop_generation, old)
        self.stats.phase = "streaming"
        log.info("rebuilt into generation %d in %.1fs; readers switched; generation %d dropped", new,
                 time.monotonic() - began, old, extra=self._extra())

    def _stopped_rebuild(self, new: int, old: int) -> PermanentError:
        return PermanentError(f"sink {self.name}: stopped during a rebuild; generation {new} is "
                              f"incomplete and readers still see {old}; start again to redo it")

    def _fill_in_batches(self, reader, stop_event: threading.Event, targets: dict[TopicPartition, int],
                         new: int, old: int) -> None:
        """The new generation written batch by batch, as the topics are read."""
        reported = time.monotonic()
        # Read ahead as run() does: the next batch is read and decoded while the sink writes one
        # (a PipelinedSink: while its writes in flight run). Positions move only once a write
        # succeeded, in order; nothing is committed before the switch, so a failure anywhere leaves
        # readers on the old generation (and a restart redoes it).
        writes = self._writes
        try:
            while not all(self.positions.get(tp, 0) >= end for tp, end in targets.items()):
                if stop_event.is_set():
                    raise self._stopped_rebuild(new, old)
                if writes and self._covers(writes.newest, targets):
                    events, ends = [], {}  # the last batch is in flight: nothing past the ends to read
                else:
                    events, ends = self._batch(reader)
                settled = writes.make_room(everything=not events)
                if events:
                    writes.hand(events, ends, self._batch_bytes)
                    if not self.read_ahead:
                        settled += writes.make_room(everything=True)
                for pending in settled:
                    self._rebuilt(pending)
                if not events:
                    self.positions.update(ends)  # only poison records, set aside already
                    self.stats.progressed()
                if time.monotonic() - reported > 1.0:  # a long rebuild is progress, not a stall
                    self.report(self.stats)
                    reported = time.monotonic()
                if self.progress:
                    self.progress(sum(min(self.positions.get(tp, 0), e) for tp, e in targets.items()),
                                  sum(targets.values()))
        finally:
            writes.drain()  # an error: let the writes in flight end before anything else runs

    def _fill_in_windows(self, reader, stop_event: threading.Event, targets: dict[TopicPartition, int],
                         new: int, old: int) -> None:
        """The new generation filled from windows of the history reduced to the newest version per
        key (cdc.bulk_window), read partition after partition where the reader allows it
        (``_stages``): a partition read to its end has its keys' newest versions, and its window
        is loaded on the sink's thread while the next is read (cdc.runtime.window_loads). A window
        goes in bulk (``bulk_load``) only if the generation holds none of its keys, else through
        ``write`` (version-guarded, as a batch is). The window in flight and the one being filled
        share the bound (``bulk_window_mb``). Nothing is committed before the switch: a failure or
        a kill anywhere leaves readers on the old generation, and the next rebuild opens the new
        one empty again and starts over."""
        with bulk_window.collection_paused():
            self._fill_windows(reader, stop_event, targets, new, old)

    def _fill_windows(self, reader, stop_event: threading.Event, targets: dict[TopicPartition, int],
                      new: int, old: int) -> None:
        # The log's bulk reader, where it has one, hands out batches packed in one bytes object
        # (no Python object per record); it commits nothing. Else ``reader`` (assigned already).
        bulk = self.log.bulk_reader() if self.packed_reads else None
        try:
            log.info("generation %d: reading the history %s", new,
                     "packed (cdc.log.kafka_bulk)" if bulk is not None else "record by record", extra=self._extra())
            self._fill_windows_from(bulk or reader, bulk is not None, stop_event, targets, new, old)
        finally:
            if bulk is not None:
                bulk.close()

    def _stages(self, targets: dict[TopicPartition, int], packed: bool) -> list[list[TopicPartition]]:
        """The partitions in the order they are read, in stages: one stage after another where the
        reader can be assigned anew (the packed reader), so that once a stage is read to its ends
        its keys are final and its window loads while the next stage is read; else all at once
        (one stage). A stage is one partition, or several small ones."""
        wanted = sorted(tp for tp, end in targets.items() if end > 0)
        if not (packed and self.staged_reads):
            return [wanted]
        # Small partitions share a stage: each stage costs a new assignment and the fetch's start,
        # so a sink of many small topics would otherwise pay that per partition.
        least = max(sum(targets.values()) // BULK_STAGES, BULK_STAGE_RECORDS)
        stages: list[list[TopicPartition]] = [[]]
        held = 0
        for tp in wanted:
            if held >= least:
                stages.append([])
                held = 0
            stages[-1].append(tp)
            held += targets[tp]
        return stages if wanted else []

    def _fill_windows_from(self, reader, packed: bool, stop_event: threading.Event,
                           targets: dict[TopicPartition, int], new: int, old: int) -> None:
        bound = self.config.bulk_window_mb << 20
        window = NewestWindow(bound)
        sink_thread = self._sink_thread
        loads = WindowLoads(sink_thread.submit if sink_thread is not None else None,
                            lambda w, bulk: self._load_window(w, bulk, new), self._extra())
        read: dict[TopicPartition, int] = {}
        wait = self.config.batch_wait_ms / 1000
        reported = time.monotonic()
        stages = self._stages(targets, packed)
        try:
            for stage in stages:
                if packed:  # only this stage's partitions: nothing of the next mixes in
                    reader.assign({tp: self.positions.get(tp, 0) for tp in stage})
                cut = False  # a window of this stage was loaded before the stage's ends
                while not all(read.get(tp, 0) >= targets[tp] for tp in stage):
                    if stop_event.is_set():
                        raise self._stopped_rebuild(new, old)
                    loads.raise_failed()
                    if packed:  # a read at a time (a window overshoots its bound by one read at most)
                        batches = [reader.poll(BULK_ADD_RECORDS, wait)]
                    else:
                        records = reader.poll(BULK_POLL_RECORDS, wait)
                        batches = [records[at:at + BULK_ADD_RECORDS] for at in range(0, len(records), BULK_ADD_RECORDS)]
                    for batch in batches:  # a window overshoots its bound by one slice at most
                        for record, err in (window.add_packed(batch, read) if packed else window.add(batch, read)):
                            self._poison(record.topic, record.partition, record.offset, str(err), record)
                        if window.stats()[1] + loads.held() >= bound:
                            loads.wait()  # the window in flight loaded: its memory is free
                            if window.stats()[1] + loads.held() >= bound:  # still: loaded before more is read
                                loads.submit(window, whole=False)
                                loads.wait()
                                window, cut = window.following(), True
                    if packed:  # a partition's end, seen after its last record (compaction may leave none there)
                        for tp, end in reader.ends.items():
                            read[tp] = max(read.get(tp, 0), end)
                    self.stats.progressed()
                    if time.monotonic() - reported > 1.0:  # a long rebuild is progress, not a stall
                        self.report(self.stats)
                        reported = time.monotonic()
                    if self.progress:
                        self.progress(sum(min(read.get(tp, 0), e) for tp, e in targets.items()), sum(targets.values()))
                if window.records:  # the stage read to its ends: loaded while the next stage is read
                    loads.submit(window, whole=not cut)
                    window = window.following()
            loads.wait()
        finally:
            loads.settle()
        self.positions.update(read)

    def _load_window(self, window: NewestWindow, bulk: bool, generation: int) -> None:
        """On the sink's thread: ``window`` into ``generation`` (see ``_load_parts``)."""
        keys, nbytes = window.stats()
        began = time.monotonic()
        self._load_parts(window, bulk)
        self.stats.bytes += window.read_bytes()
        self.stats.events += window.records  # every record of the window is in the store now
        log.info("generation %d: a window of %d records reduced to %d keys (%.0f MiB) loaded %s in %.1fs",
                 generation, window.records, keys, nbytes / (1 << 20), "in bulk" if bulk else "as guarded writes",
                 time.monotonic() - began, extra=self._extra())

    def _load_parts(self, window: NewestWindow, bulk: bool) -> None:
        """On the sink's thread: every part of ``window``, in bulk if ``bulk`` (the generation
        holds none of its keys) and the sink takes it, else (or if that fails) through ``write``
        with its retries and poison isolation."""
        for part in window.parts(BULK_PART_KEYS):
            if bulk:
                if part.tombstones:  # the generation never held these keys: nothing to remove
                    continue
                try:
                    if self.sink.bulk_load(part):
                        self.stats.progressed()
                        continue
                except SchemaChangeError:
                    raise
                except Exception as err:  # noqa: BLE001 - nothing of the part was written: write it as events
                    log.warning("bulk load of %d keys of %s failed (%s); writing them as events",
                                len(part.upserts) + len(part.deletes), part.topic, err, extra=self._extra())
            self._write_in_shape(part.events())
            self.stats.progressed()

    def _rebuilt(self, pending: PendingWrite) -> None:
        """A rebuild's write settled without error: its positions count."""
        nbytes = self._bytes_of.pop(pending.future, 0)
        pending.settled = True
        self.positions.update(pending.ends)
        self.stats.events += pending.events
        self.stats.bytes += nbytes
        self.stats.progressed()

    def _rebuild_until_done(self, reader, stop_event: threading.Event) -> None:
        """``_rebuild``, begun again when a shape that also asks for one arrives meanwhile (the new
        generation's tables were made in the shapes known when they were made)."""
        while True:
            try:
                self._rebuild(reader, stop_event)
                return
            except RebuildRequired as err:
                log.warning("%s: during the rebuild; beginning it again", err, extra=self._extra())

    def rebuild(self, stop_event: threading.Event) -> None:
        """The foreground rebuild of ``cdc rebuild``."""
        self._stop = stop_event
        self._sink_thread = SinkThread(self.name)
        self.sink.attach(self.context())
        try:
            self._sink_call(self.sink.start)
            self._writes = InFlight(self, self._writes_in_flight())
            tune_gc()
            reader = self.log.reader(self.group)
            self._open_packed()
            try:
                self._rebuild(reader, stop_event)
            finally:
                reader.close()
                self._close_packed()
                self._sink_call(self.sink.stop)
        finally:
            self._sink_thread.close()
            self._sink_thread = None


class ProgressBar:
    """``[#####.....]  45%  123,456/270,000 records  34,567/s`` on a terminal; a line every 5 s elsewhere."""

    def __init__(self, label: str, stream=sys.stderr) -> None:
        self.label = label
        self.stream = stream
        self.began = time.monotonic()
        self.shown = 0.0
        self.tty = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.shown < (0.2 if self.tty else 5.0) and done < total:
            return
        self.shown = now
        fraction = done / total if total else 1.0
        rate = done / max(now - self.began, 1e-6)
        bar = "#" * int(fraction * 30)
        text = f"{self.label} [{bar:<30}] {fraction:4.0%} {done:,}/{total:,} records {rate:,.0f}/s"
        self.stream.write(("\r" + text) if self.tty else text + "\n")
        if self.tty and done >= total:
            self.stream.write("\n")
        self.stream.flush()
