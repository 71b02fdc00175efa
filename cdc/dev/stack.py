"""Bring the local stack up, down, and report on it.

State lives in ``<dev home>/dev.json`` (the throwaway root directory, and per service its pid and
ports) and the connection settings in ``<dev home>/dev.env``. ``up`` is idempotent: services that
are running and answer are kept, dead ones are cleaned away and started again. A file lock makes
concurrent ``up``/``down`` calls (two test sessions, say) take turns.

Every server is started in a session of its own, so ``down`` can signal its whole process group
and wait until no process of it is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from cdc.dev import jars
from cdc.dev.paths import dev_home, env_file, state_file
from cdc.dev.services import SERVICES, Service
from cdc.errors import DevStackError

log = logging.getLogger(__name__)

# "spark" has no server: it stands for the Kafka-source and Delta jars a local Spark session needs.
ALL = (*SERVICES, "spark")


@dataclass(frozen=True, slots=True)
class Status:
    name: str
    pid: int | None
    ports: dict[str, int]
    running: bool
    answering: bool


def _check_names(names: list[str] | tuple[str, ...] | None) -> list[str]:
    chosen = list(ALL if not names else names)
    unknown = [n for n in chosen if n not in ALL]
    if unknown:
        raise DevStackError(f"unknown service(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
    return chosen


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    dev_home().mkdir(parents=True, exist_ok=True)
    with open(dev_home() / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _load() -> dict:
    try:
        return json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {"root": None, "services": {}}


def _save(state: dict) -> None:
    tmp = state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_file())
    env: dict[str, str] = {}
    for name, entry in sorted(state["services"].items()):
        env.update(entry["settings"])
    lines = [f"{key}={value}\n" for key, value in sorted(env.items())]
    tmp = env_file().with_suffix(".tmp")
    tmp.write_text("".join(lines))
    tmp.replace(env_file())


def _service(root: str, name: str, entry: dict | None = None) -> Service:
    return SERVICES[name](Path(root), entry["ports"] if entry else None)


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def _stop_group(pgid: int, sig: int, grace: float = 30.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
    deadline = time.monotonic() + grace
    while _group_members(pgid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            grace, deadline = 0.0, time.monotonic() + 10
        _reap()
        time.sleep(0.05)


def _reap() -> None:
    """Collect exited children of this process (servers started by an in-process ``up``)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _wait_ready(services: dict[str, tuple[Service, object]], timeout: float) -> None:
    pending = dict(services)
    deadline = time.monotonic() + timeout
    while pending:
        for name, (service, process) in list(pending.items()):
            if process.poll() is not None:
                raise DevStackError(f"{name} exited with code {process.returncode} while starting; "
                                    f"its log ({service.log_path}) ends:\n{service.log_tail()}")
            if service.probe():
                service.after_ready()
                log.info("%s is ready on port %d", name, service.port)
                del pending[name]
        if pending and time.monotonic() > deadline:
            names = ", ".join(pending)
            raise DevStackError(f"{names} did not answer within {timeout:.0f}s; last log lines:\n" +
                                "\n".join(s.log_tail(8) for s, _ in pending.values()))
        if pending:
            time.sleep(0.2)


def up(names: list[str] | tuple[str, ...] | None = None, *, timeout: float = 180.0) -> dict[str, str]:
    """Start the named services (all by default) unless they already run; return dev.env's settings."""
    chosen = _check_names(names)
    with _locked():
        state = _load()
        for name, entry in list(state["services"].items()):
            if name == "spark":
                continue
            service = _service(state["root"], name, entry)
            if not _group_members(entry["pid"]) or not service.probe():
                log.warning("%s (pid %s) is no longer answering; starting it again", name, entry["pid"])
                _stop_group(entry["pid"], signal.SIGKILL)
                shutil.rmtree(service.dir, ignore_errors=True)
                del state["services"][name]
        if not state["root"] or not os.path.isdir(state["root"]):
            # World-traversable, so servers running as their own system users can reach their dirs.
            state["root"] = tempfile.mkdtemp(prefix="cdc-dev-")
            os.chmod(state["root"], 0o755)
            state["services"] = {}
        if "spark" in chosen:
            state["services"]["spark"] = {"pid": None, "ports": {},
                                          "settings": {"SPARK_JARS": ",".join(jars.spark_jars())}}
        to_start = [n for n in chosen if n != "spark" and n not in state["services"]]
        services = {n: _service(state["root"], n) for n in to_start}
        # Java components need their jars before anything starts; resolve them first, one by one
        # (parallel Maven runs would race on the shared local repository).
        for name in to_start:
            if name in jars.COMPONENTS:
                jars.ensure_jars(name)
        with ThreadPoolExecutor(max_workers=max(1, len(services))) as pool:
            for future in [pool.submit(s.prepare) for s in services.values()]:
                future.result()
        started: dict[str, tuple[Service, object]] = {}
        try:
            for name, service in services.items():
                started[name] = (service, service.launch())
            _wait_ready(started, timeout)
        except BaseException:
            for service, process in started.values():
                _stop_group(process.pid, signal.SIGKILL)
            raise
        for name, (service, process) in started.items():
            state["services"][name] = {"pid": process.pid, "ports": service.ports,
                                       "settings": service.settings()}
        _save(state)
        return read_env()


def down() -> list[str]:
    """Stop every service of the stack, wait until no process of it is left, delete its data."""
    with _locked():
        state = _load()
        stopped = []
        for name, entry in state["services"].items():
            if name == "spark" or entry["pid"] is None:
                continue
            _stop_group(entry["pid"], SERVICES[name].stop_signal)
            stopped.append(name)
        if state["root"]:
            shutil.rmtree(state["root"], ignore_errors=True)
        for path in (state_file(), env_file()):
            path.unlink(missing_ok=True)
        return stopped


def status() -> list[Status]:
    state = _load()
    rows = []
    for name in ALL:
        entry = state["services"].get(name)
        if entry is None:
            rows.append(Status(name, None, {}, False, False))
        elif name == "spark":
            rows.append(Status(name, None, {}, True, bool(entry["settings"].get("SPARK_JARS"))))
        else:
            running = bool(_group_members(entry["pid"]))
            answering = running and _service(state["root"], name, entry).probe()
            rows.append(Status(name, entry["pid"], entry["ports"], running, answering))
    return rows


def read_env() -> dict[str, str]:
    """The settings in dev.env (empty when the stack is down)."""
    try:
        text = env_file().read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
