"""The delta sink against Kafka and Delta, with crafted change events: ordering, deletes,
truncates, crash replay, SCD2 and schema changes.

Events are made by the framework's own EnvelopeEncoder and published with a KafkaLog writer, so
the sink reads exactly what a source would publish. Each round of events is published while the
query is stopped and read by one ``processAllAvailable`` after a restart from the checkpoint, so a
round is one micro-batch (and every round also exercises a resume).
"""

from __future__ import annotations

import json

import pytest
from delta.tables import DeltaTable

from cdc.errors import RetriableError, SchemaChangeError
from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.log.base import TopicSettings
from cdc.log.kafka import KafkaLog
from cdc.serde import EnvelopeEncoder, Record, encode_schema_change
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from tests.contexts import attached

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ITEMS = TableId("shop", "public", "items")
ITEM_COLUMNS = (Column("id", "integer", True, False), Column("name", "text"), Column("qty", "integer"))


class Topics:
    """Publishes crafted events of a source named ``pg`` under ``prefix``."""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        self.log = KafkaLog(bootstrap)
        self.prefix = prefix
        self.encoder = EnvelopeEncoder("postgresql", "pg", prefix,
                                       on_new_topic=lambda t: self.log.ensure_topic(t, TopicSettings(partitions=2)))
        self.writer = self.log.writer()

    def schema(self, table: TableId, columns, version: int) -> None:
        self.log.ensure_topic(f"{self.prefix}.schema-changes", TopicSettings(partitions=1))
        self.writer.publish([encode_schema_change(SchemaChange(table, tuple(columns), version, 0), "pg", self.prefix)])
        self.writer.flush(30)

    def publish(self, *events: ChangeEvent) -> None:
        self.writer.publish(self.encoder.encode(list(events)))
        self.writer.flush(30)

    def topic(self, table: TableId) -> str:
        return self.encoder.topic(table)

    def close(self) -> None:
        self.writer.close()
        self.log.close()


def upsert(key: int, version: int, table: TableId = ITEMS, op: Op = Op.UPDATE, **row) -> ChangeEvent:
    return ChangeEvent(op, table, {"id": key}, None, {"id": key, **row}, version, 1_700_000_000_000 + version)


def delete(key: int, version: int, table: TableId = ITEMS) -> ChangeEvent:
    return ChangeEvent(Op.DELETE, table, {"id": key}, {"id": key}, None, version, 1_700_000_000_000 + version)


def truncate(version: int, table: TableId = ITEMS) -> ChangeEvent:
    return ChangeEvent(Op.TRUNCATE, table, None, None, None, version, 1_700_000_000_000 + version)


@pytest.fixture
def topics(kafka_bootstrap, kafka_topic):
    instance = Topics(kafka_bootstrap, kafka_topic)
    yield instance
    instance.close()


def sink_config(topics: Topics, tmp_path, **overrides) -> DeltaSinkConfig:
    settings = dict(name="lake", type="delta", topics=[f"{topics.prefix}.*"], path=str(tmp_path / "lake"),
                    checkpoint=str(tmp_path / "checkpoint"), trigger_seconds=0.5, topic_prefix=topics.prefix,
                    kafka={"bootstrap_servers": topics.log.bootstrap_servers},
                    spark={"conf": {"spark.sql.shuffle.partitions": "2"}})
    settings.update(overrides)
    return DeltaSinkConfig.model_validate(settings)


def catch_up(spark, config: DeltaSinkConfig, after_table=None) -> DeltaSink:
    """Start the sink's query, process everything the topics hold, stop it."""
    sink = attached(DeltaSink(config))
    sink.start(session=spark)
    sink.job.after_table = after_table
    try:
        sink.job.query.processAllAvailable()
    finally:
        sink.stop()
    return sink


def rows(spark, path: str, *columns: str, where: str | None = None) -> list[tuple]:
    frame = spark.read.format("delta").load(path)
    if where:
        frame = frame.where(where)
    return sorted(tuple(r) for r in frame.select(*columns).collect())


