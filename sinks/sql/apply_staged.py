"""Applying table plans on PostgreSQL and DuckDB: stage the batch once, then set-based statements.

Why this shape: the hot path has to move tens of thousands of rows a second on a small machine,
and per-value work in Python is what limits it (DuckDB also runs executemany a row at a time, at
a few hundred rows a second). So Python converts no value at all: each action goes into the
temporary table ``cdc_stage`` as (table index, key JSON, version, op, row JSON), the row being
the event's ``after`` as orjson dumps it, and the database converts while it upserts::

    INSERT INTO t AS x (cols, __cdc_version)
    SELECT CAST(s.j->>'c' AS <type>), ..., s.v FROM cdc_stage s
     WHERE s.t = <table> AND s.op = 'u'
       AND NOT EXISTS (SELECT 1 FROM cdc_sink_deletes d          -- only if the table has any
                        WHERE d.tbl = <tbl> AND d.key_json = s.k AND d.version >= s.v)
    ON CONFLICT (pk) DO UPDATE SET c = excluded.c, ... WHERE x.__cdc_version < excluded.__cdc_version

Staging: PostgreSQL gets one COPY in CSV with delimiter 0x02 and quote 0x01, bytes that JSON text
never contains raw (orjson escapes control characters), so nothing needs escaping; the stage is
``ON COMMIT DELETE ROWS``. PostgreSQL's upserts, the bulk of most batches, are staged typed
instead (``copy_rows``): one COPY per table into a temporary table with the target's column
types, and the upsert above selects the columns as they are (``decode`` for binary). DuckDB gets the whole batch as one JSON parameter, unnested by
``from_json`` (binding one value is cheap; binding thousands is not).

Both databases' input functions read the contract's forms directly: ISO timestamps with ``Z``,
``infinity``, ``NaN`` floats (and numerics, PostgreSQL only); base64 goes through
``decode(.., 'base64')`` / ``from_base64``, and json/jsonb/arrays stay JSON (a JSON null becomes
SQL NULL). A value that does not fit fails the statement without naming the row; the sink then
probes a single-row batch column by column (``SqlSink._diagnose``).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy.engine import Connection

import sinks.sql.copy_rows as copy_rows
from cdc.api import NativeCodecs, SinkEvent
from sinks.sql.bookkeeping import DELETES, Bookkeeping
from sinks.sql.errors import DRIVER_ERRORS
from sinks.sql.plan import DELETED, VERSION, ColumnPlan, PlanFailed, TablePlan, key_values
from sinks.sql.reduce import version_of
from sinks.sql.target import Target
from sinks.sql.types import Family

STAGE = "cdc_stage"
UPSERT, DELETE, TOMBSTONE = "u", "d", "x"
_PG_STAGE = (f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGE} "
             f"(t integer, k text, v bigint, op \"char\", j jsonb) ON COMMIT DELETE ROWS")
_PG_COPY = f"COPY {STAGE} (t, k, v, op, j) FROM STDIN WITH (FORMAT csv, DELIMITER E'\\x02', QUOTE E'\\x01')"
_DUCKDB_STAGE = f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGE} (t INTEGER, k VARCHAR, v BIGINT, op VARCHAR, j JSON)"
_DUCKDB_FILL = (f"INSERT INTO {STAGE} SELECT * FROM (SELECT unnest(from_json(?::JSON, "
                f"'[{{\"t\":\"INTEGER\",\"k\":\"VARCHAR\",\"v\":\"BIGINT\",\"op\":\"VARCHAR\",\"j\":\"JSON\"}}]'), "
                f"recursive := true))")


def driver_cursor(conn: Connection) -> Any:
    """A cursor of the driver's own under ``conn`` (psycopg2: a context manager with
    ``copy_expert``, which SQLAlchemy's DBAPI protocol does not describe)."""
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None, "a connection in use holds its DBAPI connection (None only once closed)"
    return dbapi.cursor()


