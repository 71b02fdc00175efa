"""The ``type: delta`` sink: the compacted topics into Delta tables, by Spark Structured Streaming.

Unlike the framework's other sinks it is not fed by the sink runtime: Spark reads Kafka itself and
owns the position (the query's checkpoint), so it is a ``SelfDrivenSink``::

    sink = DeltaSink(config)
    sink.attach(context)                   # the runtime's; context.log_config: brokers, topic prefix
    sink.run(stop_event, report=report)    # returns when stop_event is set

The runtime calls ``run`` instead of driving ``write``. ``cdc verify`` reads the tables through
``start_reading`` (a ``ReadableSink``: spark_sinks/reading.py), which starts no query. ``run``
starts the query (``start``), waits for it until ``stop_event`` is set (or the query ends: an
``available_now`` sink ends when it caught up), then stops it after the batch in flight
(``stop``). ``stop`` may be called from another thread. Errors are ``cdc.errors`` types: a query
that failed on a ``SchemaChangeError`` or a poison record with ``on_poison: stop`` raises that
(permanent); any other failure (brokers away, executors lost) raises ``RetriableError``, and a
restart resumes from the checkpoint.

On a cluster, the same config runs under ``spark-submit`` (``cdc run-sink``, cdc/runtime/submit.py).
The Kafka brokers are the sink's ``kafka.bootstrap_servers`` or else the log's; the embedded log
has no brokers Spark could read, so a delta sink needs Kafka.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cdc.api import (
    CdcError,
    ConfigError,
    ConnectorStats,
    PermanentError,
    ReadableSink,
    RetriableError,
    SelfDrivenSink,
    SelfRebuildingSink,
    StoredRow,
)
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.formats import FORMATS, check_format
from spark_sinks.session import quiet_loggers

if TYPE_CHECKING:  # imported where used: pyspark loads only once a sink starts
    from pyspark.sql import SparkSession

    from spark_sinks.job import DeltaJob
    from spark_sinks.reading import DeltaReader

log = logging.getLogger(__name__)

# How long stop() lets the batch in flight finish before it interrupts it (the batch then re-runs
# from the checkpoint). Below the worker's drain time (cdc run's --grace, 20 s by default), so
# the sink stops the query itself rather than the worker exiting under it.
STOP_WAIT_S = 8.0
STOP_TIMEOUT = "30s"  # then a query's stop gives up waiting for its batch (spark.sql.streaming.stopTimeout)


class DeltaSink(SelfDrivenSink, SelfRebuildingSink, ReadableSink):
    config_model = DeltaSinkConfig
    formats = FORMATS  # each record's format is recognized by itself (parse.envelopes)

    def __init__(self, config: DeltaSinkConfig, generation: int | None = None) -> None:
        super().__init__(config, generation)
        self.config: DeltaSinkConfig = config
        # The app config's ``log`` section: run(log=...) sets it, else the context's is used.
        self.log_config: Any = None
        self.session: SparkSession | None = None
        self.job: DeltaJob | None = None
        self._own_session = False
        self._lock = threading.Lock()
        self._rebuild = False  # request_rebuild(): the next run rebuilds every table first
        self._reader: DeltaReader | None = None  # start_reading(): the tables read, no query

    def request_rebuild(self) -> None:
        """``cdc rebuild``: the next ``run`` builds every table again from its compacted topic
        (``DeltaJob.rebuild_all``, each swapped in by one overwrite commit) before it streams."""
        self._rebuild = True

    @property
    def stats(self) -> ConnectorStats:
        return self.job.stats if self.job is not None else self.context.stats

    # -- the Sink interface ----------------------------------------------------------------------
    def start(self, session=None, *, before_query: Callable[[DeltaJob, SparkSession], None] | None = None) -> None:
        """Start the streaming query (on ``session``, else a session of its own);
        ``before_query(job, session)`` runs once the job exists, before the query starts."""
        from spark_sinks.job import DeltaJob
        from spark_sinks.lakes import session_settings

        bootstrap, options, prefix, log_, registry_url = self._kafka()
        with self._lock:
            if session is None:
                session, self._own_session = _session(self.config, self.context.spark_jars), True
            try:
                quiet_loggers(session)  # spark-submit's session, or one given, too
                own = self.session = session.newSession()  # its own SQL settings, the same SparkContext
                for name, value in session_settings(self.config).items():
                    own.conf.set(name, value)  # a catalog: Spark reads its settings when it is first named
                _runtime_settings(own, self.config.spark.conf)
                job = self.job = DeltaJob(self.config, bootstrap_servers=bootstrap, prefix=prefix, log_=log_,
                                          kafka_options=options, stats=self.context.stats, registry_url=registry_url,
                                          context=self.context)
                if before_query is None:
                    job.start(own)
            except BaseException:
                log_.close()
                if self._own_session:
                    session.sparkContext.stop()
                    self._own_session = False
                raise
        if before_query is None:
            return
        try:
            before_query(job, own)  # outside the lock: stop() may come meanwhile
            with self._lock:
                if self.session is None:
                    return  # stopped meanwhile
                job.start(self.session)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the query once the batch in flight is written (at most STOP_WAIT_S), or end the
        reads of ``start_reading``; may be called from any thread, and more than once. A batch cut
        short is re-run from the checkpoint at the next start."""
        with self._lock:
            self._reader = None
            job = self.job
            query = job.query if job is not None else None
            if job is not None and query is not None and query.isActive:
                deadline = time.monotonic() + STOP_WAIT_S
                while query.status.get("isTriggerActive") and time.monotonic() < deadline:
                    time.sleep(0.1)
                job.stopping = True
                if self._own_session and self.session is not None:
                    # An interrupted batch is expected now, and re-runs from the checkpoint: the
                    # JVM's and Py4J's stack traces about it would only bury the log's real lines.
                    self.session.sparkContext.setLogLevel("OFF")
                    logging.getLogger("py4j").setLevel(logging.CRITICAL)
                try:
                    query.stop()
                except Exception as err:  # noqa: BLE001 - Spark's TimeoutException through Py4J
                    # Its batch did not end within spark.sql.streaming.stopTimeout: the context's
                    # stop below ends it, and it re-runs from the checkpoint at the next start.
                    log.warning("delta sink %s: the query did not stop within %s; stopping Spark under it (%s)",
                                self.config.name, STOP_TIMEOUT, _first_line(err))
            if job is not None and job.log is not None:
                job.log.close()
            if self._own_session and self.session is not None:
                self.session.sparkContext.stop()
                self._own_session = False
            self.session = None

    # -- reading the tables (ReadableSink: cdc verify, spark_sinks/reading.py) ---------------------
    def start_reading(self) -> None:
        """A Spark session to read the tables with (the one active in this process, else one of
        its own, as ``start`` makes it); no query starts, so nothing is written and the
        checkpoint stays where it is. ``stop()`` ends it."""
        from pyspark.sql import SparkSession

        from spark_sinks.lakes import session_settings, targets
        from spark_sinks.reading import DeltaReader

        prefix = self._topic_prefix(self.log_config if self.log_config is not None else self.context.log_config)
        with self._lock:
            try:  # a process with Spark already (a test's, spark-submit's) reads with it, and keeps it
                session = SparkSession.active()
            except Exception:  # noqa: BLE001 - PySparkRuntimeError: no session in this process
                session, self._own_session = _session(self.config, self.context.spark_jars), True
            quiet_loggers(session)
            own = self.session = session.newSession()  # the sink's SQL settings, as its MERGEs have them
            for name, value in {**session_settings(self.config), **self.config.spark.conf}.items():
                own.conf.set(name, value)
            mode = "scd2" if self.config.scd2 else "soft" if self.config.soft_delete else "type1"
            self._reader = DeltaReader(own, targets(self.config, prefix), mode, self.config.checkpoint)

    def _reading(self) -> DeltaReader:
        if self._reader is None:
            raise PermanentError(f"sink {self.config.name}: call start_reading() before reading its tables")
        return self._reader

    def applied_offsets(self, topic: str) -> dict[int, int] | None:
        return self._reading().applied_offsets(topic)

    def read_rows(self, topic: str, after: tuple | None = None, limit: int | None = None) -> list[StoredRow]:
        return self._reading().read_rows(topic, after, limit)

    def read_range(self, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
        return self._reading().read_range(topic, after, upto)

    def read_keys(self, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
        return self._reading().read_keys(topic, keys)

    def stored_forms(self, topic: str, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
        return self._reading().stored_forms(topic, rows)

    # -- running itself --------------------------------------------------------------------------
    def run(self, stop_event: threading.Event, *, report: Callable[[ConnectorStats], None] | None = None,
            log: Any = None, session=None) -> None:
        """Run until ``stop_event`` is set or the query ends; ``log`` is the app config's log
        section (brokers and topic prefix; else ``log_config`` as set before, else the context's);
        ``report`` gets the stats about once a second."""
        if log is not None:
            self.log_config = log
        rebuild, self._rebuild = self._rebuild, False
        try:
            self.start(session, before_query=(lambda job, session: self._rebuild_tables(job, session, stop_event, report))
                       if rebuild else None)
        except BaseException:
            if not stop_event.is_set():
                raise
            # A stop during the rebuild: readers keep the tables not swapped yet.
            self.stats.phase = "stopped"
            if report is not None:
                report(self.stats)
            return
        job = self.job
        query = job.query if job is not None else None
        if job is None or query is None:  # stop() came during the rebuild, before the query started
            self.stats.phase = "stopped"
            if report is not None:
                report(self.stats)
            return
        try:
            while not stop_event.is_set():
                try:
                    if query.awaitTermination(1):
                        break  # available_now: caught up
                except Exception as err:  # noqa: BLE001 - StreamingQueryException and Py4J errors
                    raise self._typed(job, err) from err
                if report is not None:
                    report(job.stats)
            job.stats.phase = "stopped" if stop_event.is_set() else "finished"
        except CdcError:
            job.stats.phase = "failed"
            raise
        finally:
            self.stop()
            if report is not None:
                report(job.stats)

    def _rebuild_tables(self, job: DeltaJob, session: SparkSession, stop_event: threading.Event,
                        report: Callable[[ConnectorStats], None] | None) -> None:
        """Rebuild every table before the query starts, reporting the phase ``rebuilding`` each
        second meanwhile (the runtime counts each report as progress)."""
        job.stats.phase = "rebuilding"
        done = threading.Event()

        def tick() -> None:
            while report is not None and not done.wait(1.0):
                report(job.stats)

        ticker = threading.Thread(target=tick, name="cdc-delta-rebuild-report", daemon=True)
        ticker.start()
        began = time.monotonic()
        try:
            tables = job.rebuild_all(session, stop_event)
        finally:
            done.set()
            ticker.join()
        log.warning("rebuilt %d table(s) in %.1fs%s", len(tables), time.monotonic() - began,
                    "; stopped before the rest" if stop_event.is_set() else "",
                    extra={"connector": self.config.name, "phase": job.stats.phase})
        if stop_event.is_set():
            raise _Stopped  # no query: run() says stopped

    @staticmethod
    def _typed(job, err: BaseException) -> CdcError:
        if isinstance(job.failure, CdcError):
            return job.failure
        return RetriableError(f"sink {job.name}: the streaming query failed: {_first_line(err)}")

    def _topic_prefix(self, log_config: Any) -> str:
        return self.config.topic_prefix or getattr(log_config, "topic_prefix", None) or "cdc"

    def _kafka(self):
        """(bootstrap servers, Kafka source options, topic prefix, a Log for the driver's reads, the
        schema registry's URL of avro records or None)."""
        log_config = self.log_config if self.log_config is not None else self.context.log_config
        check_format(self.config.name, getattr(log_config, "format", None))
        registry_url = getattr(getattr(log_config, "schema_registry", None), "url", None)
        kafka_log = getattr(log_config, "kafka", None)
        prefix = self._topic_prefix(log_config)
        if self.config.kafka is not None:
            bootstrap = self.config.kafka.bootstrap_servers
            # The log's client settings, where the sink reads the log's own brokers.
            same = kafka_log if kafka_log is not None and kafka_log.bootstrap_servers == bootstrap else None
            log_ = self.context.open_kafka_log(bootstrap,
                                               producer_config=dict(same.producer) if same is not None else None,
                                               consumer_config=dict(same.consumer) if same is not None else None)
            return bootstrap, dict(self.config.kafka.options), prefix, log_, registry_url
        if kafka_log is None:
            raise ConfigError(f"sink {self.config.name} (delta) needs Kafka: give it kafka.bootstrap_servers, "
                              f"or use a Kafka log (Spark cannot read the embedded log)")
        log_ = self.context.open_kafka_log(kafka_log.bootstrap_servers, producer_config=dict(kafka_log.producer),
                                           consumer_config=dict(kafka_log.consumer))
        return kafka_log.bootstrap_servers, {}, prefix, log_, registry_url


def _runtime_settings(session: SparkSession, conf: dict[str, str]) -> None:
    """The sink's ``spark.conf`` settings a running session takes. The others (a cluster's
    ``spark.executor.memory``, ``spark.cores.max``, ...) went to the session's builder when the sink
    made it; setting one again, even to its own value, fails with CANNOT_MODIFY_CONFIG. Under
    spark-submit they belong on its command line: one that differs there is logged."""
    started = session.sparkContext.getConf()
    # A query's stop waits for its batch in flight; Spark's default waits for ever.
    session.conf.set("spark.sql.streaming.stopTimeout", STOP_TIMEOUT)
    for name, value in conf.items():
        if session.conf.isModifiable(name) or name.startswith("spark.sql.catalog."):
            session.conf.set(name, value)  # a catalog's settings are read when it is first named
        elif started.get(name) != value:
            log.warning("delta sink: %s=%s is a setting Spark takes only at start (the running session has %s): "
                        "give it to spark-submit --conf", name, value, started.get(name))


def _session(config: DeltaSinkConfig, spark_jars: Callable[[], list[str]]):
    """Under spark-submit, the session it configured; otherwise a local one with the jars (the
    config's ``spark.jars``, else those the runtime resolves: ``spark_jars``)."""
    from pyspark.sql import SparkSession

    if os.environ.get("PYSPARK_GATEWAY_PORT") or os.environ.get("SPARK_SUBMIT"):
        session = SparkSession.builder.appName(f"cdc-delta-{config.name}").getOrCreate()
    else:
        from spark_sinks.session import local_session

        jars = config.spark.jars if config.spark.jars is not None else spark_jars()
        session = local_session(f"cdc-delta-{config.name}", jars=jars, conf=config.spark.conf,
                                master=config.spark.master, driver_memory=config.spark.driver_memory)
    return session


class _Stopped(Exception):
    """The stop came during a rebuild, before the query started."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
