"""The base of the local stack's servers, and the helpers they share (ports, binaries, users).

A service is built from its data directory and its ports alone, so the same object can be made
again from the state file by a later ``cdc dev status``, ``restart`` or ``down``. ``prepare`` runs
once per data directory; ``launch`` runs again on every restart, with the same data and ports.

``probe`` makes one connection attempt and says whether *this stack's* server answers: a port can
be answered by another stack's server (two checkouts, a port freed by a stopped server and taken by
another), so every probe also checks an identity only our server has (its data directory, its
Kafka cluster id, its OpenSearch cluster name, a connection id seen on both sides).

PostgreSQL and MariaDB refuse to run as root: when we are root they run as their system users
(``postgres``, ``mysql``), which then own the data directory.
"""

from __future__ import annotations

import logging
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import ClassVar

from cdc.errors import DevStackError

LOOPBACK = "127.0.0.1"

log = logging.getLogger(__name__)


def _same_path(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(str(a).rstrip("/")) == os.path.realpath(str(b).rstrip("/"))


def _foreign(service: Service, what: str) -> bool:
    """Log (once per process and port) that another server answers our port; always False."""
    key = (service.name, service.port)
    if key not in _warned:
        _warned.add(key)
        log.warning("%s: port %d is answered by a server that is not this stack's (%s)",
                    service.name, service.port, what)
    return False


_warned: set[tuple[str, int]] = set()


def free_port(low: int | None = None, high: int | None = None) -> int:
    """A TCP port on loopback that nothing listens on now (in [low, high] when given).

    A range is tried in random order: two stacks starting at once would otherwise both pick its
    first port before either server binds it.
    """
    candidates = [0] if low is None else random.sample(range(low, (high or low) + 1), (high or low) - low + 1)
    for candidate in candidates:
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, candidate))
            except OSError:
                continue
            return s.getsockname()[1]
    raise DevStackError(f"no free loopback port in {low}..{high}")


def port_open(port: int, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _system_user(name: str) -> tuple[int, int] | None:
    """(uid, gid) to run a server as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for candidate in (name, "nobody"):
        try:
            entry = pwd.getpwnam(candidate)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise DevStackError(f"running as root and there is no '{name}' user to run the server as")


def _chown_tree(path: Path, owner: tuple[int, int] | None) -> None:
    if owner is None:
        return
    for dirpath, _dirnames, filenames in os.walk(path):
        os.chown(dirpath, *owner)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), *owner)


def _find_binary(name: str, extra_dirs: list[str]) -> str:
    for directory in extra_dirs:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    raise DevStackError(f"'{name}' is not installed; run scripts/setup")


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else _find_binary("java", [])


class Service:
    """Base of the servers. Subclasses set ``name``, the ports they need, and the four steps."""

    name: ClassVar[str]
    port_names: ClassVar[tuple[str, ...]] = ("port",)
    run_as: ClassVar[str | None] = None
    stop_signal: ClassVar[int] = signal.SIGTERM

    def __init__(self, root: Path, ports: dict[str, int] | None = None) -> None:
        self.dir = root / self.name
        self.ports = dict(ports) if ports else self.choose_ports()

    @property
    def port(self) -> int:
        return self.ports["port"]

    @property
    def log_path(self) -> Path:
        return self.dir.parent / f"{self.name}.log"

    def choose_ports(self) -> dict[str, int]:
        return {name: free_port() for name in self.port_names}

    def owner(self) -> tuple[int, int] | None:
        return _system_user(self.run_as) if self.run_as else None

    def run(self, cmd: list[str]) -> None:
        """Run a set-up command to completion as the service's user; fail with its output."""
        owner = self.owner()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.dir,
                              user=owner[0] if owner else None, group=owner[1] if owner else None,
                              extra_groups=[] if owner else None)
        if done.returncode != 0:
            out = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise DevStackError(f"{self.name}: {' '.join(cmd[:2])} failed (exit {done.returncode}):\n{out}")

    def prepare(self) -> None:
        """Create the data directory and initialise it (may take seconds)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        _chown_tree(self.dir, self.owner())

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """Variables the server needs beyond this process's environment."""
        return {}

    def launch(self) -> subprocess.Popen:
        owner = self.owner()
        log = open(self.log_path, "ab")
        extra = self.environment()
        try:
            return subprocess.Popen(
                self.command(), cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log,
                env={**os.environ, **extra} if extra else None,
                stderr=subprocess.STDOUT, start_new_session=True,
                user=owner[0] if owner else None, group=owner[1] if owner else None,
                extra_groups=[] if owner else None)
        finally:
            log.close()

    def probe(self) -> bool:
        raise NotImplementedError

    def after_ready(self) -> None:
        """One-time set-up that needs the running server (users, grants)."""

    def settings(self) -> dict[str, str]:
        """The connection settings this service adds to dev.env."""
        raise NotImplementedError

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
