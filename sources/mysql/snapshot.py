"""The consistent initial snapshot of a MySQL/MariaDB source, with the least locking.

On MariaDB, ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` fixes an InnoDB read view together with
the binlog position it matches (``SHOW STATUS LIKE 'binlog_snapshot_%'``: file and position; the
commit order is held still for that instant, no table lock is taken). Streaming starts exactly at
that position, and the GTID position there is ``BINLOG_GTID_POS(file, position)``.

Several readers must share one view, and each opens its own. How they are opened, in order:

1. **lock-free**: open every reader, then compare their binlog snapshot positions. Equal positions
   mean no transaction was binlogged in between, so all views hold the same transactions: done,
   without any lock. Tried twice (on a quiet server it almost always succeeds).
2. **FLUSH TABLES WITH READ LOCK for an instant**: take the global read lock (waiting at most
   ``snapshot_lock_timeout`` for running statements), open all readers, read the position, UNLOCK
   TABLES. Writes wait only while the readers' transactions start (milliseconds).
3. **one reader, lock-free**: where FTWRL is not permitted (no RELOAD privilege) or timed out, a
   single reader reads every table in its own consistent snapshot.

Tables are read in primary-key ranges (an integer single-column key is cut into about
``snapshot_chunk_rows`` rows per chunk; other tables are one chunk) through unbuffered cursors with
no client-side conversion, then converted by ``types.text_converter`` to the same JSON the binlog
decoder makes. Sessions run with ``time_zone = '+00:00'`` so TIMESTAMP text is UTC, as in the binlog.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pymysql
import pymysql.cursors

from cdc.errors import PrerequisiteError, RetriableError
from cdc.events import ChangeEvent, Op, SnapshotMarker
from sources.mysql.catalog import connect, query
from sources.mysql.changes import key_function
from sources.mysql.config import MySqlConfig
from sources.mysql.errors import wrap
from sources.mysql.schema import TableSchema
from sources.mysql.types import INTEGER_TYPES, select_expression, text_converter

log = logging.getLogger(__name__)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class SnapshotReader:
    """One connection inside a consistent-snapshot transaction."""

    def __init__(self, config: MySqlConfig) -> None:
        self.conn = connect(config, raw=True, cursorclass=pymysql.cursors.Cursor)
        query(self.conn, "SET SESSION time_zone = '+00:00'")
        query(self.conn, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def begin(self) -> None:
        query(self.conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY", what="opening a snapshot")

    def position(self) -> tuple[str, int] | None:
        """The binlog position this reader's snapshot is consistent with (MariaDB), or None."""
        status = {name.lower(): value for name, value in query(self.conn, "SHOW STATUS LIKE 'binlog_snapshot_%'")}
        file, pos = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
        if not file or pos is None:
            return None
        return (file.decode() if isinstance(file, bytes) else file), int(pos)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - closing on the way out
            pass


def _close(readers: list[SnapshotReader]) -> None:
    for reader in readers:
        reader.close()


def open_readers(config: MySqlConfig, count: int, extra: dict) -> tuple[list[SnapshotReader], tuple[str, int], str]:
    """``count`` readers (or one) sharing one view, the binlog position of that view, and how
    they were opened ("lock-free", "FTWRL", "single reader")."""
    if count > 1:
        for _ in range(2):
            readers = [SnapshotReader(config) for _ in range(count)]
            for reader in readers:
                reader.begin()
            positions = {reader.position() for reader in readers}
            shared = positions.pop() if len(positions) == 1 else None
            if shared is not None:
                return readers, shared, "lock-free"
            _close(readers)
        locked = _open_under_lock(config, count, extra)
        if locked is not None:
            return locked
    reader = SnapshotReader(config)
    reader.begin()
    position = reader.position()
    if position is None:
        reader.close()
        raise PrerequisiteError("the server reports no binlog_snapshot_file/position (MariaDB's consistent "
                                "snapshot status): use MariaDB, or give the user RELOAD for FLUSH TABLES WITH "
                                "READ LOCK")
    return [reader], position, "single reader"


def _open_under_lock(config: MySqlConfig, count: int, extra: dict):
    control = connect(config)
    readers: list[SnapshotReader] = []
    try:
        query(control, f"SET SESSION lock_wait_timeout = {max(1, math.ceil(config.snapshot_lock_timeout))}")
        try:
            with control.cursor() as cur:
                cur.execute("FLUSH TABLES WITH READ LOCK")
        except pymysql.Error as err:
            log.warning("FLUSH TABLES WITH READ LOCK failed (%s): one lock-free snapshot reader instead of %d",
                        wrap(err, "locking"), count, extra=extra)
            return None
        began = time.monotonic()
        try:
            readers = [SnapshotReader(config) for _ in range(count)]
            for reader in readers:
                reader.begin()
            position = readers[0].position()
            if position is None:
                rows = query(control, "SHOW MASTER STATUS")
                position = (rows[0][0], int(rows[0][1]))
        finally:
            query(control, "UNLOCK TABLES")
        positions = {reader.position() for reader in readers}
        if len(positions) != 1:
            raise RetriableError(f"snapshot readers opened under FLUSH TABLES WITH READ LOCK disagree on the binlog "
                                 f"position ({sorted(map(str, positions))})")
        log.info("snapshot readers opened under FLUSH TABLES WITH READ LOCK (held %.0f ms)",
                 (time.monotonic() - began) * 1000, extra=extra)
        return readers, position, "FTWRL"
    except BaseException:
        _close(readers)
        raise
    finally:
        control.close()


