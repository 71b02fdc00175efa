"""A column renamed in PostgreSQL while a writer writes, through capture and Kafka into Delta.

The rename keeps the column's values in the source without logging a row, so the Delta sink must
rename its column in place (column mapping) rather than add the new name and keep the old one:
the rows not written since would hold NULL under the new name. Checked for the three ways a row
reaches the table: a live sink under ``evolve`` (renamed in place), a new sink over the compacted
topic (rows written before the rename, under the old name, land under the new one), and a sink
under ``fail``, which stops with ``SchemaChangeError`` naming the column and writes nothing.

A shape's ``renamed_from`` names the column in the shape just before, so a sink that sees two
renames at once (it was stopped over both, or they came between two of its batches) must chain
them: ``note -> memo -> remark`` renames the table's ``note`` to ``remark``, and rows of every
shape, read in the same batch or later ones, land under ``remark``.
"""

from __future__ import annotations

import pytest

from cdc.api import SchemaChangeError
from cdc.log.kafka import KafkaLog
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from tests.contexts import attached
from tests.integration.pg_capture import capturing, pg_config, topic_state, wait_until
from tests.integration.test_spark_delta_schema_live import delta_state
from tests.live_ddl import PgDb, Writer, rows_of, source_columns

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.postgres]


def _config(tmp_path, name: str, prefix: str, kafka: str, policy: str, **more) -> DeltaSinkConfig:
    return DeltaSinkConfig.model_validate(dict(more,
        name=name, type="delta", topics=[f"{prefix}.public.*"], path=str(tmp_path / name),
        checkpoint=str(tmp_path / f"{name}-checkpoint"), trigger_seconds=0.5, topic_prefix=prefix,
        schema_policy=policy, kafka={"bootstrap_servers": kafka},
        spark={"conf": {"spark.sql.shuffle.partitions": "2"}}))


def _catch_up(spark, config: DeltaSinkConfig):
    """Run the sink over everything its topics hold now; the typed failure, if any."""
    sink = attached(DeltaSink(config))
    sink.start(session=spark)
    try:
        try:
            sink.job.query.processAllAvailable()
        except Exception:  # noqa: BLE001 - the typed error is the job's failure
            assert sink.job.failure is not None
        return sink.job.failure
    finally:
        sink.stop()


def test_a_rename_under_a_live_writer_keeps_the_values_under_the_new_name(spark, pg_dsn, kafka_bootstrap,
                                                                          kafka_topic, tmp_path):
    db = PgDb(pg_dsn)
    db.seed()   # orders: 30 rows with note = 'seed'
    prefix = kafka_topic
    log = KafkaLog(kafka_bootstrap)
    topic = f"{prefix}.public.orders"
    # A table made without column mapping (as before the sink made its tables with it, and on the
    # oldest protocol): the first rename turns it on.
    lake = _config(tmp_path, "lake", prefix, kafka_bootstrap, "evolve",
                   table_properties={"delta.columnMapping.mode": "none"})
    strict = _config(tmp_path, "strict", prefix, kafka_bootstrap, "fail")
    writer = Writer(db)
    marker = [0]

    def settle(capture) -> None:
        """Stop the writer and wait until the topic holds everything written so far."""
        writer.pause()
        marker[0] -= 1
        db.execute(f"INSERT INTO orders (id) VALUES ({marker[0]})")
        wait_until(lambda: f'{{"id":{marker[0]}}}' in topic_state(log, topic), what="the capture to catch up",
                   capture=capture)

    def equal_to_source(config: DeltaSinkConfig) -> None:
        columns = source_columns(db.url, "orders")
        expected = rows_of(db.url, "orders", columns)
        actual = delta_state(spark, f"{config.path}/public/orders", columns)
        assert actual == expected, (config.name, columns, {k: (expected.get(k), actual.get(k))
                                                           for k in set(expected) | set(actual)
                                                           if expected.get(k) != actual.get(k)})

    try:
        with capturing(pg_config(pg_dsn, tmp_path, slot=f"rn_{prefix}"), log, prefix) as capture:
            wait_until(lambda: len(topic_state(log, topic)) == 30, capture=capture)
            writer.start()
            writer.resume()
            settle(capture)
            for config in (lake, strict):
                assert _catch_up(spark, config) is None
                equal_to_source(config)
            before = spark.read.format("delta").load(f"{strict.path}/public/orders").collect()

            writer.resume()
            db.execute("ALTER TABLE orders RENAME COLUMN note TO remark")   # while the writer writes
            writer.resume()
            settle(capture)
            # Rows the writer did not touch since hold 'seed' under remark in the source only.
            assert rows_of(db.url, "orders", ["id", "remark"])[5] == ("seed",)

            assert _catch_up(spark, lake) is None
            equal_to_source(lake)
            frame = spark.read.format("delta").load(f"{lake.path}/public/orders")
            assert "note" not in frame.columns
            properties = {r["key"]: r["value"] for r in spark.sql(
                f"SHOW TBLPROPERTIES delta.`{lake.path}/public/orders`").collect()}
            assert properties["delta.columnMapping.mode"] == "name"

            # A new sink over the compacted topic: the older rows are there under note.
            bootstrap = _config(tmp_path, "bootstrap", prefix, kafka_bootstrap, "evolve")
            assert _catch_up(spark, bootstrap) is None
            equal_to_source(bootstrap)

            failure = _catch_up(spark, strict)
            assert isinstance(failure, SchemaChangeError), failure
            assert "column note renamed to remark" in str(failure), failure
            after = spark.read.format("delta").load(f"{strict.path}/public/orders")
            assert "remark" not in after.columns
            assert set(map(tuple, after.collect())) == set(map(tuple, before))   # nothing of the batch was written
            assert writer.error is None, writer.error
    finally:
        writer.close()
        log.close()


