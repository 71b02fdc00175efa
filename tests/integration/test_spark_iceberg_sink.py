"""The Spark sink with ``table_format: iceberg`` against Kafka, with crafted change events, its
tables read back by PyIceberg (not Spark): ordering, deletes, truncates, a crash replay, SCD2,
schema changes, through a ``hadoop``, a ``jdbc`` and a ``rest`` catalog (Iceberg's own REST
catalog server).

Each round of events is published while the query is stopped and read by one
``processAllAvailable`` after a restart from the checkpoint (the Delta tests' way:
tests/integration/test_spark_delta_sink.py, whose event makers these are)."""

from __future__ import annotations

import pytest

from cdc.errors import SchemaChangeError
from cdc.events import Column, Op
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from tests.contexts import attached
from tests.iceberg_tables import IcebergTables, RestCatalogServer, jdbc_catalog
from tests.integration.test_spark_delta_sink import (
    ITEM_COLUMNS,
    ITEMS,
    Topics,
    catch_up,
    delete,
    die_after_items,
    publish_round,
    seed_items_and_orders,
    truncate,
    upsert,
)

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.iceberg]


@pytest.fixture
def topics(kafka_bootstrap, kafka_topic):
    instance = Topics(kafka_bootstrap, kafka_topic)
    yield instance
    instance.close()


@pytest.fixture(params=["hadoop", "jdbc", "rest"])
def catalog(request, tmp_path):
    """(the sink's iceberg.catalog section, the database's DSN or None)."""
    if request.param == "hadoop":
        yield {"type": "hadoop"}, None
    elif request.param == "jdbc":
        dsn = request.getfixturevalue("target_dsn")
        yield jdbc_catalog(dsn), dsn
    else:
        server = RestCatalogServer(tmp_path / "rest").start()
        try:
            yield {"type": "rest", "uri": server.uri}, None
        finally:
            server.stop()


def iceberg_config(topics: Topics, tmp_path, catalog, **overrides) -> tuple[DeltaSinkConfig, IcebergTables]:
    section, dsn = catalog
    settings = dict(name="lake", type="delta", table_format="iceberg", topics=[f"{topics.prefix}.*"],
                    path=str(tmp_path / "warehouse"), checkpoint=str(tmp_path / "checkpoint"), trigger_seconds=0.5,
                    topic_prefix=topics.prefix, kafka={"bootstrap_servers": topics.log.bootstrap_servers},
                    iceberg={"catalog": section}, spark={"conf": {"spark.sql.shuffle.partitions": "2"}})
    settings.update(overrides)
    config = DeltaSinkConfig.model_validate(settings)
    return config, IcebergTables(section, config.path, dsn=dsn)


@pytest.mark.parametrize("soft_delete", [False, True], ids=["hard-delete", "soft-delete"])
def test_late_out_of_order_and_duplicate_events_never_regress_a_row(spark, topics, tmp_path, catalog, soft_delete):
    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    config, tables = iceberg_config(topics, tmp_path, catalog, soft_delete=soft_delete)

    def live(row: dict) -> bool:
        return not soft_delete or not row["__cdc_deleted"]

    publish_round(topics, 1)
    catch_up(spark, config)
    assert tables.rows("public.items", "id", "name", "qty", "__cdc_version", where=live) == [
        (1, "a30", 3, 30), (2, "b", 1, 10), (5, "e", 1, 40), (7, "g", 7, 45)]
    if soft_delete:
        assert tables.rows("public.items", "id", "__cdc_version", where=lambda r: r["__cdc_deleted"]) == [
            (3, 20), (4, 6)]
    else:
        assert tables.rows("_cdc_deletes.public.items", "__cdc_key", "__cdc_version") == [
            ('{"id":3}', 20), ('{"id":4}', 6)]
    assert tables.properties("public.items")["write.merge.mode"] == "merge-on-read"

    # Late updates, a late insert of a deleted key, an insert newer than a delete, a replayed
    # duplicate, a new delete, a tombstone alone.
    publish_round(topics, 2)
    catch_up(spark, config)
    assert tables.rows("public.items", "id", "name", "qty", "__cdc_version", where=live) == [
        (1, "a30", 3, 30), (2, "b", 1, 10), (4, "d7", 7, 7), (6, "f", 6, 60)]

    # A truncate: older rows go, one at its very version and one newer stay; the watermark holds
    # for later batches.
    publish_round(topics, 3)
    catch_up(spark, config)
    assert tables.rows("public.items", "id", "name", "__cdc_version", where=live) == [
        (6, "f", 60), (9, "i", 70), (10, "j", 55)]
    assert tables.properties("public.items")["cdc.truncated_at"] == "55"
    publish_round(topics, 4)
    catch_up(spark, config)
    assert tables.rows("public.items", "id", "__cdc_version", where=live) == [(6, 60), (9, 70), (10, 55), (11, 55)]

    # cdc verify reads the tables as it reads Delta's: the live rows, in key order.
    reader = attached(DeltaSink(config))
    reader.start_reading()
    try:
        stored = reader.read_rows(topics.topic(ITEMS))
    finally:
        reader.stop()
    assert [(row.key, row.row["name"]) for row in stored] == [((6,), "f"), ((9,), "i"), ((10,), "j"), ((11,), "k")]


