"""Rebuilding a sink's store into a new generation while readers keep seeing the current one.

A rebuild (``cdc rebuild``, or the runner's answer to ``RebuildRequired``) of a
``RebuildableSink``, in this order:

1. ``open_generation(new)``, and the targets: the matching topics' end offsets now.
2. The generation is filled from offset 0 up to the targets (and on to later ends while the
   topics grow fast meanwhile, as under a snapshot: ``GO_ON_*``): batch by batch as the topics are
   read (``_fill_in_batches``: the next batch is read while the sink writes one, and positions
   move only once a write succeeded, in order), or for a ``BulkLoadableSink`` in windows reduced
   to the newest version per key, loaded in bulk where the generation holds none of their keys
   (window_fill.py). Either way nothing is committed yet.
3. ``switch_generation(new)``: readers see the new generation. Only then are the positions
   committed, and ``drop_generation(old)`` follows. A switch that fails retriably (a store
   briefly away while a sink writes its documents at the switch) is called again with a backoff
   (1 s doubling to 30 s) until it succeeds or the runner stops, the phase ``retrying`` meanwhile:
   the fill is not thrown away for it.

A failure, a stop or a kill before the switch leaves readers on the old generation and the
group's commits where they were; the next rebuild opens the new generation empty again and
starts over. Streaming after a rebuild goes on from where the fill ended, not from offset 0. A
shape that itself asks for a rebuild meanwhile begins it again (``until_done``): the new
generation's tables were made in the shapes known when they were made. As a group member
(``scale_out: group``) a rebuild runs only while no member is in the group (sink_group.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cdc import bulk_window
from cdc.api import BulkLoadableSink, RebuildableSink, Sink, SinkEvent
from cdc.api.stats import ConnectorStats
from cdc.errors import CdcError, PermanentError, RebuildRequired
from cdc.log.base import TopicPartition
from cdc.runtime.sink_reading import SinkReading
from cdc.runtime.sink_thread import SinkThread
from cdc.runtime.sink_writing import SinkWriter
from cdc.runtime.window_fill import WindowFill
from cdc.runtime.write_pipeline import InFlight, PendingWrite

log = logging.getLogger(__name__)
# A fill goes on to the topics' later ends (at most GO_ON_ROUNDS times) while they grew meanwhile by
# GO_ON_RECORDS records or more.
GO_ON_ROUNDS, GO_ON_RECORDS = 20, 20_000
SWITCH_BACKOFF_FIRST, SWITCH_BACKOFF_MAX = 1.0, 30.0  # a switch that failed retriably, called again


class Rebuilds:
    """The runner's rebuilds, on the runner's thread; every call on the sink goes to its thread.
    ``windows``: the bulk fill (its ``load_window`` is where a window goes into the store)."""

    def __init__(self, sink: Sink, sink_thread: SinkThread, reading: SinkReading, writer: SinkWriter,
                 stats: ConnectorStats, report: Callable[[ConnectorStats], None],
                 progress: Callable[[int, int], None] | None, *, refuse_unless_alone: Callable[[str], None]) -> None:
        self.sink = sink
        self.name = sink.config.name
        self.sink_thread = sink_thread
        self.reading = reading
        self.stats = stats
        self.report = report
        self.progress = progress
        self.refuse_unless_alone = refuse_unless_alone
        self.windows = WindowFill(sink, sink_thread, reading, writer, stats, report, progress)

    def _extra(self) -> dict:
        return {"connector": self.name, "phase": self.stats.phase}

    def until_done(self, writes: InFlight, stop_event: threading.Event) -> None:
        """``rebuild``, begun again when a shape that also asks for one arrives meanwhile."""
        while True:
            try:
                self.rebuild(writes, stop_event)
                return
            except RebuildRequired as err:
                log.warning("%s: during the rebuild; beginning it again", err, extra=self._extra())

    def rebuild(self, writes: InFlight, stop_event: threading.Event) -> None:
        """A new generation from offset 0; readers switch to it once it has caught up. ``writes``:
        the run's writes in flight (none when called)."""
        sink, call = self.sink, self.sink_thread.call
        if not isinstance(sink, RebuildableSink):
            raise PermanentError(f"sink {self.name} ({sink.config.type}) cannot rebuild: its store has no "
                                 f"generations")
        self.refuse_unless_alone("a rebuild")
        old = call(sink.current_generation)
        new = old + 1
        self.stats.phase = "rebuilding"
        self.report(self.stats)
        call(sink.open_generation, new)
        reading = self.reading
        targets = reading.ends()
        reading.start_over(targets)
        began = time.monotonic()

        def halt() -> None:
            if stop_event.is_set():
                raise PermanentError(f"sink {self.name}: stopped during a rebuild; generation {new} is "
                                     f"incomplete and readers still see {old}; start again to redo it")
        if isinstance(sink, BulkLoadableSink) and bulk_window.available() and call(lambda: sink.bulk_loads):
            self.windows.fill(targets, new, halt)
        else:
            self._fill_in_batches(writes, targets, halt)
            # The topics grew a lot meanwhile (a snapshot under way, as at a first start): that is
            # loaded too before the switch, rather than change by change after it.
            for _ in range(GO_ON_ROUNDS):
                later = reading.ends()
                grown = sum(max(end - targets.get(tp, 0), 0) for tp, end in later.items())
                if grown < GO_ON_RECORDS:
                    break
                log.info("the topics grew by %d records during the rebuild; filling them too before the switch",
                         grown, extra=self._extra())
                targets = later
                reading.go_on_to(targets)
                self._fill_in_batches(writes, targets, halt)
        # Streaming after the rebuild (the runner's run) goes on from where the fill ended, not
        # from offset 0 (a windowed fill reads through a bulk reader of its own).
        reading.assign_from(dict(reading.positions))
        log.info("generation %d filled in %.1fs; switching to it (a sink may write it in full first)", new,
                 time.monotonic() - began, extra=self._extra())
        self._switch(new, old, stop_event)
        reading.commit_positions()
        call(sink.drop_generation, old)
        self.stats.phase = "streaming"
        log.info("rebuilt into generation %d in %.1fs; readers switched; generation %d dropped", new,
                 time.monotonic() - began, old, extra=self._extra())

    def _switch(self, new: int, old: int, stop_event: threading.Event) -> None:
        """``switch_generation(new)``, again after a retriable error until it succeeds or the
        runner stops (RebuildableSink: a switch called again resumes)."""
        sink, backoff = self.sink, SWITCH_BACKOFF_FIRST
        assert isinstance(sink, RebuildableSink)
        while True:
            try:
                self.sink_thread.call(sink.switch_generation, new)
            except CdcError as err:
                if not err.retriable:
                    raise
                self.stats.failed_attempt(err)
                self.report(self.stats)
                log.warning("switching to generation %d failed (%s); retrying in %.0fs", new, err, backoff,
                            extra=self._extra())
                if stop_event.wait(backoff):
                    raise PermanentError(f"sink {self.name}: stopped while switching to generation {new}; readers "
                                         f"still see {old}; start again to redo the rebuild") from err
                backoff = min(backoff * 2, SWITCH_BACKOFF_MAX)
                continue
            if self.stats.phase == "retrying":
                self.stats.progressed("rebuilding")
                self.report(self.stats)
            return

    def _fill_in_batches(self, writes: InFlight, targets: dict[TopicPartition, int], halt: Callable[[], None]) -> None:
        """The new generation written batch by batch, as the topics are read."""
        reading = self.reading
        reported = time.monotonic()
        events: list[SinkEvent]
        ends: dict[TopicPartition, int]
        # Read ahead as a run does: the next batch is read and decoded while the sink writes one
        # (a PipelinedSink: while its writes in flight run). Positions move only once a write
        # succeeded, in order; nothing is committed before the switch, so a failure anywhere
        # leaves readers on the old generation (and a restart redoes it).
        try:
            while not reading.reached(targets):
                halt()
                if writes and reading.covers(writes.newest.ends, targets):
                    events, ends = [], {}  # the last batch is in flight: nothing past the ends to read
                else:
                    events, ends = reading.batch()
                settled = writes.make_room(everything=not events)
                if events:
                    writes.hand(events, ends, reading.batch_bytes)
                for pending in settled:
                    self._rebuilt(pending)
                if not events:
                    reading.positions.update(ends)  # only poison records, set aside already
                    self.stats.progressed()
                if time.monotonic() - reported > 1.0:  # a long rebuild is progress, not a stall
                    self.report(self.stats)
                    reported = time.monotonic()
                if self.progress:
                    self.progress(reading.done(targets), sum(targets.values()))
        finally:
            writes.drain()  # an error: let the writes in flight end before anything else runs

    def _rebuilt(self, pending: PendingWrite) -> None:
        """A rebuild's write settled without error: its positions count."""
        pending.settled = True
        self.reading.positions.update(pending.ends)
        self.stats.events += pending.events
        self.stats.bytes += pending.nbytes
        self.stats.progressed()
