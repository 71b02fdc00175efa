"""A sink retrying a write says so (phase, error, time, attempts) and clears it once it writes."""

from __future__ import annotations

import threading

from cdc.runtime.sink_runner import SinkRunner
from tests.faults.harness import wait_for
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``
from tests.integration.test_sink_runner import RecordingSink, _config, _publish


def test_a_retrying_sink_reports_retrying_then_clears_it(log, monkeypatch):  # noqa: F811 - the fixture
    monkeypatch.setattr("cdc.runtime.sink_writing.BACKOFF_FIRST", 0.01)
    _publish(log, 20, keys=20)
    reports: list[dict] = []
    sink = RecordingSink(_config(), fail_retriable=3)
    runner = SinkRunner(sink, log, "p", report=lambda stats: reports.append(stats.snapshot()))
    runner.run(threading.Event(), until_caught_up=True)
    retrying = [r for r in reports if r["phase"] == "retrying"]
    assert [r["attempts"] for r in retrying] == [1, 2, 3]
    assert all("the store is busy" in r["last_error"] and r["last_error_at"] > 0 for r in retrying)
    recovered = reports[reports.index(retrying[-1]) + 1]
    assert recovered["phase"] == "streaming" and recovered["attempts"] == 0
    assert recovered["last_error"] is None and recovered["last_error_at"] is None
    assert runner.stats.progress_at is not None and runner.stats.errors == 3


def _run_in_thread(runner) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def _reporting_runner(log, monkeypatch):  # noqa: F811
    """A runner whose reports (one a second while it runs) are kept: evidence that it polled on."""
    monkeypatch.setattr("cdc.runtime.sink_reading.IDLE_CHECK_S", 0.0)
    reports: list[dict] = []
    runner = SinkRunner(RecordingSink(_config()), log, "p", report=lambda stats: reports.append(stats.snapshot()))
    return runner, reports


def test_a_sink_that_reads_nothing_while_the_log_holds_records_makes_no_progress(log, monkeypatch):  # noqa: F811
    """The stall `cdc rebuild` once caused: a reader assigned nothing polls nothing for ever. Each
    empty poll counted as "caught up", so the health stayed green; now an empty poll is progress
    only when the sink stands at the log's ends."""
    _publish(log, 20, keys=20)
    runner, reports = _reporting_runner(log, monkeypatch)
    monkeypatch.setattr(runner.reading, "assign_from", lambda start: None)  # reads nothing, ever
    stop, thread = _run_in_thread(runner)
    try:
        wait_for(lambda: len(reports) >= 4, timeout=60, what="a few seconds of polls")
        assert runner.stats.events == 0
        assert runner.stats.progress_at is None, "an empty poll of a sink behind the log counted as progress"
    finally:
        stop.set()
        thread.join(30)


def test_a_sink_caught_up_makes_progress_while_idle(log, monkeypatch):  # noqa: F811
    _publish(log, 20, keys=20)
    runner, reports = _reporting_runner(log, monkeypatch)
    stop, thread = _run_in_thread(runner)
    try:
        wait_for(lambda: runner.stats.events == 20 and runner.stats.progress_at, timeout=60, what="caught up")
        first = runner.stats.progress_at
        wait_for(lambda: runner.stats.progress_at > first, timeout=60, what="progress while idle")
    finally:
        stop.set()
        thread.join(30)
