"""What a connector reports about itself: counters and its current phase.

A worker process fills one ``ConnectorStats`` and sends snapshots of it to the supervisor (a dict
over a pipe, once a second and at every phase change); the supervisor serves them as /metrics and
/status.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class ConnectorStats:
    name: str
    kind: str                      # "source" or "sink"
    phase: str = "starting"        # starting, snapshot, streaming, finished, stopped, failed, restarting
    events: int = 0                # events published (sources) or written (sinks)
    bytes: int = 0                 # bytes of record values
    errors: int = 0                # errors seen (each restart after an error counts one)
    restarts: int = 0
    position: str | None = None    # the last stored position, as text
    lag_seconds: float | None = None
    last_error: str | None = None
    updated: float = field(default_factory=time.time)

    def snapshot(self) -> dict:
        self.updated = time.time()
        return asdict(self)