def merges_of(spark, path: str) -> list[dict]:
    """userMetadata of the MERGE commits of a table, oldest first."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    return [json.loads(h.userMetadata) for h in history if h.operation == "MERGE" and h.userMetadata]


def seed_items_and_orders(topics: Topics) -> None:
    """Items 1-5 (5 deleted at 30) and orders 1-3, each key at version 10 + key."""
    orders = TableId("shop", "public", "orders")
    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    topics.schema(orders, ITEM_COLUMNS, 1)
    topics.publish(*[upsert(k, 10 + k, op=Op.CREATE, name=f"i{k}", qty=k) for k in range(1, 6)], delete(5, 30),
                   *[upsert(k, 10 + k, table=orders, op=Op.CREATE, name=f"o{k}", qty=k) for k in range(1, 4)])


class Crash(Exception):
    pass


def die_after_items(spark, config: DeltaSinkConfig) -> None:
    """Run batch 0 and let it die right after public.items was written (before public.orders)."""
    def crash_after_items(batch_id: int, table: str) -> None:
        if table == "public.items":
            raise Crash(f"killed in batch {batch_id} after {table}")

    sink = attached(DeltaSink(config))
    sink.start(session=spark)
    sink.job.after_table = crash_after_items
    with pytest.raises(Exception, match="killed in batch 0"):
        sink.job.query.processAllAvailable()
    assert isinstance(sink.job.failure, Crash)
    sink.stop()


def publish_round(topics: Topics, n: int) -> None:
    """Round ``n`` of the type-1 test's events (the Iceberg tests publish the same):
    1 out of order within the batch, a duplicate, deletes of keys never seen; 2 late updates, a
    late insert of a deleted key, an insert newer than a delete, a replayed duplicate, a new
    delete, a tombstone alone; 3 a truncate at 55 with rows older, at and newer than it; 4 rows
    at and below the watermark."""
    if n == 1:
        topics.publish(
            upsert(1, 10, op=Op.CREATE, name="a", qty=1), upsert(1, 30, name="a30", qty=3),
            upsert(1, 20, name="a20", qty=2),
            upsert(2, 10, op=Op.CREATE, name="b", qty=1), upsert(2, 10, op=Op.CREATE, name="b", qty=1),
            delete(3, 20),
            upsert(4, 5, op=Op.CREATE, name="d", qty=1), delete(4, 6),
            upsert(5, 40, op=Op.CREATE, name="e", qty=1), upsert(7, 45, op=Op.CREATE, name="g", qty=7))
    elif n == 2:
        topics.writer.publish([Record(topics.topic(ITEMS), b'{"id":7}', None)])
        topics.publish(
            upsert(1, 25, name="a25", qty=25),
            upsert(3, 15, op=Op.CREATE, name="late", qty=15),
            upsert(4, 7, op=Op.CREATE, name="d7", qty=7),
            upsert(2, 10, op=Op.CREATE, name="b", qty=1),
            delete(5, 41),
            upsert(6, 60, op=Op.CREATE, name="f", qty=6))
    elif n == 3:
        topics.publish(truncate(55), upsert(8, 50, op=Op.CREATE, name="h", qty=8),
                       upsert(9, 70, op=Op.CREATE, name="i", qty=9), upsert(10, 55, op=Op.CREATE, name="j", qty=10))
    else:
        topics.publish(upsert(11, 55, op=Op.CREATE, name="k", qty=11), upsert(12, 54, op=Op.CREATE, name="l", qty=12))


# -- type 1 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("soft_delete", [False, True], ids=["hard-delete", "soft-delete"])
def test_late_out_of_order_and_duplicate_events_never_regress_a_row(spark, topics, tmp_path, soft_delete):
    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    config = sink_config(topics, tmp_path, soft_delete=soft_delete)
    table = f"{config.path}/public/items"
    live = "NOT __cdc_deleted" if soft_delete else None

    # Round 1, one batch: out of order within the batch, a duplicate, deletes of keys never seen.
    publish_round(topics, 1)
    topics.writer.publish([Record(topics.topic(ITEMS), b'{"id":99}', b"not an envelope")])
    topics.writer.flush(30)
    catch_up(spark, config)
    assert rows(spark, table, "id", "name", "qty", "__cdc_version", where=live) == [
        (1, "a30", 3, 30), (2, "b", 1, 10), (5, "e", 1, 40), (7, "g", 7, 45)]
    [dead] = [json.loads(r.value) for r in topics.log.read_all(f"{topics.prefix}.dead-letter.lake")]
    assert (dead["topic"], dead["value"]) == (topics.topic(ITEMS), "not an envelope")
    assert dead["reason"] == "not JSON, or a field of the wrong type"
    if soft_delete:  # deleted rows stay, marked, with the delete's version: their own memory
        assert rows(spark, table, "id", "__cdc_version", where="__cdc_deleted") == [(3, 20), (4, 6)]
    else:
        assert rows(spark, f"{config.path}/_cdc_deletes/public/items", "__cdc_key", "__cdc_version") == [
            ('{"id":3}', 20), ('{"id":4}', 6)]

    # Round 2: late updates, a late insert of a deleted key, an insert newer than a delete, a
    # replayed duplicate, a new delete, a tombstone alone (its delete compacted away).
    publish_round(topics, 2)
    catch_up(spark, config)
    assert rows(spark, table, "id", "name", "qty", "__cdc_version", where=live) == [
        (1, "a30", 3, 30), (2, "b", 1, 10), (4, "d7", 7, 7), (6, "f", 6, 60)]
    if soft_delete:  # the tombstone has no version: the row keeps its own
        assert rows(spark, table, "id", "__cdc_version", where="__cdc_deleted AND id IN (5, 7)") == [(5, 41), (7, 45)]

    # Round 3: a truncate; in the same batch a row older than it (dropped), one newer and one at
    # its very version (kept: a table dropped and created again has its truncate at the version
    # of the new table's first row, from the PostgreSQL source).
    publish_round(topics, 3)
    catch_up(spark, config)
    assert rows(spark, table, "id", "name", "__cdc_version", where=live) == [(6, "f", 60), (9, "i", 70), (10, "j", 55)]
    # The watermark is kept in the table, for later batches and restarts.
    properties = spark.sql(f"SHOW TBLPROPERTIES delta.`{table}`").collect()
    assert {p.key: p.value for p in properties}["cdc.truncated_at"] == "55"
    publish_round(topics, 4)
    catch_up(spark, config)
    assert rows(spark, table, "id", "__cdc_version", where=live) == [(6, 60), (9, 70), (10, 55), (11, 55)]


def test_a_new_checkpoint_cut_between_a_delete_and_its_tombstone_keeps_the_row_inserted_after_it(
        spark, topics, tmp_path):
    """soft_delete: the table holds a key inserted again after a delete; a new checkpoint reads
    the topic again one record per micro-batch, so its tombstone comes alone. Without a version
    it marked the live row deleted at the row's own version, and the insert's replay (an equal
    version) was refused: the row was lost. With its delete's version (its header) it is a
    delete at 20, older than the row."""
    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    config = sink_config(topics, tmp_path, soft_delete=True)
    table = f"{config.path}/public/items"
    topics.publish(upsert(1, 10, op=Op.CREATE, name="a", qty=1), delete(1, 20),
                   upsert(1, 30, op=Op.CREATE, name="again", qty=3))
    catch_up(spark, config)
    assert rows(spark, table, "id", "name", "__cdc_version", "__cdc_deleted") == [(1, "again", 30, False)]
    catch_up(spark, config.model_copy(update={"checkpoint": str(tmp_path / "checkpoint2"),
                                              "max_offsets_per_trigger": 1}))
    assert rows(spark, table, "id", "name", "__cdc_version", "__cdc_deleted") == [(1, "again", 30, False)]


def test_a_batch_that_died_after_one_table_is_replayed_without_applying_twice(spark, topics, tmp_path):
    seed_items_and_orders(topics)
    config = sink_config(topics, tmp_path)
    items_path, orders_path = f"{config.path}/public/items", f"{config.path}/public/orders"
    memory_path = f"{config.path}/_cdc_deletes/public/items"
    die_after_items(spark, config)
    # Tables are written in topic order: items was, orders never was.
    assert rows(spark, items_path, "id") == [(1,), (2,), (3,), (4,)]
    assert not DeltaTable.isDeltaTable(spark, orders_path)

    # The restart re-runs batch 0. A version-guarded MERGE would change nothing anyway (and Delta
    # records no empty commit), but the delete memory is appended to: without the batch's
    # transaction id it would now hold the delete twice.
    catch_up(spark, config)
    assert rows(spark, items_path, "id", "name", "__cdc_version") == [(k, f"i{k}", 10 + k) for k in range(1, 5)]
    assert rows(spark, orders_path, "id", "name") == [(k, f"o{k}") for k in range(1, 4)]
    assert rows(spark, memory_path, "__cdc_key", "__cdc_version") == [('{"id":5}', 30)]
    assert merges_of(spark, items_path) == [{"sink": "lake", "batch": 0, "step": "merge"}]
    assert merges_of(spark, orders_path) == [{"sink": "lake", "batch": 0, "step": "merge"}]

    # Nothing lost after the replay: the next batch is batch 1 and carries on.
    topics.publish(upsert(1, 100, name="i1b", qty=100))
    catch_up(spark, config)
    assert rows(spark, items_path, "id", "name", where="id = 1") == [(1, "i1b")]
    assert [m["batch"] for m in merges_of(spark, items_path)] == [0, 1]


# -- SCD type 2 ------------------------------------------------------------------------------------

def test_scd2_keeps_every_version_with_its_validity(spark, topics, tmp_path):
    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    config = sink_config(topics, tmp_path, scd2=True)
    table = f"{config.path}/public/items"
    history = ("id", "name", "__cdc_valid_from", "__cdc_valid_to", "__cdc_current")

    topics.publish(upsert(1, 10, op=Op.CREATE, name="a", qty=1), upsert(1, 20, name="b", qty=1),
                   upsert(2, 10, op=Op.CREATE, name="x", qty=1))
    catch_up(spark, config)
    assert rows(spark, table, *history) == [(1, "a", 10, 20, False), (1, "b", 20, None, True),
                                            (2, "x", 10, None, True)]

    # A delete closes the key, a later insert reopens it; a late and a duplicate record add nothing.
    topics.publish(delete(1, 30), upsert(1, 40, op=Op.CREATE, name="c", qty=1), upsert(1, 15, name="late", qty=1),
                   upsert(2, 15, name="y", qty=1), upsert(2, 15, name="y", qty=1))
    catch_up(spark, config)
    assert rows(spark, table, *history) == [
        (1, "a", 10, 20, False), (1, "b", 20, 30, False), (1, "c", 40, None, True),
        (2, "x", 10, 15, False), (2, "y", 15, None, True)]

    # A truncate closes what is current.
    topics.publish(truncate(50))
    catch_up(spark, config)
    assert rows(spark, table, "id", "__cdc_valid_to", where="__cdc_valid_from >= 15") == [
        (1, 30), (1, 50), (2, 50)]
    assert rows(spark, table, "id", where="__cdc_current") == []


# -- schema changes --------------------------------------------------------------------------------

def test_a_type_change_the_table_cannot_follow_fails_or_rebuilds_by_policy(spark, topics, tmp_path):
    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    topics.publish(upsert(1, 10, op=Op.CREATE, name="a", qty=1), upsert(2, 11, op=Op.CREATE, name="b", qty=2))
    config = sink_config(topics, tmp_path)
    table = f"{config.path}/public/items"
    catch_up(spark, config)

    # qty becomes text: text values do not fit the bigint column.
    topics.schema(ITEMS, (*ITEM_COLUMNS[:2], Column("qty", "text")), 20)
    topics.publish(upsert(2, 21, name="b", qty="many"))
    sink = attached(DeltaSink(config))
    sink.start(session=spark)
    with pytest.raises(Exception):  # noqa: B017 (whatever pyspark wraps it in; sink.job.failure is checked)
        sink.job.query.processAllAvailable()
    assert isinstance(sink.job.failure, SchemaChangeError)
    assert "column qty: string values do not fit the table's bigint" in str(sink.job.failure)
    sink.stop()
    assert rows(spark, table, "id", "qty") == [(1, 1), (2, 2)]

    # With schema_policy: rebuild, the table is rebuilt from the topic with qty as text.
    catch_up(spark, sink_config(topics, tmp_path, schema_policy="rebuild"))
    frame = spark.read.format("delta").load(table)
    assert dict(frame.dtypes)["qty"] == "string"
    assert rows(spark, table, "id", "name", "qty", "__cdc_version") == [(1, "a", "1", 10), (2, "b", "many", 21)]
    operations = [h.operation for h in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()]
    assert "WRITE" in operations[-3:]  # the swap: one overwrite commit


def test_rows_of_a_shape_the_sink_has_not_read_yet_wait_for_it(spark, topics, tmp_path):
    """Each row names its shape (source.schema_version). A micro-batch whose rows name a shape
    the schema topic does not show yet is retried, never written with an older shape: qty 2.5
    of the new double shape would not fit the table's bigint."""
    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    topics.encoder.schema_versions[ITEMS] = 1
    topics.publish(upsert(1, 10, op=Op.CREATE, name="a", qty=1))
    config = sink_config(topics, tmp_path, schema_policy="rebuild")
    table = f"{config.path}/public/items"
    catch_up(spark, config)

    topics.encoder.schema_versions[ITEMS] = 20  # the new shape's record is not there yet
    topics.publish(upsert(2, 21, op=Op.CREATE, name="b", qty=2.5))
    sink = attached(DeltaSink(config))
    sink.start(session=spark)
    with pytest.raises(Exception):  # noqa: B017 (whatever pyspark wraps it in; sink.job.failure is checked)
        sink.job.query.processAllAvailable()
    assert isinstance(sink.job.failure, RetriableError) and "shape 20" in str(sink.job.failure)
    sink.stop()
    assert rows(spark, table, "id", "qty") == [(1, 1)]

    topics.schema(ITEMS, (*ITEM_COLUMNS[:2], Column("qty", "double precision")), 20)
    catch_up(spark, config)
    assert rows(spark, table, "id", "name", "qty") == [(1, "a", 1.0), (2, "b", 2.5)]


