"""The streaming query of one delta sink: Kafka source, ``foreachBatch``, a MERGE per table.

Exactly-once rests on two things Spark and Delta keep, not on the framework's consumer groups:

1. The query's checkpoint: Spark records a micro-batch's offsets before running it and marks it
   done after ``foreachBatch`` returns. A restart re-runs an unfinished batch with the same id
   and the same offsets.
2. Delta's transaction ids: every commit of a batch carries ``txnAppId`` (the query's id and the
   step) and ``txnVersion`` (the batch id), set through Delta's session settings (the delete
   memory's append, which runs beside the MERGE: as its writer's options). A commit whose
   table already holds that app id at that version or later is skipped. So a batch that died
   after writing some tables re-runs and writes only the others.

Beyond that every write is version-guarded (``merge``, ``scd2``), so even a replay from the
earliest offsets (a new checkpoint over existing tables) never regresses a row.

Threading: ``foreachBatch`` runs on a Py4J callback thread of the driver; ``stats``, ``failure``
and the caches here are only touched from it (one batch at a time) and read elsewhere; the
delete memory's append runs on a thread of its own beside the MERGE (``merge.beside``), which the
batch waits for before it goes on, and only marks its target's memory as written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import orjson
from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from cdc.api import (
    ConnectorStats,
    LogClient,
    PermanentError,
    RetriableError,
    SchemaChangeError,
    SinkContext,
    dead_letter_topic,
    standalone_sink_context,
)
from spark_sinks import evolve, merge, rebuild, scd2
from spark_sinks.avro_records import AvroSchemas, require_spark_avro
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.connect_json import ConnectCodecs
from spark_sinks.lakes import create_properties, targets
from spark_sinks.maintenance import Maintenance
from spark_sinks.parse import (
    KEY,
    OP,
    TS,
    VERSION,
    RowDecoder,
    connect_keys,
    envelopes,
    latest_per_key,
    learn_schemas,
    row_changes,
    summarize,
    topic_pattern,
)
from spark_sinks.schemas import SchemaRegistry, TableShape
from spark_sinks.session import conf_within
from spark_sinks.tables import TableTarget
from spark_sinks.timing import PhaseClock

log = logging.getLogger(__name__)

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
PURGE_INTERVAL_S = 3600.0
# Read when a frame is persisted. A batch's envelopes are cached uncompressed: their largest
# column, each row's JSON text, is nearly unique, so the columnar cache's encodings (dictionary,
# run lengths) barely shrink it, and trying them was 15% of the JVM CPU of reading a batch and
# reducing it per key (spark_sinks/README.md, "Speed").
CACHE_COMPRESSED = "spark.sql.inMemoryColumnarStorage.compressed"


@dataclass(frozen=True, slots=True)
class BatchReport:
    batch_id: int
    records: int
    seconds: float             # wall time of foreachBatch
    finished: float            # time.time() when its commits were done
    oldest_ms: int | None      # the oldest and newest source commit time (ts_ms) in the batch
    newest_ms: int | None
    phases: dict[str, float]   # wall seconds per phase (timing.PhaseClock), summed over tables


class DeltaJob:
    def __init__(self, config: DeltaSinkConfig, *, bootstrap_servers: str, prefix: str,
                 log_: LogClient | None = None, kafka_options: dict[str, str] | None = None,
                 stats: ConnectorStats | None = None, registry_url: str | None = None,
                 context: SinkContext | None = None) -> None:
        self.config = config
        self.name = config.name
        self.prefix = prefix
        self.bootstrap_servers = bootstrap_servers
        self.kafka_options = dict(kafka_options or {})
        self.log = log_
        # The runtime's services (the schema topic, the registry, dead-letter topics); a job built
        # alone (tests, benchmarks) has none and reads no schema topic.
        self.context = context or standalone_sink_context(config.name, prefix)
        self.registry = SchemaRegistry(self.context.schema_book(log_, prefix) if log_ is not None else None,
                                       prefix, config.json_columns)
        self.codecs = ConnectCodecs()   # the Connect schemas of debezium-json records seen so far
        # avro records: their writer schemas by registry id (the log's schema_registry.url)
        self.avro = AvroSchemas(registry_url, self.codecs, self.context.avro_writer_schema)
        self.mode = "scd2" if config.scd2 else "soft" if config.soft_delete else "type1"
        self.stats = stats or ConnectorStats(config.name, "sink")
        self.failure: BaseException | None = None   # what made the last batch fail, typed
        self.batches: deque[BatchReport] = deque(maxlen=1000)  # the latest batches, for metrics
        # Called after each table's MERGE with (batch id, table name): tests put a crash there.
        self.after_table: Callable[[int, str], None] | None = None
        # Called with (batch id, table name) once a table followed a new shape of its source
        # (columns added, renamed or widened) and before any row of the batch is written to it:
        # tests put a crash between a schema change and its first row there.
        self.after_shape: Callable[[int, str], None] | None = None
        self.query: StreamingQuery | None = None
        self._query_id: str | None = None
        self._started = threading.Event()
        self._targets: dict[tuple[str, str], TableTarget] = {}
        self._make_target = targets(config, prefix)
        self.maintenance = Maintenance(config.maintenance, self.stats)
        self.clock = PhaseClock()
        self.stopping = False   # set by the sink's stop(): a batch failing now was interrupted

    def _extra(self) -> dict:
        return {"connector": self.name, "phase": self.stats.phase}

    # -- the query -------------------------------------------------------------------------------
    def source_options(self) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.bootstrap_servers,
                **{f"kafka.{k}": v for k, v in self.kafka_options.items()}}

    def start(self, session: SparkSession):
        """Start the streaming query on ``session``; returns the StreamingQuery."""
        config = self.config
        reader = (session.readStream.format("kafka").options(**self.source_options())
                  .option("subscribePattern", topic_pattern(config.topics))
                  .option("includeHeaders", "true")  # a tombstone's version (spark_sinks/parse.py)
                  .option("startingOffsets", config.starting_offsets)
                  .option("failOnDataLoss", str(config.fail_on_data_loss).lower()))
        if config.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
        writer = (reader.load().writeStream.foreachBatch(self._batch)
                  .option("checkpointLocation", config.checkpoint).queryName(f"cdc-delta-{self.name}"))
        if config.available_now:
            writer = writer.trigger(availableNow=True)
        elif config.trigger_seconds > 0:
            writer = writer.trigger(processingTime=f"{int(config.trigger_seconds * 1000)} milliseconds")
        self._started.clear()
        self.failure = None
        self.stopping = False
        query = self.query = writer.start()
        self.bind(query.id)  # kept in the checkpoint: the same across restarts
        self.stats.phase = "streaming"
        log.info("streaming %s into %s (%s), checkpoint %s", ", ".join(config.topics), config.path,
                 self.mode, config.checkpoint, extra=self._extra())
        return query

    @property
    def batch_seconds(self) -> list[float]:
        return [b.seconds for b in self.batches]

    def bind(self, query_id: str) -> None:
        """Name the query whose batches ``apply`` writes (its id makes the Delta transaction ids).
        ``start`` does it; a caller of ``apply`` without a streaming query gives its own."""
        self._query_id = query_id
        self._started.set()

    def unbind(self) -> None:
        """Forget the query bound (a rebuild's own id): the next batch waits for ``start``'s."""
        self._query_id = None
        self._started.clear()

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self.apply(batch, batch_id)
        except BaseException as err:
            if self.stopping:
                # stop() interrupted it: nothing of it is marked done, and it re-runs from the
                # checkpoint (its commits carry transaction ids, so nothing is applied twice).
                log.info("batch %d interrupted by the stop; it re-runs at the next start", batch_id,
                         extra=self._extra())
                raise BatchFailed(f"batch {batch_id} interrupted by the stop") from None
            # Py4J turns the exception into text; keep the typed one for whoever awaits the query.
            self.failure = err
            self.stats.errors += 1
            self.stats.last_error = f"{type(err).__name__}: {err}"
            log.error("batch %d failed: %s", batch_id, self.stats.last_error, extra=self._extra())
            # Spark matches the text of a foreachBatch error with a backtracking regex that
            # overflows the stack on a long one (a Py4JJavaError carries the whole Java stack
            # trace): a StackOverflowError and pages of trace instead of the query's failure.
            # The typed error is ``failure``; Spark gets its first line.
            raise BatchFailed(f"batch {batch_id} failed: {_first_line(self.stats.last_error)}") from None

    # -- one micro-batch -------------------------------------------------------------------------
    def apply(self, batch: DataFrame, batch_id: int) -> None:
        """Write micro-batch ``batch_id`` (Kafka source rows) into the tables."""
        self._started.wait(60)  # the first batch can come before start() has the query's id
        if self._query_id is None:
            raise PermanentError(f"sink {self.name}: a batch to write but no query id (call start or bind)")
        began = time.monotonic()
        clock = self.clock
        clock.take()
        session = batch.sparkSession
        rows, summary = self._read(batch)
        try:
            self._learn_codecs(batch, summary)
            if any(s["poison"] for s in summary):
                with clock.phase("poison"):
                    self._poison(rows)
            for item in sorted(summary, key=lambda s: s["topic"]):
                target = self._target(item["topic"])
                self.apply_topic(session, rows.where(F.col("topic") == item["topic"]), item, batch_id, target)
            with clock.phase("purge"):
                written = [self._target(s["topic"]) for s in summary]
                self._purge(session, written)
            if not self.stopping:
                with clock.phase("maintenance"):
                    self.maintenance.after_batch(session, written)
        finally:
            with clock.phase("unpersist"):
                rows.unpersist()
        seconds = time.monotonic() - began
        records = sum(s["records"] for s in summary)
        newest = max((s["newest_ts"] for s in summary if s["newest_ts"] is not None), default=None)
        oldest = min((s["oldest_ts"] for s in summary if s["oldest_ts"] is not None), default=None)
        phases = clock.take()
        self.batches.append(BatchReport(batch_id, records, seconds, time.time(), oldest, newest, phases))
        self.stats.events += records
        if newest is not None:
            self.stats.lag_seconds = max(0.0, time.time() - newest / 1000)
        log.debug("batch %d: %d records, %d tables, %.2fs (%s)", batch_id, records, len(summary), seconds,
                  " ".join(f"{name} {s:.2f}" for name, s in phases.items()), extra=self._extra())

    def _read(self, raw: DataFrame) -> tuple[DataFrame, list[Row]]:
        """The envelopes of ``raw`` (Kafka rows), persisted, and their ``summarize``. The writer
        schemas of avro records new to the job are read from the registry first, and the rows
        parsed again with them (once per new schema)."""
        learnt = False
        while True:
            with conf_within(raw.sparkSession, {CACHE_COMPRESSED: "false"}):
                rows = envelopes(raw, self.avro.known()).persist(StorageLevel.MEMORY_AND_DISK)
            try:
                with self.clock.phase("read"):  # the first action: Kafka read and envelope parse, cached
                    summary = summarize(rows)
            except BaseException:
                rows.unpersist()
                raise
            unknown = {i for s in summary for i in s["unknown_avro"]}
            if not unknown:
                return rows, summary
            rows.unpersist()
            if learnt:  # read from the registry a moment ago: only a broken parse could miss them
                raise RetriableError(f"sink {self.name}: avro schema ids {sorted(unknown)} not read")
            with self.clock.phase("schemas"):
                require_spark_avro(raw.sparkSession, self.name)
                self.avro.learn(self.name, unknown)
            learnt = True

    def _learn_codecs(self, raw: DataFrame, summary: list[Row]) -> None:
        """Read the Connect schemas (debezium-json records) of the batch that are new to the job."""
        values = {c for s in summary for c in s["value_codecs"] if c not in self.codecs}
        keys = {c for s in summary for c in s["key_codecs"] if c not in self.codecs}
        if values or keys:
            with self.clock.phase("schemas"):
                learn_schemas(raw, self.codecs, values, keys)
            missing = (values | keys) - set(self.codecs.known())
            if missing:  # the same rows were read twice: only a broken hash could miss
                raise RetriableError(f"sink {self.name}: Connect schemas {sorted(missing)} not found in their batch")
            log.info("%d new Connect schema(s) read", len(values | keys), extra=self._extra())

    def _target(self, topic: str, area: str = "") -> TableTarget:
        target = self._targets.get((topic, area))
        if target is None:
            target = self._targets[(topic, area)] = self._make_target(topic, self.mode, area)
        return target

    def _shape(self, session: SparkSession, item: Row, target: TableTarget) -> TableShape:
        """The table's shape: its schema record's, else inferred from the rows' names. A column the
        rows have and the shape lacks is added as text (after re-reading the schema records)."""
        topic, seen = item["topic"], set(item["names"] or ())
        existing = {f.name.lower(): f for f in evolve.data_fields(target.schema(session))} \
            if target.exists(session) else {}
        shape = self._newest_shape(topic, item["newest_shape"])
        if shape is None:
            key = tuple(item["key_names"] or ())
            inferred = TableShape.inferred(seen | set(key), key)
            # Where the table already has a column, its type reads the value as well as text.
            return TableShape(tuple((n, existing[n.lower()].dataType if n.lower() in existing else t)
                                    for n, t in inferred.columns), key, False)
        # Names that rows of a shape before a rename carry are that column's (RowDecoder).
        seen -= shape.former_names
        seen -= {old for olds in target.former_names(session).values() for old in olds}
        missing = shape.missing(seen)
        if missing:
            # The record may have come after the rows; a newer one never goes away again.
            shape = self.registry.shape(topic) or shape
            seen -= shape.former_names
            missing = shape.missing(seen)
            if missing:
                log.warning("table %s: column(s) %s are in the rows but not in the schema record; "
                            "stored as text", target.name, ", ".join(missing), extra=self._extra())
                shape = shape.with_text_columns(missing)
        return shape

    def _newest_shape(self, topic: str, named: int | None) -> TableShape | None:
        """The table's newest shape, at least as new as the newest one the batch's rows name: the
        whole batch is written in it, so no row of a new shape goes into an old one (rows of an
        older shape are cast into it where their values fit, see evolve.py). The source publishes
        a shape before its rows, on another topic: a moment's lag is retried."""
        record = self.registry.record(topic)
        if named is not None and (record is None or not isinstance(record.get("version"), int)
                                  or record["version"] < named):
            raise RetriableError(f"sink {self.name}: rows of {topic} name shape {named}, which "
                                 f"{self.registry.topic} does not hold yet")
        return self.registry.shape_of(topic, record) if record is not None else None

    def _refuse_widening(self, target: TableTarget, plan: evolve.Plan, table_schema) -> None:
        """``fail`` stops at a type change even where Delta could widen the column losslessly: the
        user asked to decide each change of a column's type."""
        existing = {f.name.lower(): f for f in evolve.data_fields(table_schema)}
        changes = ", ".join(f"column {name}: {existing[name.lower()].dataType.simpleString()} -> "
                            f"{kind.simpleString()}" for name, kind in plan.widen)
        raise SchemaChangeError(f"sink {self.name}: table {target.name}: source schema change {changes} "
                                f"(schema_policy: fail; nothing of the new shape was written). Fix: "
                                f"schema_policy: evolve (widened in place, every value kept) or rebuild, "
                                f"then start the sink again")

    def _refuse_rename(self, target: TableTarget, plan: evolve.Plan) -> None:
        renames = "; ".join(f"column {old} renamed to {new}" for old, new in plan.rename)
        raise SchemaChangeError(f"sink {self.name}: table {target.name}: source schema change {renames} "
                                f"(schema_policy: fail; nothing of the new shape was written). Fix: "
                                f"schema_policy: evolve (or rebuild), which renames the column in place "
                                f"and keeps its values (a rebuild alone cannot: the topic holds the older "
                                f"rows under the old name), then start the sink again")

    def apply_topic(self, session: SparkSession, rows: DataFrame, item: Row, batch_id: int,
                    target: TableTarget, shape: TableShape | None = None) -> None:
        """Write one table's records of the batch (``rows``: its envelopes)."""
        if not item["changes"] and item["truncated_at"] is None:
            return  # only poison records
        clock = self.clock
        with clock.phase("table"):
            shape = shape or self._shape(session, item, target)
            rows = connect_keys(rows, self.codecs, set(item["key_codecs"]), shape.struct())
            plan = evolve.Plan()
            if target.exists(session):
                target.check_mode(session)
                plan = evolve.plan(shape, target.schema(session), target.key(session))
                if plan.recast and self.config.schema_policy != "evolve":
                    plan.incompatible_recast(target.schema(session))
                if plan.incompatible:
                    problems = "; ".join(plan.incompatible)
                    if self.config.schema_policy in ("fail", "evolve"):
                        raise SchemaChangeError(f"sink {self.name}: table {target.name} cannot follow its source: "
                                                f"{problems} (schema_policy: {self.config.schema_policy}; nothing "
                                                f"of the new shape was written; set it to rebuild, or rebuild "
                                                f"by deleting the table and the checkpoint)")
                    log.warning("table %s: %s; rebuilding it from %s", target.name, problems, target.topic,
                                extra=self._extra())
                    self.rebuild(session, target, shape, batch_id)
                    return
                if plan.rename and self.config.schema_policy == "fail":
                    self._refuse_rename(target, plan)
                if plan.widen and self.config.schema_policy == "fail":
                    self._refuse_widening(target, plan, target.schema(session))
                target.evolve(session, plan)
                if plan.changes_table and self.after_shape is not None:
                    self.after_shape(batch_id, target.name)
            else:
                target.create(session, shape, create_properties(self.config))
        if item["truncated_at"] is not None:
            with clock.phase("truncate"):
                if self.mode == "scd2":
                    scd2.truncate(session, target, item["truncated_at"])
                else:
                    merge.truncate(session, target, item["truncated_at"], self.mode == "soft")
        if not item["changes"]:
            return
        with clock.phase("plan"):
            changes = row_changes(rows)
            watermark = target.truncated_at(session)
            if watermark is not None:
                # Only what is older goes: the PostgreSQL source gives a table dropped and created
                # again its truncate at the version of the new table's first row.
                changes = changes.where(F.col("version").isNull() | (F.col("version") >= watermark))
            table_fields = evolve.data_fields(target.schema(session))
            data_columns = [f.name for f in table_fields]
            known = {name.lower() for name in shape.names}
            # Columns the table has and the shape lacks are read too (NULL when the rows lack them).
            extra = [T.StructField(f.name, f.dataType) for f in table_fields if f.name.lower() not in known]
            struct = T.StructType([*shape.struct().fields, *extra])
            decoder = RowDecoder(struct, plan.casts, self.codecs, set(item["codecs"]),
                                 shape.with_former(target.former_names(session)), shape.was_text)
        if self.mode == "scd2":
            with clock.phase("plan"):
                fresh = decoder.prepare(scd2.newer_than_history(session, target, changes))
                source = fresh.select(KEY, F.col("op").alias(OP), F.col("version").alias(VERSION),
                                      F.col("ts_ms").alias(TS), *decoder.columns())
            with clock.phase("merge"), self._txn(session, target, batch_id, "merge"):
                scd2.merge(session, target, source, data_columns)
        else:
            with clock.phase("plan"):
                latest = latest_per_key(changes)
                if self.mode == "type1":
                    latest = merge.without_remembered_deletes(session, target, latest)
                latest = decoder.prepare(latest)
                source = latest.select(*decoder.columns(), KEY, F.col("version").alias(VERSION), F.col("op").alias(OP),
                                       F.col("ts_ms").alias(TS))
            remember = self.mode == "type1" and item["deletes"]
            if remember:
                source = source.persist(StorageLevel.MEMORY_AND_DISK)
            # A table this job created and has not written yet has no row to match: its first
            # MERGE (a new table's first batch, a rebuild's staging table) only inserts. Cleared
            # before the MERGE: one that failed may still have committed.
            empty, target.empty = target.empty, False
            # The delete memory's append runs beside the MERGE: a remembered delete is true
            # whether or not its MERGE committed (it only drops upserts older than the delete),
            # and a re-run batch skips the append by its transaction id.
            memory = merge.beside(lambda: merge.remember_deletes(session, target, source, self._txn_options(
                target, batch_id, "deletes"))) if remember else None
            failed = None
            try:
                with clock.phase("merge"), self._txn(session, target, batch_id, "merge"):
                    merge.merge(session, target, source, data_columns, self.mode == "soft", insert_only=empty)
            finally:   # waited for also when the MERGE failed (whose error is the one raised)
                if memory is not None:
                    with clock.phase("deletes"):   # the append's time after the MERGE's
                        failed = memory()
                if remember:
                    source.unpersist()
            if failed is not None:
                raise failed
        if self.after_table is not None:
            self.after_table(batch_id, target.name)

    def _txn_options(self, target: TableTarget, batch_id: int, step: str) -> dict[str, str]:
        """The Delta writer options that make a commit of this batch's ``step`` happen once: it
        is skipped if its table already has that app id at this batch id or later. Empty for a
        format without transaction ids (spark_sinks/iceberg.py: the writes are version-guarded)."""
        if not target.transactions:
            return {}
        return {"txnAppId": f"cdc-delta-sink:{self._query_id}:{step}", "txnVersion": str(batch_id),
                "userMetadata": orjson.dumps({"sink": self.name, "batch": batch_id, "step": step}).decode()}

    @contextmanager
    def _txn(self, session: SparkSession, target: TableTarget, batch_id: int, step: str) -> Iterator[None]:
        """``_txn_options`` as the session's settings, for the Delta commits inside (a MERGE
        takes no writer options)."""
        options = self._txn_options(target, batch_id, step)
        if not options:
            yield
            return
        with conf_within(session, {TXN_APP_ID: options["txnAppId"], TXN_VERSION: options["txnVersion"],
                                 USER_METADATA: options["userMetadata"]}):
            yield

    def _purge(self, session: SparkSession, targets: list[TableTarget]) -> None:
        if self.mode != "type1":
            return
        now = time.monotonic()
        for target in targets:
            if now - target.purged_at > PURGE_INTERVAL_S:
                merge.purge_deletes(session, target, self.config.delete_retention_hours)
                target.purged_at = now

    # -- poison records --------------------------------------------------------------------------
    def _poison(self, rows: DataFrame) -> None:
        bad = rows.where(F.col("poison").isNotNull())
        first = bad.select("topic", "partition", "offset", "poison").first()
        assert first is not None  # called when the batch's summary counted poison rows
        where = f"{first['topic']}[{first['partition']}]@{first['offset']}"
        self.stats.errors += 1
        self.stats.last_error = f"poison record at {where}: {first['poison']}"
        if self.config.on_poison == "stop":
            raise PermanentError(f"sink {self.name}: the record at {where} is not a change event: "
                                 f"{first['poison']}")
        topic = self.config.dead_letter_topic or dead_letter_topic(self.prefix, self.name)
        if self.log is not None:
            self.context.ensure_dead_letter_topic(self.log, topic, self.config.dead_letter_retention_hours)
        # Keyed by where the record is (SinkContext.ensure_dead_letter_topic): letters never share a key.
        (bad.select(F.to_json(F.struct("topic", "partition", "offset")).alias("key"), F.to_json(F.struct(
            "topic", "partition", "offset", F.col("poison").alias("reason"), F.lit(self.name).alias("sink"),
            F.col("raw").alias("value"))).alias("value"))
         .write.format("kafka").options(**self.source_options()).option("topic", topic).save())
        log.error("records that are not change events (the first at %s: %s) sent to %s", where,
                  first["poison"], topic, extra=self._extra())

    # -- rebuilds (spark_sinks/rebuild.py) --------------------------------------------------------
    def rebuild_all(self, session: SparkSession, stop: threading.Event) -> list[str]:
        """``cdc rebuild``: every table built again before the query starts (rebuild.rebuild_all)."""
        return rebuild.rebuild_all(self, session, stop)

    def rebuild(self, session: SparkSession, target: TableTarget, shape: TableShape | None, batch_id: int) -> bool:
        """One table built again from its topic and swapped in (rebuild.rebuild_table)."""
        return rebuild.rebuild_table(self, session, target, shape, batch_id)


class BatchFailed(Exception):
    """What Spark sees of a failed micro-batch (the typed error is ``DeltaJob.failure``)."""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
