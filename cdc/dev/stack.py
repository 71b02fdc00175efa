"""Bring the local stack up, down, and report on it.

State lives in ``<dev home>/dev.json`` (the throwaway root directory, and per service its pid,
ports and whether it was stopped or frozen on purpose) and the connection settings in
``<dev home>/dev.env``. ``up`` is idempotent: services that are running and answer are kept; a
frozen one is thawed; a dead one is started again on its data directory and its ports, so its
data survives a crash (only if that fails, say its port was taken meanwhile, is it started afresh
on new ports). A file lock makes concurrent calls (two test sessions, say) take turns.

One service at a time, for fault tests and by hand (``cdc dev stop|kill|freeze|thaw|start|restart
SERVICE``): ``stop`` is a clean shutdown, ``kill`` a SIGKILL of the whole process group (a crash),
``freeze``/``thaw`` SIGSTOP/SIGCONT of the group (a server that hangs with its sockets open),
``start`` launches it again on the same data and ports, ``restart`` is ``stop`` then ``start``.

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
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cdc.dev import jars
from cdc.dev.paths import dev_home, env_file, state_file
from cdc.dev.services import SERVICES, Service
from cdc.errors import DevStackError

log = logging.getLogger(__name__)

# "spark" has no server: it stands for the Kafka-source and Delta jars a local Spark session needs.
ALL = (*SERVICES, "spark")
# What `cdc dev up` starts when no service is named: not the servers only some tests need
# (started when named, or by the test fixture that needs them).
DEFAULT = tuple(n for n in ALL if not getattr(SERVICES.get(n), "on_demand", False))
# `cdc dev up --profile NAME`: the default stack and more. ``cluster``: a replicated Kafka of three
# nodes, a Redis Cluster with a replica per master and a Spark standalone cluster of a master and
# two workers (the tests marked `cluster`).
PROFILES = {"cluster": (*DEFAULT, "kafka1", "kafka2", "kafka3", "redis-ha", "spark-master", "spark-worker1",
                        "spark-worker2")}


@dataclass(frozen=True, slots=True)
class Status:
    name: str
    pid: int | None
    ports: dict[str, int]
    running: bool
    answering: bool
    frozen: bool = False


def _check_names(names: list[str] | tuple[str, ...] | None) -> list[str]:
    chosen = list(DEFAULT if not names else names)
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
    for _name, entry in sorted(state["services"].items()):
        env.update(entry["settings"])
    lines = [f"{key}={value}\n" for key, value in sorted(env.items())]
    tmp = env_file().with_suffix(".tmp")
    tmp.write_text("".join(lines))
    tmp.replace(env_file())


def _service(root: str, name: str, entry: dict | None = None) -> Service:
    return SERVICES[name](Path(root), entry["ports"] if entry else None)


def _new_services(state: dict, names: list[str]) -> dict[str, Service]:
    """Services to start afresh. The members of a ``group`` (the nodes of one cluster) share one
    ports map: a member's peers' ports are part of its configuration."""
    shared = {group: entry["ports"] for n, entry in state["services"].items()
              if (group := getattr(SERVICES.get(n), "group", None))}
    services = {}
    for name in names:
        group = getattr(SERVICES[name], "group", None)
        services[name] = SERVICES[name](Path(state["root"]), shared.get(group))
        if group:
            shared.setdefault(group, services[name].ports)
    return services


def _group_members(pgid: int, *, zombies: bool = False) -> list[int]:
    """Live (by default non-zombie) processes whose process group is ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if (zombies or fields[0] != "Z") and int(fields[2]) == pgid:
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
    # Until its parent reaps it, a dead server's pid still exists (a zombie), and a server started
    # again at once on the same data may refuse it (PostgreSQL: "Is another postmaster running?").
    deadline = time.monotonic() + 10
    while _group_members(pgid, zombies=True) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.05)


