"""Compaction and retention of the embedded log's topics, by Kafka's rules (see ``embedded``): a
pass deduplicates each partition's records written since the last, a chunk per transaction,
against each other and against the clean section's ``latest`` record of their keys, then drops the
clean section's tombstones past their retention; a ``delete`` topic drops records past its
retention.
"""

from __future__ import annotations

import sqlite3
import time

from cdc.log.embedded_store import _BITS, _MASK, _now_ms, _Topic, _transaction

_CHUNK = 20_000                 # offsets per compaction transaction (keeps the write lock short)

# The newest record of each key among ids [?1, ?2), into a temporary table (ordered by key).
_CHUNK_LATEST = """
INSERT INTO temp.chunk_latest SELECT key, MAX(id) FROM records
WHERE id >= ?1 AND id < ?2 AND key IS NOT NULL GROUP BY key
"""
# Those keys' records in the clean section of partition ?1 (one each, which ``latest`` names) go,
# if the record there still has that key (``latest`` is a table of its own: belt and braces).
# CROSS JOIN keeps the chunk's keys the outer loop: otherwise SQLite walks the partition's whole
# ``latest`` and looks each up in the chunk.
_DELETE_SUPERSEDED_CLEAN = """
DELETE FROM records WHERE id IN (
    SELECT l.id FROM temp.chunk_latest AS c CROSS JOIN latest AS l ON l.pid = ?1 AND l.key = c.key
    CROSS JOIN records AS r ON r.id = l.id AND r.key = c.key)
"""
# In the chunk [?1, ?2), every keyed record but its key's newest goes.
_DELETE_SUPERSEDED_CHUNK = """
DELETE FROM records WHERE id >= ?1 AND id < ?2 AND key IS NOT NULL
    AND id NOT IN (SELECT top FROM temp.chunk_latest)
"""
# The chunk's newest records become their keys' clean ones, in key order.
_MOVE_LATEST = """
INSERT INTO latest (pid, key, id) SELECT ?1, key, top FROM temp.chunk_latest WHERE true
ON CONFLICT (pid, key) DO UPDATE SET id = excluded.id
"""
# A tombstone of the clean section [?2, ?3) from ?1 or before goes, and its key leaves ``latest``
# (``_drop_tombstones``): being in the clean section, it is the only record of its key there.
_TOMBSTONES = """
SELECT id, key FROM records INDEXED BY tombstones
WHERE value IS NULL AND timestamp_ms <= ?1 AND id >= ?2 AND id < ?3
"""


def _deduplicate(conn: sqlite3.Connection, pid: int, start: int, stop: int) -> None:
    """Records [start, stop) of partition ``pid`` (ids) against each other and the clean section."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS chunk_latest (key BLOB PRIMARY KEY, top INTEGER NOT NULL) "
                 "WITHOUT ROWID")
    conn.execute("DELETE FROM temp.chunk_latest")
    conn.execute(_CHUNK_LATEST, (start, stop))
    conn.execute(_DELETE_SUPERSEDED_CLEAN, (pid,))
    conn.execute(_DELETE_SUPERSEDED_CHUNK, (start, stop))
    conn.execute(_MOVE_LATEST, (pid,))


def _drop_tombstones(conn: sqlite3.Connection, pid: int, cutoff: int) -> None:
    base = pid << _BITS
    row = conn.execute("SELECT clean_offset FROM partitions WHERE id = ?", (pid,)).fetchone()
    if row is None:  # the topic was deleted meanwhile
        return
    clean, = row
    gone = conn.execute(_TOMBSTONES, (cutoff, base, base | clean)).fetchall()
    if gone:
        conn.executemany("DELETE FROM latest WHERE pid = ? AND key = ? AND id = ?", [(pid, k, i) for i, k in gone])
        conn.executemany("DELETE FROM records WHERE id = ?", [(i,) for i, _ in gone])


def compact_topic(topic: _Topic, conn: sqlite3.Connection, deadline: float | None = None, turn: int = 0) -> bool:
    """One pass over ``topic``'s partitions, from partition ``turn`` on (modulo their number).
    With a ``deadline`` (``time.monotonic()``) it starts no chunk after it, having done at least one:
    a writer's pass stalls its publishes for a bounded time, and the rest waits for the next pass.
    True when the pass went through every partition."""
    if topic.cleanup_policy == "delete":
        expire_topic(topic, conn)
    if topic.cleanup_policy != "compact":
        return True
    now = _now_ms()
    lag_cutoff = now - topic.min_compaction_lag_ms  # records from then or before may go
    tombstone_cutoff = min(lag_cutoff, now - topic.delete_retention_ms)
    first = turn % len(topic.ids) if topic.ids else 0
    for pid in topic.ids[first:] + topic.ids[:first]:
        base = pid << _BITS
        more = True
        while more:  # deduplicate the dirty offsets, a chunk per transaction
            with _transaction(conn):
                row = conn.execute("SELECT clean_offset, next_offset FROM partitions WHERE id = ?",
                                   (pid,)).fetchone()
                if row is None:  # the topic was deleted meanwhile (by another process)
                    return True
                clean, end = row
                start, stop = base | clean, base | min(end, clean + _CHUNK)
                young = conn.execute("SELECT MIN(id) FROM records WHERE id >= ? AND id < ? "
                                     "AND timestamp_ms > ?", (start, stop, lag_cutoff)).fetchone()[0]
                # Kafka's cleanable range ends at the first record younger than the lag.
                stop = young if young is not None else stop
                if stop > start:
                    _deduplicate(conn, pid, start, stop)
                    conn.execute("UPDATE partitions SET clean_offset = ? WHERE id = ?",
                                 (stop & _MASK, pid))
                more = young is None and (stop & _MASK) < end
            if more and deadline is not None and time.monotonic() >= deadline:
                return False
        with _transaction(conn):
            _drop_tombstones(conn, pid, tombstone_cutoff)
    return True


def expire_topic(topic: _Topic, conn: sqlite3.Connection) -> None:
    """A ``delete`` topic keeps every record until it is older than its retention."""
    if topic.retention_ms is None:
        return
    cutoff = _now_ms() - topic.retention_ms
    for pid in topic.ids:
        with _transaction(conn):
            conn.execute("DELETE FROM records WHERE id >= ? AND id < ? AND timestamp_ms < ?",
                         (pid << _BITS, (pid + 1) << _BITS, cutoff))
