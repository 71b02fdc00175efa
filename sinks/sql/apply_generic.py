"""Applying table plans with executemany: MySQL/MariaDB and SQLite.

Values are converted in Python (``values``) so that a value that does not fit is reported with its
table, key and column before any SQL runs. Upserts are one executemany of the version-guarded
upsert (``Target.upsert_sql``): pymysql turns it into multi-row INSERTs, sqlite3 runs it in C.
(DuckDB runs executemany a row at a time, hundreds of rows a second: it is staged instead, see
``apply_staged``.)

Remembered deletes are looked up for the batch's upsert keys (``Bookkeeping.deleted_versions``)
and such upserts are dropped here, before the upsert.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from cdc.api import PermanentError
from sinks.sql.bookkeeping import Bookkeeping
from sinks.sql.errors import DRIVER_ERRORS
from sinks.sql.plan import DELETED, VERSION, ColumnPlan, PlanFailed, TablePlan, key_values
from sinks.sql.reduce import version_of
from sinks.sql.target import Target
from sinks.sql.values import converter


class GenericApplier:
    def __init__(self, target: Target, bookkeeping: Bookkeeping, soft_delete: bool) -> None:
        self.target = target
        self.books = bookkeeping
        self.soft_delete = soft_delete
        self._sql: dict[tuple, str] = {}

    def apply_all(self, conn: Connection, plans: list[TablePlan], now: datetime) -> None:
        """Apply every plan of one write, in the caller's transaction on ``conn``."""
        for plan in plans:
            try:
                self.apply(conn, plan, now)
            except DRIVER_ERRORS as err:
                raise PlanFailed(plan, err) from err

    def apply(self, conn: Connection, plan: TablePlan, now: datetime) -> None:
        changes, books, tbl = plan.changes, self.books, plan.tbl
        if changes.truncate is not None:
            books.raise_watermark(conn, tbl, changes.truncate)
            if plan.entry is not None:
                self._truncate(conn, plan, changes.truncate)
        deletes = plan.live_deletes()
        books.remember_deletes(conn, tbl, [(k.decode(), version_of(e)) for k, e in deletes], now)
        if plan.entry is None:
            return
        if deletes:
            self._delete(conn, plan, [(key_values(e.key, e.before, self._key_names(plan)), e.version)
                                      for _, e in deletes])
        if changes.tombstones:
            self._delete(conn, plan, [(key_values(key, None, self._key_names(plan)), None)
                                      for key in changes.tombstones.values()])
        upserts = plan.live_upserts()
        if upserts:
            deleted = books.deleted_versions(conn, tbl, [k.decode() for k, _ in upserts])
            if deleted:
                upserts = [(k, e) for k, e in upserts if deleted.get(k.decode(), -1 << 63) < version_of(e)]
            self.upsert(conn, plan, [e for _, e in upserts])

    @staticmethod
    def _key_names(plan: TablePlan) -> list[str]:
        return [c.name for c in plan.key_columns]

    def _truncate(self, conn: Connection, plan: TablePlan, version: int) -> None:
        table, q, p = self.target.qualified(plan.tbl), self.target.quote, self.target.param
        if self.soft_delete:
            conn.exec_driver_sql(f"UPDATE {table} SET {q(DELETED)} = TRUE WHERE {q(VERSION)} < {p}", (version,))
        else:
            conn.exec_driver_sql(f"DELETE FROM {table} WHERE {q(VERSION)} < {p}", (version,))

    def _delete(self, conn: Connection, plan: TablePlan, keys: list[tuple[dict[str, Any], int | None]]) -> None:
        """Delete (or mark) the rows of ``keys``: with a version, only rows older than it."""
        table, q, p = self.target.qualified(plan.tbl), self.target.quote, self.target.param
        key_columns = plan.key_columns
        match = " AND ".join(f"{q(c.name)} = {p}" for c in key_columns)
        versioned = [(key, v) for key, v in keys if v is not None]
        unversioned = [key for key, v in keys if v is None]
        if versioned:
            params = [(*self._key_params(plan, key), version) for key, version in versioned]
            if self.soft_delete:
                params = [(row[-1], *row) for row in params]
                conn.exec_driver_sql(f"UPDATE {table} SET {q(DELETED)} = TRUE, {q(VERSION)} = {p} "
                                     f"WHERE {match} AND {q(VERSION)} < {p}", params)
            else:
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE {match} AND {q(VERSION)} < {p}", params)
        if unversioned:
            params = [tuple(self._key_params(plan, key)) for key in unversioned]
            if self.soft_delete:
                conn.exec_driver_sql(f"UPDATE {table} SET {q(DELETED)} = TRUE WHERE {match}", params)
            else:
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE {match}", params)

    def _key_params(self, plan: TablePlan, key: dict[str, Any]) -> list[Any]:
        out = []
        for column in plan.key_columns:
            value = key.get(column.name)
            if value is None:
                raise PermanentError(f"{plan.tbl}: key {_show(key)}: key column {column.name} has no value")
            out.append(self._convert(plan, column, key, value))
        return out

    def _convert(self, plan: TablePlan, column: ColumnPlan, key: Any, value: Any) -> Any:
        try:
            return converter(column.family, self.target.kind)(value)
        except (ValueError, TypeError, ArithmeticError) as err:
            raise PermanentError(f"{plan.tbl}: key {_show(key)}: column {column.name}: cannot store "
                                 f"{value!r} as {column.sql_type}: {err}") from None

    def upsert(self, conn: Connection, plan: TablePlan, events: list) -> None:
        """Upsert the ``events`` (their ``after`` rows), each only over an older version."""
        if not events:
            return
        columns = [c for c in plan.columns]
        names = [c.name for c in columns] + [VERSION] + ([DELETED] if self.soft_delete else [])
        convert = [(c.name, None if c.skipped else converter(c.family, self.target.kind)) for c in columns]
        rows = []
        for event in events:
            after, key = event.after, event.key
            row: list = []
            for name, conv in convert:
                value = after.get(name)
                if value is None:
                    value = key.get(name)
                if value is None or conv is None:
                    row.append(None)
                    continue
                try:
                    row.append(conv(value))
                except (ValueError, TypeError, ArithmeticError) as err:
                    column = next(c for c in columns if c.name == name)
                    raise PermanentError(f"{plan.tbl}: key {_show(key)}: column {name}: cannot store "
                                         f"{value!r} as {column.sql_type}: {err}") from None
            row.append(event.version)
            if self.soft_delete:
                row.append(False)
            rows.append(tuple(row))
        key_names = [c.name for c in plan.key_columns]
        if set(key_names) != set(events[0].key):
            rows = _newest_per_key(rows, [names.index(k) for k in key_names], names.index(VERSION))
        sql_key = (plan.tbl, tuple(names))
        sql = self._sql.get(sql_key)
        if sql is None:
            sql = self._sql[sql_key] = self.target.upsert_sql(plan.tbl, names, key_names, guard=VERSION)
        conn.exec_driver_sql(sql, rows)


def _newest_per_key(rows: list[tuple], key_at: list[int], version_at: int) -> list[tuple]:
    """One row per table key, the newest. Needed when the table's key is not the events' key (a
    key change under ``schema_policy: ignore``): then two event keys can be one table row, and a
    multi-row upsert must not touch a row twice."""
    newest: dict[tuple, tuple] = {}
    for row in rows:
        key = tuple(row[i] for i in key_at)
        kept = newest.get(key)
        if kept is None or row[version_at] > kept[version_at]:
            newest[key] = row
    return list(newest.values())


def _show(key: Any) -> str:
    import orjson

    try:
        return orjson.dumps(key).decode()
    except TypeError:
        return repr(key)
