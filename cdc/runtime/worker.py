"""One connector in a process of its own (the GIL: one capture stream per core).

The supervisor starts ``worker_main`` in a spawned process with the config file's path, the
connector's name and a pipe. The worker builds everything from the config and the stored
position alone, runs until done or until SIGTERM/SIGINT, and reports its stats over the pipe. Its
exit code tells the supervisor what to do next:

    0   finished, or stopped on request: do not restart
    75  failed with a retriable error: restart after a backoff
    2   failed with a permanent error that may heal (the message is in the last report): restart
        only as the connector's ``retry_failed`` policy says
    3   failed with a permanent error that does not heal by itself (``CdcError.heals``), or a bug:
        do not restart
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import traceback
from multiprocessing.connection import Connection

from cdc.errors import CdcError, PermanentError
from cdc.runtime.stop_signals import stop_on_signals

EXIT_OK, EXIT_PERMANENT, EXIT_FINAL, EXIT_RETRIABLE = 0, 2, 3, 75
_DIGITS = re.compile(r"\d+")
DRAIN_TIMEOUT = 10.0  # seconds a connector gets to drain on SIGTERM (the supervisor passes its own)

log = logging.getLogger(__name__)


def build_runner(config, name: str, report=None):
    """The runner for connector ``name`` of ``config``: a SourceRunner resumed from its stored
    position, or a SinkRunner resumed from its group's committed offsets."""
    from cdc.api import SelfDrivenSink
    from cdc.log.open import open_log
    from cdc.offsets import OffsetStore
    from cdc.plugins import sink_class, source_plugin
    from cdc.runtime.runner import SourceRunner
    from cdc.runtime.sink_runner import SinkRunner

    sinks = [s for s in config.sinks if s.name == name]
    if sinks:
        sink = sink_class(sinks[0])(sinks[0])
        if isinstance(sink, SelfDrivenSink):  # e.g. a Spark job: it reads the topics itself
            if getattr(sinks[0], "scale_out", "single") == "group":
                from cdc.errors import ConfigError

                raise ConfigError(f"sink {name} ({sinks[0].type}) reads the topics itself and scales out its own "
                                  f"way (a Spark cluster's executors); scale_out: group is for sinks the runtime drives")
            if config.log.format not in sink.formats:  # ...so the runtime's decoding is not in its path
                from cdc.errors import ConfigError

                raise ConfigError(f"sink {name} ({sinks[0].type}) reads the topics itself and cannot read "
                                  f"log.format {config.log.format}: it reads {', '.join(sink.formats)}")
            return SelfRunningSink(sink, report, config.log)
        return SinkRunner(sink, open_log(config.log), config.log.topic_prefix, report=report)
    [source_config] = [s for s in config.sources if s.name == name]
    plugin = source_plugin(source_config.type)
    log_ = open_log(config.log)
    settings = config.log.topic_settings()
    offsets = OffsetStore(log_, config.log.topic_prefix)
    source = plugin(source_config, offsets.load(name))
    return SourceRunner(source, log_, offsets, config.log.topic_prefix, settings, report=report,
                        log_format=config.log.format, format_options=config.log.debezium.options(),
                        registry_url=config.log.schema_registry.url if config.log.schema_registry else None)


class SelfRunningSink:
    """A sink that consumes the topics with its own machinery (Spark Structured Streaming owns its
    offsets in its checkpoint): the worker only starts it, reports, and stops it on request."""

    def __init__(self, sink, report=None, log_config=None) -> None:
        from cdc.runtime.contexts import sink_context

        self.sink = sink
        # The sink takes the brokers and the topic prefix from the log section; no log client:
        # it reads the topics itself.
        sink.attach(sink_context(sink.config.name, log_config=log_config))
        self.stats = sink.context.stats
        self.report = report or (lambda stats: None)
        self.log_config = log_config

    def run(self, stop: threading.Event) -> None:
        def report(stats) -> None:
            # Its own machinery retries; each report it makes while running counts as progress.
            if stats.phase not in ("failed", "retrying"):
                stats.progress_at = time.time()
            self.report(stats)

        self.sink.run(stop, report=report)


def same_error(one: str | None, other: str | None) -> bool:
    """Whether two error texts say the same, digits aside (ports, pids, offsets, seconds)."""
    return one is not None and other is not None and _DIGITS.sub("#", one) == _DIGITS.sub("#", other)


