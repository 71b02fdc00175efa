"""KafkaLog against a closed port: calls fail within the request timeout as LogUnavailableError,
and librdkafka's identical connect failures reach the log once, not hundreds of times."""

from __future__ import annotations

import logging
import socket

import pytest

from cdc.errors import LogUnavailableError
from cdc.log.kafka import KafkaLog
from cdc.log.kafka_logs import REPEATS


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connect_failures_are_logged_once_not_hundreds_of_times(caplog, monkeypatch):
    monkeypatch.setattr(REPEATS, "_seen", {})  # what earlier tests logged must not hide these lines
    caplog.set_level(logging.DEBUG, logger="cdc.log.kafka.librdkafka")
    dead = KafkaLog(f"127.0.0.1:{_closed_port()}", timeout=3)
    try:
        with pytest.raises(LogUnavailableError):
            dead.topics()
        dead._admin.poll(0)  # serve whatever librdkafka still queued
    finally:
        dead.close()
    connect = [r for r in caplog.records if "Connect to" in r.getMessage() and r.levelno >= logging.WARNING]
    assert 1 <= len(connect) <= 2, f"{len(connect)} connect failure lines"
