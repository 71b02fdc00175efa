"""The snapshot half of the PostgreSQL source: a fresh slot with an exported snapshot, readers
inside it, the chunks to read (``snapshot.py`` reads them).

Snapshot rows carry ``pg_current_wal_lsn()`` taken before the slot was created as their version:
every transaction the snapshot does not see began after the slot's snapshot builder reached its
full point, so its changes have higher LSNs, and a snapshot row never overwrites such a change.

A backfill (tables new to the source) exports its snapshot from a temporary slot instead: the
source's own slot keeps its position and streams from there afterwards; the same argument orders
the backfill's rows against the changes it streams (the tables are in the publication before the
temporary slot is created, so every change they get after the snapshot is sent).

Threading: the source's thread; the readers then run in the snapshot's processes (``snapshot_procs.py``)
or, with ``snapshot_processes: false``, on its threads.
"""

from __future__ import annotations

import time

from cdc.events import Column, SchemaChange, SnapshotEnd
from cdc.positions import PgLsn
from snapshot.coordinator import OpenedSnapshot, close_quietly
from snapshot.processes import ProcessSnapshot
from sources.postgres.catalog import TableMeta
from sources.postgres.config import PostgresConfig
from sources.postgres.lookup import CatalogLookup
from sources.postgres.slot import ReplicationSlot
from sources.postgres.snapshot import SnapshotReader, SnapshotRows, plan_chunks
from sources.postgres.snapshot_procs import OpenReader, copy_lines
from sources.postgres.toast import ToastStore


def open_snapshot(config: PostgresConfig, conn, slot: ReplicationSlot, tables: list[TableMeta],
                  lookup: CatalogLookup, toast: ToastStore, backfill: bool = False) -> OpenedSnapshot:
    if not backfill:
        slot.drop_if_present()
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()")
        before = PgLsn.parse(cur.fetchone()[0])  # below every LSN the new slot will send
    conn.rollback()
    repl, consistent, snapshot_name = slot.create(export=True, temporary=backfill)
    pool, readers = None, []
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
            chunks = plan_chunks(conn, tables, config.snapshot_chunk_pages)
        conn.rollback()
        # No more readers than chunks; a table read in one chunk is not worth starting a process
        # for (a spawned reader takes about a second to start on a busy two-core machine).
        workers = max(1, min(config.reader_count, len(chunks)))
        if config.snapshot_processes and len(chunks) > 1:
            pool = ProcessSnapshot(OpenReader(slot.dsn, slot.options, snapshot_name, slot.app_name, slot.setting),
                                   copy_lines, workers, name=f"{config.name}-snapshot",
                                   ready_timeout=config.server_timeout)
        else:
            readers = [SnapshotReader(slot.dsn, slot.options, snapshot_name, slot.app_name, slot.setting)
                       for _ in range(workers)]
    except BaseException:
        close_quietly(pool)
        for reader in readers:
            reader.close()
        raise
    finally:
        repl.close()  # every reader has imported the snapshot: the exporter may go
    # Converters are made here, on this thread, before the readers need them.
    lookup.converters_for([c.type_oid for t in tables for c in t.columns])
    now = int(time.time() * 1000)
    rows = SnapshotRows(before.lsn, now, lookup.converters_for, toast,
                        batch=min(config.max_batch_events, 2048), types=lookup.types)

    def remember(qualified: str, toastable: list) -> None:
        for key_json, column, value in toastable:
            toast.remember(qualified, key_json, column, value)
        toast.flush()

    def accept(item) -> list:
        """A reader thread's (events, table, toastable values): the values are remembered first."""
        events, qualified, toastable = item
        remember(qualified, toastable)
        return events

    if pool is not None:
        plans = [rows.plan(chunk) for chunk in chunks]
        block = rows.batch

        def accept(item) -> list:  # noqa: F811 - the processes' items instead
            """A reader process's (chunk index, block of COPY lines), made into events here."""
            index, lines = item
            plan = plans[index]
            events = plan.events(lines)
            if plan.toastable:
                remember(plan.qualified, list(plan.toastable))
                plan.toastable.clear()
            return events

        pool.submit([(i, str(chunk.table.id), plan.sql, block, plan.rewrite)
                     for i, (chunk, plan) in enumerate(zip(chunks, plans))])

    # Each table's shape goes out with the first snapshot batch: a sink that types its columns
    # from the schema records (the Delta sink) must not wait for a table's first streamed change.
    shapes = tuple(SchemaChange(t.id, tuple(Column(c.name, c.type_name, c.name in t.key) for c in t.columns),
                                before.lsn, now) for t in tables)
    return OpenedSnapshot(readers, chunks, rows.read, consistent, shapes,
                          SnapshotEnd(tuple(t.id for t in tables), before.lsn), accept=accept, pool=pool,
                          described="processes" if pool is not None else "threads")
