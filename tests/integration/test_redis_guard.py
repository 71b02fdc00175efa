"""The version guard's scripts on real servers: the single Redis server and the three-master
Redis Cluster of the local stack, and a Valkey server the tests start (valkey_server.py)."""

from __future__ import annotations

import random
import uuid

import pytest
import redis
from redis.cluster import RedisCluster

from sinks.redis.keys import KeySpace, companion
from sinks.redis.pipeline import Command, ScriptPipeline
from sinks.redis.pipeline import row as row_change
from tests.integration.valkey_server import valkey_url  # noqa: F401 - a fixture

pytestmark = pytest.mark.redis


@pytest.fixture(params=["single", "cluster", "valkey"])
def client(request, redis_url, redis_cluster_url):
    if request.param == "valkey":
        client = redis.Redis.from_url(request.getfixturevalue("valkey_url"))
    else:
        client = redis.Redis.from_url(redis_url) if request.param == "single" else RedisCluster.from_url(redis_cluster_url)
    prefix = f"g{uuid.uuid4().hex[:8]}"
    yield client, prefix
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)
    client.close()


def _row(prefix, key_id):
    row = KeySpace("{prefix}:{schema}.{table}:{key}", prefix).row_key("public", "t", {"id": key_id})
    return row, companion(row)


def test_versions_compare_as_signed_64_bit_integers(client):
    """Lua numbers are doubles: the guard compares decimal strings. Neighbours near 2^63 and
    around zero must order exactly as the integers do."""
    client, prefix = client
    rng = random.Random(5)
    edges = [-(1 << 63), -(1 << 62), -1, 0, 1, (1 << 53), (1 << 53) + 1, (1 << 63) - 2, (1 << 63) - 1]
    pairs = [(a, b) for a in edges for b in edges]
    pairs += [(v, v + rng.choice([-1, 1])) for v in (rng.randrange(-(1 << 62), 1 << 62) for _ in range(300))]
    pipeline = ScriptPipeline(client, "t", pipeline_size=500)
    setup = [Command("applied", (f"{prefix}:applied:{i}",), (str(a),)) for i, (a, _) in enumerate(pairs)]
    assert pipeline.run(setup) == [1] * len(pairs)
    replies = pipeline.run([Command("applied", (f"{prefix}:applied:{i}",), (str(b),))
                            for i, (_, b) in enumerate(pairs)])
    assert replies == [1 if b > a else 0 for a, b in pairs]


def test_no_regression_no_resurrection_and_tombstones_expire(client):
    client, prefix = client
    pipeline = ScriptPipeline(client, "t")
    row, comp = _row(prefix, 1)

    def call(op, version, *payload):
        return pipeline.run([row_change((row, comp), op, str(version), payload)], (0, 60_000))[0]

    assert call("h", 10, "id", "1", "v", "new") == 1
    assert call("h", 9, "id", "1", "v", "old") == 0          # older: ignored
    assert client.hgetall(row) == {b"id": b"1", b"v": b"new"}
    assert call("h", 10, "id", "1", "v", "same version") == 0  # a replay: no-op
    assert call("h", 11, "id", "1") == 1                     # a dropped column disappears
    assert client.hgetall(row) == {b"id": b"1"}
    assert call("d", 12) == 2
    assert not client.exists(row) and client.get(comp) == b"D12" and 0 < client.pttl(comp) <= 60_000
    assert call("h", 11, "id", "1", "v", "late") == 0        # never resurrect
    assert not client.exists(row)
    assert call("s", 13, '{"id":1}') == 1                    # a newer insert comes back
    assert client.get(row) == b'{"id":1}' and client.get(comp) == b"13" and client.pttl(comp) == -1


def test_a_log_tombstone_deletes_whatever_the_version_and_keeps_a_delete(client):
    client, prefix = client
    pipeline = ScriptPipeline(client, "t")
    row, comp = _row(prefix, 2)
    ttls = (0, 60_000)
    pipeline.run([row_change((row, comp), "s", "50", ("v50",))], ttls)
    assert pipeline.run([row_change((row, comp), "t", "0")], ttls) == [2]
    # The live version is forgotten: the records after the tombstone in the log apply again.
    assert not client.exists(row) and not client.exists(comp)
    assert pipeline.run([row_change((row, comp), "s", "50", ("v50",))], ttls) == [1]
    pipeline.run([row_change((row, comp), "d", "60")], ttls)
    assert pipeline.run([row_change((row, comp), "t", "0")], ttls) == [0]  # nothing to do
    assert client.get(comp) == b"D60"


def test_live_ttl_and_invalidate(client):
    client, prefix = client
    pipeline = ScriptPipeline(client, "t")
    row, comp = _row(prefix, 3)
    pipeline.run([row_change((row, comp), "s", "5", ("v",))], (30_000, 60_000))
    assert 0 < client.pttl(row) <= 30_000 and 0 < client.pttl(comp) <= 30_000
    client.set(row, "filled by the application")
    assert pipeline.run([row_change((row, comp), "x", "6")], (0, 60_000)) == [1]
    assert not client.exists(row)
    client.set(row, "filled again")
    assert pipeline.run([row_change((row, comp), "x", "4")], (0, 60_000)) == [0]  # older: kept
    assert client.get(row) == b"filled again"


def test_many_rows_in_grouped_calls_and_pipelines_in_flight_keep_their_order_of_replies(client):
    """A single server groups rows into one script call each (guard.ROWS) and keeps two pipelines
    in flight; a cluster sends one call per row, per master. The replies come back per row, in
    order, either way."""
    client, prefix = client
    pipeline = ScriptPipeline(client, "t", pipeline_size=50, rows_per_call=7)
    ttls = (0, 60_000)
    keys = [_row(prefix, i) for i in range(300)]
    first = [row_change(k, "h", str(100 + i), ("id", str(i))) for i, k in enumerate(keys)]
    assert pipeline.run(first, ttls) == [1] * 300
    # Every third row older (refused), every third deleted, the rest written; one applied call among them.
    second = []
    for i, k in enumerate(keys):
        second.append(row_change(k, "h", str(50), ("id", "old")) if i % 3 == 0 else
                      row_change(k, "d", str(200 + i)) if i % 3 == 1 else
                      row_change(k, "h", str(200 + i), ("id", str(i), "v", "new")))
        if i == 150:
            second.append(Command("applied", (f"{prefix}:applied:src",), ("7",)))
    expected = [0 if i % 3 == 0 else 2 if i % 3 == 1 else 1 for i in range(300)]
    expected.insert(151, 1)
    assert pipeline.run(second, ttls) == expected
    assert client.hgetall(keys[0][0]) == {b"id": b"0"}
    assert not client.exists(keys[1][0]) and client.get(keys[1][1]) == b"D201"
    assert client.hgetall(keys[2][0]) == {b"id": b"2", b"v": b"new"}
