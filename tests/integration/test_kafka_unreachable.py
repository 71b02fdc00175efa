"""KafkaLog against a closed port: calls fail within the request timeout as LogUnavailableError,
and librdkafka's identical connect failures reach the log once, not hundreds of times."""

from __future__ import annotations

import logging
import os
import signal
import socket

import pytest

from cdc.errors import LogUnavailableError
from cdc.log.kafka import KafkaLog
from cdc.log.kafka_logs import REPEATS


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_broker_is_one_error_naming_the_setting_and_the_address(caplog, monkeypatch):
    """librdkafka's connect failures (~580 identical lines once, then three lines at every start:
    the connect failure, _ALL_BROKERS_DOWN and an error without the address) are folded into the
    typed error of the call that waited, which names the address tried and the setting."""
    monkeypatch.setattr(REPEATS, "_seen", {})  # what earlier tests logged must not hide these lines
    caplog.set_level(logging.INFO, logger="cdc.log.kafka.librdkafka")
    port = _closed_port()
    dead = KafkaLog(f"127.0.0.1:{port}", timeout=3)
    try:
        with pytest.raises(LogUnavailableError) as raised:
            dead.topics()
        dead._admin.poll(0)  # serve whatever librdkafka still queued
    finally:
        dead.close()
    assert f"no Kafka broker at 127.0.0.1:{port} (log.kafka.bootstrap_servers) can be reached" in str(raised.value)
    assert f"tried ipv4#127.0.0.1:{port}: Connection refused" in str(raised.value)
    noise = [r.getMessage() for r in caplog.records if r.name.startswith("cdc.log.kafka")
             and r.levelno >= logging.INFO and ("Connect to" in r.getMessage() or "BROKERS_DOWN" in r.getMessage())]
    assert noise == []


def test_the_daemon_says_it_once_within_the_request_timeout_and_not_again_at_each_restart(tmp_path):
    import subprocess
    import sys
    import time

    port = _closed_port()
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  kafka: {{bootstrap_servers: '127.0.0.1:{port}', topic_prefix: ku, request_timeout: 3}}\n"
                      "sources:\n  - {name: gen, type: generator, rate: 10}\n")
    daemon = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while sum("restarting in" in line for line in lines) < 3:  # evidence: three restarts
            assert time.monotonic() < deadline, "".join(lines)
            lines.append(daemon.stdout.readline())
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(60)
    errors = [line for line in lines if " ERROR " in line or " WARNING " in line and "restarting" not in line]
    assert len(errors) == 1, "".join(lines)
    assert f"127.0.0.1:{port} (log.kafka.bootstrap_servers)" in errors[0]
    restarts = [line for line in lines if "restarting in" in line]
    assert "(the same error again)" not in restarts[0] and all("(the same error again)" in r for r in restarts[1:])
