"""The Redis sink follows the live schema contract per ``schema_policy``: rows name their shape,
the runtime cuts batches by shape, and the sink decides per policy (sinks/redis/shapes.py).
Real Kafka and the stack's single Redis server, through the sink runtime."""

from __future__ import annotations

import threading

import pytest
import redis

from cdc.errors import SchemaChangeError
from cdc.events import Column, TableId
from cdc.runtime.sink_runner import SinkRunner
from sinks.redis import row_key
from sinks.redis.config import RedisSinkConfig
from sinks.redis.sink import RedisSink
from tests.integration.pg_capture import kafka_log  # noqa: F401 - the fixture ``log``
from tests.shapes import ShapedTopics

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

TABLE = TableId("shop", "public", "orders")
V1, V2 = 1_000, 2_000
SHAPE_1 = (Column("id", "int4", key=True, nullable=False), Column("amount", "int4"), Column("note", "text"))
# amount int4 -> text (its values change kind), note dropped, extra added.
SHAPE_2 = (Column("id", "int4", key=True, nullable=False), Column("amount", "text"), Column("extra", "varchar(10)"))


@pytest.fixture
def cache(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _run(log, prefix, redis_url, policy) -> RedisSink:
    config = RedisSinkConfig(name=f"{prefix}-cache", url=redis_url, topics=[f"{prefix}.public.*"],
                             key_prefix=prefix, schema_policy=policy, batch_wait_ms=50)
    sink = RedisSink(config)
    SinkRunner(sink, log, prefix).run(threading.Event(), until_caught_up=True)
    return sink


def _row(cache, prefix, key_id) -> dict:
    return {k.decode(): v.decode() for k, v in cache.hgetall(row_key(cache, prefix, "public", "orders",
                                                                      {"id": key_id})).items()}


def _first_rows(source: ShapedTopics) -> None:
    source.publish(TABLE, V1, SHAPE_1, [{"id": i, "amount": 10 * i, "note": f"n{i}"} for i in (1, 2, 3)])


def test_evolve_gives_each_key_the_new_shape_at_its_next_change(log, kafka_topic, redis_url, cache):
    prefix = kafka_topic
    source = ShapedTopics(log, prefix, partitions=2)
    _first_rows(source)
    _run(log, prefix, redis_url, "evolve")
    source.publish(TABLE, V2, SHAPE_2, [{"id": 1, "amount": "ten", "extra": "x"}, {"id": 4, "amount": "four", "extra": None}])
    _run(log, prefix, redis_url, "evolve")

    assert _row(cache, prefix, 1) == {"id": "1", "amount": "ten", "extra": "x"}   # note gone with the rewrite
    assert _row(cache, prefix, 2) == {"id": "2", "amount": "20", "note": "n2"}    # not changed since: old shape
    assert _row(cache, prefix, 4) == {"id": "4", "amount": "four"}


def test_fail_stops_before_the_first_row_of_a_changed_type_and_again_after_a_restart(
        log, kafka_topic, redis_url, cache):
    prefix = kafka_topic
    source = ShapedTopics(log, prefix, partitions=2)
    _first_rows(source)
    _run(log, prefix, redis_url, "fail")
    source.publish(TABLE, V2, SHAPE_2, [{"id": 1, "amount": "ten", "extra": "x"}, {"id": 4, "amount": "four", "extra": None}])
    topic = TABLE.topic(prefix)
    ends_before = {tp: end for tp, end in log.end_offsets(topic).items()}

    for _attempt in range(2):  # a restarted sink decides the same: the followed shape is kept in Redis
        with pytest.raises(SchemaChangeError) as raised:
            _run(log, prefix, redis_url, "fail")
        message = str(raised.value)
        assert "table shop.public.orders" in message and "column amount: int4 -> text" in message
        assert f"cdc rebuild CONFIG {prefix}-cache" in message
        assert _row(cache, prefix, 1) == {"id": "1", "amount": "10", "note": "n1"}  # nothing of the new shape
        assert _row(cache, prefix, 4) == {}
    # Nothing of the new shape was committed: every partition's offset is at most where its rows begin.
    reader = log.reader(f"{prefix}-cache")
    committed = reader.committed(list(ends_before))
    reader.close()
    first_new = {}
    for record in log.read_all(topic):
        if b'"schema_version":2000' in record.value:
            first_new.setdefault((record.topic, record.partition), record.offset)
    assert first_new and all((committed.get(tp) or 0) <= offset for tp, offset in first_new.items())


def test_rebuild_switches_readers_to_a_generation_in_the_new_shape(log, kafka_topic, redis_url, cache):
    prefix = kafka_topic
    source = ShapedTopics(log, prefix, partitions=2)
    _first_rows(source)
    _run(log, prefix, redis_url, "rebuild")
    assert cache.get(f"{prefix}.generation") is None  # generation 1
    source.publish(TABLE, V2, SHAPE_2, [{"id": 1, "amount": "ten", "extra": "x"}])
    _run(log, prefix, redis_url, "rebuild")

    assert cache.get(f"{prefix}.generation") == b"2"
    # Every key is in the new shape: the dropped column is gone even from keys not changed since.
    assert _row(cache, prefix, 1) == {"id": "1", "amount": "ten", "extra": "x"}
    assert _row(cache, prefix, 2) == {"id": "2", "amount": "20"}
    assert _row(cache, prefix, 3) == {"id": "3", "amount": "30"}
