"""Compaction and retention of the embedded log's topics, by Kafka's rules (see ``embedded``): a
pass deduplicates each partition's records written since the last, a chunk per transaction, then
drops the tombstones past their retention; a ``delete`` topic drops records past its retention.
"""

from __future__ import annotations

import sqlite3

from cdc.log.embedded_store import _BITS, _MASK, _now_ms, _Topic, _transaction

_CHUNK = 20_000                 # offsets per compaction transaction (keeps the write lock short)

# The latest record per key among ids [?1, ?2) deletes that key's older records in [?3, latest).
_DELETE_SUPERSEDED = """
WITH latest(key, top) AS (SELECT key, MAX(id) FROM records WHERE id >= ?1 AND id < ?2 GROUP BY key)
DELETE FROM records WHERE id IN (
    SELECT old.id FROM latest JOIN records AS old ON old.key = latest.key
    WHERE old.id >= ?3 AND old.id < latest.top AND old.timestamp_ms <= ?4)
"""
# A tombstone in [?2, ?3) from ?1 or before goes, unless an older record of its key is still there.
_DELETE_TOMBSTONES = """
DELETE FROM records INDEXED BY tombstones
WHERE value IS NULL AND timestamp_ms <= ?1 AND id >= ?2 AND id < ?3 AND NOT EXISTS (
    SELECT 1 FROM records AS old WHERE old.key = records.key AND old.id >= ?2 AND old.id < records.id)
"""


def compact_topic(topic: _Topic, conn: sqlite3.Connection) -> None:
    if topic.cleanup_policy == "delete":
        expire_topic(topic, conn)
    if topic.cleanup_policy != "compact":
        return
    now = _now_ms()
    lag_cutoff = now - topic.min_compaction_lag_ms  # records from then or before may go
    tombstone_cutoff = min(lag_cutoff, now - topic.delete_retention_ms)
    for pid in topic.ids:
        base = pid << _BITS
        more = True
        while more:  # deduplicate the dirty offsets, a chunk per transaction
            with _transaction(conn):
                clean, end = conn.execute("SELECT clean_offset, next_offset FROM partitions "
                                          "WHERE id = ?", (pid,)).fetchone()
                start, stop = base | clean, base | min(end, clean + _CHUNK)
                young = conn.execute("SELECT MIN(id) FROM records WHERE id >= ? AND id < ? "
                                     "AND timestamp_ms > ?", (start, stop, lag_cutoff)).fetchone()[0]
                # Kafka's cleanable range ends at the first record younger than the lag.
                stop = young if young is not None else stop
                if stop > start:
                    conn.execute(_DELETE_SUPERSEDED, (start, stop, base, lag_cutoff))
                    conn.execute("UPDATE partitions SET clean_offset = ? WHERE id = ?",
                                 (stop & _MASK, pid))
                more = young is None and (stop & _MASK) < end
        with _transaction(conn):
            conn.execute(_DELETE_TOMBSTONES, (tombstone_cutoff, base, base + (1 << _BITS)))


def expire_topic(topic: _Topic, conn: sqlite3.Connection) -> None:
    """A ``delete`` topic keeps every record until it is older than its retention."""
    if topic.retention_ms is None:
        return
    cutoff = _now_ms() - topic.retention_ms
    for pid in topic.ids:
        with _transaction(conn):
            conn.execute("DELETE FROM records WHERE id >= ? AND id < ? AND timestamp_ms < ?",
                         (pid << _BITS, (pid + 1) << _BITS, cutoff))
