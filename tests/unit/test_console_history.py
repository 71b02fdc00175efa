"""The console's history: bounded per connector, and throughput that never goes negative."""

from __future__ import annotations

from cdc.runtime.history import History


def test_history_keeps_the_last_hour_and_computes_events_per_second():
    rows = [{"name": "src", "phase": "snapshot", "lag_seconds": None, "events": 0}]
    history = History(lambda: rows, interval=10.0, keep=60.0)  # 6 samples per connector
    for step in range(10):
        rows[0] = {**rows[0], "events": step * 100, "phase": "streaming" if step > 3 else "snapshot",
                   "lag_seconds": float(step)}
        history.sample(now=1000.0 + step * 10)
    series = history.series("src")
    assert [s["t"] for s in series] == [1040.0 + i * 10 for i in range(6)]  # the oldest fell off
    assert series[0]["events_per_s"] is None  # nothing before it is kept
    assert [s["events_per_s"] for s in series[1:]] == [10.0] * 5
    assert series[-1]["phase"] == "streaming" and series[-1]["lag_seconds"] == 9.0
    assert history.series("unknown") == []


def test_a_worker_restart_counts_from_zero_instead_of_a_negative_rate():
    rows = [{"name": "wh", "phase": "streaming", "lag_seconds": 0.0, "events": 500}]
    history = History(lambda: rows)
    history.sample(now=0.0)
    rows[0] = {**rows[0], "events": 30}  # a new worker process counts from zero
    history.sample(now=10.0)
    assert history.series("wh")[-1]["events_per_s"] == 3.0
