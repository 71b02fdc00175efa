"""The PostgreSQL snapshot's reader processes (snapshot/processes.py) under `cdc run`: they die
with the daemon. Each test freezes the daemon's process group (SIGSTOP) once the readers exist,
so the strike lands mid-snapshot by construction, not by a sleep; then kills and looks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg2
import pytest

pytestmark = pytest.mark.postgres

ROWS = 400_000  # a snapshot that takes seconds, so the readers are still reading when frozen


def _group(pgid: int) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every live process in group ``pgid``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        state, ppid, group = fields[0], int(fields[1]), int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            found[int(entry)] = (ppid, cmdline)
    return found


def _readers(pgid: int) -> dict[int, int]:
    """reader pid -> its parent's pid: the spawned children of the daemon's capture process (the
    daemon spawns one per source; that one spawns the readers)."""
    return {pid: ppid for pid, (ppid, cmdline) in _group(pgid).items() if "spawn_main" in cmdline and ppid != pgid}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")


def _wait(what: str, check, daemon: subprocess.Popen, log_file: Path, limit: float = 180):
    """Poll until ``check()`` is truthy; a bound on a broken test, not a timing assertion."""
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        if daemon.poll() is not None:
            raise AssertionError(f"the daemon exited before {what}:\n{log_file.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log_file.read_text()[-3000:]}")
        time.sleep(0.05)


def _start(pg_dsn: str, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL)")
        cur.execute("INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, %s) g", (ROWS,))
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: '{tmp_path / 'log'}', topic_prefix: shop, fsync: false}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{pg_dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', snapshot_workers: 2, snapshot_processes: true, snapshot_chunk_pages: 64}}\n"
        "http: null\n")
    log_file = tmp_path / "daemon.log"
    daemon = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=tmp_path,
                              stdout=open(log_file, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    return daemon, log_file


def _frozen_with_readers(daemon: subprocess.Popen, log_file: Path) -> dict[int, int]:
    """Freeze the daemon's group the moment both readers exist; thaw and retry if they were not
    all there yet. Returns the readers (pid -> parent pid), frozen."""
    while True:
        _wait("the snapshot's reader processes", lambda: len(_readers(daemon.pid)) >= 2, daemon, log_file)
        os.killpg(daemon.pid, signal.SIGSTOP)
        readers = _readers(daemon.pid)
        if len(readers) >= 2:
            return readers
        os.killpg(daemon.pid, signal.SIGCONT)


def test_kill_9_of_the_daemons_group_leaves_no_reader_process(pg_dsn, tmp_path):
    daemon, log_file = _start(pg_dsn, tmp_path)
    try:
        readers = _frozen_with_readers(daemon, log_file)
        assert len(set(readers.values())) == 1 and daemon.pid not in readers  # children of one capture process
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(30)
    _wait_gone(readers)
    _wait_gone(_group(daemon.pid))  # nothing else of the daemon either (its capture process, trackers)


def test_readers_die_when_their_capture_process_is_killed_alone(pg_dsn, tmp_path):
    """Not the group: only the process that started the readers (PR_SET_PDEATHSIG takes them)."""
    daemon, log_file = _start(pg_dsn, tmp_path)
    try:
        readers = _frozen_with_readers(daemon, log_file)
        (parent,) = set(readers.values())
        os.kill(parent, signal.SIGKILL)
        os.killpg(daemon.pid, signal.SIGCONT)
        _wait_gone(readers)
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(30)


def _wait_gone(pids, limit: float = 30) -> None:
    """The kernel takes a moment to deliver the signals; a bound, not a timing assertion."""
    deadline = time.monotonic() + limit
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes still alive: {[p for p in pids if _alive(p)]}")
        time.sleep(0.05)
