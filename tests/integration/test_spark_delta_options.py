"""The delta sink's session and column options against a live Spark session: the driver on
loopback by default, json/jsonb as a typed VARIANT column by option."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from cdc.events import Column, Op
from spark_sinks.delta import DeltaSink
from spark_sinks.session import LOOPBACK, driver_address
from spark_sinks.types import spark_type
from tests.contexts import attached
from tests.integration.test_spark_delta_sink import (
    ITEMS,
    catch_up,
    rows,
    sink_config,
    topics,  # noqa: F401 - the fixture
    upsert,
)

DOC_COLUMNS = (Column("id", "integer", True, False), Column("name", "text"), Column("doc", "jsonb"))


def test_a_local_driver_binds_to_loopback_unless_told_otherwise():
    assert driver_address("local[2]", {}, {}) == {"spark.driver.bindAddress": LOOPBACK,
                                                  "spark.driver.host": LOOPBACK}
    assert driver_address("local[*]", {"spark.driver.bindAddress": "0.0.0.0"}, {}) == {}
    assert driver_address("local[2]", {}, {"SPARK_LOCAL_IP": "10.1.2.3"}) == {}
    assert driver_address("spark://master:7077", {}, {}) == {}   # executors elsewhere must reach it


@pytest.mark.spark
def test_the_running_driver_listens_on_loopback(spark):
    env = spark.sparkContext._jvm.org.apache.spark.SparkEnv.get()
    assert env.rpcEnv().address().host() == LOOPBACK
    assert env.blockManager().blockManagerId().host() == LOOPBACK


def test_json_columns_are_text_unless_variant_is_asked_for():
    assert spark_type("jsonb") == T.StringType() and spark_type("json") == T.StringType()
    assert spark_type("jsonb", "variant") == T.VariantType()
    assert spark_type("text", "variant") == T.StringType()


@pytest.mark.spark
@pytest.mark.kafka
def test_jsonb_lands_as_a_variant_column_by_option(spark, topics, tmp_path):
    topics.schema(ITEMS, DOC_COLUMNS, 1)
    doc = {"tags": ["a", "b"], "size": {"w": 3, "h": 4.5}, "note": None}
    topics.publish(upsert(1, 10, op=Op.CREATE, name="x", doc=doc), upsert(2, 11, op=Op.CREATE, name="y", doc=None))
    config = sink_config(topics, tmp_path, json_columns="variant")
    table = f"{config.path}/public/items"
    catch_up(spark, config)
    frame = spark.read.format("delta").load(table)
    assert dict(frame.dtypes)["doc"] == "variant"
    got = (frame.selectExpr("id", "variant_get(doc, '$.size.h', 'double') AS h",
                            "variant_get(doc, '$.tags[1]', 'string') AS tag")
           .orderBy("id").collect())
    assert [tuple(r) for r in got] == [(1, 4.5, "b"), (2, None, None)]

    # An update replaces the document.
    topics.publish(upsert(1, 20, name="x", doc={"size": {"w": 5}}))
    catch_up(spark, config)
    assert rows(spark, table, "id", "name") == [(1, "x"), (2, "y")]
    assert spark.read.format("delta").load(table).where("id = 1").selectExpr(
        "variant_get(doc, '$.size.w', 'int')").first()[0] == 5


@pytest.mark.spark
@pytest.mark.kafka
def test_settings_spark_takes_only_at_start_do_not_fail_the_sinks_start(spark, topics, tmp_path, caplog):
    """A cluster's settings in the sink's ``spark.conf`` (``spark.executor.memory``...) go to the
    builder of the session the sink makes; set again on the running session they failed the
    start with CANNOT_MODIFY_CONFIG, even at the same value. The runtime ones still apply."""
    started = spark.sparkContext.getConf()
    config = sink_config(topics, tmp_path, spark={"conf": {
        "spark.sql.shuffle.partitions": "3",
        "spark.executor.memory": started.get("spark.executor.memory", "1g"),
        "spark.cores.max": "64"}})
    sink = attached(DeltaSink(config))
    sink.start(session=spark, before_query=lambda job, session: None)
    try:
        assert sink.session.conf.get("spark.sql.shuffle.partitions") == "3"
    finally:
        sink.stop()
    assert "spark.cores.max=64 is a setting Spark takes only at start" in caplog.text
