"""Running the contenders of a benchmark one after the other: ``cdc run`` and Debezium's
connectors in Kafka Connect standalone (``cdc.dev.connect``), each started in a session of its
own, timed from the start of its process until a probe says the work is done, then ended whole.

Used by bench/debezium_capture.py (records in a topic) and bench/jdbc_sink.py (rows in a table);
the probe is theirs; their shared options, the list of contenders, the starting, waiting and
stopping are here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# (done, where it stands): "1,200 of 5,000 records in t", "the target at (3, 9) of (5, 15)".
Probe = Callable[[], tuple[bool, str]]


def add_contender_arguments(parser, each: str) -> None:
    """The options of a bench of ours against Debezium: partitions, a time limit for ``each``
    contender ("reader", "applier"), which Debezium runs to leave out."""
    parser.add_argument("--partitions", type=int, default=3, help="partitions of each topic")
    parser.add_argument("--timeout", type=float, default=1200, help=f"seconds each {each} may take at most")
    parser.add_argument("--skip-default", action="store_true", help="no Debezium run with its defaults")
    parser.add_argument("--skip-tuned", action="store_true", help="no tuned Debezium run")


def contenders(args) -> list[tuple[str, bool | None]]:
    """(label, tuned) in the order they run: ours (None), then Debezium with its defaults (False)
    and tuned (True) unless ``--skip-default``/``--skip-tuned``."""
    runs: list[tuple[str, bool | None]] = [("ours", None)]
    if not args.skip_default:
        runs.append(("debezium default", False))
    if not args.skip_tuned:
        runs.append(("debezium tuned", True))
    return runs


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process's session, SIGKILL after 30 s; nothing when it has ended already."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_until_done(probe: Probe, began: float, alive: Callable[[], bool], describe: Callable[[], str],
                    timeout: float, who: str, interval: float) -> float:
    """Seconds from ``began`` until ``probe`` says done; an error with ``describe()`` (the
    contender's log) when ``who`` ends or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not (progress := probe())[0]:
        if not alive():
            raise RuntimeError(f"the {who} ended with {progress[1]}:\n{describe()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{progress[1]} after {timeout:g}s:\n{describe()}")
        time.sleep(interval)
    return time.perf_counter() - began


def time_cdc(directory: Path, config: str, options: list[str], wait) -> float:
    """``cdc run`` of ``config`` (YAML text, written to ``directory``, made here) with ``options``:
    ``wait(began, alive, describe)``'s seconds."""
    directory.mkdir()
    path = directory / "cdc.yaml"
    path.write_text(config)
    log = directory / "cdc.log"
    began = time.perf_counter()
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(path), *options], cwd=directory,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return wait(began, lambda: process.poll() is None,
                    lambda: "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
    finally:
        stop_group(process)


def time_connect(directory: Path, bootstrap: str, connectors: dict[str, dict[str, str]],
                 worker_settings: dict[str, str] | None, wait) -> float:
    """A Connect standalone worker (-Xmx1g, its directory made here) running ``connectors``:
    ``wait(began, alive, describe)``'s seconds; a failed task counts as the worker ending."""
    from cdc.dev.connect import ConnectStandalone

    directory.mkdir()
    connect = ConnectStandalone(directory, bootstrap)
    began = time.perf_counter()
    connect.start(connectors, worker_settings=worker_settings, heap="1g")
    try:
        return wait(began, lambda: connect.alive() and not connect.task_failed(), connect.log_tail)
    finally:
        connect.stop()
