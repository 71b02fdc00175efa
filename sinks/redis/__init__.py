"""The Redis sink (``type: redis``): topics into Redis keys, single server or Redis Cluster, on
redis-py (Redis 7/8, Valkey). Every write and delete is version-guarded server-side; deletes leave
tombstones; the applied position of each source is published for read-your-writes.

    config.py       RedisSinkConfig
    sink.py         RedisSink: lifecycle, a write, truncates, counters, generations (plugin glue)
    keys.py         row keys from the template, stable primary-key encoding, version companions,
                    generation namespaces, meta keys
    values.py       column choice; hash fields, JSON strings, RedisJSON documents
    guard.py        the Lua scripts: guarded write/delete/tombstone, the applied version
    shapes.py       the live schema contract: the shape each table's keys follow, per schema_policy
    plan.py         a batch -> the newest change per key -> script calls
    pipeline.py     bounded pipelines of EVALSHA calls (rows grouped per call on a single server),
                    retries, NOSCRIPT reloads
    resp.py         script calls packed as RESP, sent per server or per cluster master (MOVED/ASK)
    client.py       connections (URL, password secret, TLS, database, cluster); error codes
    applied.py      why the applied version is a sound read-your-writes signal; the tracker
    publisher.py    the thread that publishes applied versions from stored checkpoints
    generations.py  namespaces per generation, the pointer key, background SCAN/UNLINK drops
    wait.py         for applications: row_key, wait_for, pg_version, mysql_version

See README.md for the key layout, value formats and the read-your-writes recipe.
"""

from sinks.redis.config import RedisSinkConfig
from sinks.redis.wait import (
           WaitTimeout,
           applied_version,
           current_namespace,
           mysql_version,
           pg_version,
           row_key,
           wait_for,
)

__all__ = ["RedisSinkConfig", "WaitTimeout", "applied_version", "current_namespace", "mysql_version",
           "pg_version", "row_key", "wait_for"]
