"""The Redis sink and a replayed tombstone alone in its batch: a row deleted and inserted again
with the same key comes back (the tombstone forgets the live version it removes, so the replayed
insert applies again); it needs no ``SinkContext.delete_read`` (see docs/architecture.md)."""

from __future__ import annotations

import uuid

import pytest
import redis

from cdc.api import Op, SinkEvent
from sinks.redis import row_key
from sinks.redis.config import RedisSinkConfig
from sinks.redis.sink import RedisSink

pytestmark = pytest.mark.redis


def _event(offset: int, op: Op | None, version: int | None) -> SinkEvent:
    source = {} if op is None else {"schema": "public", "table": "accounts", "name": "pg", "version": version}
    after = None if op in (None, Op.DELETE) else {"id": 7, "name": f"v{version}"}
    return SinkEvent("shop.public.accounts", 0, offset, {"id": 7}, op, None, after, version, source)


def test_a_replayed_tombstone_alone_leaves_the_row_inserted_after_it(redis_url):
    prefix = f"s{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    sink = RedisSink(RedisSinkConfig(name="cache", url=redis_url, topics=["shop.*"], key_prefix=prefix,
                                     format="json"))
    sink.start()
    try:
        history = [_event(0, Op.CREATE, 3), _event(1, Op.DELETE, 5), _event(2, None, None), _event(3, Op.CREATE, 7)]
        key = row_key(client, prefix, "public", "accounts", {"id": 7})
        sink.write(history)  # the run that was killed before committing past offset 1
        assert b"v7" in client.get(key)
        for event in history[1:]:  # the replay, one record per batch
            sink.write([event])
        assert b"v7" in client.get(key)
    finally:
        sink.stop()
        for name in client.scan_iter(match=f"{prefix}*"):
            client.delete(name)
        client.close()


def test_a_replayed_tombstone_with_its_deletes_version_leaves_the_row_in_place(redis_url):
    """The tombstone's delete compacted away, the key inserted again; the replay meets the
    tombstone alone. With its delete's version (its header) it is a guarded delete at 5, older
    than the row: the row is never gone, not even until the insert's replay."""
    prefix = f"s{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    sink = RedisSink(RedisSinkConfig(name="cache", url=redis_url, topics=["shop.*"], key_prefix=prefix,
                                     format="json"))
    sink.start()
    try:
        history = [_event(0, Op.CREATE, 3), _event(1, None, 5), _event(2, Op.CREATE, 7)]
        key = row_key(client, prefix, "public", "accounts", {"id": 7})
        sink.write(history)
        assert b"v7" in client.get(key)
        sink.write([history[1]])
        assert b"v7" in client.get(key)
        sink.write([_event(3, None, 9)])  # a newer one still deletes it
        assert client.get(key) is None
    finally:
        sink.stop()
        for name in client.scan_iter(match=f"{prefix}*"):
            client.delete(name)
        client.close()
