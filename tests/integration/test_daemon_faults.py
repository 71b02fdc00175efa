"""`cdc run` and `cdc status` when something around them is broken: a taken HTTP port, an
unreachable Kafka, a database that refuses connections. Each test waits for the state it wants
(a phase in /status, a line in the output), never for a fixed time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cdc.dev.services import free_port


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cdc(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)


def _start(config: Path, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=cwd or config.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _stop(process: subprocess.Popen) -> str:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate(timeout=30)
    return output


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _wait_for(what: str, check, process: subprocess.Popen, limit: float = 180):
    """Poll ``check()`` until it returns something truthy; fail if the daemon exits first (or
    after ``limit`` seconds, a bound on a broken test, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            result = check()
        except OSError:
            result = None
        if result:
            return result
        if process.poll() is not None:
            pytest.fail(f"the daemon exited ({process.returncode}) before {what}:\n{_stop(process)[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {limit:.0f}s:\n{_stop(process)[-3000:]}")
        time.sleep(0.2)


def test_a_taken_http_port_is_one_clear_line_and_the_permanent_exit_code(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "cdc.yaml").write_text(
            "log: {embedded: {path: ./data}}\n"
            "sources:\n  - {name: gen, type: generator, events: 10}\n"
            f'http: "127.0.0.1:{port}"\n')
        result = _cdc("run", "cdc.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [l for l in result.stderr.splitlines() if l.startswith("cdc: error")]
    assert f"http: 127.0.0.1:{port}" in line and "in use" in line.lower()
