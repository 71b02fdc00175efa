"""The PostgreSQL half of incremental snapshots (the algorithm: snapshot/incremental.py).

``SignalTable`` creates the signal table when it is missing and writes its rows; the stream
brings them back (the table is in the publication). A low watermark's version is
``pg_current_wal_insert_lsn()`` taken in its transaction before the row is written. PostgreSQL
numbers a change by where it was written, not where its transaction commits, so the chunk is read
only once every transaction that had an xid when the low watermark committed has ended
(``readable``, asked at each poll while the stream goes on): their changes are then inside the
window or visible to the chunk's read, and every change the read cannot see is written after the
low watermark, above its version. A transaction left open (or prepared) holds the snapshot, not
the stream, and the log says so every ``server_timeout``.

``read_chunk`` reads a key range with the initial snapshot's COPY reader (``snapshot.py``), on
the source's own connection, in a statement of its own (READ COMMITTED: it sees what committed
before it).

Threading: the source's thread.
"""

from __future__ import annotations

import json
import logging
import time

import psycopg2

from cdc.events import ChangeEvent, TableId
from snapshot.signals import OPEN, SIGNAL_COLUMNS, WATERMARKS, condition_error
from sources.postgres.catalog import TableMeta, quoted_name, table_meta
from sources.postgres.errors import wrap
from sources.postgres.lookup import CatalogLookup
from sources.postgres.snapshot import SnapshotRows, quote_ident
from sources.postgres.toast import ToastStore

log = logging.getLogger(__name__)


def signal_table_id(name: str, database: str) -> TableId:
    schema, table = name.split(".")  # the config checked the form (snapshot/incremental.py)
    return TableId(database, schema, table)


class SignalTable:
    def __init__(self, conn, table: TableId, key_columns: dict, server_timeout: float, source: str) -> None:
        self.conn, self.id, self.server_timeout, self.source = conn, table, server_timeout, source
        self.qualified = quoted_name(table)
        self.waiting_for: tuple[int, float, float] | None = None  # (xmax at the low watermark, since, warned)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s)::oid", (self.qualified,))
                oid = cur.fetchone()[0]
                if oid is None:  # created only when missing: CREATE needs a grant that writing does not
                    cur.execute(f"CREATE TABLE {self.qualified} ({SIGNAL_COLUMNS})")
                    cur.execute("SELECT %s::regclass::oid", (self.qualified,))
                    oid = cur.fetchone()[0]
                    log.info("created the signal table %s", table, extra={"connector": source, "phase": "starting"})
            conn.commit()
            self.meta: TableMeta = table_meta(conn, oid, table.db, key_columns)
            conn.rollback()
        except psycopg2.Error as err:
            conn.rollback()
            raise wrap(err, f"source {source}: creating the signal table {table}") from err

    def write(self, signal_id: str, kind: str, data: dict) -> int:
        what = f"writing signal {kind} to {self.id}"
        try:
            with self.conn.cursor() as cur:
                if kind == OPEN:  # the watermarks of earlier chunks are of no more use
                    cur.execute(f"DELETE FROM {self.qualified} WHERE type = ANY(%s)", (list(WATERMARKS),))
                cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
                version = int(cur.fetchone()[0])
                cur.execute(f"INSERT INTO {self.qualified} (id, type, data) VALUES (%s, %s, %s)",
                            (signal_id, kind, json.dumps(data)))
            self.conn.commit()
            if kind == OPEN:  # every transaction with an xid below this has to end before the read
                with self.conn.cursor() as cur:
                    cur.execute("SELECT txid_snapshot_xmax(txid_current_snapshot())")
                    self.waiting_for = (cur.fetchone()[0], time.monotonic(), time.monotonic())
                self.conn.rollback()
        except psycopg2.Error as err:
            self.conn.rollback()
            raise wrap(err, what) from err
        return version

    def readable(self) -> bool:
        """Whether the transactions open when the last low watermark was written have all ended."""
        if self.waiting_for is None:
            return True
        xmax, began, said = self.waiting_for
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT txid_snapshot_xmin(txid_current_snapshot())")
                oldest = cur.fetchone()[0]
            self.conn.rollback()
        except psycopg2.Error as err:
            self.conn.rollback()
            raise wrap(err, "reading the oldest open transaction") from err
        if oldest >= xmax:
            self.waiting_for = None
            return True
        now = time.monotonic()
        if now - said >= self.server_timeout:
            log.warning("the incremental snapshot's next chunk has waited %.0fs for transaction %d (open since "
                        "before its low watermark) to end; streaming goes on", now - began, oldest,
                        extra={"connector": self.source, "phase": "incremental snapshot"})
            self.waiting_for = (xmax, began, now)
        return False


