"""The capture daemon (``cdc run``) and other ``cdc`` commands as processes of a test, shared by
the end-to-end tests: each runs in a session of its own, so it is stopped or killed whole
(``os.killpg``), children included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def cdc_process(config: Path, command: str, *args: str, log: str | None = None) -> subprocess.Popen:
    """``cdc <command> <config> <args>`` in a session of its own, run in the config's directory;
    its output appended to ``log`` (a file name beside the config), else discarded."""
    out = open(config.parent / log, "ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen([sys.executable, "-m", "cdc.cli", command, str(config), *args],
                                cwd=config.parent, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log:
            out.close()


def run_daemon(config: Path, only: str, log: str | None = None) -> subprocess.Popen:
    """``cdc run CONFIG --only ONLY``: one connector's daemon."""
    return cdc_process(config, "run", "--only", only, log=log)


def stop_daemon(process: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM to its whole session (it drains), SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def kill_daemon(process: subprocess.Popen) -> None:
    """SIGKILL to its whole session (a crash)."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
