"""The sink runtime reads the next batch while the sink writes one: offsets are still committed only
for what was written, and every call on the sink comes from one thread (embedded log, fake store)."""

from __future__ import annotations

import threading

import orjson
import pytest

from cdc.errors import PermanentError, SchemaChangeError
from cdc.log.embedded import EmbeddedLog
from cdc.runtime.sink_runner import SinkRunner
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``
from tests.integration.test_sink_runner import RecordingSink, _committed, _config, _publish

WAIT = 30.0  # a bound on waiting for evidence, not a timing assertion


class ReadSignals:
    """Wraps a log so that a test sees each poll of the runner's reader that returned records."""

    def __init__(self, log: EmbeddedLog) -> None:
        self._log = log
        self.batches = 0  # polls that returned records
        self.changed = threading.Condition()

    def wait_for_batches(self, count: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.batches >= count, timeout)

    def __getattr__(self, name):
        return getattr(self._log, name)

    def reader(self, group=None):
        reader = self._log.reader(group)
        poll, signals = reader.poll, self

        def signalling_poll(*args, **kwargs):
            records = poll(*args, **kwargs)
            if records:
                with signals.changed:
                    signals.batches += 1
                    signals.changed.notify_all()
            return records
        reader.poll = signalling_poll
        return reader


class FailsAfterReadAhead(RecordingSink):
    """Writes batches; the ``fail_at``-th batch (1 = the first; 0: none) waits until the runner has
    read another batch meanwhile (the overlap), then fails with ``error``, as does every write of
    its events after (the halves the runner tries)."""

    def __init__(self, config, signals: ReadSignals, fail_at: int, error: Exception) -> None:
        super().__init__(config)
        self.signals, self.fail_at, self.error = signals, fail_at, error
        self.batches = 0
        self.written: set[tuple[int, int]] = set()  # (partition, offset) of events written
        self.failed: list[tuple[int, int]] = []
        self.read_ahead = False
        self.threads: set[int] = set()

    def start(self):
        self.threads.add(threading.get_ident())

    def stop(self):
        self.threads.add(threading.get_ident())

    def write(self, events):
        self.threads.add(threading.get_ident())
        if not self.failed:
            self.batches += 1
            if self.batches == self.fail_at:  # the batch after this one read before it is written?
                self.read_ahead = self.signals.wait_for_batches(self.fail_at + 1, WAIT)
                self.failed = [(e.partition, e.offset) for e in events]
                raise self.error
        elif {(e.partition, e.offset) for e in events} & set(self.failed):
            raise self.error
        super().write(events)
        self.written.update((e.partition, e.offset) for e in events)


@pytest.mark.parametrize("error", [SchemaChangeError("a column changed type"),
                                   PermanentError("the store refuses everything")],
                         ids=["schema-change", "permanent-stop"])
def test_a_failed_write_commits_nothing_of_its_batch_nor_of_the_batch_read_ahead(log, error):
    _publish(log, 400, keys=400)
    signals = ReadSignals(log)
    sink = FailsAfterReadAhead(_config(on_poison="stop"), signals, fail_at=2, error=error)
    runner = SinkRunner(sink, signals, "p")
    with pytest.raises(type(error)):
        runner.run(threading.Event(), until_caught_up=True)
    assert sink.read_ahead, "the runner did not read the next batch while the sink was writing"
    assert sink.failed and sink.written  # the first batch was written, the second failed
    _, committed = _committed(log)
    failed_from = {}
    for partition, offset in sink.failed:
        failed_from[partition] = min(offset, failed_from.get(partition, offset))
    for (_topic, partition), stored in committed.items():
        stored = stored or 0
        # Everything below a committed offset was written ...
        assert {(partition, o) for o in range(stored)} <= sink.written, (partition, stored)
        # ... and nothing of the failed batch (nor past it) is committed.
        if partition in failed_from:
            assert stored <= failed_from[partition], (partition, stored, failed_from[partition])


def test_every_call_on_the_sink_comes_from_one_thread_and_all_is_written(log):
    _publish(log, 500, keys=40)
    signals = ReadSignals(log)
    sink = FailsAfterReadAhead(_config(), signals, fail_at=0, error=RuntimeError())
    runner = SinkRunner(sink, signals, "p")
    runner.run(threading.Event(), until_caught_up=True)
    assert len(sink.threads) == 1 and threading.get_ident() not in sink.threads
    assert {k: v[1]["v"] for k, v in sink.generations[1].items()} == \
        {orjson.dumps({"id": k}): max(i for i in range(500) if i % 40 == k) for k in range(40)}
    ends, committed = _committed(log)
    assert committed == ends