class _KeyRange:
    """A chunk of a keyset read, shaped like snapshot.Chunk for ``SnapshotRows``; ``condition``:
    the user's SQL condition on the table's rows (``cdc snapshot --where``), or None."""

    def __init__(self, table: TableMeta, after: tuple | None, size: int, literal, condition: str | None = None) -> None:
        self.table, self.after, self.size, self.literal = table, after, size, literal
        self.condition = condition

    def where(self, alias: str = "") -> str:
        prefix = f"{alias}." if alias else ""
        types = {c.name: c.type_name for c in self.table.columns}
        keys = ", ".join(prefix + quote_ident(k) for k in self.table.key)
        clauses = []
        if self.after is not None:
            values = ", ".join(f"{self.literal(v)}::{types[k]}" for k, v in zip(self.table.key, self.after))
            clauses.append(f"({keys}) > ({values})")
        if self.condition is not None:
            # Under an alias the reader joins other relations whose columns share the table's
            # names: the condition is evaluated on the row alone, where its names are unambiguous.
            clauses.append(f"EXISTS (SELECT FROM (SELECT {alias}.*) f WHERE {self.condition})" if alias
                           else f"({self.condition})")
        clause = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return f"{clause} ORDER BY {keys} LIMIT {self.size}"


class _OnConnection:
    def __init__(self, conn) -> None:
        self.conn = conn


def read_chunk(conn, lookup: CatalogLookup, toast: ToastStore, table: TableMeta, after: tuple | None, size: int,
               version: int, where: str | None = None) -> list[ChangeEvent]:
    lookup.converters_for([c.type_oid for c in table.columns])

    def literal(value) -> str:
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        with conn.cursor() as cur:
            return cur.mogrify("%s", (value,)).decode()

    rows = SnapshotRows(version, int(time.time() * 1000), lookup.converters_for, toast, batch=size,
                        types=lookup.types)
    events: list[ChangeEvent] = []

    def emit(item) -> None:
        batch, qualified, toastable = item
        for key_json, column, value in toastable:
            toast.remember(qualified, key_json, column, value)
        events.extend(batch)

    try:
        rows.read(_OnConnection(conn), _KeyRange(table, after, size, literal, where), emit)
        conn.rollback()
    except BaseException:
        conn.rollback()
        raise
    toast.flush()
    return events


def filter_error(conn, table: TableId, where: str) -> str | None:
    """Why PostgreSQL refuses ``where`` as a condition on ``table`` (planned, never run); None if
    it takes it. Its shape is checked before the server sees it (``condition_error``)."""
    shape = condition_error(where)
    if shape is not None:
        return shape
    try:
        with conn.cursor() as cur:
            cur.execute(f"EXPLAIN SELECT FROM {quoted_name(table)} WHERE ({where})")
        return None
    except psycopg2.Error as err:
        return (err.diag.message_primary or str(err)).strip()
    finally:
        conn.rollback()


def estimate_rows(conn, table: TableId) -> int | None:
    """The planner's estimate of ``table``'s rows (None before the table was ever analyzed)."""
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                        (quoted_name(table),))
            found = cur.fetchone()
    finally:
        conn.rollback()
    return found[0] if found and found[0] >= 0 else None
