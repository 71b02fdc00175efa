"""``cdc run``: every declared connector in a process of its own, supervised.

The supervisor starts one worker process per connector, collects their stats, serves them over
HTTP, and restarts a worker that failed with a retriable error after an exponential backoff
(1 s doubling to 60 s, reset after a minute of healthy running). A permanent error stops that
connector with its message; the others go on. SIGTERM/SIGINT asks every worker to drain (flush
the log, store the last position) and waits for them; a worker that does not exit within the
grace period is killed, which is safe: its stored position is never ahead of the log. A stop sent
to the whole process group reaches the workers too, and the supervisor's own SIGTERM follows:
each process takes any number of them as one request (``stop_signals``).

Health (``healthy``, served as /healthz): a connector is unhealthy when it failed permanently, or
when it has made no progress (``ConnectorStats.progress_at``) for its ``unhealthy_after``
seconds, whether it is blocked (a frozen broker, a hung database) or retrying. A streaming sink is
also unhealthy once it has been behind the log for ``unhealthy_after`` seconds without its
committed offsets moving, as the supervisor measures them (``sink_lag``), whatever its worker
reports (``stalled_seconds``). Progress is kept
across the worker's restarts, so a connector that fails at every start stays unhealthy. While a
worker waits to be restarted, and while its next process has not made progress yet, its phase is
``retrying`` with the last error, its time and the count of attempts.

A permanent error stops that connector, and when the error may heal (``CdcError.heals``) its
``retry_failed`` policy (``cdc.api.RetryFailed``) starts it again after a backoff, up to
``max_attempts`` times in a row (progress resets the count): a grant given, a database created or
a lock freed heals it without a restart of the daemon. The
phase stays ``failed`` (and /healthz 503) while it waits; ``next_attempt_at`` says when.

Control (``control``, from the HTTP thread; ``cdc restart|pause|resume|rebuild``): a command is
queued and carried out by the main loop, so only the main thread starts and stops processes.
``restart`` drains the worker (SIGTERM) and starts it again at once; ``pause`` drains it and keeps
it stopped (phase ``paused``, healthy: an operator's choice) until ``resume``; ``rebuild`` (a sink
that can rebuild) drains it and starts it in rebuild mode: a new generation from offset 0, then
streaming. The other connectors go on meanwhile.

Threading: ``run`` is the main loop on the main thread; the HTTP server reads ``stats`` from its
own thread under ``lock``.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from cdc.api import RetryFailed
from cdc.api.stats import DONE_PHASES, ConnectorStats
from cdc.errors import CdcError
from cdc.runtime.stop_signals import StopSignals
from cdc.runtime.worker import EXIT_FINAL, EXIT_OK, EXIT_RETRIABLE, same_error, worker_main

if TYPE_CHECKING:  # made by `cdc run`, which has the config loaded
    from cdc.runtime.status_report import StatusReport

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX, HEALTHY_AFTER = 1.0, 60.0, 60.0


@dataclass
class Worker:
    name: str
    stats: ConnectorStats
    process: BaseProcess | None = None  # a spawn context's SpawnProcess
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
    retry_failed: RetryFailed = field(default_factory=RetryFailed)
    failed_starts: int = 0  # starts after a permanent failure since the connector's last progress
    intent: str | None = None  # "restart", "pause" or "rebuild": why the running process is stopping
    stop_asked_at: float | None = None
    paused: bool = False
    mode: str = "run"  # "rebuild": the next process rebuilds the sink's store first
    rebuilt_at: float | None = None  # Unix time the last requested rebuild finished
    rebuild_pid: int | None = None  # the process started in rebuild mode (only its reports finish it)
    previous_error: str | None = None  # what the process before the last one failed with

    phase_since: float = field(default_factory=time.time)  # when stats.phase last changed

    def retry(self, now: float) -> tuple[bool, float]:
        """After a retriable exit: schedule the next start. Returns whether the process failed with
        the error of the process before it, and the delay. A process that ran healthily resets
        both: its failure is a new incident, said in full and retried soon."""
        if now - self.started_at > HEALTHY_AFTER:
            self.backoff, self.previous_error = BACKOFF_FIRST, None
        again = same_error(self.stats.last_error, self.previous_error)
        self.previous_error = self.stats.last_error
        delay, self.restart_at = self.backoff, now + self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)
        return again, delay

    def stalled_for(self, now: float, stalled_since: float | None) -> float | None:
        """Seconds a streaming sink has been behind the log without its commits moving (the
        supervisor's own measure, sink_lag), counted from its last phase change at the earliest
        (a rebuild commits nothing until it switches); None when it is not."""
        if stalled_since is None or self.stats.phase != "streaming" or self.paused:
            return None
        return now - max(stalled_since, self.phase_since)

    def unhealthy(self, now: float, stalled_since: float | None = None) -> bool:
        phase = self.stats.phase
        if self.paused:
            return False  # stopped on request: not a fault
        if phase == "failed":
            return True
        stalled = self.stalled_for(now, stalled_since)
        if stalled is not None and stalled > self.unhealthy_after:
            return True
        return phase not in DONE_PHASES and now - self.last_progress > self.unhealthy_after


class Supervisor:
    def __init__(self, config_path: str, names: list[str], *, http: str | None = None,
                 grace: float = 20.0, level: int = logging.INFO, kinds: dict[str, str] | None = None,
                 unhealthy_after: dict[str, float] | None = None,
                 retry_failed: dict[str, RetryFailed] | None = None, token: str | None = None) -> None:
        self.config_path = config_path
        self.grace = grace
        # A worker stops waiting for its drain before the supervisor stops waiting for it.
        self.drain_timeout = max(1.0, grace * 0.75)
        self.level = level
        self.http = http
        self.token = token
        self.lock = threading.Lock()
        kinds = kinds or {}
        self.workers = {n: Worker(n, ConnectorStats(n, kinds.get(n, "source"))) for n in names}
        for name, seconds in (unhealthy_after or {}).items():
            if name in self.workers:
                self.workers[name].unhealthy_after = seconds
        for name, policy in (retry_failed or {}).items():
            if name in self.workers:
                self.workers[name].retry_failed = policy
        self.commands: queue.Queue = queue.Queue()
        from cdc.runtime.sink_lag import SinkLagMonitor

        sinks = [n for n in names if kinds.get(n) == "sink"]
        self.sink_lag = SinkLagMonitor(config_path, sinks) if sinks else None
        from cdc.runtime.verify_schedule import VerifySchedule

        self.verify = VerifySchedule(config_path, sinks) if sinks else None  # sinks' `verify:` passes
        self.stopping = threading.Event()
        # What `cdc status` prints, computed here (GET /status/report); set by `cdc run`, which
        # has the config loaded (cdc.runtime.status_report).
        self.status_report: StatusReport | None = None
        self._ctx = multiprocessing.get_context("spawn")

    # -- the view the HTTP server reads --------------------------------------------------------
    def _stalled_since(self, name: str) -> float | None:
        return self.sink_lag.stalled_since(name) if self.sink_lag is not None else None

    def snapshot(self) -> list[dict]:
        now = time.time()
        lag = self.sink_lag.figures() if self.sink_lag is not None else {}
        with self.lock:
            return [{**w.stats.snapshot(), **_sink_lag_fields(lag.get(w.name), w.stats.kind),
                     "healthy": not w.unhealthy(now, self._stalled_since(w.name)),
                     "stalled_seconds": _rounded(w.stalled_for(now, self._stalled_since(w.name))),
                     "seconds_since_progress": round(now - w.last_progress, 1),
                     "unhealthy_after": w.unhealthy_after,
                     "pid": w.process.pid if w.process is not None else None,
                     "next_attempt_at": self._next_attempt_at(w, now), "rebuilt_at": w.rebuilt_at,
                     "verify": self.verify.result(w.name) if self.verify is not None else None}
                    for w in self.workers.values()]

    @staticmethod
    def _next_attempt_at(worker: Worker, now: float) -> float | None:
        if worker.restart_at is None:
            return None
        return round(now + max(0.0, worker.restart_at - time.monotonic()), 3)

    def healthy(self) -> bool:
        now = time.time()
        with self.lock:
            return not any(w.unhealthy(now, self._stalled_since(w.name)) for w in self.workers.values())

    # -- workers -------------------------------------------------------------------------------
    def _start(self, worker: Worker) -> None:
        parent, child = self._ctx.Pipe(duplex=False)
        # A restart after a failure tells the new process what the last one failed with, so the
        # same error again is not printed again (worker.run_connector).
        previous = worker.stats.last_error if worker.base_attempts else None
        process = self._ctx.Process(target=worker_main, name=f"cdc-{worker.name}",
                                    args=(self.config_path, worker.name, child, self.level,
                                          self.drain_timeout, worker.mode, previous))
        process.start()
        child.close()
        worker.process, worker.conn = process, parent
        worker.rebuild_pid = process.pid if worker.mode == "rebuild" else None
        worker.started_at = time.monotonic()
        worker.restart_at = None
        worker.done = worker.paused = False
        worker.intent = worker.stop_asked_at = None
        log.info("started (pid %d%s)", process.pid, ", to rebuild its store" if worker.mode == "rebuild" else "",
                 extra={"connector": worker.name, "phase": "starting"})

    def _drain_reports(self, worker: Worker) -> None:
        conn = worker.conn
        try:
            while conn is not None and conn.poll():
                stats = ConnectorStats(**conn.recv())
                stats.kind = worker.stats.kind
                stats.restarts = worker.stats.restarts
                stats.errors += worker.base_errors
                # Only the rebuilding process's "streaming" ends a rebuild: the process drained
                # for it still reports "streaming" after the command set the mode.
                if (worker.mode == "rebuild" and stats.phase == "streaming" and worker.process is not None
                        and worker.process.pid == worker.rebuild_pid):
                    worker.mode = "run"  # the rebuild is done: a later start just streams
                    worker.rebuilt_at = time.time()
                    # Once: this process's later reports (it streams on, and is drained for the
                    # next `cdc rebuild`) must not end that next rebuild before it began.
                    worker.rebuild_pid = None
                if stats.progress_at is not None and stats.progress_at > worker.last_progress:
                    worker.last_progress = stats.progress_at
                    worker.base_attempts = 0  # this process got work done: the retrying is over
                    worker.failed_starts = 0
                elif worker.base_attempts:  # restarted, and not past the trouble yet
                    stats.attempts += worker.base_attempts
                    if stats.last_error is None:
                        stats.last_error, stats.last_error_at = (worker.stats.last_error,
                                                                 worker.stats.last_error_at)
                    if stats.phase == "starting":
                        stats.phase = "retrying"
                stats.progress_at = worker.last_progress
                with self.lock:
                    if stats.phase != worker.stats.phase:
                        worker.phase_since = time.time()
                    worker.stats = stats
        except (EOFError, OSError):
            pass

    def _reap(self, worker: Worker) -> None:
        process = worker.process
        if process is None or process.is_alive():
            return
        self._drain_reports(worker)
        code = process.exitcode
        assert code is not None  # a started process that is no longer alive has exited
        worker.exit_codes.append(code)
        intent, worker.intent, worker.stop_asked_at = worker.intent, None, None
        if intent is not None and not self.stopping.is_set():
            self._reset_process(worker)
            self._carry_out(worker, intent)
            return
        if code < 0 and not self.stopping.is_set():  # killed by a signal: no report said so
            worker.stats.failed_attempt(f"killed by signal {-code}")
        self._reset_process(worker)
        extra = {"connector": worker.name, "phase": worker.stats.phase}
        if self.stopping.is_set() or code == EXIT_OK:
            worker.done = True
            log.info("exited (%s)", worker.stats.phase, extra=extra)
            return
        if code == EXIT_RETRIABLE or code < 0:  # a retriable error, or killed by a signal
            again, delay = worker.retry(time.monotonic())
            log.warning("exited with %s%s; restarting in %.0fs", code, " (the same error again)" if again else "",
                        delay, extra=extra)
            with self.lock:
                worker.stats.restarts += 1
                worker.stats.phase = "retrying"
            return
        with self.lock:
            worker.stats.phase = "failed"
        policy = worker.retry_failed
        if code != EXIT_FINAL and worker.failed_starts < policy.max_attempts:
            worker.failed_starts += 1
            delay = policy.delay(worker.failed_starts)
            worker.restart_at = time.monotonic() + delay
            log.error("stopped after a permanent error: %s; starting it again in %.0fs (attempt %d of %d, "
                      "retry_failed)", worker.stats.last_error, delay, worker.failed_starts, policy.max_attempts,
                      extra=extra)
            return
        worker.done = True
        log.error("stopped after a permanent error: %s", worker.stats.last_error, extra=extra)

    def _reset_process(self, worker: Worker) -> None:
        worker.base_errors = worker.stats.errors
        worker.base_attempts = worker.stats.attempts
        worker.process = None
        if worker.conn is not None:
            worker.conn.close()
            worker.conn = None

    # -- control (cdc restart|pause|resume|rebuild) ---------------------------------------------
    ACTIONS = ("restart", "pause", "resume", "rebuild", "snapshot")

    def control(self, action: str, name: str, timeout: float = 10.0, body: dict | None = None) -> tuple[int, str]:
        """Queue ``action`` for connector ``name`` (any thread); (HTTP status, message) once the main
        loop took it. The process stops and starts in the background: /status shows it."""
        if action not in self.ACTIONS:
            return 404, f"no action {action!r}; actions: {', '.join(self.ACTIONS)}"
        if name not in self.workers:
            return 404, f"no connector {name!r} runs here; connectors: {', '.join(self.workers)}"
        if action == "snapshot":
            body = body or {}
            action = body.get("action") or ("stop" if body.get("stop") else "execute")
            return self._request_snapshot(name, body.get("tables"), action, body.get("where"))
        answer: queue.Queue = queue.Queue(maxsize=1)
        self.commands.put((action, name, answer))
        try:
            return answer.get(timeout=timeout)
        except queue.Empty:
            return 503, "the daemon did not take the command in time (stopping?)"

    def _request_snapshot(self, name: str, tables, action: str = "execute", where=None) -> tuple[int, str]:
        """An incremental snapshot asked for (``execute``; ``stop``, ``pause``, ``resume``) through
        the source's own log: a row in its signal table (snapshot/incremental.py), so the request
        is ordered with the changes, and durable, even while the source's process restarts."""
        from cdc.api import IncrementalSnapshotSource
        from cdc.config import load_config
        from cdc.plugins import source_plugin

        if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables) or \
                (action == "execute" and not tables) or not (where is None or isinstance(where, str)):
            return 400, ("name the tables to snapshot: {\"tables\": [\"schema.table\", ...], "
                         "\"where\": \"optional SQL condition\"}")
        config = load_config(self.config_path, only=[name])
        source = next((s for s in config.sources if s.name == name), None)
        if source is None:
            return 409, f"{name} is a sink: only a source's tables can be snapshotted"
        plugin = source_plugin(source.type)
        if not issubclass(plugin, IncrementalSnapshotSource):
            return 409, f"source {name} ({source.type}) takes no incremental snapshots"
        try:
            plugin.signal_snapshot(source, tables, action=action, where=where)
        except CdcError as err:
            return (409 if not err.retriable else 503), str(err)
        what = {"execute": "", "stop": "stopping the ", "pause": "pausing the ", "resume": "resuming the "}[action]
        what += f"incremental snapshot of {', '.join(tables) or 'every table'}"
        if where:
            what += f" (rows where {where})"
        log.info("%s requested", what, extra={"connector": name, "phase": self.workers[name].stats.phase})
        return 202, f"{name}: {what} requested"

    def _take_commands(self) -> None:
        while True:
            try:
                action, name, answer = self.commands.get_nowait()
            except queue.Empty:
                return
            answer.put(self._command(action, self.workers[name]))

    def _command(self, action: str, worker: Worker) -> tuple[int, str]:
        extra = {"connector": worker.name, "phase": worker.stats.phase}
        if action == "resume" and not worker.paused:
            return 409, f"{worker.name} is not paused (phase {worker.stats.phase})"
        if action == "rebuild":
            if worker.stats.kind != "sink":
                return 409, f"{worker.name} is a source: only a sink's store can be rebuilt"
            worker.mode = "rebuild"
        if worker.process is not None and worker.process.is_alive():
            if worker.intent is None:
                worker.process.terminate()  # drains: the position is stored, then it exits
                worker.stop_asked_at = time.monotonic()
            worker.intent = "restart" if action == "resume" else action
            log.info("%s requested: draining it", action, extra=extra)
            return 202, f"{worker.name}: {action} under way (draining pid {worker.process.pid})"
        log.info("%s requested", action, extra=extra)
        self._carry_out(worker, action)
        return 202, f"{worker.name}: {action} done" if action == "pause" else f"{worker.name}: starting"

    def _carry_out(self, worker: Worker, action: str) -> None:
        """With no process running: pause it, or start it (again, or in rebuild mode)."""
        if action == "pause":
            worker.paused, worker.restart_at, worker.done = True, None, False
            with self.lock:
                worker.stats.phase = "paused"
            log.info("paused", extra={"connector": worker.name, "phase": "paused"})
            return
        worker.failed_starts = 0
        self._start(worker)

    def _enforce_grace(self, worker: Worker) -> None:
        """A process asked to stop by a command that does not drain in time is killed (safe: its
        stored position is never ahead of the log)."""
        if (worker.stop_asked_at is not None and worker.process is not None
                and time.monotonic() - worker.stop_asked_at > self.grace and worker.process.is_alive()):
            log.warning("did not drain within %.0fs; killing it", self.grace,
                        extra={"connector": worker.name, "phase": worker.stats.phase})
            worker.process.kill()
            worker.stop_asked_at = None

    # -- the main loop -------------------------------------------------------------------------
    def run(self) -> int:
        signals = StopSignals(self.stopping)
        signals.install()
        server = None
        if self.http:
            from cdc.runtime.http import serve

            server = serve(self, self.http, self.token, report=self.status_report)
        if self.sink_lag is not None:
            self.sink_lag.start()
        if self.verify is not None:
            self.verify.start()
        try:
            for worker in self.workers.values():
                self._start(worker)
            while not self.stopping.is_set() and not all(w.done for w in self.workers.values()):
                self._take_commands()
                for worker in self.workers.values():
                    self._drain_reports(worker)
                    self._enforce_grace(worker)
                    self._reap(worker)
                    if worker.restart_at is not None and time.monotonic() >= worker.restart_at:
                        self._start(worker)
                self.stopping.wait(0.2)
            self._shutdown()
        finally:
            # `cdc run` exits after this: a signal of a stop burst arriving now (late, on a busy
            # machine) changes nothing, rather than ending the exit with SIGINT's default (-2).
            signals.uninstall(then=signal.SIG_IGN)
            if self.sink_lag is not None:
                self.sink_lag.stop()
            if self.verify is not None:
                self.verify.stop()
            if server is not None:
                server.shutdown()
                server.server_close()
        return 1 if any(w.stats.phase == "failed" for w in self.workers.values()) else 0

    def _shutdown(self) -> None:
        live = [(w, process) for w in self.workers.values() if (process := w.process) is not None]
        for _, process in live:
            process.terminate()  # SIGTERM: the worker drains and stores its position
        deadline = time.monotonic() + self.grace
        for worker, process in live:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("did not drain within %.0fs; killing it", self.grace,
                            extra={"connector": worker.name, "phase": worker.stats.phase})
                process.kill()
                process.join()
            self._reap(worker)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def _sink_lag_fields(topics: dict | None, kind: str) -> dict:
    """A sink's row: its lag per topic (records, seconds) and in total, as last measured."""
    if kind != "sink":
        return {}
    if topics is None:
        return {"consumer_lag": None, "topics": None}
    return {"consumer_lag": sum(t["records"] for t in topics.values()), "topics": topics,
            "lag_seconds": max((t["seconds"] for t in topics.values()), default=0.0)}