class StagedApplier:
    def __init__(self, target: Target, bookkeeping: Bookkeeping, soft_delete: bool,
                 native: NativeCodecs | None = None) -> None:
        self.target = target
        self.copy_rows = native.copy_rows if native is not None else None  # rows as JSON bytes, in C
        self.books = bookkeeping
        self.soft_delete = soft_delete
        self.pg = target.kind == "postgresql"
        # PostgreSQL's upserts staged typed (copy_rows); False stages them as jsonb like DuckDB's,
        # which bench/sql_upsert.py runs beside it for a same-run comparison.
        self.typed_upserts = self.pg
        # True: the remembered-delete check as a per-row probe of the deletes' key (OFFSET 0 keeps
        # PostgreSQL from pulling it up into an anti-join). Off: the planner's hash anti-join reads
        # every remembered delete of the table at every batch, yet it took less server CPU in
        # bench/bootstrap.py (--probed-deletes) at 37k remembered deletes and batches of 10k;
        # in a statement-level test probing won only at about 300k remembered deletes.
        self.probe_deletes = False
        self._sql: dict[tuple, str] = {}
        self._formatters: dict[tuple, Callable[[Iterable[tuple[bytes, SinkEvent]]], bytes]] = {}

    # --- statements on the caller's connection ---------------------------------------------------

    def _run(self, conn: Connection, sql: str, params: tuple = ()) -> Any:
        """Run one statement; its first row, if it returns rows."""
        if self.pg:  # psycopg2's own cursor: no SQLAlchemy work per statement on the hot path
            with driver_cursor(conn) as cursor:
                cursor.execute(sql, params)
                return cursor.fetchone() if cursor.description else None
        result = conn.exec_driver_sql(sql, params)
        return result.first() if result.returns_rows else None

    def apply_all(self, conn: Connection, plans: list[TablePlan], now: datetime) -> None:
        """Apply every plan of one write, in the caller's transaction on ``conn``."""
        try:
            staged = self._stage(conn, plans)
        except DRIVER_ERRORS as err:
            raise PlanFailed(plans[0] if len(plans) == 1 else None, err) from err
        for index, plan in enumerate(plans):
            try:
                self._apply(conn, index, plan, staged[index], now)
            except DRIVER_ERRORS as err:
                raise PlanFailed(plan, err) from err

    def _stage(self, conn: Connection, plans: list[TablePlan]) -> list[set[str]]:
        """Every plan's actions into cdc_stage; per plan, which ops it staged."""
        staged: list[set[str]] = []
        pieces: list = []  # PostgreSQL: COPY lines; DuckDB: row objects
        line = self._pg_line if self.pg else self._duckdb_row
        for index, plan in enumerate(plans):
            ops: set[str] = set()
            staged.append(ops)
            if plan.entry is None:
                continue
            key_names = [c.name for c in plan.key_columns]
            deletes = plan.live_deletes()
            if deletes:
                ops.add(DELETE)
                pieces += [line(index, k, e.version, DELETE, key_values(e.key, e.before, key_names)) for k, e in deletes]
            if plan.changes.tombstones:
                ops.add(TOMBSTONE)
                pieces += [line(index, k, None, TOMBSTONE, key_values(key, None, key_names))
                           for k, key in plan.changes.tombstones.items()]
            upserts = plan.live_upserts()
            if upserts:
                ops.add(UPSERT)
                if self.typed_upserts:  # PostgreSQL: typed, per table (_copy_upserts)
                    pass
                elif self.pg:  # one format per row, no call
                    dumps, head = orjson.dumps, b"%d\x02" % index
                    pieces += [b"%b%b\x02%d\x02u\x02%b\n" % (head, k, version_of(e), dumps(e.after))
                               for k, e in upserts]
                else:
                    pieces += [line(index, k, e.version, UPSERT, e.after) for k, e in upserts]
        if not pieces:
            return staged
        if self.pg:
            with driver_cursor(conn) as cursor:
                cursor.execute(_PG_STAGE)
                cursor.copy_expert(_PG_COPY, io.BytesIO(b"".join(pieces)))
        else:
            conn.exec_driver_sql(_DUCKDB_STAGE)
            conn.exec_driver_sql(f"DELETE FROM {STAGE}")
            conn.exec_driver_sql(_DUCKDB_FILL, (orjson.dumps(pieces).decode(),))
        return staged

    @staticmethod
    def _pg_line(index: int, key: bytes, version: int | None, op: str, row: Any) -> bytes:
        return b"%d\x02%b\x02%b\x02%b\x02%b\n" % (index, key, b"" if version is None else b"%d" % version,
                                                  op.encode(), orjson.dumps(row))

    @staticmethod
    def _duckdb_row(index: int, key: bytes, version: int | None, op: str, row: Any) -> dict[str, Any]:
        return {"t": index, "k": key.decode(), "v": version, "op": op, "j": row}

    def _apply(self, conn: Connection, index: int, plan: TablePlan, staged: set[str], now: datetime) -> None:
        changes, tbl, p = plan.changes, plan.tbl, "%s" if self.pg else "?"
        if changes.truncate is not None:
            self._run(conn, self.books.watermark_sql, (tbl, changes.truncate))
            if plan.entry is not None:
                table, q = self.target.qualified(tbl), self.target.quote
                if self.soft_delete:
                    self._run(conn, f"UPDATE {table} SET {q(DELETED)} = TRUE WHERE {q(VERSION)} < {p}",
                              (changes.truncate,))
                else:
                    self._run(conn, f"DELETE FROM {table} WHERE {q(VERSION)} < {p}", (changes.truncate,))
        if plan.entry is None:  # no table yet: only remember the deletes
            self.books.remember_deletes(conn, tbl, [(k.decode(), version_of(e)) for k, e in plan.live_deletes()], now)
            return
        deletes_table = self.target.qualified(DELETES)
        if DELETE in staged:
            self._run(conn, f"INSERT INTO {deletes_table} AS d (tbl, key_json, version, {self.target.quote('at')}) "
                            f"SELECT {p}, s.k, s.v, {p} FROM {STAGE} s WHERE s.t = {p} AND s.op = 'd' "
                            f"ON CONFLICT (tbl, key_json) DO UPDATE SET version = excluded.version, "
                            f"{self.target.quote('at')} = excluded.{self.target.quote('at')} "
                            f"WHERE d.version < excluded.version", (tbl, now, index))
            self._run(conn, self._sql_for(plan, DELETE), (index,))
        if TOMBSTONE in staged:
            self._run(conn, self._sql_for(plan, TOMBSTONE), (index,))
        if UPSERT in staged:
            stage = self._copy_upserts(conn, index, plan) if self.typed_upserts else None
            # Most tables have no remembered delete at all: then skip the anti-join per row.
            check_deletes = self._run(conn, f"SELECT 1 FROM {deletes_table} WHERE tbl = {p} LIMIT 1", (tbl,)) is not None
            # The table's key is not the events' key after a key change under schema_policy
            # ignore: two event keys may then be one row, which one upsert must not touch twice.
            event_key = next(iter(changes.upserts.values())).key
            one_per_row = {c.name for c in plan.key_columns} != set(event_key)
            sql = self._sql_for(plan, UPSERT, check_deletes, one_per_row, stage)
            if stage is not None:
                self._run(conn, sql, (tbl,) if check_deletes else ())
            else:
                self._run(conn, sql, (index, tbl) if check_deletes else (index,))

    def _copy_upserts(self, conn: Connection, index: int, plan: TablePlan) -> str:
        """The plan's upserts COPYed as typed rows into a temporary table; its name."""
        shape = tuple((c.name, c.family, c.skipped) for c in plan.columns)
        format_rows = self._formatters.get(shape)
        if format_rows is None:
            format_rows = self._formatters[shape] = copy_rows.formatter(plan.columns, self.copy_rows)
        stage = copy_rows.stage_name(index, plan.columns)
        columns = ", ".join(f"c{i} {copy_rows.stage_type(c)}" for i, c in enumerate(plan.columns))
        with driver_cursor(conn) as cursor:
            cursor.execute(f"CREATE TEMPORARY TABLE IF NOT EXISTS {stage} (k text, v bigint"
                           f"{', ' if columns else ''}{columns}) ON COMMIT DELETE ROWS")
            cursor.copy_expert(f"COPY {stage} FROM STDIN", io.BytesIO(format_rows(plan.live_upserts())))
        return stage

    # --- SQL --------------------------------------------------------------------------------------

    def _sql_for(self, plan: TablePlan, op: str, check_deletes: bool = False, one_per_row: bool = False,
                 typed_stage: str | None = None) -> str:
        cache_key = (plan.tbl, op, check_deletes, one_per_row, typed_stage, self.probe_deletes,
                     tuple((c.name, c.sql_type, c.key, c.skipped) for c in plan.columns))
        sql = self._sql.get(cache_key)
        if sql is None:
            sql = self._sql[cache_key] = self._build(plan, op, check_deletes, one_per_row, typed_stage)
        return sql

    def _escape(self, text: str) -> str:
        # psycopg2 interpolates parameters with %: a literal % in a name must be doubled.
        return text.replace("%", "%%") if self.pg else text

    def value_sql(self, column: ColumnPlan) -> str:
        """The expression that reads ``column`` from the staged row JSON ``s.j``."""
        if column.skipped:
            return "NULL"
        name = self._escape("'" + column.name.replace("'", "''") + "'")
        if column.family is Family.JSON:
            return f"NULLIF(s.j->{name}, 'null'::{'jsonb' if self.pg else 'JSON'})"
        if column.family is Family.BINARY:
            return f"decode(s.j->>{name}, 'base64')" if self.pg else f"from_base64(s.j->>{name})"
        return f"CAST(s.j->>{name} AS {column.sql_type})"

    @staticmethod
    def typed_value_sql(index: int, column: ColumnPlan) -> str:
        """The expression that reads ``column`` (the ``index``-th) from a typed stage row ``s``."""
        if column.skipped:
            return "NULL"
        if column.family is Family.BINARY:
            return f"decode(s.c{index}, 'base64')"
        return f"s.c{index}"

    def _build(self, plan: TablePlan, op: str, check_deletes: bool, one_per_row: bool,
               typed_stage: str | None = None) -> str:
        def q(name: str) -> str:
            return self._escape(self.target.quote(name))

        p = "%s" if self.pg else "?"
        table = self._escape(self.target.qualified(plan.tbl))
        keys = plan.key_columns
        match = " AND ".join(f"x.{q(c.name)} = {self.value_sql(c)}" for c in keys)
        stage = f"{STAGE} s WHERE s.t = {p} AND s.op = '{op}'"
        if op == DELETE:
            if self.soft_delete:
                return (f"UPDATE {table} AS x SET {q(DELETED)} = TRUE, {q(VERSION)} = s.v FROM {stage} "
                        f"AND {match} AND x.{q(VERSION)} < s.v")
            return f"DELETE FROM {table} AS x USING {stage} AND {match} AND x.{q(VERSION)} < s.v"
        if op == TOMBSTONE:
            if self.soft_delete:
                return f"UPDATE {table} AS x SET {q(DELETED)} = TRUE FROM {stage} AND {match}"
            return f"DELETE FROM {table} AS x USING {stage} AND {match}"
        names = [c.name for c in plan.columns] + [VERSION] + ([DELETED] if self.soft_delete else [])
        if typed_stage is not None:
            stage = f"{typed_stage} s WHERE TRUE"
            value_of = {c.name: self.typed_value_sql(i, c) for i, c in enumerate(plan.columns)}
        else:
            value_of = {c.name: self.value_sql(c) for c in plan.columns}
        values = [value_of[c.name] for c in plan.columns] + ["s.v"] + (["FALSE"] if self.soft_delete else [])
        updates = [n for n in names if n not in {c.name for c in keys}]
        conflict = ", ".join(q(c.name) for c in keys)
        sets = ", ".join(f"{q(n)} = excluded.{q(n)}" for n in updates)
        deletes = self._escape(self.target.qualified(DELETES))
        probe = " OFFSET 0" if self.probe_deletes and self.pg else ""  # see __init__
        select = f"SELECT {', '.join(values)} FROM {stage} " + (
            f"AND NOT EXISTS (SELECT 1 FROM {deletes} d WHERE d.tbl = {p} AND d.key_json = s.k "
            f"AND d.version >= s.v{probe}) " if check_deletes else "")
        if one_per_row:
            key_values_sql = ", ".join(value_of[c.name] for c in keys)
            select = (f"SELECT DISTINCT ON ({key_values_sql}) {select.removeprefix('SELECT ')}"
                      f"ORDER BY {key_values_sql}, s.v DESC ")
        return (f"INSERT INTO {table} AS x ({', '.join(q(n) for n in names)}) {select}"
                f"ON CONFLICT ({conflict}) DO UPDATE SET {sets} WHERE x.{q(VERSION)} < excluded.{q(VERSION)}")
