"""``cdc status`` answered by the daemon: ``GET /status/report?name=A&name=B``.

The command's slow path loads the config (pydantic, every plugin's model), opens the log and asks
each PostgreSQL server for its slots: over a second before it prints a line. The daemon has all of
that loaded already, so it computes the same rows here and the command (``quick_status``) only
prints them. The answer carries the real path and the SHA-256 of the config file the daemon
loaded: the command uses it only when both match the file it was given, so a daemon started from
another file (the default address is the same for every file) or a file edited since the daemon
started sends the command down the slow path, which reads the file as it is now.

409 means "ask the slow way": a connector named is not run by this daemon, or a sink's store
needs describing (``DescribedSink``), which the slow path does by connecting to the store.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable

HEALTH = ("healthy", "attempts", "last_error", "last_error_at", "seconds_since_progress")


def file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def daemon_rows(sources: list, sinks: list, live: dict[str, dict]) -> list[dict] | None:
    """The rows from the daemon's own figures alone (no log, no server asked: fast); None unless
    the daemon runs every connector shown and the sinks' stores need no describing."""
    from cdc.api import DescribedSink
    from cdc.plugins import sink_class

    connectors = [*sources, *sinks]
    if not connectors or any(c.name not in live for c in connectors):
        return None
    if any(issubclass(sink_class(s), DescribedSink) for s in sinks):
        return None
    rows = []
    for source in sources:
        row = live[source.name]
        rows.append({"kind": "source", "name": source.name, "phase": row.get("phase"),
                     "position": row.get("position"), "lag_seconds": row.get("lag_seconds"),
                     "events": row.get("events"), "snapshot_progress": row.get("snapshot_progress"),
                     "incremental_snapshot": row.get("incremental_snapshot"), **{k: row.get(k) for k in HEALTH}})
    for sink in sinks:
        row = live[sink.name]
        rows.append({"kind": "sink", "name": sink.name, "phase": row.get("phase"),
                     "consumer_lag": row.get("consumer_lag"), "lag_seconds": row.get("lag_seconds"),
                     "topics": row.get("topics"), "stores": None, "details": row.get("details") or {},
                     **{k: row.get(k) for k in HEALTH}})
    return rows


class StatusReport:
    """Built once by ``cdc run`` from the config it loaded; ``answer`` runs on HTTP threads (it
    reads the supervisor's snapshot and opens its own server connections, so they may overlap)."""

    def __init__(self, config_path: str, config, digest: str, snapshot: Callable[[], list[dict]]) -> None:
        self.file = os.path.realpath(config_path)
        self.config = config
        self.digest = digest
        self.snapshot = snapshot
        self._lock = threading.Lock()  # plugin imports on first use: one thread at a time

    def answer(self, names: list[str]) -> tuple[int, dict]:
        from cdc.runtime.slots_cli import slot_rows

        if not names:
            return 400, {"message": "name the connectors to show: ?name=A&name=B"}
        running = {c.name for c in [*self.config.sources, *self.config.sinks]}
        missing = [n for n in names if n not in running]
        if missing:
            return 409, {"message": f"this daemon does not run {', '.join(missing)}"}
        sources = [s for s in self.config.sources if s.name in names]
        sinks = [s for s in self.config.sinks if s.name in names]
        live = {row["name"]: row for row in self.snapshot()}
        with self._lock:
            rows = daemon_rows(sources, sinks, live)
        if rows is None:
            return 409, {"message": "a connector shown has no figures yet, or a sink's store needs describing"}
        slots, problems, code = slot_rows(sources)
        return 200, {"file": self.file, "digest": self.digest, "rows": rows, "slots": slots,
                     "problems": problems, "exit": code}
