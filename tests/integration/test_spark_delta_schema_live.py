"""The DDL script of tests/live_ddl.py against the Delta sink, for each source: PostgreSQL or
MariaDB -> capture -> Kafka -> the delta sink's query (``schema_policy: rebuild``), a writer
writing while each DDL runs. After each step the Delta tables equal the source on the source's
columns, with the types the README's table says (a widened decimal in place; int -> text and
numeric -> double rebuilt). One Spark session for the whole script (the ``spark`` fixture)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cdc.log.kafka import KafkaLog
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from tests.integration.pg_capture import capturing, pg_config, topic_state, wait_until
from tests.integration.test_mysql_source import mysql_config
from tests.live_ddl import STEPS, Writer, rows_of, source_columns
from tests.live_ddl import source_db  # noqa: F401 - the fixture

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

# spark_sinks/README.md (types.py): both sources' types of the changed columns after each step.
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


def capture_config(db, tmp_path, prefix: str):
    """(the source's config, the namespace of its topics: ``<prefix>.<namespace>.<table>``)."""
    if db.kind == "postgres":
        return pg_config(db.dsn, tmp_path, slot=f"dl_{prefix}"), "public"
    return mysql_config(db.base, db.db, heartbeat_interval=1.0), db.db


def test_the_ddl_script_reaches_delta_in_order(spark, source_db, kafka_bootstrap, kafka_topic, tmp_path):
    db = source_db
    db.seed()
    source = db.url
    prefix = kafka_topic
    log = KafkaLog(kafka_bootstrap)
    capture, namespace = capture_config(db, tmp_path, prefix)
    config = DeltaSinkConfig.model_validate(dict(
        name="lake", type="delta", topics=[f"{prefix}.{namespace}.*"], path=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"), trigger_seconds=0.5, topic_prefix=prefix, schema_policy="rebuild",
        kafka={"bootstrap_servers": kafka_bootstrap}, spark={"conf": {"spark.sql.shuffle.partitions": "2"}}))
    orders = f"{prefix}.{namespace}.orders"
    writer = Writer(db)
    marker = [0]
    try:
        with capturing(capture, log, prefix) as running:
            wait_until(lambda: len(topic_state(log, orders)) == 30, capture=running)
            writer.start()
            for step, ddl in zip(STEPS, db.script):
                writer.resume()
                db.execute(ddl)  # while the writer writes
                db.execute("UPDATE orders SET t = t + 1")
                writer.resume()
                writer.pause()
                # A marker row: once it is in the topic, everything before it is.
                marker[0] -= 1
                db.execute(f"INSERT INTO orders (id) VALUES ({marker[0]})")
                wait_until(lambda: f'{{"id":{marker[0]}}}' in topic_state(log, orders),
                           what="the capture to catch up", capture=running)
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
                        actual = delta_state(spark, f"{config.path}/{namespace}/{table}", columns)
                        assert actual == expected, (step, table, {k: (expected.get(k), actual.get(k))
                                                                  for k in set(expected) | set(actual)
                                                                  if expected.get(k) != actual.get(k)})
                types = dict(spark.read.format("delta").load(f"{config.path}/{namespace}/orders").dtypes)
                for column, type_ in DELTA_TYPES.get(step, {}).items():
                    assert types[column] == type_, (step, column, types[column])
                if step == "rename a column":
                    assert "c1" not in types and "c1r" in types, (step, types)
            assert writer.error is None, writer.error
    finally:
        writer.close()
        log.close()
