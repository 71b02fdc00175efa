"""A Redis server with TLS on loopback that a test starts itself, and the throwaway certificates
it needs (made with the openssl CLI into the test's directory).

The server runs in a process group of its own and is killed whole (``os.killpg``) at the end;
Debian's redis-server is built with TLS. It requires a client certificate signed by the test CA
(``tls-auth-clients yes``) and a password, so a sink that reaches it has used every TLS setting.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.integration.pg_capture import wait_until


@dataclass(frozen=True)
class TlsFiles:
    ca: Path            # the CA that signs the server's and the client's certificates
    server_cert: Path   # names 127.0.0.1 and localhost
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path      # a CA that signed nothing here: the wrong one


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl(directory, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN=cdc test {ca}",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.crt")
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, extra in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _openssl(directory, "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=cdc test {name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr")
        _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "1", "-out", f"{name}.crt", *extra)
    return TlsFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key",
                    directory / "client.crt", directory / "client.key", directory / "other-ca.crt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TlsRedis:
    """``redis-server --port 0 --tls-port P`` on loopback; ``url`` has no password in it."""

    def __init__(self, directory: Path, files: TlsFiles, password: str) -> None:
        self.dir, self.files, self.password = directory, files, password
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        files = self.files
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, ssl=True,
                           ssl_ca_certs=str(files.ca), ssl_certfile=str(files.client_cert),
                           ssl_keyfile=str(files.client_key), socket_timeout=10)

    def start(self) -> None:
        files = self.files
        for _ in range(3):  # the port is picked before redis binds it: another process may take it
            self.port = _free_port()
            with open(self.dir / "redis-tls.log", "ab") as log:
                self.process = subprocess.Popen(
                    ["redis-server", "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
                     "--tls-cert-file", str(files.server_cert), "--tls-key-file", str(files.server_key),
                     "--tls-ca-cert-file", str(files.ca), "--tls-auth-clients", "yes",
                     "--requirepass", self.password, "--dir", str(self.dir), "--save", "", "--appendonly", "no",
                     "--protected-mode", "no", "--loglevel", "warning"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            client = self.client()
            try:
                if wait_until(lambda: self.process.poll() is not None or _answers(client), timeout=30,
                              what="the test's TLS redis-server") and self.process.poll() is None:
                    return
            finally:
                client.close()
        raise AssertionError(f"the TLS redis-server did not start; see {self.dir / 'redis-tls.log'}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.exceptions.BusyLoadingError):
        return False