def test_fail_stops_at_a_widening_that_evolve_makes_in_place(spark, topics, tmp_path):
    columns = (Column("id", "integer", True, False), Column("name", "text"), Column("price", "numeric(6,2)"))
    topics.schema(ITEMS, columns, 1)
    topics.publish(upsert(1, 10, op=Op.CREATE, name="a", price="1.50"))
    config = sink_config(topics, tmp_path)  # schema_policy: fail, the default
    table = f"{config.path}/public/items"
    catch_up(spark, config)

    topics.schema(ITEMS, (*columns[:2], Column("price", "numeric(12,2)")), 20)  # Delta could widen this
    topics.publish(upsert(1, 21, name="a", price="1234567.25"))
    sink = attached(DeltaSink(config))
    sink.start(session=spark)
    with pytest.raises(Exception):  # noqa: B017 (whatever pyspark wraps it in; sink.job.failure is checked)
        sink.job.query.processAllAvailable()
    sink.stop()
    assert isinstance(sink.job.failure, SchemaChangeError)
    assert "table" in str(sink.job.failure) and "column price: decimal(6,2) -> decimal(12,2)" in str(sink.job.failure)
    assert rows(spark, table, "id", "__cdc_version") == [(1, 10)]  # nothing of the new shape written

    catch_up(spark, sink_config(topics, tmp_path, schema_policy="evolve"))
    assert dict(spark.read.format("delta").load(table).dtypes)["price"] == "decimal(12,2)"
    assert [(r[0], str(r[1])) for r in rows(spark, table, "id", "price")] == [(1, "1234567.25")]
