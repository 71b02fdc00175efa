"""``cdc run``: every declared connector in a process of its own, supervised.

The supervisor starts one worker process per connector, collects their stats, serves them over
HTTP, and restarts a worker that failed with a retriable error after an exponential backoff
(1 s doubling to 60 s, reset after a minute of healthy running). A permanent error stops that
connector with its message; the others go on. SIGTERM/SIGINT asks every worker to drain (flush
the log, store the last position) and waits for them; a worker that does not exit within the
grace period is killed, which is safe: its stored position is never ahead of the log.

Health (``healthy``, served as /healthz): a connector is unhealthy when it failed permanently, or
when it has made no progress (``ConnectorStats.progress_at``) for its ``unhealthy_after``
seconds, whether it is blocked (a frozen broker, a hung database) or retrying. Progress is kept
across the worker's restarts, so a connector that fails at every start stays unhealthy. While a
worker waits to be restarted, and while its next process has not made progress yet, its phase is
``retrying`` with the last error, its time and the count of attempts.

Threading: ``run`` is the main loop on the main thread; the HTTP server reads ``stats`` from its
own thread under ``lock``.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from cdc.runtime.stats import DONE_PHASES, ConnectorStats
from cdc.runtime.worker import EXIT_OK, EXIT_RETRIABLE, worker_main

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX, HEALTHY_AFTER = 1.0, 60.0, 60.0


@dataclass
class Worker:
    name: str
    stats: ConnectorStats
    process: multiprocessing.Process | None = None
    conn: Connection | None = None
    started_at: float = 0.0
    backoff: float = BACKOFF_FIRST
    restart_at: float | None = None
    done: bool = False
    base_errors: int = 0  # errors of earlier processes of this connector
    base_attempts: int = 0  # failed attempts (processes) since the connector's last progress
    unhealthy_after: float = 60.0
    last_progress: float = field(default_factory=time.time)  # kept across restarts
    exit_codes: list[int] = field(default_factory=list)

    def unhealthy(self, now: float) -> bool:
        phase = self.stats.phase
        if phase == "failed":
            return True
        return phase not in DONE_PHASES and now - self.last_progress > self.unhealthy_after


class Supervisor:
    def __init__(self, config_path: str, names: list[str], *, http: str | None = None,
                 grace: float = 20.0, level: int = logging.INFO, kinds: dict[str, str] | None = None,
                 unhealthy_after: dict[str, float] | None = None) -> None:
        self.config_path = config_path
        self.grace = grace
        # A worker stops waiting for its drain before the supervisor stops waiting for it.
        self.drain_timeout = max(1.0, grace * 0.75)
        self.level = level
        self.http = http
        self.lock = threading.Lock()
        kinds = kinds or {}
        self.workers = {n: Worker(n, ConnectorStats(n, kinds.get(n, "source"))) for n in names}
        for name, seconds in (unhealthy_after or {}).items():
            if name in self.workers:
                self.workers[name].unhealthy_after = seconds
        self.stopping = threading.Event()
        self._ctx = multiprocessing.get_context("spawn")

    # -- the view the HTTP server reads --------------------------------------------------------
    def snapshot(self) -> list[dict]:
        now = time.time()
        with self.lock:
            return [{**w.stats.snapshot(), "healthy": not w.unhealthy(now),
                     "seconds_since_progress": round(now - w.last_progress, 1),
                     "unhealthy_after": w.unhealthy_after} for w in self.workers.values()]

    def healthy(self) -> bool:
        now = time.time()
        with self.lock:
            return not any(w.unhealthy(now) for w in self.workers.values())

    # -- workers -------------------------------------------------------------------------------
    def _start(self, worker: Worker) -> None:
        parent, child = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(target=worker_main, name=f"cdc-{worker.name}",
                                    args=(self.config_path, worker.name, child, self.level,
                                          self.drain_timeout))
        process.start()
        child.close()
        worker.process, worker.conn = process, parent
        worker.started_at = time.monotonic()
        worker.restart_at = None
        log.info("started (pid %d)", process.pid, extra={"connector": worker.name, "phase": "starting"})

    def _drain_reports(self, worker: Worker) -> None:
        conn = worker.conn
        try:
            while conn is not None and conn.poll():
                stats = ConnectorStats(**conn.recv())
                stats.kind = worker.stats.kind
                stats.restarts = worker.stats.restarts
                stats.errors += worker.base_errors
                if stats.progress_at is not None and stats.progress_at > worker.last_progress:
                    worker.last_progress = stats.progress_at
                    worker.base_attempts = 0  # this process got work done: the retrying is over
                elif worker.base_attempts:  # restarted, and not past the trouble yet
                    stats.attempts += worker.base_attempts
                    if stats.last_error is None:
                        stats.last_error, stats.last_error_at = (worker.stats.last_error,
                                                                 worker.stats.last_error_at)
                    if stats.phase == "starting":
                        stats.phase = "retrying"
                stats.progress_at = worker.last_progress
                with self.lock:
                    worker.stats = stats
        except (EOFError, OSError):
            pass

    def _reap(self, worker: Worker) -> None:
        process = worker.process
        if process is None or process.is_alive():
            return
        self._drain_reports(worker)
        code = process.exitcode
        worker.exit_codes.append(code)
        if code < 0 and not self.stopping.is_set():  # killed by a signal: no report said so
            worker.stats.failed_attempt(f"killed by signal {-code}")
        worker.base_errors = worker.stats.errors
        worker.base_attempts = worker.stats.attempts
        worker.process = None
        if worker.conn is not None:
            worker.conn.close()
            worker.conn = None
        extra = {"connector": worker.name, "phase": worker.stats.phase}
        if self.stopping.is_set() or code == EXIT_OK:
            worker.done = True
            log.info("exited (%s)", worker.stats.phase, extra=extra)
            return
        if code == EXIT_RETRIABLE or code < 0:  # a retriable error, or killed by a signal
            if time.monotonic() - worker.started_at > HEALTHY_AFTER:
                worker.backoff = BACKOFF_FIRST
            worker.restart_at = time.monotonic() + worker.backoff
            log.warning("exited with %s; restarting in %.0fs", code, worker.backoff, extra=extra)
            with self.lock:
                worker.stats.restarts += 1
                worker.stats.phase = "retrying"
            worker.backoff = min(worker.backoff * 2, BACKOFF_MAX)
            return
        worker.done = True
        with self.lock:
            worker.stats.phase = "failed"
        log.error("stopped after a permanent error: %s", worker.stats.last_error, extra=extra)

    # -- the main loop -------------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        self.stopping.set()

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self.request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        server = None
        if self.http:
            from cdc.runtime.http import serve

            server = serve(self, self.http)
        try:
            for worker in self.workers.values():
                self._start(worker)
            while not self.stopping.is_set() and not all(w.done for w in self.workers.values()):
                for worker in self.workers.values():
                    self._drain_reports(worker)
                    self._reap(worker)
                    if worker.restart_at is not None and time.monotonic() >= worker.restart_at:
                        self._start(worker)
                self.stopping.wait(0.2)
            self._shutdown()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if server is not None:
                server.shutdown()
                server.server_close()
        return 1 if any(w.stats.phase == "failed" for w in self.workers.values()) else 0

    def _shutdown(self) -> None:
        live = [w for w in self.workers.values() if w.process is not None]
        for worker in live:
            worker.process.terminate()  # SIGTERM: the worker drains and stores its position
        deadline = time.monotonic() + self.grace
        for worker in live:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.warning("did not drain within %.0fs; killing it", self.grace,
                            extra={"connector": worker.name, "phase": worker.stats.phase})
                worker.process.kill()
                worker.process.join()
            self._reap(worker)
