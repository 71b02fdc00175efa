"""What the source looks up in the catalog while it runs: tables it meets in the stream, the
names and converters of types, the values that ADD COLUMN left unlogged.

Threading: the source's thread, except ``converters_for``, which snapshot readers call from
theirs: while ``in_snapshot()`` it reads the catalog on a connection of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg2

from cdc.events import TableId
from sources.postgres.catalog import ColumnMeta, TableMeta, matches, schema_of, table_meta
from sources.postgres.config import PostgresConfig
from sources.postgres.errors import wrap
from sources.postgres.types import converter_for, load_type_catalog

log = logging.getLogger(__name__)


def array_element(text: str) -> str | None:
    """The one element of a PostgreSQL array's text (``{0}``, ``{"a, b"}``, ``{NULL}``), or None."""
    inner = text[1:-1]
    if inner == "NULL":
        return None
    if inner.startswith('"'):
        out, escaped = [], False
        for char in inner[1:-1]:
            if escaped or char != "\\":
                out.append(char)
                escaped = False
            else:
                escaped = True
        return "".join(out)
    return inner


class CatalogLookup:
    def __init__(self, config: PostgresConfig, conn, database: str, tables: dict[int, TableMeta], dsn: str,
                 options: str, in_snapshot: Callable[[], bool], phase: Callable[[], str]) -> None:
        self.cfg, self.conn, self.database, self.tables = config, conn, database, tables
        self.dsn, self.options, self.in_snapshot, self.phase = dsn, options, in_snapshot, phase
        self.types: dict[int, Any] = {}
        self.extra_tables: dict[int, TableMeta] = {}  # streamed but not captured (the signal table)
        self.converters: dict[int, Callable[[str], Any]] = {}
        self._type_names: dict[tuple[int, int], str] = {}

    def table(self, oid: int) -> TableMeta | None:
        meta = self.tables.get(oid) or self.extra_tables.get(oid)
        if meta is None:
            try:
                candidate = table_meta(self.conn, oid, self.database, self.cfg.key_columns)
            except psycopg2.Error as err:
                raise wrap(err, f"reading the catalog entry of relation {oid}") from err
            if not matches(schema_of(candidate.id), candidate.id.table, self.cfg.tables):
                return None
            log.info("new table in the publication: %s", candidate.id,
                     extra={"connector": self.cfg.name, "phase": self.phase()})
            meta = self.tables[oid] = candidate
        return meta

    def gone_table(self, message) -> TableMeta | None:
        """A captured table dropped since the changes being streamed were written: its meta from
        the Relation message itself (its key: the replica identity's columns, or the configured
        key_columns), so its last changes are captured in their own shape rather than stopping the
        source."""
        if not matches(message.namespace, message.name, self.cfg.tables):
            return None
        columns = tuple(ColumnMeta(c.name, c.type_oid, self.type_name(c.type_oid, c.type_modifier), False)
                        for c in message.columns)
        key = tuple(self.cfg.key_columns.get(f"{message.namespace}.{message.name}") or
                    (c.name for c in message.columns if c.is_key))
        log.info("table %s.%s (oid %d) was dropped after changes still to stream; they are read in its last "
                 "shape", message.namespace, message.name, message.oid,
                 extra={"connector": self.cfg.name, "phase": self.phase()})
        meta = TableMeta(message.oid, TableId(self.database, message.namespace, message.name), columns, key,
                         message.replica_identity)
        self.tables[message.oid] = meta
        return meta

    def filled(self, oid: int, names: list[str]) -> dict[str, Any]:
        """The values that rows existing before columns ``names`` were added got without being
        logged: PostgreSQL keeps a constant default of ADD COLUMN as the column's "missing value"
        (``attmissingval``) instead of rewriting the table. From the catalog as it is now, so a
        later rewrite of the table (which clears it) loses it: then the sink is not told."""
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT attname, atttypid, attmissingval::text FROM pg_attribute WHERE attrelid = %s "
                            "AND atthasmissing AND NOT attisdropped AND attname = ANY(%s)", (oid, names))
                found = cur.fetchall()
            self.conn.rollback()
        except psycopg2.Error as err:
            raise wrap(err, f"reading the missing values of relation {oid}") from err
        filled = {}
        for name, type_oid, text in found:
            element = array_element(text)
            if element is not None:
                filled[name] = self.converters_for([type_oid])[0](element)
        return filled

    def attnums(self, oid: int) -> dict[str, int]:
        """Column name -> attnum of relation ``oid``'s live columns, from the catalog as it is now."""
        return self.all_attnums([oid]).get(oid, {})

    def all_attnums(self, oids: list[int]) -> dict[int, dict[str, int]]:
        """``attnums`` of several relations at once (at start: the captured tables as they are)."""
        found: dict[int, dict[str, int]] = {}
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT attrelid::bigint, attname, attnum FROM pg_attribute WHERE attrelid = ANY(%s::oid[]) "
                            "AND attnum > 0 AND NOT attisdropped", (list(oids),))
                for oid, name, attnum in cur.fetchall():
                    found.setdefault(oid, {})[name] = attnum
            self.conn.rollback()
        except psycopg2.Error as err:
            raise wrap(err, f"reading the columns of relations {oids}") from err
        return found

    def type_name(self, oid: int, modifier: int) -> str:
        name = self._type_names.get((oid, modifier))
        if name is None:
            try:
                with self.conn.cursor() as cur:
                    cur.execute("SELECT format_type(%s, %s)", (oid, modifier if modifier >= 0 else None))
                    name = self._type_names[(oid, modifier)] = cur.fetchone()[0]
                self.conn.rollback()
            except psycopg2.Error as err:
                raise wrap(err, f"naming type {oid}") from err
        return name

    def converters_for(self, oids: list[int]) -> list[Callable[[str], Any]]:
        missing = [o for o in oids if o not in self.converters]
        if missing:
            conn = psycopg2.connect(self.dsn, options=self.options) if self.in_snapshot() else self.conn
            try:
                self.types.update(load_type_catalog(conn, [o for o in missing if o not in self.types]))
                conn.rollback()
            finally:
                if conn is not self.conn:
                    conn.close()
            for oid in missing:
                self.converters[oid] = converter_for(oid, self.types)
        return [self.converters[o] for o in oids]

    def forget_type(self, oid: int) -> None:
        """A Type message: the type may have changed (an enum gained a label)."""
        self.types.pop(oid, None)
        self.converters.pop(oid, None)
