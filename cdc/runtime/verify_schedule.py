"""``verify:`` on a sink: the daemon runs ``cdc verify`` of its store in the background.

A thread of the supervisor starts each sink's pass every ``every`` seconds (from the start of the
last one; a pass that takes longer is followed by the next at once), one pass at a time, as a
child process ``cdc verify FILE SINK --json`` in a session of its own: the daemon's processes
never share a core's GIL with it, and a pass that fails or is killed changes nothing else. Its
answer becomes ``result(sink)``, which ``/metrics`` shows as ``cdc_verify_mismatched_rows{sink,
table}`` (missing, extra and different keys) and ``cdc_verify_last_pass_timestamp_seconds``. A
mismatch, or a pass that could not decide (unsettled keys: exit 3), is logged as a warning naming
the first keys of each kind with both sides, and never stops the pipeline. ``stop()`` kills a
pass under way.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from cdc.runtime.verify_cli import EXIT_DIFFERENT, EXIT_EQUAL, EXIT_UNSETTLED

log = logging.getLogger(__name__)

SHOWN = 3  # keys per kind of difference named in the log, with both sides


class VerifySchedule:
    def __init__(self, config_path: str, names: list[str]) -> None:
        self.config_path, self.names = config_path, names
        self._results: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._child: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._loop, name="cdc-verify", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def result(self, sink: str) -> dict[str, Any] | None:
        """The last pass of ``sink``: ``at`` (Unix time it ended), ``tables`` {table: keys that
        differ}, ``equal``, ``error`` (why the pass gave no answer, or None); None before the first."""
        with self._lock:
            return self._results.get(sink)

    def _schedules(self) -> dict[str, tuple[float, float | None]]:
        from cdc.config import load_config

        config = load_config(self.config_path, only=self.names)
        return {s.name: (s.verify.every, s.verify.rows_per_s) for s in config.sinks
                if s.name in self.names and s.verify is not None}

    def _loop(self) -> None:
        try:
            schedules = self._schedules()
        except Exception as err:  # noqa: BLE001 - the workers report a broken config themselves
            log.warning("background verify is off: %s", err)
            return
        due = {name: time.monotonic() for name in schedules}
        while schedules and not self._stop.is_set():
            name = min(due, key=lambda n: due[n])
            if self._stop.wait(max(0.0, due[name] - time.monotonic())):
                return
            began = time.monotonic()
            every, rows_per_s = schedules[name]
            self._note(name, self._pass(name, rows_per_s))
            due[name] = began + every

    def _pass(self, sink: str, rows_per_s: float | None) -> dict[str, Any]:
        command = [sys.executable, "-m", "cdc.cli", "verify", self.config_path, sink, "--json"]
        if rows_per_s is not None:
            command += ["--rows-per-s", str(rows_per_s)]
        self._child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True)
        out, err = self._child.communicate()
        code = self._child.returncode
        try:
            answer = json.loads(out) if code in (EXIT_EQUAL, EXIT_DIFFERENT, EXIT_UNSETTLED) else None
        except json.JSONDecodeError:
            answer = None
        if answer is None:
            last = (err.decode(errors="replace").strip().splitlines() or [f"exit code {code}"])[-1]
            return {"at": time.time(), "tables": {}, "equal": None, "error": last}
        tables = {t["table"]: t["counts"]["missing"] + t["counts"]["extra"] + t["counts"]["different"]
                  for t in answer["tables"]}
        return {"at": time.time(), "tables": tables, "equal": answer["equal"], "error": None,
                "shown": _shown(answer["tables"])}

    def _note(self, sink: str, result: dict[str, Any]) -> None:
        if self._stop.is_set():
            return  # a pass cut short by the stop says nothing
        if result["error"] is not None:
            log.warning("background verify of sink %s gave no answer: %s", sink, result["error"])
        elif not result["equal"]:
            differ = ", ".join(f"{t}: {n}" for t, n in result["tables"].items() if n)
            if differ:
                log.warning("background verify of sink %s: keys differ (%s): %s", sink, differ, result["shown"])
            else:
                log.warning("background verify of sink %s: not decided, keys unsettled (still changing, or the "
                            "store did not apply the log in time): %s", sink, result["shown"])
        with self._lock:
            self._results[sink] = result


def _shown(tables: list[dict[str, Any]]) -> str:
    """The first keys of each kind a pass found, with both sides, as the warning names them (the
    pass's process is gone after it: this line is what keeps them)."""
    parts = []
    for table in tables:
        for kind in ("missing", "extra", "different", "unsettled"):
            for found in table.get(kind, [])[:SHOWN]:
                parts.append(f"{table['table']} {kind} key {json.dumps(found['key'])}: source "
                             f"{json.dumps(found['source'], default=str)}, store {json.dumps(found['store'], default=str)}")
    return "; ".join(parts) or "no keys listed"
