"""The MySQL/MariaDB half of ``cdc verify`` (cdc.api.VerifiableSource): key ranges and single keys
of the captured tables, each read at a known binlog position.

A read is one statement in autocommit (one consistent read, no table lock: InnoDB reads the rows
as they were when it began), through the incremental snapshot's key-range reader
(incremental._KeyRange and snapshot.SnapshotRows), so the rows are the events the source would
publish for them. Its position is the binlog's, read just after the statement: every change the
read shows committed before it, so at or below that position, which is what ``cdc verify`` needs
(a store that applied the log past it holds every change the read shows; cdc/runtime/verify.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pymysql
from pymysql.converters import encoders

from cdc.api import SourceRead, TableReader, captured_table
from cdc.events import ChangeEvent
from cdc.positions import MySqlPosition
from sources.mysql.catalog import captured_tables, connect, current_position, load_schemas, matches
from sources.mysql.config import MySqlConfig
from sources.mysql.errors import wrap
from sources.mysql.incremental import _KeyRange, _OnConnection, _quote
from sources.mysql.schema import TableSchema
from sources.mysql.snapshot import SnapshotRows


class MySqlTableReader(TableReader):
    def __init__(self, config: MySqlConfig) -> None:
        self.cfg = config
        self.control = connect(config)
        self.conn = connect(config, raw=True)  # raw: the default encoders quote the key values
        try:
            signal = tuple(config.signal_table.split(".")) if config.signal_table else None
            names = [(db, t) for db, t in captured_tables(self.control, config.tables)
                     if matches(db, t, config.tables) and (db, t) != signal]
            schemas = load_schemas(self.control, names, config.key_columns)
        except BaseException:
            self.close()
            raise
        self._tables: dict[str, TableSchema] = {str(s.id): s for s in schemas.values()}

    def tables(self) -> list[str]:
        return sorted(self._tables)

    def read(self, table: str, after: tuple | None, limit: int) -> SourceRead:
        return self._read(table, after, limit, None)

    def read_keys(self, table: str, keys: Sequence[dict[str, Any]]) -> SourceRead:
        if not keys:
            file, pos = current_position(self.control)
            return SourceRead([], MySqlPosition(file, pos))
        return self._read(table, None, len(keys), self.where_keys(table, keys))

    def where_keys(self, table: str, keys: Sequence[dict[str, Any]]) -> str:
        schema = self._schema(table)
        names = ", ".join(_quote(k) for k in schema.key)
        values = ", ".join("(" + ", ".join(self._literal(key.get(k)) for k in schema.key) + ")" for key in keys)
        return f"({names}) IN ({values})"

    def _literal(self, value: Any) -> str:
        return self.conn.escape(value, encoders)

    def _read(self, table: str, after: tuple | None, limit: int, where: str | None) -> SourceRead:
        schema = self._schema(table)
        events: list[ChangeEvent] = []
        try:
            self.conn.ping()
            rows = SnapshotRows(0, int(time.time() * 1000), {"file": None, "pos": None, "row": 0, "gtid": None},
                                batch=limit)
            # Shaped like the snapshot's reader and chunk, as the incremental snapshot hands them.
            reader: Any = _OnConnection(self.conn)
            chunk: Any = _KeyRange(schema, after, limit, self._literal, where)
            rows.read(reader, chunk, events.extend)
            file, pos = current_position(self.control)  # after the read: every change it shows is before
        except pymysql.Error as err:
            raise wrap(err, f"source {self.cfg.name}: reading {table} to verify") from err
        return SourceRead(events, MySqlPosition(file, pos))

    def _schema(self, table: str) -> TableSchema:
        return captured_table(self.cfg.name, self._tables, table)

    def close(self) -> None:
        for conn in (getattr(self, "control", None), getattr(self, "conn", None)):
            if conn is not None:
                try:
                    conn.close()
                except pymysql.Error:
                    pass