def test_a_batch_that_died_after_one_table_is_replayed_and_changes_nothing_twice(spark, topics, tmp_path):
    """Iceberg commits carry no transaction id: the re-run batch writes again, and its
    version guards make that write change nothing."""
    seed_items_and_orders(topics)
    config, tables = iceberg_config(topics, tmp_path, ({"type": "hadoop"}, None))
    die_after_items(spark, config)
    assert tables.rows("public.items", "id") == [(1,), (2,), (3,), (4,)]
    assert not tables.exists("public.orders")

    catch_up(spark, config)
    assert tables.rows("public.items", "id", "name", "__cdc_version") == [(k, f"i{k}", 10 + k) for k in range(1, 5)]
    assert tables.rows("public.orders", "id", "name") == [(k, f"o{k}") for k in range(1, 4)]
    # The memory's append ran twice; readers take each key's newest version.
    assert set(tables.rows("_cdc_deletes.public.items", "__cdc_key", "__cdc_version")) == {('{"id":5}', 30)}

    topics.publish(upsert(1, 100, name="i1b", qty=100), upsert(5, 29, op=Op.CREATE, name="late", qty=5))
    catch_up(spark, config)
    assert tables.rows("public.items", "id", "name") == [(1, "i1b"), (2, "i2"), (3, "i3"), (4, "i4")]


def test_scd2_keeps_every_version_with_its_validity(spark, topics, tmp_path, catalog):
    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    config, tables = iceberg_config(topics, tmp_path, catalog, scd2=True)
    history = ("id", "name", "__cdc_valid_from", "__cdc_valid_to", "__cdc_current")

    topics.publish(upsert(1, 10, op=Op.CREATE, name="a", qty=1), upsert(1, 20, name="b", qty=1),
                   upsert(2, 10, op=Op.CREATE, name="x", qty=1))
    catch_up(spark, config)
    assert tables.rows("public.items", *history) == [(1, "a", 10, 20, False), (1, "b", 20, None, True),
                                                     (2, "x", 10, None, True)]

    topics.publish(delete(1, 30), upsert(1, 40, op=Op.CREATE, name="c", qty=1), upsert(1, 15, name="late", qty=1),
                   upsert(2, 15, name="y", qty=1), upsert(2, 15, name="y", qty=1))
    catch_up(spark, config)
    assert tables.rows("public.items", *history) == [
        (1, "a", 10, 20, False), (1, "b", 20, 30, False), (1, "c", 40, None, True),
        (2, "x", 10, 15, False), (2, "y", 15, None, True)]

    topics.publish(truncate(50))
    catch_up(spark, config)
    assert tables.rows("public.items", "id", "__cdc_valid_to", where=lambda r: r["__cdc_valid_from"] >= 15) == [
        (1, 30), (1, 50), (2, 50)]
    assert tables.rows("public.items", "id", where=lambda r: r["__cdc_current"]) == []


def test_columns_added_renamed_widened_and_a_type_change_rebuilt(spark, topics, tmp_path):
    columns = (Column("id", "integer", True, False), Column("name", "text"), Column("price", "numeric(6,2)"))
    topics.schema(ITEMS, columns, 1)
    topics.publish(upsert(1, 10, op=Op.CREATE, name="a", price="1.50"))
    config, tables = iceberg_config(topics, tmp_path, ({"type": "hadoop"}, None), schema_policy="evolve")
    catch_up(spark, config)

    # name renamed to title, a column added, price widened (same scale: in place).
    renamed = (columns[0], Column("title", "text", renamed_from="name"), Column("price", "numeric(12,2)"),
               Column("note", "text"))
    topics.schema(ITEMS, renamed, 20)
    topics.publish(upsert(2, 21, op=Op.CREATE, title="b", price="1234567.25", note="new"))
    catch_up(spark, config)
    assert tables.columns("public.items")["title"] == "string"
    assert tables.columns("public.items")["price"] == "decimal(12, 2)"
    assert [(r[0], r[1], str(r[2]), r[3]) for r in tables.rows("public.items", "id", "title", "price", "note")] == [
        (1, "a", "1.50", None), (2, "b", "1234567.25", "new")]

    # price becomes text: evolve refuses, rebuild builds the table again from the topic.
    topics.schema(ITEMS, (*renamed[:2], Column("price", "text"), renamed[3]), 30)
    topics.publish(upsert(2, 31, title="b", price="many", note="new"))
    sink = attached(DeltaSink(config))
    sink.start(session=spark)
    with pytest.raises(Exception):  # noqa: B017 (whatever pyspark wraps it in; sink.job.failure is checked)
        sink.job.query.processAllAvailable()
    sink.stop()
    assert isinstance(sink.job.failure, SchemaChangeError)
    catch_up(spark, config.model_copy(update={"schema_policy": "rebuild"}))
    assert tables.columns("public.items")["price"] == "string"
    assert tables.rows("public.items", "id", "title", "price") == [(1, "a", "1.50"), (2, "b", "many")]
    assert not tables.exists("_cdc_rebuild.public.items")
