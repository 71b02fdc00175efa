"""PostgreSQL -> capture -> Kafka -> the delta sink's streaming query -> Delta, under a live workload."""

from __future__ import annotations

import random
import threading
import time

import psycopg2
import pytest
from pyspark.testing import assertDataFrameEqual

from cdc.log.kafka import KafkaLog
from cdc.runtime.schemas import SchemaBook
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from spark_sinks.schemas import SchemaRegistry
from tests.contexts import attached
from tests.integration.pg_capture import capturing, execute, pg_config, topic_state, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.postgres]


class Workload:
    """Small transactions of inserts, updates and deletes on ``items`` until stopped; after
    ``add_column`` is set, it also writes the new ``note`` column."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        self.with_note = threading.Event()
        self.changes = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(11)
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    key = rng.randint(1, 400)
                    choice = rng.random()
                    if choice < 0.5:
                        cur.execute("UPDATE items SET qty = qty + 1, price = price + 0.25, updated = now() "
                                    "WHERE id = %s", (key,))
                        if self.with_note.is_set():
                            cur.execute("UPDATE items SET note = %s WHERE id = %s", (f"note {key}", key))
                    elif choice < 0.75:
                        cur.execute("INSERT INTO items (id, name, qty, price, flag) VALUES (%s, %s, 1, 1.00, true) "
                                    "ON CONFLICT (id) DO UPDATE SET name = excluded.name", (key, f"new {key}"))
                    else:
                        cur.execute("DELETE FROM items WHERE id = %s", (key,))
                    self.changes += 1
                    time.sleep(0.01)
        except BaseException as err:  # noqa: BLE001 - reported by finish()
            self.error = err
        finally:
            conn.close()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error


def source_rows(spark, dsn: str, schema):
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(f.name for f in schema.fields)} FROM items")
            rows = cur.fetchall()
    finally:
        conn.close()
    return spark.createDataFrame(rows, schema)


def delta_rows(spark, path: str):
    frame = spark.read.format("delta").load(path)
    return frame.select(*[c for c in frame.columns if not c.startswith("__cdc_")])


def test_postgres_to_delta_under_a_live_workload(spark, pg_dsn, kafka_bootstrap, kafka_topic, tmp_path):
    execute(pg_dsn,
            "CREATE TABLE items (id int PRIMARY KEY, name text, qty int, price numeric(10,2), "
            "updated timestamptz DEFAULT now(), flag boolean)",
            "INSERT INTO items (id, name, qty, price, flag) "
            "SELECT g, 'item ' || g, g, g * 1.5, g % 2 = 0 FROM generate_series(1, 300) g")
    prefix, topic = kafka_topic, f"{kafka_topic}.public.items"
    log = KafkaLog(kafka_bootstrap)
    config = DeltaSinkConfig.model_validate(dict(
        name="lake", type="delta", topics=[f"{prefix}.public.*"], path=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"), trigger_seconds=1, topic_prefix=prefix,
        kafka={"bootstrap_servers": kafka_bootstrap}, spark={"conf": {"spark.sql.shuffle.partitions": "2"}}))
    table = f"{config.path}/public/items"
    workload = Workload(pg_dsn)
    try:
        # Slot names are server-wide: a unique one, so that concurrent tests never share it.
        with capturing(pg_config(pg_dsn, tmp_path, slot=f"delta_{prefix}"), log, prefix) as capture:
            wait_until(lambda: len(topic_state(log, topic)) == 300, what="the snapshot", capture=capture)
            workload.thread.start()
            # The first streamed change publishes the table's schema record: the sink types its
            # columns from it (without one they would all be text).
            registry = SchemaRegistry(SchemaBook(log, prefix), prefix)
            wait_until(lambda: registry.record(topic), what="the schema record", capture=capture)

            sink = attached(DeltaSink(config))
            sink.start(session=spark)
            try:
                wait_until(lambda: sink.job.stats.events > 300, timeout=120, what="the first batches")
                execute(pg_dsn, "ALTER TABLE items ADD COLUMN note text")  # under the running query
                workload.with_note.set()
                time.sleep(3)
                workload.finish()
                # A last row after the workload: once it is in the topic, everything before it is.
                execute(pg_dsn, "INSERT INTO items (id, name, qty, price, flag) VALUES (0, 'last', 0, 0, false)")
                wait_until(lambda: '{"id":0}' in topic_state(log, topic), what="the capture to catch up",
                           capture=capture)
                sink.job.query.processAllAvailable()
                assert sink.job.failure is None
                assert len(sink.job.batch_seconds) >= 2, "the workload should span several micro-batches"
            finally:
                sink.stop()
    finally:
        workload.stop.set()
        log.close()
    assert workload.changes > 100, "the workload made too few changes to test anything"

    actual = delta_rows(spark, table)
    assert actual.columns == ["id", "name", "qty", "price", "updated", "flag", "note"]
    assert dict(actual.dtypes) == {"id": "bigint", "name": "string", "qty": "bigint", "price": "decimal(10,2)",
                                   "updated": "timestamp", "flag": "boolean", "note": "string"}
    expected = source_rows(spark, pg_dsn, actual.schema)
    # Inserts and deletes are equally likely over 400 keys: the table drifts towards 200 rows.
    assert expected.count() > 100
    assert actual.where("note IS NOT NULL").count() > 0
    assertDataFrameEqual(actual, expected)

    # Bootstrap: a new sink from the earliest offsets (available_now: it stops once caught up)
    # builds the same table from the compacted topic alone.
    fresh = config.model_copy(update={"path": str(tmp_path / "lake2"), "checkpoint": str(tmp_path / "cp2"),
                                      "available_now": True})
    attached(DeltaSink(fresh)).run(threading.Event(), session=spark)
    assertDataFrameEqual(delta_rows(spark, f"{fresh.path}/public/items"), expected)
