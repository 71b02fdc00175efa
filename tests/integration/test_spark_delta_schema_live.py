"""The DDL script of tests/live_ddl.py against the Delta sink: PostgreSQL -> capture -> Kafka ->
the delta sink's query (``schema_policy: rebuild``), a writer writing while each DDL runs.
After each step the Delta tables equal the source on the source's columns, with the types the
README's table says (a widened decimal in place; int -> text and numeric -> double rebuilt)."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from cdc.log.kafka import KafkaLog
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from tests.integration.pg_capture import capturing, pg_config, topic_state, wait_until
from tests.live_ddl import STEPS, PgDb, Writer, rows_of, source_columns

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.postgres]

DELTA_TYPES = {"widen a numeric": {"amount": "decimal(14,4)"}, "int to text": {"qty": "string"},
               "numeric to double": {"amount": "double"}}


def _norm(value):
    if value is None or isinstance(value, (str, bool)):
        return value
    return Decimal(str(value)).normalize()


def delta_state(spark, path: str, columns: list[str]) -> dict:
    try:
        frame = spark.read.format("delta").load(path)
    except Exception:  # noqa: BLE001 - no table yet
        return {}
    present = [c for c in columns if c in frame.columns]
    if present != columns:
        return {}
    return {r[0]: tuple(_norm(v) for v in r[1:]) for r in frame.select(*columns).collect()}


def test_the_ddl_script_reaches_delta_in_order(spark, pg_dsn, kafka_bootstrap, kafka_topic, tmp_path):
    db = PgDb(pg_dsn)
    db.seed()
    source = db.url
    prefix = kafka_topic
    log = KafkaLog(kafka_bootstrap)
    config = DeltaSinkConfig.model_validate(dict(
        name="lake", type="delta", topics=[f"{prefix}.public.*"], path=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"), trigger_seconds=0.5, topic_prefix=prefix, schema_policy="rebuild",
        kafka={"bootstrap_servers": kafka_bootstrap}, spark={"conf": {"spark.sql.shuffle.partitions": "2"}}))
    writer = Writer(db)
    marker = [0]
    try:
        with capturing(pg_config(pg_dsn, tmp_path, slot=f"dl_{prefix}"), log, prefix) as capture:
            wait_until(lambda: len(topic_state(log, f"{prefix}.public.orders")) == 30, capture=capture)
            writer.thread.start()
            for step, ddl in zip(STEPS, db.script):
                writer.resume()
                db.execute(ddl)  # while the writer writes
                db.execute("UPDATE orders SET t = t + 1")
                writer.resume()
                writer.pause()
                # A marker row: once it is in the topic, everything before it is.
                marker[0] -= 1
                db.execute(f"INSERT INTO orders (id) VALUES ({marker[0]})")
                wait_until(lambda: f'{{"id":{marker[0]}}}' in topic_state(log, f"{prefix}.public.orders"),
                           what="the capture to catch up", capture=capture)
                # The query runs from its checkpoint over what the step added (a few micro-batches:
                # a running query would make one per trigger while the writer writes, minutes in all).
                sink = DeltaSink(config)
                sink.start(session=spark)
                try:
                    sink.job.query.processAllAvailable()
                    assert sink.job.failure is None, sink.job.failure
                finally:
                    sink.stop()
                for table in ("orders", "items"):
                    columns = source_columns(source, table)
                    if columns:
                        expected = rows_of(source, table, columns)
                        actual = delta_state(spark, f"{config.path}/public/{table}", columns)
                        assert actual == expected, (step, table, {k: (expected.get(k), actual.get(k))
                                                                  for k in set(expected) | set(actual)
                                                                  if expected.get(k) != actual.get(k)})
                types = dict(spark.read.format("delta").load(f"{config.path}/public/orders").dtypes)
                for column, type_ in DELTA_TYPES.get(step, {}).items():
                    assert types[column] == type_, (step, column, types[column])
            assert writer.error is None, writer.error
    finally:
        writer.stop.set()
        if writer.thread.is_alive():
            writer.thread.join()
        log.close()
