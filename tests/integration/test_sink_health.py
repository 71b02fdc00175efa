"""A sink retrying a write says so (phase, error, time, attempts) and clears it once it writes."""

from __future__ import annotations

import threading

from cdc.runtime.sink_runner import SinkRunner
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``
from tests.integration.test_sink_runner import RecordingSink, _config, _publish


def test_a_retrying_sink_reports_retrying_then_clears_it(log, monkeypatch):  # noqa: F811 - the fixture
    monkeypatch.setattr("cdc.runtime.sink_runner.BACKOFF_FIRST", 0.01)
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
