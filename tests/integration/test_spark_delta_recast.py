"""A numeric and a bigint that the source turns into doubles (PostgreSQL's ``ALTER ... TYPE double
precision`` rewrites every row to the nearest double without logging one), in the Delta sink:
``evolve`` casts the table's values the same way (one rewrite commit); ``rebuild`` rebuilds from
the topic, whose rows of the older shape carry the decimal's text, which must land as that double
too (Spark's JSON reader read it as NULL); so must such a row in the batch of the new shape.

Crafted events (as tests/integration/test_spark_delta_sink.py); the doubles expected are Python's
``float`` of the decimal text and of the integer, the nearest double, which is what PostgreSQL's
and MariaDB's casts give (tests/integration/test_sql_evolve_cast.py checks those against a real
source)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cdc.events import Column, Op, TableId
from tests.integration.test_spark_delta_sink import catch_up, rows, sink_config, topics, upsert  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ORDERS = TableId("shop", "public", "orders")
BEFORE = (Column("id", "integer", True, False), Column("amount", "numeric(12,2)"), Column("big", "bigint"))
AFTER = (Column("id", "integer", True, False), Column("amount", "double precision"),
         Column("big", "double precision"))
# Decimals that are no binary fraction, the widest numeric(12,2); integers past 2**53, which a
# double rounds (odd ones to an even neighbour).
OLD = {k: (str(Decimal(k) * Decimal("1.01") + Decimal("0.07")), 9007199254740993 + k) for k in range(1, 21)}
OLD[21] = ("9999999999.99", -9007199254740995)


def shaped(topics, version: int, columns) -> None:
    topics.schema(ORDERS, columns, version)
    topics.encoder.schema_versions[ORDERS] = version


@pytest.mark.parametrize("policy", ["evolve", "rebuild"])
def test_a_numeric_that_becomes_a_double_lands_as_the_sources_cast(spark, topics, tmp_path, policy):
    config = sink_config(topics, tmp_path, schema_policy=policy)
    table = f"{config.path}/public/orders"
    shaped(topics, 1, BEFORE)
    topics.publish(*[upsert(k, 10 + k, ORDERS, Op.CREATE, amount=a, big=b) for k, (a, b) in OLD.items()])
    catch_up(spark, config)
    assert dict(spark.read.format("delta").load(table).dtypes)["amount"] == "decimal(12,2)"

    # One batch: a row written before the DDL (the older shape, a decimal's text), the new shape,
    # and a row of it.
    topics.publish(upsert(5, 100, ORDERS, amount="7.77", big=5))
    shaped(topics, 200, AFTER)
    topics.publish(upsert(100, 300, ORDERS, Op.CREATE, amount=1.2345678901234567, big=9007199254740992.0))
    catch_up(spark, config)
    types = dict(spark.read.format("delta").load(table).dtypes)
    assert (types["amount"], types["big"]) == ("double", "double"), types
    expected = {k: (float(a), float(b)) for k, (a, b) in OLD.items()} | {5: (7.77, 5.0),
                                                                       100: (1.2345678901234567, 2.0 ** 53)}
    assert {k: (a, b) for k, a, b in rows(spark, table, "id", "amount", "big")} == expected

    # The table goes on as before: a MERGE over it, its key and mode still known.
    topics.publish(upsert(1, 400, ORDERS, amount=2.5, big=-1.0))
    catch_up(spark, config)
    assert rows(spark, table, "id", "amount", "big", where="id = 1") == [(1, 2.5, -1.0)]
    properties = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{table}`").collect()}
    assert (properties["cdc.key"], properties["cdc.mode"]) == ("id", "type1"), properties
