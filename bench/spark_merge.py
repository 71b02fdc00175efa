"""Delta sink throughput and latency: change events MERGEd into Delta, beside a plain append.

    .venv/bin/cdc dev up --only kafka,spark
    .venv/bin/python -m bench.spark_merge [--changes 1000000] [--keys 100000] [--batch 100000]
                                          [--latency-seconds 30] [--rate 1000] [--trigger 1]
                                          [--debezium-json] [--avro] [--iceberg] [--event-log DIR]
                                          [--variant LABEL:KEY=VALUE;... --rounds N] [--sweep SIZES]

Steps, in one run, on one local Spark session (``local[2]``, one shuffle partition per core):
  1. changes: ``--changes`` change events of an ``orders`` table over ``--keys`` keys (the
     columns of bench.sql_upsert), as the PostgreSQL source makes them: the first ``--keys`` are
     inserts of each key, the rest updates of random keys and 2% deletes, version = position.
     Made as Kafka-shaped rows (key, value JSON, topic, partition, offset) and written to Parquet
     before any clock runs, so neither the generation nor a broker is measured here.
  2. baseline: the same rows, batch by batch, parsed like the sink parses them and appended to a
     Delta table (``mode("append")``): the ceiling of getting these rows into Delta at all. One
     batch is appended untimed before, so that neither run pays the JVM's warm-up.
  3. ours: the same batches through ``DeltaJob.apply``, the sink's foreachBatch (envelope parse,
     newest version per key, MERGE, delete memory); checks that the table then holds every live
     key at its newest version.
  3b. with ``--debezium-json``: the same changes re-encoded by the framework's ``debezium-json``
     encoder (Kafka Connect JSON, Debezium's encodings; made before any clock runs) through the
     same ``DeltaJob.apply`` into a second table, checked equal to the first: the cost of reading
     that format (the schema in every record, the logical types converted in Spark SQL).
  3c. with ``--avro``: the same in the ``avro`` format (schemas in the stack's registry, records
     decoded with spark-avro, then read as debezium-json rows), checked equal to the first.
  3c'. with ``--iceberg``: the same rows appended to an Iceberg table, then the same batches
     through ``DeltaJob.apply`` with ``table_format: iceberg`` (a hadoop catalog), once per write
     mode (merge-on-read, copy-on-write), each checked like 3: the rate against the Iceberg
     append's and the time against Delta's MERGE of step 3.
  3d. with ``--variant``: MERGE runs with other Delta settings or table properties
     (``cow:table.delta.enableDeletionVectors=false``), alternating with the defaults in the same
     session for ``--rounds`` rounds, each checked like 3: JVM CPU, Spark jobs, phases per run.
  3e. with ``--sweep 25000,100000,...``: per batch size, append and MERGE of the changes after
     the first ``--keys`` (written untimed before: the table holds every key, a live sink's
     steady state), and their ratio by wall and by CPU. The ratio depends on the batch size: the
     MERGE's cost follows the batches and the keys they touch, the append's the changes.
  4. latency: a streaming query of the sink on a Kafka topic while a producer writes ``--rate``
     changes/s for ``--latency-seconds``; per micro-batch, the time from the oldest change's commit
     time (ts_ms, set when produced) to the end of the batch's commits.
Prints rows/s of 2 and 3, their ratio, the CPU seconds each took in Spark's JVM and in this
process (from /proc: unlike wall time, barely inflated by other work on a shared machine, so
the figure to compare across runs) and the classes Spark generated for the run's queries (its codegen
cache's misses), the seconds per phase of a batch (``spark_sinks.timing``:
read = Kafka/Parquet read, envelope parse and the per-topic summary; table = shape and table
metadata; plan = building the MERGE source; merge = Delta's MERGE; deletes = the wait after it
for the delete memory's append, which runs beside it), and the latency percentiles. Spark's
fixed cost per job (seconds on a small machine) dominates small batches, so latency is bounded
below by it.

Where the time goes, by Spark's event log (``--event-log``; 1M changes over 100k keys in
batches of 100k, at load 10-17 on the shared 2-core machine). A type 1 batch with deletes is
about 32 Spark jobs: the read (3: the rows read, envelopes parsed, the per-topic summary
collected, the envelopes cached); Delta's snapshots of the new versions of the table and of the
delete memory (5); the memory's file listing for the join before the MERGE (3); the MERGE: its
source materialized (4-5), the table scanned for the files it touches (5), the changed rows
written (2-3), deletion vectors written for the touched files (7-8); the memory's append (2:
its rows computed again from the MERGE source's shuffle output, since Delta materializes a copy
of its own, then one commit). The append baseline is one write job per batch with the same read
and parse inside it, but no summary, cache, reduction, guard or memory. It ran first, so it
also paid the JVM's warm-up (JIT), which flattered the MERGE's ratio (the append's JVM CPU was
23 s for 300k rows in one run, 40 s for 1M in another): one batch is now appended untimed before
either run. Tried before: ``spark.sql.adaptive.enabled=false`` (the same jobs: Delta issues
them itself), ``merge.materializeSource=none`` (no gain); kept: one shuffle partition per local
core, the delete memory as one file per batch, an absent delete memory asked for once, and now
an insert-only MERGE for a table the job created and has not written (its first batch: Delta
neither materializes the source nor scans for matches nor writes deletion vectors).

Figures, this branch against main's sink (the same bench file, alternating processes main,
branch, main, branch; 200k changes over 50k keys in batches of 50k, latency skipped) on the
shared 2-core machine at load 8-36, where wall time measures the neighbours and even CPU seconds
swing with the load (main's MERGE took 81.5 s of JVM CPU at load 36, 59.2 s at load 21 -> 11):
  round 1, main (no warm-up batch yet): append 26.3 s JVM CPU; MERGE 81.5 s JVM + 2.1 s Python,
    load 36 -> 31, batches 206 178 264 128 s
  round 1, branch: append 16.8 s; MERGE 72.0 s JVM + 1.3 s Python, load 28 -> 17, batches 88 74
    82 69 s
  round 2, main: append 15.3 s; MERGE 59.2 s JVM + 1.1 s Python, load 21 -> 11, batches 35 16 24
    16 s; phases merge 42.8, read 28.4, deletes 8.1, plan 2.4, table 2.3 s
  round 2, branch: append 11.5 s; MERGE 57.3 s JVM + 1.0 s Python, load 8.5 -> 7.0, batches 27
    16 20 15 s (0.24x the append's rate by wall); phases merge 43.4, read 17.3, deletes 7.3
The insert-only first MERGE is within this noise on four batches (57.3 against 59.2 s of CPU in
the closer pair; its first batch took 27 s against 35 s, at a lower load): no gain shown beyond
noise, and a small one expected (a new table's first batch only). By CPU the MERGE costs 4-5x
the append of the same rows.

Tried after that, not kept (branch s6delta, reverted): the MERGE source computed once by the
sink and the delete memory held in Spark between batches: a batch stayed at about 33 jobs, and
paired runs beside main's sink (120k changes over 30k keys, load 30-39) gave 68.5 against 67.2 s
of JVM CPU, 0.24x against 0.25x; no gain beyond noise (the README's "Speed" has the details).

Session s7 (load 8-18 on the shared machine; the README's "Speed" has the tables). The bench's
warm-up covered only the append: a cold first MERGE run took 83.0 s of JVM CPU, the same
batches warm 49.4 s (400k changes over 100k keys, batches of 100k), so main's figures
understated the MERGE; both sides are warmed now. ``--variant`` in that session: copy-on-write
43.7-54.9 s and 81 jobs against 49.4 s and 102 jobs, no statistics 44.4-48.4 s and 105 jobs
(neither kept: see the README). ``--sweep`` (350k changes over 50k keys): batches of 100k
0.10x by wall, 0.20x by CPU (8.8 against 43.9 s, 91 jobs in 3 batches); one batch of 300k
0.53x by wall, 0.32x by CPU (6.0 against 18.9 s, 26 jobs); batches of 25k 0.26x by wall, 0.15x
by CPU (17.7 against 117.1 s, 395 jobs in 12 batches). Another run, 1.1M changes over 100k keys,
one batch of 1M after the 100k inserts: append 69,445 rows/s (12.9 s), MERGE 22,438 (31.6 s,
26 jobs), 0.32x by wall, 0.41x by CPU; a third run at load 5 -> 3: append 138,903 rows/s
(12.3 s), MERGE 59,537 (30.0 s), 0.43x by wall, 0.41x by CPU, and the same 1M changes in four
batches of up to 300k: 0.29x by wall, 0.21x by CPU (16.1 against 74.9 s, 125 jobs). The sink's
own batch for a backlog is ``max_offsets_per_trigger``, 1M records by default, 10x this bench's
default batch: the default batch here measures many small MERGEs, the sweep's 1M a backlog. Latency (30 s at 1k
changes/s, trigger 1 s) at load 5-6, consecutive runs: micro-batches p50 7.5 s, p95 9.4 s (this
bench), p50 7.0 s, p95 8.3 s (main's): the sink's 5 s p95 needs a quiet machine.

Session s8 (load 4-15; the README's "Speed" has every run): paired with main's sink at 1M
changes over 100k keys in one batch (``--sweep 1000000 --changes 1100000``), the MERGE's JVM CPU
was 20.9-23.8 s against main's 22.2-25.1 s (1.3-1.7 s less in each adjacent pair) with the
batch's envelopes cached uncompressed, and the
wait for the delete memory (0.5-1.1 s at 1M, 22.1 of 176.5 s at the default batches in a loaded
run) to 0.0 s with its append beside the MERGE; MERGE / append 0.46-0.50x by wall (main's in the
same pairs 0.41-0.44x), 0.44-0.49x by CPU (main's 0.43-0.47x): 0.5x once, not reliably.
Reducing the batch per key before the cache cost more JVM CPU than the cache it saved (13.4-14.7
against 12.0-13.6 s for that step in 1M), and was not kept.

Session s9 (load 4-6, another helper's OpenSearch benches beside; the README's "Speed" has the
table): per JVM thread (``/proc/<pid>/task``), a 1M MERGE's JVM CPU was 11.7-12.5 s on Spark's
task threads and 3.1-5.4 s on the C2 JIT compiler (the append's 0.6-1.2 s): Spark's cache of
generated classes (100) did not hold a MERGE batch's, 77 compiled again per batch. With 1000
(``session.py``), paired with main's sink (``--sweep 1000000``, four pairs): MERGE 15.2-16.3 s of
JVM CPU against 17.0-19.4 s, 0.53-0.62x the append by wall and 0.52-0.56x by CPU against
0.43-0.53x and 0.42-0.50x. ParallelGC took both sides down alike; C1 only tripled the task CPU.
At the defaults (batches of 100k, one pair, load 2.5-4.4): MERGE 57.2 s of JVM CPU against
87.5 s, 0.35x by wall against 0.27x; latency p95 2.1 s against 2.7 s. The runs print the classes
generated now (82 in the ten 100k batches).

On a quiet machine (load 2.5-2.9, main before these changes, the defaults: 1M changes over 100k
keys, batches of 100k): append 46.4k rows/s, MERGE 13.7k (0.29x), per batch 6.6-8.3 s (merge
4.2, read 1.7, deletes 0.9 s); latency at 1k changes/s, trigger 1 s: batch p50 2.7 s, p95 3.6 s,
commit -> visible p50 5.5 s, p95 6.4 s. Earlier rounds: 0.21-0.35x at load 7-42.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid

from pyspark.sql import functions as F

TOPIC = "bench.public.orders"
COLUMNS = [("id", "bigint", True), ("customer_id", "integer", False), ("status", "text", False),
           ("total", "numeric(10,2)", False), ("created_at", "timestamp with time zone", False),
           ("updated_at", "timestamp with time zone", False), ("note", "text", False)]
STATUSES = ["new", "paid", "packed", "shipped", "delivered", "cancelled"]


def schema_record(table: str = "orders") -> dict:
    return {"source": "bench", "db": "bench", "schema": "public", "table": table, "version": 1,
            "ts_ms": 0, "ddl": None,
            "columns": [{"name": n, "type": t, "key": k, "nullable": not k} for n, t, k in COLUMNS]}


def make_changes(spark, path: str, changes: int, keys: int, seed: int = 7) -> None:
    """Kafka-shaped rows of ``changes`` events over ``keys`` keys, written to Parquet at ``path``."""
    n = F.col("id")
    key = F.when(n < keys, n + 1).otherwise(F.pmod(F.xxhash64(n, F.lit(seed)), F.lit(keys)) + 1)
    op = F.when(n < keys, F.lit("c")).when(F.rand(seed) < 0.02, F.lit("d")).otherwise(F.lit("u"))
    iso = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"
    ts = F.timestamp_seconds(F.lit(1_700_000_000) + n / 1000)
    row = F.struct(F.col("key").alias("id"), F.pmod(n * 7919, F.lit(50_000)).cast("int").alias("customer_id"),
                   F.element_at(F.array(*[F.lit(s) for s in STATUSES]),
                                F.pmod(n, F.lit(6)).cast("int") + 1).alias("status"),
                   F.format_string("%.2f", F.pmod(n * 31, F.lit(100_000)) / 100).alias("total"),
                   F.date_format(F.timestamp_seconds(F.lit(1_600_000_000) + F.col("key")), iso).alias("created_at"),
                   F.date_format(ts, iso).alias("updated_at"),
                   F.when(F.pmod(n, F.lit(10)) == 0, F.lit("gift wrap")).alias("note"))
    source = F.struct(F.lit("postgresql").alias("connector"), F.lit("bench").alias("name"),
                      F.lit("bench").alias("db"), F.lit("public").alias("schema"), F.lit("orders").alias("table"),
                      F.lit("false").alias("snapshot"), (F.lit(1_700_000_000_000) + n).alias("ts_ms"),
                      (n + 1).alias("version"))
    envelope = F.struct(F.when(F.col("op") == "d", F.struct(F.col("key").alias("id"))).alias("before"),
                        F.when(F.col("op") != "d", row).alias("after"), F.col("op"),
                        (F.lit(1_700_000_000_000) + n).alias("ts_ms"), source.alias("source"))
    frame = (spark.range(changes).withColumn("key", key).withColumn("op", op)
             .select(F.to_json(F.struct(F.col("key").alias("id"))).cast("binary").alias("key"),
                     F.to_json(envelope).cast("binary").alias("value"), F.lit(TOPIC).alias("topic"),
                     F.pmod(F.col("key"), F.lit(2)).cast("int").alias("partition"), n.alias("offset")))
    frame.write.mode("overwrite").parquet(path)


def to_format(spark, source: str, path: str, fmt: str = "debezium-json", registry_url: str | None = None) -> None:
    """The Kafka-shaped rows of ``source`` (json format) re-encoded in ``fmt``, at ``path``
    (on the driver: the executors' Python need not have the framework installed)."""
    import orjson

    from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
    from cdc.formats import make_encoder

    table = TableId("bench", "public", "orders")
    encoder = make_encoder(fmt, "postgresql", "bench", "bench", registry_url=registry_url)
    encoder.learn([SchemaChange(table, tuple(Column(n, t, k, not k) for n, t, k in COLUMNS), 1, 0)])
    encoder.schema_versions[table] = 1
    rows = spark.read.parquet(source)
    out = []
    for row in rows.toLocalIterator():
        value = orjson.loads(row["value"])
        # Spark's to_json leaves null fields out: a delete has no "after", an insert no "before"
        event = ChangeEvent(Op(value["op"]), table, orjson.loads(row["key"]), value.get("before"),
                            value.get("after"), value["source"]["version"], value["source"]["ts_ms"])
        [record] = encoder.encode([event], now_ms=value["ts_ms"])[:1]
        out.append((record.key, record.value, row["topic"], row["partition"], row["offset"]))
    spark.createDataFrame(out, rows.schema).write.mode("overwrite").parquet(path)


def same_tables(spark, left: str, right: str, fmt: str = "debezium-json") -> None:
    def rows(path):
        return spark.read.format("delta").load(path)
    a, b = rows(left), rows(right)
    assert a.dtypes == b.dtypes and a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty(), \
        f"the {fmt} table differs from the json one"


def batches(spark, path: str, changes: int, size: int, first: int = 0):
    """Batches of ``size`` of the changes at offsets ``first`` .. ``changes``, with their ids."""
    rows = spark.read.parquet(path)
    for batch_id, start in enumerate(range(first, changes, size)):
        yield batch_id, rows.where((F.col("offset") >= start) & (F.col("offset") < min(start + size, changes)))


def iceberg_catalog(spark, name: str, warehouse: str) -> str:
    """Register the hadoop catalog ``name`` (an Iceberg run's own) on ``spark``; returns ``name``."""
    from spark_sinks.config import IcebergCatalog
    from spark_sinks.iceberg import catalog_settings

    for key, value in catalog_settings(name, IcebergCatalog(name=name), warehouse).items():
        spark.conf.set(key, value)
    return name


def write_rows(frame, target: str) -> None:
    """Append ``frame`` to ``target``: a Delta path, or an Iceberg table (``<catalog>.<ns>.<table>``)."""
    if "/" not in target:
        if frame.sparkSession.catalog.tableExists(target):
            frame.writeTo(target).append()
        else:
            frame.sparkSession.sql(f"CREATE NAMESPACE IF NOT EXISTS {target.rsplit('.', 1)[0]}")
            frame.writeTo(target).using("iceberg").tableProperty("format-version", "2").create()
    else:
        frame.write.format("delta").mode("append").save(target)


def run_append(spark, data: str, target: str, changes: int, size: int, first: int = 0) -> float:
    from spark_sinks.connect_json import ConnectCodecs
    from spark_sinks.parse import RowDecoder, envelopes
    from spark_sinks.schemas import TableShape

    decoder = RowDecoder(TableShape.from_record(schema_record()).struct(), {}, ConnectCodecs(), set())
    began = time.perf_counter()
    for _, batch in batches(spark, data, changes, size, first):
        parsed = decoder.prepare(envelopes(batch))
        write_rows(parsed.select(*decoder.columns(), "__cdc_key", F.col("version").alias("__cdc_version"),
                                 F.col("op").alias("__cdc_op"), F.col("ts_ms").alias("__cdc_ts_ms")), target)
    return time.perf_counter() - began


def merge_job(root: str, registry_url: str | None = None, table_properties: dict[str, str] | None = None,
              iceberg: str | None = None, catalog: str = "", **settings):
    """The sink's job writing under ``root`` (Delta), or with ``iceberg`` (a write mode:
    merge-on-read, copy-on-write) into the Iceberg catalog ``catalog`` (``iceberg_catalog``);
    ``settings``: more of the sink's settings."""
    from cdc.runtime.contexts import sink_context
    from spark_sinks.config import DeltaSinkConfig
    from spark_sinks.job import DeltaJob

    lake = {"table_format": "iceberg", "iceberg": {"catalog": {"name": catalog}, "write_mode": iceberg}} \
        if iceberg else {}
    config = DeltaSinkConfig(name="bench", type="delta", topics=["bench.*"], path=root,
                             checkpoint=root + "-checkpoint", **lake, **settings,
                             **({"table_properties": table_properties} if table_properties else {}))
    job = DeltaJob(config, bootstrap_servers="unused:9092", prefix="bench", registry_url=registry_url,
                   context=sink_context(config.name))
    job.registry.remember(TOPIC, schema_record())
    job.bind(f"bench-{uuid.uuid4().hex}")
    return job


def run_merge(spark, data: str, root: str, changes: int, size: int,
              registry_url: str | None = None, first: int = 0, job=None) -> tuple[float, list]:
    """The changes from offset ``first`` on through ``DeltaJob.apply`` in batches of ``size``
    (``job``: one that already wrote the changes before ``first``, or an Iceberg one)."""
    job = job or merge_job(root, registry_url)
    done = len(job.batches)
    began = time.perf_counter()
    for batch_id, batch in batches(spark, data, changes, size, first):
        job.apply(batch, done + batch_id)
    return time.perf_counter() - began, list(job.batches)[done:]


def phase_line(reports) -> str:
    """Seconds per phase (spark_sinks.timing), summed over ``reports``, largest first."""
    total: dict[str, float] = {}
    for report in reports:
        for name, seconds in report.phases.items():
            total[name] = total.get(name, 0.0) + seconds
    return "  ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(total.items(), key=lambda i: -i[1]))


def check(spark, data: str, table: str) -> int:
    """The table (a Delta path, or an Iceberg table's name) holds exactly the live keys, each at
    its newest version; returns their count."""
    from spark_sinks.parse import envelopes

    parsed = envelopes(spark.read.parquet(data))
    newest = parsed.groupBy("__cdc_key").agg(F.max_by("op", "version").alias("op"), F.max("version").alias("v"))
    expected = newest.where("op <> 'd'").select("__cdc_key", "v")
    frame = spark.table(table) if "/" not in table else spark.read.format("delta").load(table)
    actual = frame.select("__cdc_key", F.col("__cdc_version").alias("v"))
    assert expected.exceptAll(actual).isEmpty() and actual.exceptAll(expected).isEmpty(), \
        "the MERGEd table differs from the newest version of each live key"
    return actual.count()


def run_latency(spark, bootstrap: str, root: str, seconds: float, rate: int, trigger: float,
                keys: int = 10_000) -> list:
    import orjson

    from cdc.events import ChangeEvent, Op, TableId
    from cdc.log.base import TopicSettings
    from cdc.log.kafka import KafkaLog
    from cdc.serde import EnvelopeEncoder, Record, schema_changes_topic
    from spark_sinks.config import DeltaSinkConfig
    from spark_sinks.delta import DeltaSink

    prefix = f"bench_{uuid.uuid4().hex[:8]}"
    log = KafkaLog(bootstrap)
    table = TableId("bench", "public", "orders")
    encoder = EnvelopeEncoder("postgresql", "bench", prefix,
                              on_new_topic=lambda t: log.ensure_topic(t, TopicSettings(partitions=2)))
    writer = log.writer()
    log.ensure_topic(schema_changes_topic(prefix), TopicSettings(partitions=1))
    writer.publish([Record(schema_changes_topic(prefix), b'{"table":"orders"}', orjson.dumps(schema_record()))])
    encoder.topic(table)
    writer.flush(30)
    config = DeltaSinkConfig(name="bench-latency", type="delta", topics=[f"{prefix}.*"], path=root,
                             checkpoint=root + "-checkpoint", trigger_seconds=trigger, topic_prefix=prefix,
                             kafka={"bootstrap_servers": bootstrap})
    sink = DeltaSink(config)
    sink.start(session=spark)
    rng = random.Random(3)
    version = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            tick = time.monotonic()
            now_ms = time.time_ns() // 1_000_000
            events = []
            for _ in range(max(1, rate // 10)):
                version += 1
                key = rng.randint(1, keys)
                events.append(ChangeEvent(Op.UPDATE, table, {"id": key}, None, {
                    "id": key, "customer_id": key % 500, "status": rng.choice(STATUSES), "total": "12.50",
                    "created_at": "2024-01-01T00:00:00Z", "updated_at": "2024-01-02T00:00:00Z", "note": None},
                    version, now_ms))
            writer.publish(encoder.encode(events, now_ms))
            writer.poll()
            time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
        writer.flush(30)
        sink.job.query.processAllAvailable()
        return [b for b in sink.job.batches if b.records]
    finally:
        sink.stop()
        writer.close()
        for topic in (encoder.topic(table), schema_changes_topic(prefix)):
            log.delete_topic(topic)
        log.close()


def job_count(event_dir: str, reports) -> int:
    """How many Spark jobs started during ``reports``' batches (the event log in ``event_dir``)."""
    import glob
    import json

    spans = [(b.finished - b.seconds, b.finished) for b in reports]
    count = 0
    for path in sorted(glob.glob(f"{event_dir}/**/*", recursive=True)):
        if os.path.isdir(path) or "appstatus" in path:
            continue
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if '"SparkListenerJobStart"' in line:
                    start = json.loads(line)["Submission Time"] / 1000
                    count += any(a <= start <= b for a, b in spans)
    return count


def parse_variant(text: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """``LABEL:KEY=VALUE;KEY=VALUE`` -> (label, Spark SQL settings, table properties: the keys
    written ``table.NAME``)."""
    label, _, spec = text.partition(":")
    conf, props = {}, {}
    for item in filter(None, spec.split(";")):
        key, _, value = item.partition("=")
        if key.startswith("table."):
            props[key[len("table."):]] = value
        else:
            conf[key] = value
    return label, conf, props


def run_variant(spark, cpu, data: str, root: str, changes: int, size: int, conf: dict[str, str],
                props: dict[str, str], first: int = 0) -> tuple[float, list, str]:
    """``run_merge`` with ``conf`` set for the run and tables made with ``props``; with ``first``,
    the changes before it are written first, untimed, as one batch (the table then holds every
    key: the steady state of a live sink). Returns the seconds, the batches and the CPU spent."""
    previous = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        job = merge_job(root, table_properties=props or None)
        if first:
            run_merge(spark, data, root, first, first, job=job)
        before = cpu.read()
        seconds, reports = run_merge(spark, data, root, changes, size, first=first, job=job)
        return seconds, reports, cpu.since(before)
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def job_lines(event_dir: str, reports) -> list[str]:
    """Spark's jobs during ``reports``' batches, from the event log in ``event_dir`` (written
    uncompressed): seconds and count per job description, largest first, and the share of the
    batches' wall time spent inside jobs (the rest is the driver: planning, Delta's log and
    snapshots, Py4J)."""
    import glob
    import json

    jobs: dict[int, dict] = {}
    for path in sorted(glob.glob(f"{event_dir}/**/*", recursive=True)):
        if os.path.isdir(path) or "appstatus" in path:
            continue
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                event = json.loads(line)
                if event["Event"] == "SparkListenerJobStart":
                    props = event.get("Properties") or {}
                    jobs[event["Job ID"]] = {"start": event["Submission Time"] / 1000, "end": None, "what": (
                        props.get("spark.job.description") or props.get("callSite.short") or "?")[:90]}
                elif event["Event"] == "SparkListenerJobEnd" and event["Job ID"] in jobs:
                    jobs[event["Job ID"]]["end"] = event["Completion Time"] / 1000
    spans = [(b.finished - b.seconds, b.finished) for b in reports]
    seconds: dict[str, float] = {}
    count: dict[str, int] = {}
    for job in jobs.values():
        if job["end"] is not None and any(start <= job["start"] <= end for start, end in spans):
            seconds[job["what"]] = seconds.get(job["what"], 0.0) + job["end"] - job["start"]
            count[job["what"]] = count.get(job["what"], 0) + 1
    wall = sum(end - start for start, end in spans)
    out = [f"          Spark jobs: {sum(count.values())} in {len(reports)} batches, {sum(seconds.values()):.1f}s "
           f"of {wall:.1f}s wall inside jobs"]
    out += [f"            {secs:7.1f}s  x{count[what]:<3d} {what}"
            for what, secs in sorted(seconds.items(), key=lambda item: -item[1])[:15]]
    return out


class CpuClock:
    """CPU seconds (user + system) of Spark's JVM and of this process, from /proc: unlike wall
    time, barely inflated by other work on a shared machine; and the classes Spark generated
    and compiled (its codegen cache's misses, each compiled again by the JIT when it runs hot)."""

    def __init__(self, spark) -> None:
        jvm = spark.sparkContext._jvm
        self.jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        self.compiled = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
        self.ticks = os.sysconf("SC_CLK_TCK")

    def read(self) -> tuple[float, float, int]:
        with open(f"/proc/{self.jvm_pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.ticks, sum(os.times()[:2]), self.compiled.getCount()

    def since(self, before: tuple[float, float, int]) -> str:
        jvm, python, classes = (b - a for a, b in zip(before, self.read()))
        return f"cpu: JVM {jvm:.1f}s, python {python:.1f}s; {classes} classes generated"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_iceberg(spark, cpu, work: str, data: str, changes: int, size: int, delta_merge_s: float) -> None:
    """The Iceberg append, then the sink's MERGE into Iceberg in each write mode, of the same
    changes in the same session; each MERGE checked like Delta's."""
    warm = iceberg_catalog(spark, "bench_warm", f"{work}/iceberg-warm")
    run_append(spark, data, f"{warm}.public.append", min(size, changes), size)
    run_merge(spark, data, work, min(2 * size, changes), size,
              job=merge_job(work, iceberg="merge-on-read", catalog=warm))
    appends = iceberg_catalog(spark, "bench_append", f"{work}/iceberg-append")
    load, before = os.getloadavg()[0], cpu.read()
    append_s = run_append(spark, data, f"{appends}.public.orders", changes, size)
    print(f"baseline  Iceberg append {changes:>10,} rows in {append_s:7.1f}s  {changes / append_s:>10,.0f} rows/s  "
          f"(load {load:.1f} -> {os.getloadavg()[0]:.1f}; {cpu.since(before)})", flush=True)
    for mode in ("merge-on-read", "copy-on-write"):
        catalog = iceberg_catalog(spark, f"bench_{mode.split('-')[0]}", f"{work}/iceberg-{mode}")
        load, before = os.getloadavg()[0], cpu.read()
        seconds, done = run_merge(spark, data, work, changes, size, job=merge_job(work, iceberg=mode, catalog=catalog))
        spent = cpu.since(before)
        live = check(spark, data, f"{catalog}.public.orders")
        print(f"ours      Iceberg MERGE  {changes:>10,} rows in {seconds:7.1f}s  {changes / seconds:>10,.0f} rows/s  "
              f"({mode}: {append_s / seconds:.2f}x the Iceberg append's rate, {seconds / delta_merge_s:.2f}x Delta's "
              f"MERGE time; {live:,} live keys checked; load {load:.1f} -> {os.getloadavg()[0]:.1f}; {spent})",
              flush=True)
        print(f"          per batch of {size:,}: " + " ".join(f"{b.seconds:.1f}" for b in done) + " s")
        print(f"          seconds per phase: {phase_line(done)}", flush=True)


def iceberg_sweep(spark, cpu, work: str, data: str, changes: int, size: int, first: int) -> None:
    """``--sweep`` with ``--iceberg``: the changes after the first ``first`` (written untimed
    before, as one batch: every key in the table) appended to an Iceberg table and MERGEd into
    one in each write mode, in batches of ``size``."""
    rest = changes - first
    appends = iceberg_catalog(spark, f"sweep_append_{size}", f"{work}/sweep-append-{size}")
    run_append(spark, data, f"{appends}.public.orders", first, first)
    load, before = os.getloadavg()[0], cpu.read()
    append_s = run_append(spark, data, f"{appends}.public.orders", changes, size, first)
    print(f"sweep batch {size:>9,}: Iceberg append of {rest:,} changes after {first:,} inserts: "
          f"{rest / append_s:>8,.0f} rows/s ({cpu.since(before)}; load {load:.1f})", flush=True)
    for mode in ("merge-on-read", "copy-on-write"):
        catalog = iceberg_catalog(spark, f"sweep_{mode.split('-')[0]}_{size}", f"{work}/sweep-{mode}-{size}")
        job = merge_job(work, iceberg=mode, catalog=catalog)
        run_merge(spark, data, work, first, first, job=job)
        load, before = os.getloadavg()[0], cpu.read()
        seconds, done = run_merge(spark, data, work, changes, size, first=first, job=job)
        spent = cpu.since(before)
        check(spark, data, f"{catalog}.public.orders")
        print(f"sweep batch {size:>9,}: Iceberg MERGE {mode}: {rest / seconds:>8,.0f} rows/s ({spent}): "
              f"{append_s / seconds:.2f}x the append; {len(done)} batches, load {load:.1f} -> "
              f"{os.getloadavg()[0]:.1f}; phases: {phase_line(done)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100_000, help="changes per micro-batch")
    parser.add_argument("--latency-seconds", type=float, default=30.0, help="0: skip the Kafka latency run")
    parser.add_argument("--rate", type=int, default=1000, help="changes/s during the latency run")
    parser.add_argument("--trigger", type=float, default=1.0, help="trigger_seconds of the latency run")
    parser.add_argument("--debezium-json", action="store_true",
                        help="also MERGE the same changes in the debezium-json format")
    parser.add_argument("--avro", action="store_true",
                        help="also MERGE the same changes in the avro format (REGISTRY_URL of .cdc/dev.env)")
    parser.add_argument("--iceberg", action="store_true",
                        help="also append and MERGE the same changes into Iceberg (merge-on-read and copy-on-write)")
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument("--event-log", metavar="DIR",
                        help="write Spark's event log to DIR and print the MERGE batches' jobs from it")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark SQL setting for the run (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE;...",
                        help="also MERGE with these Spark SQL settings (table.NAME=VALUE: a table property), "
                             "alternating with the defaults in the same session, --rounds times (repeatable)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of --variant runs")
    parser.add_argument("--sweep", metavar="SIZES",
                        help="comma-separated batch sizes: per size, append and MERGE of the changes after "
                             "the first --keys (written before, untimed: every key in the table), rate ratio "
                             "(with --iceberg: into Iceberg, both write modes)")
    args = parser.parse_args(argv)

    from cdc.dev.jars import spark_jars
    from cdc.dev.stack import read_env
    from spark_sinks.session import local_session

    env = read_env()
    jars = env.get("SPARK_JARS")
    if args.event_log:
        os.makedirs(args.event_log, exist_ok=True)   # Spark refuses a directory that is not there
    events = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": args.event_log,
              "spark.eventLog.compress": "false"} if args.event_log else {}
    spark = local_session("bench-spark-merge", jars=jars.split(",") if jars else spark_jars(),
                          driver_memory=args.driver_memory, conf=events)
    for setting in args.conf:
        key, _, value = setting.partition("=")
        spark.conf.set(key, value)
    work = tempfile.mkdtemp(prefix="bench-spark-merge-")
    try:
        data = f"{work}/changes.parquet"
        print(f"generating {args.changes:,} changes over {args.keys:,} keys ...", flush=True)
        make_changes(spark, data, args.changes, args.keys)

        # Both sides warmed untimed first: whichever run came first paid the JVM's warm-up (JIT) of
        # its code. One batch appended; two batches MERGEd (an insert-only one, then one with
        # updates and deletes: the matched clauses and the delete memory), else the first MERGE
        # run paid a third more JVM CPU than the next one of the same batches.
        run_append(spark, data, f"{work}/warm-up", min(args.batch, args.changes), args.batch)
        run_merge(spark, data, f"{work}/warm-up-merge", min(2 * args.batch, args.changes), args.batch)
        cpu = CpuClock(spark)
        load, before = os.getloadavg()[0], cpu.read()
        append_s = run_append(spark, data, f"{work}/append", args.changes, args.batch)
        print(f"baseline  Delta append   {args.changes:>10,} rows in {append_s:7.1f}s  "
              f"{args.changes / append_s:>10,.0f} rows/s  (load {load:.1f} -> {os.getloadavg()[0]:.1f}; "
              f"{cpu.since(before)})", flush=True)
        # --variant and --sweep make their own MERGE runs (the first variant is the defaults)
        headline = not (args.variant or args.sweep)
        load, before = os.getloadavg()[0], cpu.read()
        merge_s, merged = run_merge(spark, data, f"{work}/lake", args.changes, args.batch) if headline \
            else (0.0, [])
        spent = cpu.since(before)
        live = check(spark, data, f"{work}/lake/public/orders") if headline else 0
        if headline:
            print(f"ours      MERGE          {args.changes:>10,} rows in {merge_s:7.1f}s  "
                  f"{args.changes / merge_s:>10,.0f} rows/s  ({append_s / merge_s:.2f}x the append's rate; "
                  f"{live:,} live keys checked; load {load:.1f} -> {os.getloadavg()[0]:.1f}; {spent})", flush=True)
            print(f"          per batch of {args.batch:,}: " + " ".join(f"{b.seconds:.1f}" for b in merged) + " s")
            print(f"          seconds per phase: {phase_line(merged)}", flush=True)
            if args.event_log:
                print("\n".join(job_lines(args.event_log, merged)), flush=True)

        if args.iceberg and headline:
            run_iceberg(spark, cpu, work, data, args.changes, args.batch, merge_s)

        formats = (["debezium-json"] if args.debezium_json else []) + (["avro"] if args.avro else [])
        registry = env.get("REGISTRY_URL") if args.avro else None
        if args.avro and not registry:
            raise SystemExit("no REGISTRY_URL: run `.venv/bin/cdc dev up --only kafka,registry,spark`")
        for fmt in formats:
            connect_data = f"{work}/changes-{fmt}.parquet"
            to_format(spark, data, connect_data, fmt, registry)
            fmt_s, done = run_merge(spark, connect_data, f"{work}/lake-{fmt}", args.changes, args.batch, registry)
            same_tables(spark, f"{work}/lake/public/orders", f"{work}/lake-{fmt}/public/orders", fmt)
            print(f"{fmt + ' MERGE':<24} {args.changes:>10,} rows in {fmt_s:7.1f}s  "
                  f"{args.changes / fmt_s:>10,.0f} rows/s  ({fmt_s / merge_s:.2f}x the json MERGE's time; "
                  f"table equal to the json one; load {os.getloadavg()[0]:.1f})", flush=True)
            print(f"          per batch of {args.batch:,}: " + " ".join(f"{b.seconds:.1f}" for b in done) + " s")
            print(f"          seconds per phase: {phase_line(done)}", flush=True)

        variants = [parse_variant(v) for v in args.variant]
        for round_ in range(args.rounds if variants else 0):
            for label, conf, props in [("defaults", {}, {}), *variants]:
                load = os.getloadavg()[0]
                root = f"{work}/v{round_}-{label}"
                seconds, done, spent = run_variant(spark, cpu, data, root, args.changes, args.batch, conf, props)
                check(spark, data, f"{root}/public/orders")
                jobs = f"; {job_count(args.event_log, done)} Spark jobs" if args.event_log else ""
                print(f"round {round_ + 1} {label:<14} MERGE {args.changes:,} rows in {seconds:6.1f}s "
                      f"{args.changes / seconds:>8,.0f} rows/s ({append_s / seconds:.2f}x the append; load "
                      f"{load:.1f} -> {os.getloadavg()[0]:.1f}; {spent}{jobs})", flush=True)
                print("          per batch: " + " ".join(f"{b.seconds:.1f}" for b in done)
                      + f" s; phases: {phase_line(done)}", flush=True)
                shutil.rmtree(root, ignore_errors=True)

        for size in [int(s) for s in args.sweep.split(",")] if args.sweep and args.iceberg else []:
            iceberg_sweep(spark, cpu, work, data, args.changes, size, min(args.keys, args.changes))

        for size in [int(s) for s in args.sweep.split(",")] if args.sweep and not args.iceberg else []:
            first = min(args.keys, args.changes)
            rest = args.changes - first
            load = os.getloadavg()[0]
            target = f"{work}/sweep-append-{size}"
            run_append(spark, data, target, first, first)
            before = cpu.read()
            append_each = run_append(spark, data, target, args.changes, size, first)
            append_cpu = cpu.since(before)
            root = f"{work}/sweep-{size}"
            seconds, done, spent = run_variant(spark, cpu, data, root, args.changes, size, {}, {}, first)
            jobs = f"; {job_count(args.event_log, done)} Spark jobs" if args.event_log else ""
            print(f"sweep batch {size:>9,}: {rest:,} changes after {first:,} inserts: "
                  f"append {rest / append_each:>8,.0f} "
                  f"rows/s ({append_cpu}), MERGE {rest / seconds:>8,.0f} rows/s ({spent}{jobs}): "
                  f"{append_each / seconds:.2f}x; {len(done)} batches, load {load:.1f} -> {os.getloadavg()[0]:.1f}",
                  flush=True)
            print("          MERGE per batch: " + " ".join(f"{b.seconds:.1f}" for b in done)
                  + f" s; phases: {phase_line(done)}", flush=True)
            for path in (target, root, root + "-checkpoint"):
                shutil.rmtree(path, ignore_errors=True)

        if args.latency_seconds > 0:
            bootstrap = env.get("KAFKA_BOOTSTRAP")
            if not bootstrap:
                raise SystemExit("no KAFKA_BOOTSTRAP: run `.venv/bin/cdc dev up --only kafka`")
            load = os.getloadavg()[0]
            reports = run_latency(spark, bootstrap, f"{work}/latency", args.latency_seconds, args.rate, args.trigger)
            oldest = [b.finished - b.oldest_ms / 1000 for b in reports]
            newest = [b.finished - b.newest_ms / 1000 for b in reports]
            durations = [b.seconds for b in reports]
            print(f"latency   {len(reports)} micro-batches at {args.rate:,} changes/s, trigger {args.trigger:g}s, "
                  f"{statistics.mean(b.records for b in reports):,.0f} records/batch  "
                  f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})")
            print(f"          batch duration p50 {percentile(durations, .5):.1f}s  "
                  f"p95 {percentile(durations, .95):.1f}s  max {max(durations):.1f}s")
            print(f"          seconds per phase: {phase_line(reports)}")
            print(f"          commit -> visible in Delta, oldest change of a batch: p50 "
                  f"{percentile(oldest, .5):.1f}s  p95 {percentile(oldest, .95):.1f}s  max {max(oldest):.1f}s; "
                  f"newest: p50 {percentile(newest, .5):.1f}s")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