def test_two_renames_between_two_batches_keep_every_value_under_the_last_name(spark, pg_dsn, kafka_bootstrap,
                                                                              kafka_topic, tmp_path):
    """note -> memo -> remark while the sinks are stopped, with rows written under each name:
    a sink caught up before (its next batch names shape 3, its table has ``note``), the same
    reading a few records per batch (rows under ``memo`` come after its table took ``remark``),
    and a new sink over the compacted topic (its table made in shape 3, rows of all three)."""
    db = PgDb(pg_dsn)
    db.seed()   # orders: 30 rows with note = 'seed'
    prefix = kafka_topic
    log = KafkaLog(kafka_bootstrap)
    topic = f"{prefix}.public.orders"
    whole = _config(tmp_path, "whole", prefix, kafka_bootstrap, "evolve")
    split = _config(tmp_path, "split", prefix, kafka_bootstrap, "evolve", max_offsets_per_trigger=6)
    try:
        with capturing(pg_config(pg_dsn, tmp_path, slot=f"rr_{prefix}"), log, prefix) as capture:
            wait_until(lambda: len(topic_state(log, topic)) == 30, capture=capture)
            for config in (whole, split):
                assert _catch_up(spark, config) is None

            db.execute("UPDATE orders SET note = 'before' WHERE id <= 5")
            db.execute("ALTER TABLE orders RENAME COLUMN note TO memo")
            db.execute("INSERT INTO orders (id, memo) SELECT g, 'between' FROM generate_series(101, 105) g")
            db.execute("UPDATE orders SET memo = 'between' WHERE id BETWEEN 6 AND 10")
            db.execute("ALTER TABLE orders RENAME COLUMN memo TO remark")
            db.execute("INSERT INTO orders (id, remark) SELECT g, 'after' FROM generate_series(201, 205) g")
            db.execute("UPDATE orders SET remark = 'after' WHERE id BETWEEN 11 AND 15")
            wait_until(lambda: topic_state(log, topic).get('{"id":205}'), what="the capture to catch up",
                       capture=capture)
            wait_until(lambda: topic_state(log, topic)['{"id":15}']["remark"] == "after",
                       what="the capture to catch up", capture=capture)

            fresh = _config(tmp_path, "fresh", prefix, kafka_bootstrap, "evolve", max_offsets_per_trigger=20)
            columns = source_columns(db.url, "orders")
            assert "remark" in columns and "memo" not in columns
            expected = rows_of(db.url, "orders", columns)
            for config in (whole, split, fresh):
                assert _catch_up(spark, config) is None, config.name
                frame = spark.read.format("delta").load(f"{config.path}/public/orders")
                assert not {"note", "memo"} & set(frame.columns), (config.name, frame.columns)
                assert frame.where("remark IS NULL").count() == 0, (config.name, frame.where("remark IS NULL")
                                                                    .select("id").collect())
                actual = delta_state(spark, f"{config.path}/public/orders", columns)
                assert actual == expected, (config.name, {k: (expected.get(k), actual.get(k))
                                                          for k in set(expected) | set(actual)
                                                          if expected.get(k) != actual.get(k)})
    finally:
        log.close()
