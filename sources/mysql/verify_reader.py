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
from cdc.api.digest import (
    Digest,
    DigestingReader,
    DigestPlan,
    Kind,
    SourceDigest,
    mysql_hash,
    mysql_value,
    renders_into,
)
from cdc.events import ChangeEvent
from cdc.positions import MySqlPosition
from sources.mysql.catalog import captured_tables, connect, current_position, load_schemas, matches
from sources.mysql.config import MySqlConfig
from sources.mysql.errors import wrap
from sources.mysql.incremental import _KeyRange, _OnConnection, _quote
from sources.mysql.schema import TableSchema
from sources.mysql.snapshot import SnapshotRows
from sources.mysql.types import ColumnType


class MySqlTableReader(TableReader, DigestingReader):
    database = "mysql"

    def __init__(self, config: MySqlConfig) -> None:
        self.cfg = config
        self.control = connect(config)
        self.conn = connect(config, raw=True)  # raw: the default encoders quote the key values
        try:
            # TIMESTAMP values read as UTC, as the snapshot reads them (snapshot.py) and the log has them.
            with self.conn.cursor() as cur:
                cur.execute("SET SESSION time_zone = '+00:00'")
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

    def digest(self, table: str, plan: DigestPlan, after: int | None, limit: int) -> SourceDigest | None:
        """cdc.api.DigestingReader: the chunk's digest in canonical texts (cdc/api/digest.py),
        one statement (one consistent read), its position read just after, as ``_read``."""
        schema = self._schema(table)
        types = {c.name: c.type for c in schema.columns}
        if schema.key != (plan.key,) or not plan.canonical or _kind_of(types.get(plan.key)) is not Kind.INTEGER:
            return None
        values = []
        for column in plan.columns:
            source = types.get(column.name)
            if source is None or not renders_into(_kind_of(source), column.kind):
                return None
            values.append(mysql_value(column, _quote(column.name)))
        key = _quote(plan.key)
        bound = f"WHERE {key} > {int(after)}" if after is not None else ""
        sql = (f"SELECT count(*), coalesce(sum(h), 0), max(k) FROM (SELECT {key} AS k, {mysql_hash(values)} AS h "
               f"FROM {_quote(schema.id.db)}.{_quote(schema.id.table)} {bound} ORDER BY {key} LIMIT {int(limit)}) s")
        try:
            self.conn.ping()
            with self.conn.cursor() as cur:
                cur.execute(sql)
                row = cur.fetchone()
            file, pos = current_position(self.control)  # after the read: every change it shows is before
        except pymysql.Error as err:
            raise wrap(err, f"source {self.cfg.name}: digesting rows of {table} after {after} to verify") from err
        if row is None:
            raise pymysql.err.InterfaceError("the server answered no row")
        last = None if row[2] is None else int(row[2])
        return SourceDigest(Digest(int(row[0]), int(row[1])), last, MySqlPosition(file, pos))

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


def _kind_of(column: ColumnType | None) -> Kind | None:
    """The digest kind a column of this type holds (None: it takes no digest)."""
    if column is None or column.json or column.binary:
        return None
    kind = _KINDS.get(column.data_type)
    if kind is Kind.INTEGER and column.column_type.startswith("tinyint(1)"):
        return None  # a boolean to some stores, a number to others
    return kind


_KINDS = {**dict.fromkeys(("tinyint", "smallint", "mediumint", "int", "bigint"), Kind.INTEGER),
          "decimal": Kind.DECIMAL, "date": Kind.DATE, "datetime": Kind.TIMESTAMP, "timestamp": Kind.INSTANT,
          **dict.fromkeys(("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum"), Kind.TEXT)}
