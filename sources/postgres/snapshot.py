"""The consistent initial snapshot of a PostgreSQL source.

1. ``before = pg_current_wal_lsn()``, then the slot is created with an exported snapshot. Every
   change the slot will ever send belongs to a transaction that began after the slot's snapshot
   builder reached its full state, so its LSN is above ``before``; snapshot rows carry ``before``
   as their version and never overwrite a streamed change in a sink.
2. Each reader connection opens a REPEATABLE READ, READ ONLY transaction and imports the exported
   snapshot (all of them before the exporting connection is released), so all readers see the
   database exactly as of the slot's consistent point.
3. Tables are cut into ranges of heap pages (``ctid`` ranges, TID range scans) and read with
   ``COPY (SELECT ...) TO STDOUT``: the same text output as pgoutput, through the same converters,
   so a snapshot row and a streamed row with the same contents give the same JSON.
4. Streaming starts at the slot's consistent point: no gap, no overlap.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson
import psycopg2

from cdc.events import ChangeEvent, Op, SnapshotMarker
from sources.postgres.catalog import TableMeta
from sources.postgres.errors import wrap
from sources.postgres.toast import FIXED_WIDTH_TYPES, MIN_TOASTABLE_CHARS, ToastStore
from sources.postgres.types import parse_copy_text_line

log = logging.getLogger(__name__)

PAGE_BYTES = 8192


@dataclass(frozen=True, slots=True)
class Chunk:
    table: TableMeta
    first_page: int | None   # None: from the start
    end_page: int | None     # None: to the end

    def where(self) -> str:
        parts = []
        if self.first_page is not None:
            parts.append(f"ctid >= '({self.first_page},0)'::tid")
        if self.end_page is not None:
            parts.append(f"ctid < '({self.end_page},0)'::tid")
        return (" WHERE " + " AND ".join(parts)) if parts else ""


def plan_chunks(conn, tables: list[TableMeta], pages_per_chunk: int) -> list[Chunk]:
    """Page ranges per table, largest tables first (so the long ones start early)."""
    sizes = {}
    with conn.cursor() as cur:
        for table in tables:
            cur.execute("SELECT pg_relation_size(%s) / %s", (table.oid, PAGE_BYTES))
            sizes[table.oid] = cur.fetchone()[0]
    chunks: list[Chunk] = []
    for table in sorted(tables, key=lambda t: -sizes[t.oid]):
        pages = sizes[table.oid]
        if pages <= pages_per_chunk:
            chunks.append(Chunk(table, None, None))
            continue
        starts = list(range(0, pages, pages_per_chunk))
        for i, start in enumerate(starts):
            last = i == len(starts) - 1
            chunks.append(Chunk(table, start if i else None, None if last else start + pages_per_chunk))
    return chunks


class _CopySink:
    """A file-like object for ``copy_expert``: splits COPY text into rows, rows into events."""

    def __init__(self, build: Callable[[list], ChangeEvent], emit: Callable[[list], None], batch: int) -> None:
        self.build = build
        self.emit = emit
        self.batch_size = batch
        self.rest = b""
        self.events: list[ChangeEvent] = []
        self.rows = 0

    def write(self, data: bytes) -> int:
        if self.rest:
            data = self.rest + data
        lines = data.split(b"\n")
        self.rest = lines.pop()
        build, events = self.build, self.events
        for line in lines:
            events.append(build(parse_copy_text_line(line)))
        self.rows += len(lines)
        if len(events) >= self.batch_size:
            self.emit(events)
            self.events = []
        return len(data)

    def close(self) -> None:
        if self.rest:
            raise ValueError("COPY output ended in the middle of a row")
        if self.events:
            self.emit(self.events)
            self.events = []


class SnapshotReader:
    """One reader connection inside the exported snapshot."""

    def __init__(self, dsn: str, options: str, snapshot_name: str, application_name: str) -> None:
        try:
            self.conn = psycopg2.connect(dsn, options=options, application_name=application_name)
            with self.conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
        except psycopg2.Error as err:
            raise wrap(err, "opening a snapshot reader") from err

    def close(self) -> None:
        try:
            self.conn.rollback()
            self.conn.close()
        except psycopg2.Error:
            pass


class SnapshotRows:
    """Turns COPY rows of a chunk into ``r`` events tagged with the snapshot's version."""

    def __init__(self, version: int, ts_ms: int, converters_for: Callable[[list[int]], list],
                 toast: ToastStore, batch: int) -> None:
        self.version = version
        self.ts_ms = ts_ms
        self.converters_for = converters_for
        self.toast = toast
        self.batch = batch

    def read(self, reader: SnapshotReader, chunk: Chunk, emit: Callable[[list], None]) -> None:
        table = chunk.table
        names = [c.name for c in table.columns]
        converters = self.converters_for([c.type_oid for c in table.columns])
        key_index = [names.index(k) for k in table.key]
        key_names = list(table.key)
        table_id, version, ts_ms = table.id, self.version, self.ts_ms
        qualified = f"{table_id.schema}.{table_id.table}"
        source = {"txId": None, "lsn": version}
        toastable = []
        may_be_toasted = [i for i, c in enumerate(table.columns) if c.type_oid not in FIXED_WIDTH_TYPES]
        new, read, marker = tuple.__new__, Op.READ, SnapshotMarker.TRUE

        def build(values: list[Any]) -> ChangeEvent:
            key = {name: converters[i](values[i]) if values[i] is not None else None
                   for name, i in zip(key_names, key_index)}
            after = {name: convert(value) if value is not None else None
                     for name, convert, value in zip(names, converters, values)}
            for i in may_be_toasted:
                value = values[i]
                if value is not None and len(value) >= MIN_TOASTABLE_CHARS:
                    toastable.append((orjson.dumps(key), names[i], value))
            return new(ChangeEvent, (read, table_id, key, None, after, version, ts_ms, marker, source, None))

        def emit_with_toast(events: list) -> None:
            # The store is the source thread's: hand the values over with the batch.
            batch_toast = list(toastable)
            toastable.clear()
            emit((events, qualified, batch_toast))

        columns = ", ".join(f'"{n}"' for n in names)
        sql = f'COPY (SELECT {columns} FROM "{table_id.schema}"."{table_id.table}"{chunk.where()}) TO STDOUT'
        sink = _CopySink(build, emit_with_toast, self.batch)
        began = time.monotonic()
        try:
            with reader.conn.cursor() as cur:
                cur.copy_expert(sql, sink, size=1 << 20)
        except psycopg2.Error as err:
            raise wrap(err, f"reading {table_id} for the snapshot") from err
        sink.close()
        log.debug("snapshot of %s%s: %d rows in %.1fs", table_id, chunk.where(), sink.rows,
                  time.monotonic() - began)
