"""The capture daemon (``cdc run``) and other ``cdc`` commands as processes of a test, shared by
the end-to-end tests: each runs in a session of its own, so it is stopped or killed whole
(``os.killpg``), children included. ``kill_daemon`` also kills the sessions its descendants made
for themselves (the Delta sink starts Spark's JVM in one of its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def cdc_process(config: Path, command: str, *args: str, log: str | None = None,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """``cdc <command> <config> <args>`` in a session of its own, run in the config's directory;
    its output appended to ``log`` (a file name beside the config), else discarded; ``env`` added
    to the environment."""
    return module_process(config, "cdc.cli", command, str(config), *args, log=log, env=env)


def module_process(config: Path, module: str, *args: str, log: str | None = None,
                   env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m <module> <args>`` in a session of its own, run in the config's directory (the
    project's root on its path), its output appended to ``log`` as ``cdc_process`` does."""
    out = open(config.parent / log, "ab") if log else subprocess.DEVNULL
    root = str(Path(__file__).resolve().parent.parent)
    environment = {**os.environ, **(env or {}),
                   "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        return subprocess.Popen([sys.executable, "-m", module, *args], cwd=config.parent, env=environment, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log:
            out.close()


def run_daemon(config: Path, only: str, log: str | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``cdc run CONFIG --only ONLY``: one connector's daemon."""
    return cdc_process(config, "run", "--only", only, log=log, env=env)


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
    """SIGKILL to its whole session and to the sessions of its descendants (a crash), all frozen
    first so that none of them acts after another died (Spark's JVM would finish a commit)."""
    groups = {process.pid} | {group for pid in _descendants(process.pid) if (group := _group(pid)) is not None}
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for group in groups:
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                pass
    process.wait()


def wait_beside(what: str, check, daemon: subprocess.Popen, limit: float = 180.0, every: float = 0.5):
    """Poll ``check`` until it returns something truthy, which is returned; fail naming ``what``
    after ``limit`` seconds, or at once if ``daemon`` exited meanwhile."""
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        assert daemon.poll() is None, f"the daemon exited ({daemon.returncode}) before {what}"
        assert time.monotonic() < deadline, f"not within {limit:.0f}s: {what}"
        time.sleep(every)


def _group(pid: int) -> int | None:
    """The process group of ``pid``; None once it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux: /proc), whatever session it is in."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found
