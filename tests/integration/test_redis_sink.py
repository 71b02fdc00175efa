"""RedisSink.write on the stack's single server and its cluster: formats, columns, truncates,
generations, errors. (End to end through Kafka and `cdc run`: test_redis_pipeline.py.)"""

from __future__ import annotations

import socket
import uuid

import orjson
import pytest
import redis
from redis.cluster import RedisCluster

from cdc.api import Op, PermanentError, RetriableError, SinkEvent
from sinks.redis import row_key
from sinks.redis.client import command_known
from sinks.redis.config import RedisSinkConfig
from sinks.redis.keys import companion
from sinks.redis.sink import RedisSink
from tests.integration.valkey_server import valkey_url  # noqa: F401 - a fixture

pytestmark = pytest.mark.redis
TOPIC = "shop.public.accounts"


@pytest.fixture(params=["single", "cluster", "valkey"])
def target(request, redis_url, redis_cluster_url):
    cluster = request.param == "cluster"
    url = request.getfixturevalue("valkey_url") if request.param == "valkey" else redis_cluster_url if cluster else redis_url
    client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    prefix = f"s{uuid.uuid4().hex[:8]}"
    yield url, cluster, client, prefix
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)
    client.close()


def _sink(target, generation=None, **settings) -> RedisSink:
    url, cluster, _, prefix = target
    sink = RedisSink(RedisSinkConfig(name="cache", url=url, cluster=cluster, topics=["shop.*"], key_prefix=prefix,
                                     **settings), generation)
    sink.start()
    return sink


def _event(offset, op, version, after=None, key_id=1, table="accounts"):
    key = {"id": key_id}
    source = {} if op is None else {"schema": "public", "table": table, "name": "pg", "version": version}
    return SinkEvent(f"shop.public.{table}", 0, offset, key, op, None, after, version, source)


def _key(target, key_id=1, table="accounts"):
    _, _, client, prefix = target
    return row_key(client, prefix, "public", table, {"id": key_id})


def test_hash_format_with_chosen_columns_and_a_schema_change(target):
    client = target[2]
    sink = _sink(target, exclude=["secret"], rename={"balance": "bal"})
    try:
        sink.write([_event(0, Op.CREATE, 10, {"id": 1, "balance": "12.50", "secret": "x", "note": None})])
        assert client.hgetall(_key(target)) == {b"id": b"1", b"bal": b"12.50"}
        # The table gained a column: the hash gains a field with the next write.
        sink.write([_event(1, Op.UPDATE, 11, {"id": 1, "balance": "13.00", "secret": "x", "note": None,
                                              "tags": ["a", "b"], "vip": True})])
        assert client.hgetall(_key(target)) == {b"id": b"1", b"bal": b"13.00", b"tags": b'["a","b"]', b"vip": b"true"}
        sink.write([_event(0, Op.CREATE, 10, {"id": 1}), _event(2, Op.DELETE, 12, key_id=1)])
        assert sink.context.stats.details == {"keys_written": 2, "tombstones": 1, "stale_skipped": 0}
    finally:
        sink.stop()


def test_json_format_with_ttl_and_the_version_beside_the_value(target):
    client = target[2]
    sink = _sink(target, format="json", include=["id", "note"], ttl_seconds=600)
    try:
        sink.write([_event(0, Op.CREATE, 10, {"id": 1, "balance": 1, "note": None})])
        key = _key(target)
        assert orjson.loads(client.get(key)) == {"id": 1, "note": None}
        assert 0 < client.ttl(key) <= 600
        assert client.get(companion(key)) == b"10"
    finally:
        sink.stop()


def test_invalidate_deletes_on_every_change(target):
    client = target[2]
    sink = _sink(target, format="invalidate")
    try:
        client.set(_key(target), "cached by the application")
        sink.write([_event(0, Op.UPDATE, 10, {"id": 1})])
        assert not client.exists(_key(target))
    finally:
        sink.stop()


def test_redisjson_is_refused_with_a_clear_message_where_the_module_is_missing(target):
    url, cluster, client, prefix = target
    servers = [client.get_redis_connection(n) for n in client.get_primaries()] if cluster else [client]
    if any(command_known(server, "JSON.SET") for server in servers):
        pytest.fail("this test expects a server without RedisJSON (the stack's redis-server)")
    sink = RedisSink(RedisSinkConfig(name="cache", url=url, cluster=cluster, topics=["shop.*"], key_prefix=prefix,
                                     format="redisjson"))
    with pytest.raises(PermanentError) as caught:
        sink.start()
    message = str(caught.value)
    # It names the sink, the server (every master of a cluster) and what MODULE LIST answered there.
    assert message.startswith("redis sink cache: format redisjson needs the RedisJSON module (command JSON.SET)")
    assert url in message and "format: json" in message
    for server in servers:
        # Redis 7.0 loads none; Valkey 9 lists its built-in "lua".
        names = ", ".join(m[b"name"].decode() for m in server.module_list()) or "no modules loaded"
        address = "{host}:{port}".format(**server.connection_pool.connection_kwargs)
        assert f"{address if cluster else url} (MODULE LIST: {names})" in message


