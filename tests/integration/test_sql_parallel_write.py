"""A large PostgreSQL write applied over several connections at once (``SqlSink._parts``): one
transaction per part, and what lands is exactly what one transaction per write lands, version
guard, remembered deletes and tombstones included."""

from __future__ import annotations

import random

import pytest

from cdc.api import PermanentError
from cdc.events import Op
from tests.unit.test_sql_sink import Sinks, delete, rows, schema_record, tombstone, truncate, upsert

pytestmark = pytest.mark.postgres

KEYS = 3000  # three parts of at least MIN_PART_KEYS each


@pytest.fixture
def sinks(pg_dsn):
    made = Sinks(pg_dsn.replace("postgresql://", "postgresql+psycopg2://", 1))
    made.records["shop.public.orders"] = schema_record([("id", "bigint"), ("t", "text"), ("n", "numeric(12,3)")])
    yield made
    made.stop()


def _transactions(sink, table: str = "orders__g1") -> int:
    """How many transactions wrote the table's rows (system columns are not visible through the view)."""
    return rows(sink, "count(DISTINCT xmin::text)", table=table, order="1")[0][0]


def test_a_large_write_goes_over_several_connections_and_lands_as_one_transaction_would(sinks):
    parallel = sinks(name="s1", write_connections=3)
    serial = sinks(name="s2", schema="serial", write_connections=1)
    rng = random.Random(18)
    first = [upsert(k, 1000 + k, op=Op.CREATE, t=f"first {k}", n=f"{k}.5") for k in range(KEYS)]
    later, version = [], 10_000
    for _ in range(2 * KEYS):
        key, version = rng.randrange(KEYS), version + 1
        kind = rng.random()
        later.append(delete(key, version) if kind < 0.15 else tombstone(key) if kind < 0.2 else
                     upsert(key, version, t=f"v{version}", n="1.25"))
    stale = [upsert(k, 1000 + k, t="stale", n="0") for k in range(KEYS)]  # older than every later change
    replay = later + stale  # another order (a tombstone deletes whatever the order), older versions of every key
    rng.shuffle(replay)
    for sink in (parallel, serial):
        sink.write(first)
        assert _transactions(sink, "orders__g1" if sink is parallel else "serial.orders__g1") == \
            (3 if sink is parallel else 1)
        sink.write(later)
        sink.write(replay)
    got = rows(parallel, "id, __cdc_version, t, n::text")
    assert got == rows(serial, "id, __cdc_version, t, n::text", table="serial.orders")
    last = {e.key["id"]: e for e in later}
    deleted = {key for key, e in last.items() if e.op is Op.DELETE}
    assert deleted and not deleted & {row[0] for row in got}  # remembered deletes held against the stale rows
    upserted = {key: e.version for key, e in last.items() if e.op is Op.UPDATE}
    assert upserted and all(version >= upserted[key] for key, version, _, _ in got if key in upserted)
    remembered = rows(parallel, "key_json, version", table="cdc_sink_deletes", order="1")
    assert remembered and remembered == rows(serial, "key_json, version", table="serial.cdc_sink_deletes", order="1")

def test_a_batch_with_a_truncate_stays_one_transaction(sinks):
    sink = sinks(name="s1", write_connections=3)
    sink.write([truncate(5)] + [upsert(k, 10 + k, op=Op.CREATE, t="x", n="1") for k in range(KEYS)])
    assert _transactions(sink) == 1
    assert rows(sink, "count(*)", order="1") == [(KEYS,)]


def test_a_value_that_does_not_fit_in_one_part_fails_the_write_and_the_sink_writes_on(sinks):
    sink = sinks(name="s1", write_connections=3)
    batch = [upsert(k, 10 + k, op=Op.CREATE, t="x", n="1") for k in range(KEYS)]
    batch[KEYS // 2] = upsert(KEYS // 2, 10 + KEYS // 2, op=Op.CREATE, t="x", n="not a number")
    with pytest.raises(PermanentError, match="orders__g1: a value does not fit"):
        sink.write(batch)
    del batch[KEYS // 2]
    sink.write(batch)  # the parts' connections are back in the pool, none left in a failed transaction
    assert rows(sink, "count(*)", order="1") == [(KEYS - 1,)]