def _reap() -> None:
    """Collect exited children of this process (servers started by an in-process ``up``)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _wait_ready(services: dict[str, tuple[Service, subprocess.Popen]], timeout: float) -> None:
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


def _alive(entry: dict) -> bool:
    return entry.get("pid") is not None and bool(_group_members(entry["pid"]))


def _relaunch(state: dict, name: str, timeout: float) -> None:
    """Start a service that is not running again on its data directory and ports; wait for it."""
    entry = state["services"][name]
    service = _service(state["root"], name, entry)
    if not service.dir.is_dir():
        raise DevStackError(f"{name}: its data directory {service.dir} is gone; run `cdc dev up`")
    process = service.launch()
    try:
        _wait_ready({name: (service, process)}, timeout)
    except BaseException:
        _stop_group(process.pid, signal.SIGKILL)
        raise
    entry.update(pid=process.pid, stopped=False, frozen=False)


def up(names: list[str] | tuple[str, ...] | None = None, *, timeout: float = 180.0) -> dict[str, str]:
    """Start the named services (all by default) unless they already run; return dev.env's settings.
    A member of a group (a node of a cluster) brings its whole group: one node alone cannot form
    the cluster (a Kafka node waiting for its quorum exits after a minute)."""
    chosen = _check_names(names)
    groups = {getattr(SERVICES.get(n), "group", None) for n in chosen} - {None}
    chosen += [n for n, cls in SERVICES.items() if getattr(cls, "group", None) in groups and n not in chosen]
    with _locked():
        state = _load()
        for name, entry in list(state["services"].items()):
            if name == "spark":
                continue
            if entry.get("frozen") and _alive(entry):
                log.warning("%s (pid %s) was frozen; thawing it", name, entry["pid"])
                _signal_group(entry, signal.SIGCONT)
                entry["frozen"] = False
            service = _service(state["root"], name, entry)
            if _alive(entry) and service.probe():
                continue
            log.warning("%s (pid %s) is not answering; starting it again on its data and port %d",
                        name, entry.get("pid"), service.port)
            if entry.get("pid") is not None:
                _stop_group(entry["pid"], signal.SIGKILL)
            try:
                _relaunch(state, name, timeout)
            except DevStackError as err:
                log.warning("%s could not start on its data (%s); starting it afresh", name, err)
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
        services = _new_services(state, to_start)
        # Java components need their jars before anything starts; resolve them first, one by one
        # (parallel Maven runs would race on the shared local repository).
        for name in to_start:
            for component in jars.components_of(name):
                jars.ensure_jars(component)
        with ThreadPoolExecutor(max_workers=max(1, len(services))) as pool:
            for future in [pool.submit(s.prepare) for s in services.values()]:
                future.result()
        started: dict[str, tuple[Service, subprocess.Popen]] = {}
        try:
            for name, service in services.items():
                started[name] = (service, service.launch())
            _wait_ready(started, timeout)
        except BaseException:
            for _, process in started.values():
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
            if name == "spark" or not _alive(entry):
                continue
            if entry.get("frozen"):
                _signal_group(entry, signal.SIGCONT)
            _stop_group(entry["pid"], SERVICES[name].stop_signal)
            stopped.append(name)
        if state["root"]:
            shutil.rmtree(state["root"], ignore_errors=True)
        for path in (state_file(), env_file()):
            path.unlink(missing_ok=True)
        return stopped


def _entry(state: dict, name: str) -> dict:
    _check_names([name])
    entry = state["services"].get(name)
    if entry is None or name == "spark":
        raise DevStackError(f"{name} is not part of the stack (has no server); start it with `cdc dev up`")
    return entry


def _signal_group(entry: dict, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(entry["pid"], sig)


def stop(name: str) -> None:
    """Shut one service down cleanly, keeping its data directory and ports."""
    with _locked():
        state = _load()
        entry = _entry(state, name)
        if _alive(entry):
            if entry.get("frozen"):  # a stopped process cannot act on SIGTERM
                _signal_group(entry, signal.SIGCONT)
            _stop_group(entry["pid"], SERVICES[name].stop_signal)
        entry.update(pid=None, stopped=True, frozen=False)
        _save(state)


def kill(name: str) -> None:
    """SIGKILL one service's whole process group (a crash); its data directory stays."""
    with _locked():
        state = _load()
        entry = _entry(state, name)
        if _alive(entry):
            _stop_group(entry["pid"], signal.SIGKILL, grace=0.0)
        entry.update(pid=None, stopped=True, frozen=False)
        _save(state)


def freeze(name: str) -> None:
    """SIGSTOP one service's process group: it keeps its sockets open and answers nothing."""
    _set_frozen(name, True)


def thaw(name: str) -> None:
    """SIGCONT a frozen service."""
    _set_frozen(name, False)


def _set_frozen(name: str, frozen: bool) -> None:
    with _locked():
        state = _load()
        entry = _entry(state, name)
        if not _alive(entry):
            raise DevStackError(f"{name} is not running")
        _signal_group(entry, signal.SIGSTOP if frozen else signal.SIGCONT)
        entry["frozen"] = frozen
        _save(state)


def start(name: str, *, timeout: float = 180.0) -> None:
    """Start a stopped (or crashed) service on its data directory and ports; no-op if it answers."""
    with _locked():
        state = _load()
        entry = _entry(state, name)
        if entry.get("frozen") and _alive(entry):
            _signal_group(entry, signal.SIGCONT)
            entry["frozen"] = False
        if _alive(entry) and _service(state["root"], name, entry).probe():
            _save(state)
            return
        if entry.get("pid") is not None:
            _stop_group(entry["pid"], signal.SIGKILL)  # what is left of a hung or crashed server
        _relaunch(state, name, timeout)
        _save(state)


def restart(name: str, *, timeout: float = 180.0) -> None:
    """``stop`` then ``start``: a clean restart on the same data and ports."""
    stop(name)
    start(name, timeout=timeout)


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
            running = _alive(entry)
            frozen = running and bool(entry.get("frozen"))
            answering = running and not frozen and _service(state["root"], name, entry).probe()
            rows.append(Status(name, entry["pid"], entry["ports"], running, answering, frozen))
    return rows


def read_env() -> dict[str, str]:
    """The settings in dev.env (empty when the stack is down)."""
    try:
        text = env_file().read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
