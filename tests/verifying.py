"""Helpers of the ``cdc verify`` tests: a verify run in this process, the keys of its answer, and
(from the dev stack) a free port for a daemon's HTTP API."""

from __future__ import annotations

import json
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

from cdc.cli import main
from cdc.dev.service import free_port

__all__ = ["free_port", "keys_of", "verify"]


def verify(config: Path | str, sink: str, *args: str, settle_timeout: float = 30) -> tuple[int, dict]:
    """``cdc verify --json`` in this process: its exit code and its answer."""
    out = StringIO()
    with redirect_stdout(out):
        code = main(["verify", str(config), sink, "--json", "--settle-timeout", str(settle_timeout), *args])
    return code, json.loads(out.getvalue()) if out.getvalue().strip() else {}


def keys_of(answer: dict, kind: str) -> list:
    """The keys of one kind (missing, extra, different, unsettled) in every table of an answer."""
    return sorted(k for table in answer["tables"] for finding in table[kind] for k in finding["key"])
