"""For applications: find a row's key through the generation pointer, and wait for your own write.

    import redis, psycopg2
    from sinks.redis import wait_for, pg_version

    with pg.cursor() as cur:                       # your transaction, committed
        cur.execute("UPDATE accounts SET balance = 10 WHERE id = 7")
    pg.commit()
    with pg.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        position = pg_version(cur.fetchone()[0])  # at or after your commit
    wait_for(cache, "shop", "shop_pg", position, timeout=5)   # prefix, source name
    cache.hgetall(row_key(cache, "shop", "public", "accounts", {"id": 7}))

MySQL/MariaDB: after the commit, ``SHOW MASTER STATUS`` (``SHOW BINARY LOG STATUS`` on MySQL 8.4)
gives (file, position); ``mysql_version(file, position)`` encodes it as the source encodes
versions. See applied.py for why the applied version is a sound signal.
"""

from __future__ import annotations

import time
from typing import Any

from sinks.redis.config import DEFAULT_KEY_TEMPLATE
from sinks.redis.keys import KeySpace, applied_key, generation_pointer, namespace

MYSQL_FILE_SHIFT = 32  # the MySQL source's version: (binlog file index << 32) | position


class WaitTimeout(TimeoutError):
    """The sink did not apply the position in time (it may be stopped or behind)."""


def pg_version(lsn_text: str) -> int:
    """PostgreSQL's ``X/Y`` LSN as the source's version (the 64-bit WAL position)."""
    high, sep, low = lsn_text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {lsn_text!r}")
    return (int(high, 16) << 32) | int(low, 16)


def mysql_version(binlog_file: str, position: int) -> int:
    """A binlog (file, position) as the MySQL source's version."""
    index = int(binlog_file.rsplit(".", 1)[1])
    return (index << MYSQL_FILE_SHIFT) | position


def current_namespace(client, prefix: str) -> str:
    """The key namespace readers should use now (follows ``cdc rebuild``'s switch)."""
    pointer = client.get(generation_pointer(prefix))
    return namespace(prefix, int(pointer) if pointer is not None else 1)


def row_key(client, prefix: str, schema: str, table: str, key: dict[str, Any],
            template: str = DEFAULT_KEY_TEMPLATE) -> str:
    """The key of one row in the current generation."""
    return KeySpace(template, current_namespace(client, prefix)).row_key(schema, table, key)


def applied_version(client, prefix: str, source: str) -> int | None:
    stored = client.get(applied_key(current_namespace(client, prefix), source))
    return None if stored is None else int(stored)


def wait_for(client, prefix: str, source: str, version: int, timeout: float = 10.0,
             poll_interval: float = 0.005) -> int:
    """Block until the sink has applied every change of ``source`` up to ``version``; returns the
    applied version. Raises ``WaitTimeout`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    interval = poll_interval
    while True:
        applied = applied_version(client, prefix, source)
        if applied is not None and applied >= version:
            return applied
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"source {source}: version {version} not applied within {timeout}s "
                              f"(applied: {applied})")
        time.sleep(interval)
        interval = min(interval * 2, 0.1)
