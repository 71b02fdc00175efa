"""The filter that keeps librdkafka's repeated log lines from flooding the log."""

from __future__ import annotations

import logging

from cdc.log import kafka_logs
from cdc.log.kafka_logs import RepeatFilter


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("librdkafka", level, __file__, 1, "%s [%s] %s",
                             ("FAIL", "rdkafka#producer-1", message), None)


def test_repeats_are_held_back_then_counted(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(kafka_logs.time, "monotonic", lambda: now[0])
    repeats = RepeatFilter(window=30)
    lines = [f"Connect to ipv4#127.0.0.1:{port} failed: Connection refused (after {i}ms in state CONNECT)"
             for i, port in enumerate([9092] * 580)]
    passed = [r for r in map(_record, lines) if repeats.filter(r)]
    assert len(passed) == 1
    now[0] += 31
    again = _record(lines[0])
    assert repeats.filter(again)
    assert "(and 579 more like it in the last 31s)" in again.getMessage()


def test_different_lines_and_levels_pass():
    repeats = RepeatFilter(window=30)
    assert repeats.filter(_record("Connect failed"))
    assert repeats.filter(_record("Connect failed", logging.WARNING))
    assert repeats.filter(_record("Metadata request timed out"))
    assert not repeats.filter(_record("Connect failed"))
