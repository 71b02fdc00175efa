"""The MySQL/MariaDB half of incremental snapshots (the algorithm: snapshot/incremental.py).

``SignalTable`` creates the signal table when it is missing and writes its rows; the binlog brings
them back. A low watermark's version is the binlog position read just before it is written: the
binlog is in commit order, so every change a later read cannot see commits after the watermark,
at a higher position. ``read_chunk`` reads a key range with the initial snapshot's row reader
(``snapshot.py``) on a connection of its own in autocommit: one statement, one consistent read
that sees everything committed before it.

Threading: the source's thread.
"""

from __future__ import annotations

import json
import time

import pymysql
from pymysql.converters import encoders

from cdc.events import ChangeEvent, TableId
from snapshot.signals import OPEN, SIGNAL_COLUMNS, WATERMARKS, condition_error
from sources.mysql.catalog import connect, current_position, query
from sources.mysql.changes import version_of
from sources.mysql.config import MySqlConfig
from sources.mysql.errors import wrap
from sources.mysql.schema import TableSchema
from sources.mysql.snapshot import SnapshotRows


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class SignalTable:
    def __init__(self, conn, name: str, source: str) -> None:
        db, table = name.split(".")  # the config checked the form (snapshot/incremental.py)
        self.conn, self.id, self.source = conn, TableId(db, None, table), source
        self.qualified = f"{_quote(db)}.{_quote(table)}"
        exists = query(conn, "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                       (db, table), what=f"source {source}: looking up the signal table {name}")
        if not exists:  # created only when missing: CREATE needs a grant that writing does not
            query(conn, f"CREATE TABLE {self.qualified} ({SIGNAL_COLUMNS})",
                  what=f"source {source}: creating the signal table {name}")

    def write(self, signal_id: str, kind: str, data: dict) -> tuple[int, str, int]:
        """(version, file, pos) of the binlog just before the row."""
        try:
            self.conn.ping()  # the control connection may have idled past wait_timeout
            with self.conn.cursor() as cur:
                cur.execute("BEGIN")
                if kind == OPEN:  # the watermarks of earlier chunks are of no more use
                    cur.execute(f"DELETE FROM {self.qualified} WHERE type IN (%s, %s)", WATERMARKS)
                cur.execute(f"INSERT INTO {self.qualified} (id, type, data) VALUES (%s, %s, %s)",
                            (signal_id, kind, json.dumps(data)))
                file, pos = current_position(self.conn)  # before this transaction's commit is written
                cur.execute("COMMIT")
        except pymysql.Error as err:
            raise wrap(err, f"writing signal {kind} to {self.id}") from err
        return version_of(int(file.rsplit(".", 1)[-1]), pos), file, pos


class _KeyRange:
    """A chunk of a keyset read, shaped like snapshot.Chunk for ``SnapshotRows``; ``condition``:
    the user's SQL condition on the table's rows (``cdc snapshot --where``), or None."""

    def __init__(self, table: TableSchema, after: tuple | None, size: int, escape, condition: str | None = None) -> None:
        self.table, self.after, self.size, self.escape = table, after, size, escape
        self.condition = condition

    def where(self) -> str:
        keys = [_quote(k) for k in self.table.key]
        order = ", ".join(keys)
        clauses = [] if self.condition is None else [f"({self.condition})"]
        if self.after is not None:
            values = [self.escape(v) for v in self.after]
            # (k1, k2) > (v1, v2) spelled out: MariaDB reads a row comparison by scanning the index
            # from its start, but ranges over this form (and the leading k1 >= v1).
            after = " OR ".join(
                "(" + " AND ".join([f"{k} = {v}" for k, v in zip(keys[:i], values[:i])] + [f"{keys[i]} > {values[i]}"]) + ")"
                for i in range(len(keys)))
            clauses[:0] = [f"{keys[0]} >= {values[0]}", f"({after})"]
        clause = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return f"{clause} ORDER BY {order} LIMIT {self.size}"


class _OnConnection:
    def __init__(self, conn: pymysql.connections.Connection) -> None:
        self.conn = conn


class ChunkReader:
    def __init__(self, config: MySqlConfig) -> None:
        self.config = config
        self.conn: pymysql.connections.Connection | None = None  # connected at the first read

    def read(self, table: TableSchema, after: tuple | None, size: int, version: int, file: str,
             pos: int, where: str | None = None) -> list[ChangeEvent]:
        conn = self.conn
        if conn is None:
            conn = self.conn = connect(self.config, raw=True)
        try:
            conn.ping()
        except pymysql.Error as err:
            raise wrap(err, f"reconnecting to read a chunk of {table.id}") from err
        rows = SnapshotRows(version, int(time.time() * 1000), {"file": file, "pos": pos, "row": 0, "gtid": None},
                            batch=size)
        events: list[ChangeEvent] = []
        # raw: no converters of its own, so the default encoders quote the key values
        rows.read(_OnConnection(conn), _KeyRange(table, after, size, lambda v: conn.escape(v, encoders), where),
                  events.extend)
        return events

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except pymysql.Error:
                pass


def filter_error(conn, table: TableId, where: str) -> str | None:
    """Why the server refuses ``where`` as a condition on ``table`` (EXPLAINed, never run); None
    if it takes it. Its shape is checked before the server sees it (``condition_error``)."""
    shape = condition_error(where)
    if shape is not None:
        return shape
    try:
        with conn.cursor() as cur:
            cur.execute(f"EXPLAIN SELECT 1 FROM {_quote(table.db)}.{_quote(table.table)} WHERE ({where})")
            cur.fetchall()
        return None
    except pymysql.err.ProgrammingError as err:  # syntax, unknown column: what the user typed
        return str(err.args[1] if len(err.args) > 1 else err)
    except pymysql.err.OperationalError as err:
        if err.args and err.args[0] in (1054, 1064, 1305):  # unknown column, syntax, unknown function
            return str(err.args[1])
        raise wrap(err, f"checking the condition on {table}") from err


def estimate_rows(conn, table: TableId) -> int | None:
    """The server's estimate of ``table``'s rows (information_schema; InnoDB's is approximate)."""
    found = query(conn, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                  (table.db, table.table), what=f"estimating the rows of {table}")
    return int(found[0][0]) if found and found[0][0] is not None else None
