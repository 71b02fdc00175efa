"""Type 1 (latest row per key) writes: one MERGE per table and micro-batch, version-guarded.

The MERGE source holds one row per key (``parse.latest_per_key``): its newest record in the batch.
Against the table (``t``) and with ``s`` the source row:

    matched, s is a delete and s.version > t.version (or s is a tombstone)  -> delete
                                                      (soft: keep the row, __cdc_deleted = true)
    matched, s is an upsert and s.version > t.version                      -> update every column
    not matched, s is an upsert                                            -> insert
    not matched, s is a delete (soft only)                                 -> insert a deleted marker

so a replayed or late record never regresses a row. Hard deletes are remembered in a side table
(key, version, when): before the MERGE, an upsert no newer than a remembered delete is dropped,
so a late insert cannot bring a deleted key back; entries older than ``delete_retention_hours``
are purged. The side table is appended to (a key may be there more than once; the newest
version counts): an append costs a fraction of a second MERGE per batch. A soft-deleted row is
its own memory (its ``__cdc_version`` is the delete's).

A truncate at version V removes (soft: marks) every row older than V, forgets remembered deletes
older than V, and records V in the table as a watermark: records older than V are dropped before
any later MERGE.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_sinks.parse import DELETED, KEY, OP, TS, VERSION
from spark_sinks.tables import DELETED_AT, TRUNCATED_PROPERTY, TableTarget, in_source, in_target, quote


def without_remembered_deletes(session: SparkSession, target: TableTarget, latest: DataFrame) -> DataFrame:
    """``latest`` (``parse.latest_per_key``) without the upserts that a remembered delete of the
    same key outranks."""
    if not target.deletes_exist(session):
        return latest
    memory = target.frame(session, deletes=True).groupBy(KEY).agg(F.max(VERSION).alias("__remembered"))
    joined = latest.join(memory, KEY, "left")
    keep = F.col("__remembered").isNull() | (F.col("op") == "d") | (F.col("version") > F.col("__remembered"))
    return joined.where(keep).drop("__remembered")


def merge(session: SparkSession, target: TableTarget, source: DataFrame, data_columns: list[str],
          soft_delete: bool, insert_only: bool = False) -> None:
    """MERGE ``source`` (data columns, __cdc_key, __cdc_version, __cdc_op, __cdc_ts_ms; one row
    per key) into ``target``.

    ``insert_only``: the table holds no row (the job created it and has not written it yet), so
    no clause can match and only the insert clauses are given: Delta's insert-only MERGE reads
    the source and writes its rows, without finding matched files or writing deletion vectors.
    The rows written are the same as the full MERGE's."""
    is_delete, upsert = f"{in_source(OP)} = 'd'", f"{in_source(OP)} <> 'd'"
    newer = f"{in_source(VERSION)} > {in_target(VERSION)}"
    row = {quote(c): in_source(c) for c in (*data_columns, KEY, VERSION, OP, TS)}
    builder = target.merge_into(session, source, f"{in_target(KEY)} = {in_source(KEY)}")
    if soft_delete:
        if not insert_only:
            # A tombstone (no version) marks a live row deleted; a versioned delete also bumps the
            # remembered version of a row already deleted.
            builder = builder.whenMatchedUpdate(
                condition=f"{is_delete} AND (({in_source(VERSION)} IS NULL AND NOT {in_target(DELETED)}) OR {newer})",
                set={quote(DELETED): "true", quote(OP): "'d'",
                     quote(VERSION): f"coalesce({in_source(VERSION)}, {in_target(VERSION)})",
                     quote(TS): f"coalesce({in_source(TS)}, {in_target(TS)})"})
            builder = builder.whenMatchedUpdate(condition=f"{upsert} AND {newer}",
                                                set={**row, quote(DELETED): "false"})
        builder = builder.whenNotMatchedInsert(condition=upsert, values={**row, quote(DELETED): "false"})
        builder = builder.whenNotMatchedInsert(condition=f"{is_delete} AND {in_source(VERSION)} IS NOT NULL",
                                               values={**row, quote(DELETED): "true"})
    else:
        if not insert_only:
            builder = builder.whenMatchedDelete(condition=f"{is_delete} AND ({in_source(VERSION)} IS NULL OR {newer})")
            builder = builder.whenMatchedUpdate(condition=f"{upsert} AND {newer}", set=row)
        builder = builder.whenNotMatchedInsert(condition=upsert, values=row)
    builder.execute()


def remember_deletes(session: SparkSession, target: TableTarget, latest: DataFrame,
                     options: dict[str, str] | None = None) -> None:
    """Append the versioned deletes of ``latest`` to the side table: an append is a fraction of
    a MERGE's cost, and readers of the memory take the newest version per key. ``options``: the
    writer's (Delta: its transaction id and commit metadata, given per write so that the append
    can run beside another write of the session)."""
    deletes = (latest.where((F.col(OP) == "d") & F.col(VERSION).isNotNull())
               .select(KEY, VERSION, F.current_timestamp().alias(DELETED_AT)))
    # One file per batch, not one per partition of the source: a batch's deletes are few, and
    # every later batch reads the whole memory (its files listed, opened and joined).
    target.append_deletes(deletes.coalesce(1), options or {})
    target.deletes_written()


def purge_deletes(session: SparkSession, target: TableTarget, retention_hours: float) -> None:
    if target.deletes_exist(session):
        target.delete(session, f"{quote(DELETED_AT)} < current_timestamp() - "
                               f"INTERVAL {int(retention_hours * 3600)} SECONDS", deletes=True)


def truncate(session: SparkSession, target: TableTarget, version: int, soft_delete: bool) -> None:
    """Everything older than ``version`` goes; ``version`` becomes the table's watermark.

    The watermark is recorded first: if the job dies in between, the replayed batch truncates
    again (both steps are idempotent), and nothing older slipped in meanwhile."""
    current = target.truncated_at(session)
    if current is None or version > current:
        target.set_properties(session, {TRUNCATED_PROPERTY: str(version)})
    older = f"{quote(VERSION)} < {int(version)}"
    if soft_delete:
        target.update(session, f"{older} AND NOT {quote(DELETED)}", {DELETED: "true", OP: "'t'"})
    else:
        target.delete(session, older)
    if target.deletes_exist(session):
        target.delete(session, older, deletes=True)


def beside(work: Callable[[], None]) -> Callable[[], BaseException | None]:
    """Start ``work`` on a thread of its own; the function returned waits for it to end and
    returns what it raised, if anything."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            failed.append(err)

    thread = threading.Thread(target=run, name="cdc-delta-beside", daemon=True)
    thread.start()

    def wait() -> BaseException | None:
        thread.join()
        return failed[0] if failed else None
    return wait