def test_a_rebuild_asked_for_by_the_last_batch_is_done(log):
    """The write of the batch that reaches the topics' ends asks for a rebuild: the runner rebuilds
    (the batch is not committed before the rebuild's own commit)."""
    _publish(log, 100, keys=100)
    sink = RecordingSink(_config(), rebuild_once_at=99)
    runner = SinkRunner(sink, log, "p")
    runner.run(threading.Event(), until_caught_up=True)
    assert sink.switched == [2] and set(sink.generations) == {2}
    assert len(sink.generations[2]) == 100


class WaitsForReadAheadInRebuild(RecordingSink):
    """Records, per write into the new generation, whether the runner read another batch while
    the write ran; from the ``fail_at``-th write of the rebuild on (1 = the first) every write
    fails with PermanentError."""

    def __init__(self, config, signals: ReadSignals, fail_at: int = 0) -> None:
        super().__init__(config)
        self.signals, self.fail_at = signals, fail_at
        self.rebuild_writes = 0
        self.read_ahead: list[bool] = []
        self.reads_before_open = 0

    def open_generation(self, generation):
        super().open_generation(generation)
        self.reads_before_open = self.signals.batches

    def write(self, events):
        if self.writing != 1:
            self.rebuild_writes += 1
            if self.rebuild_writes <= 2:  # the batch after this one read before this one is written?
                self.read_ahead.append(self.signals.wait_for_batches(
                    self.reads_before_open + self.rebuild_writes + 1, WAIT))
            if self.fail_at and self.rebuild_writes >= self.fail_at:  # and the halves the runner tries
                raise PermanentError("the store refuses everything")
        super().write(events)


def test_a_rebuild_reads_the_next_batch_while_the_sink_writes_one(log):
    _publish(log, 500, keys=400)
    signals = ReadSignals(log)
    sink = WaitsForReadAheadInRebuild(_config(), signals)
    runner = SinkRunner(sink, signals, "p")
    runner.rebuild(threading.Event())
    assert sink.read_ahead == [True, True], "the rebuild did not read ahead of its writes"
    assert sink.switched == [2] and set(sink.generations) == {2}
    assert {k: v[0] for k, v in sink.generations[2].items()} == \
        {orjson.dumps({"id": k}): max(i for i in range(500) if i % 400 == k) + 1 for k in range(400)}
    ends, committed = _committed(log)
    assert committed == ends


def test_a_rebuild_whose_write_fails_after_a_read_ahead_switches_nothing_and_commits_nothing(log):
    _publish(log, 500, keys=400)
    signals = ReadSignals(log)
    sink = WaitsForReadAheadInRebuild(_config(on_poison="stop"), signals, fail_at=2)
    runner = SinkRunner(sink, signals, "p")
    with pytest.raises(PermanentError):
        runner.rebuild(threading.Event())
    assert sink.read_ahead[0], "the rebuild did not read ahead of its writes"
    assert sink.switched == [] and sink.current == 1  # readers keep the old generation
    assert all(not offset for offset in _committed(log)[1].values())


class CommitSignals(ReadSignals):
    """Also wraps the reader's commit: each commit waits (bounded) for evidence that the sink began
    the write after the one being committed, and records whether it had."""

    def __init__(self, log: EmbeddedLog, sink_writes) -> None:
        super().__init__(log)
        self.sink_writes = sink_writes       # () -> how many writes the sink has begun
        self.commits: list[tuple[int, bool]] = []  # (writes begun before it, the next one began)

    def reader(self, group=None):
        reader = super().reader(group)
        commit, signals = reader.commit, self

        def watched_commit(offsets):
            begun = signals.sink_writes()
            ends = log_ends(signals)
            last = all(offsets.get(tp, 0) >= end for tp, end in ends.items())
            with signals.changed:
                went = last or signals.changed.wait_for(lambda: signals.sink_writes() > begun, WAIT)
            signals.commits.append((begun, went))
            return commit(offsets)
        reader.commit = watched_commit
        return reader


def log_ends(signals: CommitSignals) -> dict:
    return signals.end_offsets("p.public.items")


class CountingSink(RecordingSink):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.begun = 0
        self.signals: CommitSignals | None = None

    def write(self, events):
        with self.signals.changed:
            self.begun += 1
            self.signals.changed.notify_all()
        super().write(events)


def test_the_next_write_goes_out_before_the_previous_batch_is_committed(log):
    """A commit is a round trip to the log: the store must not wait for it. Each batch's offsets
    are still committed only after its own write (the commit waits here for the next write to
    begin: before the fix it never did, since the commit came first)."""
    _publish(log, 400, keys=400)
    sink = CountingSink(_config())
    signals = CommitSignals(log, lambda: sink.begun)
    sink.signals = signals
    runner = SinkRunner(sink, signals, "p")
    runner.run(threading.Event(), until_caught_up=True)
    assert len(signals.commits) >= 3
    assert all(went for _, went in signals.commits), signals.commits
    ends, committed = _committed(log)
    assert committed == ends
    assert len(sink.generations[1]) == 400
