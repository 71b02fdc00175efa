"""A bounded, in-memory history of every connector's figures, for the console's charts.

The supervisor keeps only the latest stats of each connector; the console wants the last hour.
``History`` samples ``supervisor.snapshot()`` every ``interval`` seconds (10 s: 360 samples per
connector for an hour, a few hundred kB for dozens of connectors) into a ring per connector, so
memory stays bounded however long the daemon runs. It lives in the daemon's process and is lost
with it: Prometheus (see ``docker/``) is the place for longer history.

Threading: ``sample`` runs on the sampler thread, ``series`` on the HTTP server's threads; both
take ``_lock``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

INTERVAL_S = 10.0
KEEP_S = 3600.0


class History:
    def __init__(self, snapshot: Callable[[], list[dict]], interval: float = INTERVAL_S,
                 keep: float = KEEP_S) -> None:
        self._snapshot = snapshot
        self.interval = interval
        self._size = max(2, int(keep / interval))
        self._rings: dict[str, deque] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def sample(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        rows = self._snapshot()
        with self._lock:
            for row in rows:
                ring = self._rings.setdefault(row["name"], deque(maxlen=self._size))
                ring.append((now, row["phase"], row.get("lag_seconds"), row.get("events", 0)))

    def series(self, name: str) -> list[dict]:
        """The samples of ``name``, oldest first, each with the events per second since the
        sample before (a worker restarted in between counts from zero again: never negative)."""
        with self._lock:
            samples = list(self._rings.get(name, ()))
        out, previous = [], None
        for at, phase, lag, events in samples:
            rate = None
            if previous is not None and at > previous[0]:
                done = events - previous[3] if events >= previous[3] else events
                rate = round(done / (at - previous[0]), 3)
            out.append({"t": at, "phase": phase, "lag_seconds": lag, "events": events, "events_per_s": rate})
            previous = (at, phase, lag, events)
        return out

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="cdc-history", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a chart gap is better than a dead sampler
                log.exception("could not sample the connectors' figures")
            if self._stop.wait(self.interval):
                return
