"""The runner's writes in flight: handed to the sink's thread, settled in batch order.

A sink that does not pipeline has one write in flight at a time (``depth`` 1): the batch's
``future`` is its whole write (sink_writing.py: retries, poison isolation), and the next batch
is read while it runs. A ``PipelinedSink`` (cdc.api) keeps several: each batch goes to the
sink's thread as ``submit_in_shape``: one ``submit`` per run of events with one shape per topic
(cdc/schema_order.py), each returning once its requests are handed to the store. A part the
sink declines (not a plain write: its store objects are to be made or changed first) ends the
submission there; that part and the ones after it are the batch's ``rest``, written with
``write`` once nothing before them is in flight. Later, on the same thread and in batch order,
``wait_all`` waits for the batch's completions.

The order of effects on the sink's one thread, with two writes in flight::

    submit(b1)  submit(b2)  wait(b1)  submit(b3)  wait(b2)  submit(b4) ...

so the store works through b1's and b2's requests while b2 and b3 are encoded, and each
batch's offsets are committed (on the runner's thread) only after its own wait returned.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

from cdc.api import WriteCompletion
from cdc.log.base import TopicPartition
from cdc.runtime.sink_thread import SinkThread
from cdc.runtime.sink_writing import SinkWriter
from cdc.schema_order import split_by_schema
from cdc.sink_events import SinkEvent

log = logging.getLogger(__name__)


@dataclass
class PendingWrite:
    """A batch handed to the sink's thread: the offsets to commit once its write succeeded.
    ``future``: the write itself, or, pipelined, its submission (a ``Submitted`` whose
    completions are waited for next); ``batch``: pipelined, the events, kept to write them again
    if the completion fails; ``nbytes``: its records' value bytes, counted once it is committed."""

    future: Future
    ends: dict[TopicPartition, int]
    events: int
    batch: list | None = None
    nbytes: int = 0
    settled: bool = False  # waited for (and committed, if it succeeded): by the loop or a revocation


class Submitted(NamedTuple):
    completions: list[WriteCompletion]  # of the parts handed over, in order
    rest: list[list[SinkEvent]]         # the parts from the first one declined on, not submitted


def submit_in_shape(sink, events: list[SinkEvent]) -> Submitted:
    """On the sink's thread: ``events`` submitted part by part until the sink declines one."""
    parts = [part for part in split_by_schema(events) if part]
    completions: list = []
    for at, part in enumerate(parts):
        completion = sink.submit(part)
        if completion is None:
            return Submitted(completions, parts[at:])
        completions.append(completion)
    return Submitted(completions, [])


def wait_all(completions: list[WriteCompletion]) -> None:
    """On the sink's thread: wait for each completion in order; the first error is raised, after
    the others were waited for too (no request of the batch outlives the call)."""
    error = None
    for completion in completions:
        try:
            completion.wait()
        except BaseException as err:  # noqa: BLE001 - raised below, once all of them ended
            error = error or err
    if error is not None:
        raise error


