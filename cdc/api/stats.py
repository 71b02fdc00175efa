"""What a connector reports about itself: counters, its current phase, and its health.

Part of the plugin API: the runtime hands a plugin its ``ConnectorStats`` (``SinkContext.stats``,
``SourceContext.stats``), and a plugin adds its own counters to ``details``; a self-driven sink
fills it itself and hands it to ``report``.

A worker process fills one ``ConnectorStats`` and sends snapshots of it to the supervisor (a dict
over a pipe, once a second and at every phase change); the supervisor serves them as /metrics and
/status.

Health rests on two facts the worker records (see ``docs/architecture.md``, "Health"):

* ``progress_at``: the last time the connector got work done: a source's log acknowledged what it
  published (or it had nothing outstanding), a sink wrote and committed a batch (or was caught
  up). A connector that is blocked (a frozen broker, a hung database) stops moving it.
* ``retrying``: the phase while it retries after a retriable error, with ``last_error``, its time
  ``last_error_at`` and ``attempts`` (consecutive failed attempts). Progress clears all three.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

# Phases, for status and metrics. "retrying": waiting to try again after a retriable error (a
# sink's write, a restart of the worker); "rebuilding": a sink writing a new generation;
# "paused": stopped on request (``cdc pause``) until ``cdc resume``.
PHASES = ("starting", "snapshot", "streaming", "rebuilding", "retrying", "paused", "finished", "stopped",
          "failed")
DONE_PHASES = frozenset({"finished", "stopped", "failed"})


@dataclass(slots=True)
class ConnectorStats:
    name: str
    kind: str                      # "source" or "sink"
    phase: str = "starting"        # one of PHASES
    events: int = 0                # events published (sources) or written (sinks)
    bytes: int = 0                 # bytes of record values
    errors: int = 0                # errors seen (each restart after an error counts one)
    restarts: int = 0
    position: str | None = None    # the last stored position, as text
    lag_seconds: float | None = None
    retained_wal_bytes: int | None = None  # WAL the source's slot holds back (PostgreSQL sources)
    snapshot_progress: dict | None = None  # a snapshot under way: rows, chunks_done, chunks_total, eta_seconds
    incremental_snapshot: dict | None = None  # one under way while streaming: tables, table, after_key, rows
    last_error: str | None = None
    last_error_at: float | None = None  # Unix time of last_error
    attempts: int = 0              # consecutive failed attempts since the last progress
    progress_at: float | None = None    # Unix time of the last progress (None: none yet)
    details: dict = field(default_factory=dict)  # a plugin's own counters (e.g. keys written), shown by status
    updated: float = field(default_factory=time.time)

    def snapshot(self) -> dict:
        self.updated = time.time()
        return asdict(self)

    def failed_attempt(self, error: BaseException | str) -> None:
        """A retriable error: the connector will try again (phase ``retrying``)."""
        self.errors += 1
        self.attempts += 1
        self.last_error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.last_error_at = time.time()
        self.phase = "retrying"

    def progressed(self, phase: str | None = None) -> None:
        """Work got done: the connector is healthy again, whatever it retried before."""
        self.progress_at = time.time()
        if self.attempts or self.phase == "retrying":
            self.attempts = 0
            self.last_error = self.last_error_at = None
            if phase is not None:
                self.phase = phase