def test_a_truncate_removes_older_keys_and_keeps_newer_ones(target):
    client = target[2]
    sink = _sink(target)
    try:
        sink.write([_event(i, Op.CREATE, 10 + i, {"id": i}, key_id=i) for i in range(1, 6)]
                   + [_event(9, Op.CREATE, 10, {"id": 1}, key_id=1, table="other")])
        sink.write([_event(6, Op.TRUNCATE, 15, key_id=0), _event(7, Op.UPDATE, 20, {"id": 5, "v": "x"}, key_id=5)])
        assert [client.exists(_key(target, i)) for i in range(1, 6)] == [0, 0, 0, 0, 1]
        assert client.exists(_key(target, 1, table="other"))  # another table: untouched
        sink.write([_event(1, Op.CREATE, 11, {"id": 1}, key_id=1)])  # a replay from before it
        assert not client.exists(_key(target, 1))
    finally:
        sink.stop()


def test_a_new_generation_is_written_aside_then_switched_to_and_the_old_one_dropped(target):
    client, prefix = target[2], target[3]
    live = _sink(target)
    try:
        live.write([_event(0, Op.CREATE, 10, {"id": 1, "v": "old"})])
        old_key = _key(target)
        live.open_generation(2)
        live.write([_event(0, Op.CREATE, 10, {"id": 1, "v": "new"})])
        assert _key(target) == old_key and client.hget(old_key, "v") == b"old"  # readers: still 1
        live.switch_generation(2)
        new_key = _key(target)
        assert new_key != old_key and client.hget(new_key, "v") == b"new"
        live.drop_generation(1)
        live.generations.wait()
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
        assert client.get(f"{prefix}.generation") == b"2"
    finally:
        live.stop()


def test_an_unreachable_server_is_a_retriable_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = RedisSink(RedisSinkConfig(name="cache", url=f"redis://127.0.0.1:{port}/0", topics=["shop.*"]))
    with pytest.raises(RetriableError):
        sink.start()


def test_a_sink_on_the_current_generation_follows_a_switch(target, monkeypatch):
    import sinks.redis.sink as sink_module

    monkeypatch.setattr(sink_module, "POINTER_CHECK_S", 0.0)
    client = target[2]
    live, rebuild = _sink(target), _sink(target)
    try:
        rebuild.open_generation(2)
        rebuild.write([_event(0, Op.CREATE, 10, {"id": 1, "v": "rebuilt"})])
        rebuild.switch_generation(2)
        live.write([_event(1, Op.UPDATE, 11, {"id": 1, "v": "live"})])
        assert client.hget(_key(target), "v") == b"live"  # in generation 2, where readers are
    finally:
        live.stop()
        rebuild.stop()


@pytest.mark.parametrize("fmt", ["hash", "json"])
def test_read_rows_gives_back_the_live_rows_in_key_order(target, fmt):
    """cdc.api.ReadableSink: what the sink wrote, deleted rows left out, in key order (10 after 9:
    numbers by value, though the keys are text), paged by ``after``; a composite key's parts."""
    sink = _sink(target, format=fmt)
    try:
        sink.write([_event(i, Op.CREATE, 10 + i, {"id": i, "name": f"n{i}"}, key_id=i) for i in (10, 2, 9, 1)]
                   + [_event(4, Op.DELETE, 20, None, key_id=2)])
        rows = sink.read_rows(TOPIC)
        assert [r.key for r in rows] == [("1",), ("9",), ("10",)]
        assert [r.row["name"] for r in rows] == ["n1", "n9", "n10"]
        assert [r.key for r in sink.read_rows(TOPIC, after=(1,), limit=1)] == [("9",)]
        assert sink.read_rows("shop.public.other") == []
        composite = SinkEvent("shop.public.pairs", 0, 0, {"a": "x:y", "b": 2}, Op.CREATE, None,
                              {"a": "x:y", "b": 2}, 1, {"schema": "public", "table": "pairs", "version": 1})
        sink.write([composite])
        assert [r.key for r in sink.read_rows("shop.public.pairs")] == [("x:y", "2")]
    finally:
        sink.stop()


def test_read_rows_of_a_sink_that_stores_no_rows_is_refused(target):
    sink = _sink(target, format="invalidate")
    try:
        with pytest.raises(PermanentError, match="stores no rows"):
            sink.read_rows(TOPIC)
    finally:
        sink.stop()