def run_connector(config_path: str, name: str, stop: threading.Event, report=None,
                  on_stats=None, mode: str = "run", previous_error: str | None = None) -> int:
    """Run one connector to completion in this process; returns the worker exit code.
    ``on_stats(stats)`` is told the runner's stats once it exists (for ``worker_main``).
    ``mode="rebuild"``: a sink rebuilds its store into a new generation first, then streams.
    ``previous_error``: what the connector's previous process failed with; the same error again
    is logged at DEBUG only (the supervisor's restart line says it recurred), as librdkafka's
    repeated lines are held back."""
    from cdc.api.stats import ConnectorStats
    from cdc.config import load_config

    stats = ConnectorStats(name, "source")  # the supervisor knows the real kind
    try:
        runner = build_runner(load_config(config_path, only=[name]), name, report)
        stats = runner.stats
        if on_stats is not None:
            on_stats(stats)
        if mode == "rebuild":
            from cdc.api import SelfRebuildingSink
            from cdc.runtime.sink_runner import SinkRunner

            if isinstance(runner, SinkRunner):
                # One session: the sink stays started from the rebuild into the streaming after it.
                runner.run(stop, rebuild_first=True)
            elif isinstance(runner, SelfRunningSink) and isinstance(runner.sink, SelfRebuildingSink):
                runner.sink.request_rebuild()  # its run rebuilds, then streams
                runner.run(stop)
            else:
                raise PermanentError(f"{name} cannot rebuild: it is not a sink, or its store has no generations")
        else:
            runner.run(stop)
        return EXIT_OK
    except CdcError as err:
        stats.failed_attempt(err)  # the error, its time, one more attempt
        stats.phase = "retrying" if err.retriable else "failed"
        log.log(logging.DEBUG if same_error(stats.last_error, previous_error) else logging.ERROR, "%s (%s)",
                stats.last_error, "retriable" if err.retriable else "permanent",
                extra={"connector": name, "phase": stats.phase})
        if report:
            report(stats)
        return EXIT_RETRIABLE if err.retriable else EXIT_PERMANENT if err.heals else EXIT_FINAL
    except Exception as err:  # a bug or an unclassified library error: do not loop on it
        stats.failed_attempt(err)
        stats.phase = "failed"
        log.error("unexpected error:\n%s", traceback.format_exc(), extra={"connector": name, "phase": "failed"})
        if report:
            report(stats)
        return EXIT_FINAL


def worker_main(config_path: str, name: str, conn: Connection, level: int,
                drain_timeout: float = DRAIN_TIMEOUT, mode: str = "run", previous_error: str | None = None) -> None:
    """The process's main thread only waits for a signal; the connector runs on another thread.

    A signal handler runs only between bytecodes of the main thread, and a thread blocked in a
    client library's call (librdkafka waiting for a broker, a database connect) would not see it
    for as long as the call lasts. So on SIGTERM or SIGINT (``stop_signals``: however many come,
    in a burst or not, they only set the stop event, never deadlock, and a second one does not cut
    the drain short) the main thread asks the connector to drain and
    waits at most ``drain_timeout`` seconds (one second when it has published or written nothing
    yet: nothing of its own to drain); past that it exits without storing anything more. That is
    always safe: a position is stored only after the log acknowledged everything up to it
    (``runner``), so an exit at any point leaves the stored position at or behind the log, as a
    crash would.
    """
    from cdc import logs

    seen: list = []  # the runner's stats, once it exists
    logs.setup(level, connector=name, phase=lambda: seen[0].phase if seen else "starting")
    stop = stop_on_signals()

    def report(stats) -> None:
        try:
            conn.send(stats.snapshot())
        except (BrokenPipeError, OSError):
            stop.set()  # the supervisor is gone: drain and exit

    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(run_connector(config_path, name, stop, report,
                                                                        seen.append, mode, previous_error)),
                              name=f"cdc-{name}", daemon=True)
    thread.start()
    while thread.is_alive() and not stop.is_set():
        thread.join(0.2)  # wakes for signals
    if thread.is_alive():
        # Something to drain only once it published or wrote (or made progress at all).
        active = bool(seen) and (seen[0].events > 0 or seen[0].progress_at is not None)
        bound = drain_timeout if active else min(drain_timeout, 1.0)
        thread.join(bound)
        if thread.is_alive():
            log.warning("did not drain within %.0fs (a server does not answer); exiting without storing "
                        "more: the stored position stays at or behind what the log acknowledged", bound,
                        extra={"connector": name, "phase": seen[0].phase if seen else "starting"})
            logging.shutdown()
            conn.close()
            os._exit(EXIT_RETRIABLE)  # the connector thread is stuck in a call: do not wait for it
    conn.close()
    raise SystemExit(codes[0] if codes else EXIT_RETRIABLE)
