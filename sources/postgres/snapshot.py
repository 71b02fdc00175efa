"""The consistent initial snapshot of a PostgreSQL source.

1. ``before = pg_current_wal_lsn()``, then the slot is created with an exported snapshot. Every
   change the slot will ever send belongs to a transaction that began after the slot's snapshot
   builder reached its full state, so its LSN is above ``before``; snapshot rows carry ``before``
   as their version and never overwrite a streamed change in a sink.
2. Each reader connection opens a REPEATABLE READ, READ ONLY transaction and imports the exported
   snapshot (all of them before the exporting connection is released), so all readers see the
   database exactly as of the slot's consistent point.
3. Tables are cut into ranges of heap pages (``ctid`` ranges, TID range scans) and read with
   ``COPY (SELECT ...) TO STDOUT``. Where every column of a table has a server-side JSON
   expression (``types/server_json.py``), the server prints each row's JSON and only the key
   columns' text goes through the converters; otherwise every column's text does, the same text
   pgoutput sends. Either way a snapshot row and a streamed row with the same contents give the
   same JSON values, and the same key bytes. Where ``_copyjson.c`` was built, the server only
   prints the plain COPY text of such a table and the reader makes the very lines that statement
   would have printed (``copy_json.py``): the JSON functions were most of the server's work.
4. Streaming starts at the slot's consistent point: no gap, no overlap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import orjson
import psycopg2

from cdc.events import ChangeEvent, Op, RowBlock, SnapshotMarker
from sources.postgres.catalog import TableMeta, quoted_name
from sources.postgres.copy_json import CopyJson, compiled
from sources.postgres.copy_out import copy_blocks
from sources.postgres.errors import DEFAULT_SETTING, connect, wrap
from sources.postgres.toast import FIXED_WIDTH_TYPES, MIN_TOASTABLE_CHARS, ToastStore
from sources.postgres.types import TypeInfo, parse_copy_text_line
from sources.postgres.types.server_json import json_expression

log = logging.getLogger(__name__)

PAGE_BYTES = 8192
ROW_BLOCKS = True  # blocks of plain rows go on as RowBlocks (False: as events; tests and bench compare)


@dataclass(frozen=True, slots=True)
class Chunk:
    table: TableMeta
    first_page: int | None   # None: from the start
    end_page: int | None     # None: to the end

    def where(self, alias: str = "") -> str:
        """The WHERE clause of this range (``alias``: the table's, when the query joins)."""
        ctid = f"{alias}.ctid" if alias else "ctid"
        parts = []
        if self.first_page is not None:
            parts.append(f"{ctid} >= '({self.first_page},0)'::tid")
        if self.end_page is not None:
            parts.append(f"{ctid} < '({self.end_page},0)'::tid")
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


class SnapshotReader:
    """One reader connection inside the exported snapshot."""

    def __init__(self, dsn: str, options: str, snapshot_name: str, application_name: str,
                 setting: str = DEFAULT_SETTING) -> None:
        self.conn = connect(dsn, "opening a snapshot reader", setting=setting, options=options,
                            application_name=application_name)
        try:
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


class OnConnection(Protocol):
    """What ``SnapshotRows`` reads through: a ``SnapshotReader``, or an incremental snapshot's
    connection (incremental.py)."""

    @property
    def conn(self) -> Any: ...


class RowRange(Protocol):
    """The rows ``SnapshotRows`` reads: a ``Chunk``, or an incremental snapshot's keyset range."""

    @property
    def table(self) -> TableMeta: ...

    def where(self, alias: str = "") -> str: ...


class SnapshotRows:
    """Turns COPY rows of a chunk into ``r`` events tagged with the snapshot's version."""

    def __init__(self, version: int, ts_ms: int, converters_for: Callable[[list[int]], list],
                 toast: ToastStore, batch: int, types: Mapping[int, TypeInfo] | None = None,
                 server_json: bool = True, client_json: bool = True) -> None:
        self.types = types or {}
        self.server_json = server_json  # False: always the converters (tests compare the two)
        # False: the server prints the row JSON even where the reader could (copy_json.py)
        self.client_json = client_json
        self.version = version
        self.ts_ms = ts_ms
        self.converters_for = converters_for
        self.toast = toast
        self.batch = batch

    def plan(self, chunk: RowRange) -> ChunkPlan:
        """The COPY statement of ``chunk`` and how its lines become events."""
        table = chunk.table
        names = [c.name for c in table.columns]
        table_id, version, ts_ms = table.id, self.version, self.ts_ms
        key_names = list(table.key)
        key_converters = self.converters_for([table.columns[names.index(k)].type_oid for k in key_names])
        may_be_toasted = [i for i, c in enumerate(table.columns) if c.type_oid not in FIXED_WIDTH_TYPES]
        source = {"txId": None, "lsn": version}
        toastable: list = []
        new, read, marker = tuple.__new__, Op.READ, SnapshotMarker.TRUE
        dumps, fragment = orjson.dumps, orjson.Fragment
        expressions = build_batch = rewrite = block_events = None
        if self.server_json:
            expressions = [json_expression(c.type_oid, self.types, "x." + quote_ident(c.name)) for c in table.columns]
            if None in expressions:
                expressions = None

        if expressions is None:
            # Every column's text through its converter (json, arrays, ranges, hstore ...).
            converters = self.converters_for([c.type_oid for c in table.columns])
            key_index = [names.index(k) for k in key_names]

            def build(line: bytes) -> ChangeEvent:
                values = parse_copy_text_line(line)
                key = {name: convert(values[i]) if values[i] is not None else None
                       for name, convert, i in zip(key_names, key_converters, key_index)}
                after = {name: convert(value) if value is not None else None
                         for name, convert, value in zip(names, converters, values)}
                for i in may_be_toasted:
                    value = values[i]
                    if value is not None and len(value) >= MIN_TOASTABLE_CHARS:
                        toastable.append((dumps(key), names[i], value))
                return new(ChangeEvent, (read, table_id, key, None, after, version, ts_ms, marker, source, None))

            columns = ", ".join(quote_ident(n) for n in names)
            sql = f"COPY (SELECT {columns} FROM {quoted_name(table_id)}" \
                  f"{chunk.where()}) TO STDOUT"
        else:
            # The server prints the row's JSON (see types/server_json.py); per line here: the key
            # columns' text (the key goes through the converters, so its bytes, the record key,
            # are the stream's), the row JSON, and the text of each value long enough to be
            # TOASTed ('' otherwise: COPY writes NULL as \N, and a backslash-free line is split
            # without unescaping).
            nkey = len(key_names)
            toast_names = [names[i] for i in may_be_toasted]
            toast_at = range(nkey + 1, nkey + 1 + len(toast_names))

            single_key = key_names[0] if nkey == 1 else None
            convert_key = key_converters[0]

            def build(line: bytes) -> ChangeEvent:
                values: Sequence[str | None]
                if b"\\" in line:
                    values = parse_copy_text_line(line)
                else:
                    values = line.decode().split("\t")
                if single_key is not None and values[0] is not None:
                    key = {single_key: convert_key(values[0])}
                else:
                    key = {name: convert(value) if value is not None else None
                           for name, convert, value in zip(key_names, key_converters, values)}
                if len(line) >= MIN_TOASTABLE_CHARS:  # else no value in it can be that long
                    for name, at in zip(toast_names, toast_at):
                        value = values[at]
                        if value:
                            toastable.append((dumps(key), name, value))
                row = values[nkey]
                assert row is not None, "row_to_json is never NULL"
                return new(ChangeEvent, (read, table_id, key, None, fragment(row), version, ts_ms,
                                         marker, source, None))

            if single_key is not None:
                def build_batch(lines: list[bytes], joined: bytes) -> list[ChangeEvent] | None:
                    # The common batch in C-level steps: no escapes anywhere in it and no line
                    # long enough to hold a value the TOAST store must keep; else line by line.
                    if b"\\" in joined or max(map(len, lines)) >= MIN_TOASTABLE_CHARS:
                        return None
                    if convert_key is int:
                        return [new(ChangeEvent, (read, table_id, {single_key: int(k)}, None, fragment(j), version,
                                                  ts_ms, marker, source, None))
                                for k, j in (line.split(b"\t", 2)[:2] for line in lines)]
                    return [new(ChangeEvent, (read, table_id, {single_key: convert_key(k.decode())}, None,
                                              fragment(j), version, ts_ms, marker, source, None))
                            for k, j in (line.split(b"\t", 2)[:2] for line in lines)]

                if convert_key is int and (in_c := compiled()) is not None:
                    # build_batch's int case for a whole block, in C (_copyjson.c): the same events.
                    head, tail = (read, table_id), (version, ts_ms, marker, source, None)
                    make = partial(new, ChangeEvent)

                    def materialize(block: bytes) -> list[ChangeEvent] | None:
                        return in_c.int_key_events(block, make, head, single_key, fragment, tail,
                                                        MIN_TOASTABLE_CHARS)

                    def block_events(block: bytes) -> list[ChangeEvent] | RowBlock | None:
                        # The block as it is where its keys' text is orjson's (a RowBlock: the json
                        # format makes its records from the lines, cdc/events.py), else its events.
                        count = in_c.int_key_rows(block, MIN_TOASTABLE_CHARS) if ROW_BLOCKS else None
                        if count is None:
                            return materialize(block)
                        return RowBlock(table_id, single_key, block, count, version, ts_ms, source, materialize)

            keys = ", ".join("x." + quote_ident(k) for k in key_names)
            json_columns = ", ".join(f"{e} AS {quote_ident(n)}" for e, n in zip(expressions, names))
            toast = "".join(
                f", CASE WHEN length(concat(x.{quote_ident(n)})) >= {MIN_TOASTABLE_CHARS} "
                f"THEN concat(x.{quote_ident(n)}) ELSE '' END" for n in toast_names)
            sql = (f"COPY (SELECT {keys}, row_to_json(j){toast} "
                   f"FROM {quoted_name(table_id)} x "
                   f"CROSS JOIN LATERAL (SELECT {json_columns}) j{chunk.where('x')}) TO STDOUT")
            if self.client_json:
                # The same lines, made in the reader from the plain COPY text (copy_json.py).
                rewrite = CopyJson.for_table(f"{table_id.schema}.{table_id.table}",
                                             [(c.name, c.type_oid) for c in table.columns], self.types,
                                             [names.index(k) for k in key_names], may_be_toasted,
                                             MIN_TOASTABLE_CHARS)
                if rewrite is not None:
                    sql = (f"COPY (SELECT {', '.join(quote_ident(n) for n in names)} "
                           f"FROM {quoted_name(table_id)}"
                           f"{chunk.where()}) TO STDOUT")

        return ChunkPlan(sql, build, build_batch,
                         f"{table_id.schema}.{table_id.table}", toastable, expressions is not None, rewrite,
                         block_events)

    def read(self, reader: OnConnection, chunk: RowRange, emit: Callable[[Any], None]) -> None:
        """Read ``chunk`` on this thread: ``emit((events, table, toastable values))`` per batch
        (the events a list or a ``RowBlock``, the table as ``schema.table``, the values the TOAST
        store must keep as (key JSON, column, value))."""
        plan = self.plan(chunk)
        toastable = plan.toastable

        def emit_with_toast(events: list[ChangeEvent] | RowBlock) -> None:
            # The store is the source thread's: hand the values over with the batch.
            batch_toast = list(toastable)
            toastable.clear()
            emit((events, plan.qualified, batch_toast))

        def on_block(block: bytes) -> None:
            emit_with_toast(plan.events(block))

        began = time.monotonic()
        try:
            rows = copy_blocks(reader.conn, plan.sql, self.batch, on_block, plan.rewrite)
        except psycopg2.Error as err:
            raise wrap(err, f"reading {chunk.table.id} for the snapshot") from err
        log.debug("snapshot of %s%s: %d rows in %.1fs (%s)", chunk.table.id, chunk.where(), rows,
                  time.monotonic() - began, "converters" if not plan.server_json
                  else "row JSON made here" if plan.rewrite is not None else "server JSON")


@dataclass(slots=True)
class ChunkPlan:
    """A chunk's COPY statement and its line -> event builders (``build_batch``: a whole batch
    in C-level steps, or None where it does not apply); the builders append the values the TOAST
    store must keep to ``toastable``. ``rewrite``: where the statement is the plain COPY, what
    turns a block of its whole lines into the lines the builders read (``copy_json.CopyJson``).
    ``block_events``: ``build_batch`` for a whole block in C, without splitting it into lines
    first (a single integer key), or None."""

    sql: str
    build: Callable[[bytes], ChangeEvent]
    build_batch: Callable[[list[bytes], bytes], list[ChangeEvent] | None] | None
    qualified: str
    toastable: list
    server_json: bool
    rewrite: CopyJson | None = None
    block_events: Callable[[bytes], list[ChangeEvent] | RowBlock | None] | None = None

    def events(self, block: bytes) -> list[ChangeEvent] | RowBlock:
        """The events of ``block`` (whole COPY lines, each ending in a newline), or the block as a
        ``RowBlock`` where ``block_events`` gives one."""
        if self.block_events is not None and block:
            events = self.block_events(block)
            if events is not None:
                return events
        lines = block.split(b"\n")
        lines.pop()
        events = self.build_batch(lines, block) if self.build_batch is not None else None
        return events if events is not None else list(map(self.build, lines))


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