class InFlight:
    """The runner's writes handed to the sink's thread and not yet settled, oldest first: at most
    ``depth`` after each hand (1 for a sink that does not pipeline: then each batch's ``future``
    is its whole write, retries and poison isolation included, as before pipelining).

    Settling is strictly in batch order, and a write's offsets are the runner's to commit only
    once it settled without error. A pipelined write that fails (its submission or a completion)
    settles every write in flight first: see ``_recover``. When settling fails, ``dropped`` is
    called: what was read past the failed batch is to be read again (SinkReading.drop_ahead).
    """

    def __init__(self, sink_thread: SinkThread, writer: SinkWriter, depth: int, *,
                 dropped: Callable[[], None]) -> None:
        self.sink_thread = sink_thread
        self.writer = writer
        self.depth = depth
        self.dropped = dropped
        self.writes: deque[PendingWrite] = deque()

    def _extra(self) -> dict:
        stats = self.writer.stats
        return {"connector": stats.name, "phase": stats.phase}

    def __bool__(self) -> bool:
        return bool(self.writes)

    @property
    def newest(self) -> PendingWrite:
        return self.writes[-1]

    def hand(self, events: list[SinkEvent], ends: dict[TopicPartition, int], nbytes: int) -> PendingWrite:
        """``events`` to the sink's thread: submitted (pipelined), else written."""
        writer = self.writer
        if self.depth > 1:
            write = PendingWrite(self.sink_thread.submit(submit_in_shape, writer.sink, events), ends, len(events),
                                 events, nbytes)
        else:
            write = PendingWrite(self.sink_thread.submit(writer.write_in_shape, events), ends, len(events),
                                 nbytes=nbytes)
        self.writes.append(write)
        return write

    def make_room(self, everything: bool = False) -> list[PendingWrite]:
        """Settle the oldest writes until another one may be handed (``everything``: all of them),
        and return them, in order, for their offsets to be committed. A submission that left
        parts unsubmitted (not plain writes) is a barrier: it settles with everything before it,
        its parts are written then, and nothing after it is handed before."""
        writes = self.writes
        if writes and writes[-1].batch is not None and not everything:
            submission = writes[-1].future
            everything = submission.exception() is not None or bool(submission.result().rest)
        keep = 0 if everything else self.depth - 1
        settled: list[PendingWrite] = []
        while len(writes) > keep:
            settled += self._settle_oldest()
        return settled

    def _settle_oldest(self) -> list[PendingWrite]:
        pending = self.writes.popleft()
        try:
            if pending.batch is None:
                pending.future.result()
                return [pending]
            try:
                submitted = pending.future.result()
                self.sink_thread.call(wait_all, submitted.completions)
                self.writer.written()
            except Exception as err:  # noqa: BLE001 - any failure: the batch goes the usual way
                return self._recover(pending, err)
            for part in submitted.rest:  # nothing before them in flight now (make_room)
                self.sink_thread.call(self.writer.write, part)
            return [pending]
        except BaseException:
            pending.settled = True  # nothing of it is committed, not even by a revocation
            self.drain()  # nothing past it either
            self.dropped()  # what was read past the failed batch is read again from the commits
            raise

    def _recover(self, failed: PendingWrite, err: Exception) -> list[PendingWrite]:
        """A pipelined write failed: every write in flight is waited for (none is committed yet);
        then the failed batch goes through the sink's ``write`` with the usual retries, poison
        isolation and dead letters (raising as that does), and each later batch whose own write
        failed is written the same way after it. Later batches that completed are durable
        already: their offsets are committed after the failed one's. The failed batch lands after
        them, which regresses nothing: a PipelinedSink's writes (deletes included) are version-
        guarded per key (cdc.api.PipelinedSink). Returns every write settled, in order."""
        later = list(self.writes)
        self.writes.clear()
        log.warning("a write of %d events failed (%s: %s) with %d later ones in flight; writing it again once "
                    "they ended", failed.events, type(err).__name__, err, len(later), extra=self._extra())
        again = [pending for pending in later if not self._completed(pending)]
        try:
            self.sink_thread.call(self.writer.write_in_shape, failed.batch)
            for pending in again:
                self.sink_thread.call(self.writer.write_in_shape, pending.batch)
        except BaseException:
            for pending in later:
                pending.settled = True
            raise
        return [failed, *later]

    def _completed(self, pending: PendingWrite) -> bool:
        """Wait for ``pending``'s write to end; whether it completed whole (submitted and waited
        for without an error, nothing left unsubmitted)."""
        try:
            if pending.batch is None:
                pending.future.result()
                return True
            submitted = pending.future.result()
            self.sink_thread.call(wait_all, submitted.completions)
            return not submitted.rest
        except Exception as err:  # noqa: BLE001 - the caller writes it again or drops it
            log.info("a write of %d events in flight also failed (%s: %s)", pending.events, type(err).__name__, err,
                     extra=self._extra())
            return False

    def drain(self) -> None:
        """Wait for every write in flight to end, committing nothing of them (an error, a lost
        partition, a stop by an error): no request outlives the runner's next step."""
        writes = list(self.writes)
        self.writes.clear()
        for pending in writes:
            pending.settled = True
            self._completed(pending)