@dataclass(frozen=True, slots=True)
class Chunk:
    table: TableSchema
    column: str | None = None    # the integer key column ranged over
    low: int | None = None       # inclusive; None: from the start
    high: int | None = None      # exclusive; None: to the end

    def where(self) -> str:
        column = self.column
        if column is None:  # the whole table: no bounds either
            return ""
        parts = []
        if self.low is not None:
            parts.append(f"{_quote(column)} >= {self.low}")
        if self.high is not None:
            parts.append(f"{_quote(column)} < {self.high}")
        return (" WHERE " + " AND ".join(parts)) if parts else ""


def plan_chunks(reader: SnapshotReader, tables: list[TableSchema], chunk_rows: int) -> list[Chunk]:
    """Key ranges per table (inside the reader's snapshot), largest tables first."""
    sized = []
    for table in tables:
        db, name = table.id.db, table.id.table
        rows = query(reader.conn, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                                  "AND TABLE_NAME = %s", (db, name))
        sized.append((int(rows[0][0] or 0) if rows else 0, table))
    chunks: list[Chunk] = []
    for estimate, table in sorted(sized, key=lambda item: -item[0]):
        column = table.key[0] if len(table.key) == 1 else None
        types = {c.name: c.type for c in table.columns}
        if column is None or types[column].data_type not in INTEGER_TYPES or estimate <= chunk_rows:
            chunks.append(Chunk(table))
            continue
        low, high = query(reader.conn, f"SELECT MIN({_quote(column)}), MAX({_quote(column)}) FROM "
                                       f"{_quote(table.id.db)}.{_quote(table.id.table)}")[0]
        if low is None:
            chunks.append(Chunk(table))
            continue
        low, high = int(low), int(high)
        width = max(1, math.ceil((high - low + 1) / math.ceil(estimate / chunk_rows)))
        bounds = list(range(low + width, high + 1, width))
        starts = [None] + bounds
        ends = bounds + [None]
        chunks += [Chunk(table, column, a, b) for a, b in zip(starts, ends)]
    return chunks


class OnConnection(Protocol):
    """What ``SnapshotRows`` reads through: a ``SnapshotReader``, or an incremental snapshot's
    connection (incremental.py)."""

    @property
    def conn(self) -> pymysql.connections.Connection: ...


class RowRange(Protocol):
    """The rows ``SnapshotRows`` reads: a ``Chunk``, or an incremental snapshot's keyset range."""

    @property
    def table(self) -> TableSchema: ...

    def where(self) -> str: ...


class SnapshotRows:
    """Reads a chunk into ``r`` events tagged with the snapshot's version and position."""

    def __init__(self, version: int, ts_ms: int, source_fields: dict[str, Any], batch: int) -> None:
        self.version = version
        self.ts_ms = ts_ms
        self.source_fields = source_fields
        self.batch = batch

    def read(self, reader: OnConnection, chunk: RowRange, emit: Callable[[list], None]) -> None:
        table = chunk.table
        names = [c.name for c in table.columns]
        converters = [text_converter(c.type) for c in table.columns]
        key_of = key_function(tuple(names), table.key)
        table_id, version, ts_ms, fields = table.id, self.version, self.ts_ms, self.source_fields
        new, read, true = tuple.__new__, Op.READ, SnapshotMarker.TRUE
        columns = ", ".join(select_expression(c.name, c.type) for c in table.columns)
        sql = f"SELECT {columns} FROM {_quote(table_id.db)}.{_quote(table_id.table)}{chunk.where()}"
        began = time.monotonic()
        count = 0
        try:
            with reader.conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(sql)
                while True:
                    rows = cur.fetchmany(self.batch)
                    if not rows:
                        break
                    events = []
                    for values in rows:
                        row = {name: None if value is None else convert(value)
                               for name, convert, value in zip(names, converters, values)}
                        events.append(new(ChangeEvent, (read, table_id, key_of(row), None, row, version, ts_ms, true,
                                                        fields, None)))
                    count += len(events)
                    emit(events)
        except pymysql.Error as err:
            raise wrap(err, f"reading {table_id} for the snapshot") from err
        log.debug("snapshot of %s%s: %d rows in %.1fs", table_id, chunk.where(), count, time.monotonic() - began)


