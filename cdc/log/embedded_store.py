"""The embedded log's SQLite layout (tables, record ids) and the primitives its connections share:
transactions, errors, topics as read from the ``topics`` table. See ``embedded`` for the design.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cdc.errors import LogUnavailableError
from cdc.headers import Headers
from cdc.log.packed_headers import pack

_BITS = 40                      # offset bits of a record id: 10^12 records per partition
_MASK = (1 << _BITS) - 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, cleanup_policy TEXT NOT NULL,
    min_compaction_lag_ms INTEGER NOT NULL, delete_retention_ms INTEGER NOT NULL, retention_ms INTEGER);
CREATE TABLE IF NOT EXISTS partitions (
    id INTEGER PRIMARY KEY, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL DEFAULT 0, clean_offset INTEGER NOT NULL DEFAULT 0,
    UNIQUE (topic, partition));
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY, key BLOB, value BLOB, timestamp_ms INTEGER NOT NULL, headers BLOB);
DROP INDEX IF EXISTS records_by_key;
CREATE TABLE IF NOT EXISTS latest (
    pid INTEGER NOT NULL, key BLOB NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (pid, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tombstones ON records (timestamp_ms) WHERE value IS NULL;
CREATE TABLE IF NOT EXISTS group_offsets (
    grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition)) WITHOUT ROWID;
"""
# A new log's page size: appends and range reads touch fewer pages, and a commit writes fewer of
# them to the WAL (bench.publish's embedded path: +40% over SQLite's 4 KiB). Only a new file takes it.
PAGE_SIZE = 32768
# Made after the migration below, so that a database from before headers gets them in its view too.
_VIEW = f"""
CREATE VIEW IF NOT EXISTS log AS
    SELECT p.topic, p.partition, r.id & {_MASK} AS offset, r.key, r.value, r.timestamp_ms, r.headers
    FROM records AS r JOIN partitions AS p ON p.id = r.id >> {_BITS}
"""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _packer():
    """``pack`` for one publish: a delete and its tombstone share their headers' list, packed once."""
    last: list = [None, None]

    def packed(headers: Headers | None) -> bytes | None:
        if headers is None:
            return None
        if headers is not last[0]:
            last[0], last[1] = headers, pack(headers)
        return last[1]
    return packed


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextmanager
def _unavailable(what: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as err:  # locked past busy_timeout, I/O error, disk full
        raise LogUnavailableError(f"embedded log: {what}: {err}") from err


@dataclass(frozen=True, slots=True)
class _Topic:
    name: str
    cleanup_policy: str
    min_compaction_lag_ms: int
    delete_retention_ms: int
    retention_ms: int | None  # "delete" policy: records older than this go (None: never)
    ids: tuple[int, ...]  # partition number -> partition id
