"""Processes that are other hosts to Kafka: a member of a consumer group run with ``as_host``'s
environment connects to the brokers from its own loopback address (127.0.0.2, 127.0.0.3, ...),
which the group's coordinator reports as the member's host. ``source_address.c`` (built here
with gcc, which scripts/setup installs) does it: librdkafka has no source-address setting."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("source_address.c")


def _library() -> Path:
    """The shared library, built once per version of the source (in the temp directory)."""
    text = SOURCE.read_bytes()
    built = Path(tempfile.gettempdir()) / f"cdc-source-address-{hashlib.sha256(text).hexdigest()[:12]}.so"
    if not built.exists():
        partial = built.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE), "-ldl"], check=True,
                       capture_output=True)
        partial.replace(built)
    return built


def as_host(address: str, bootstrap: str) -> dict[str, str]:
    """Environment for a process whose connections to the brokers of ``bootstrap`` (host:port,...)
    come from ``address``."""
    ports = ",".join(server.rsplit(":", 1)[1] for server in bootstrap.split(","))
    return {"LD_PRELOAD": str(_library()), "CDC_SOURCE_ADDRESS": address, "CDC_SOURCE_PORTS": ports}
