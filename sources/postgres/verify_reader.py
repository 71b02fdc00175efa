"""The PostgreSQL half of ``cdc verify`` (cdc.api.VerifiableSource): key ranges and single keys
of the captured tables, each read in a snapshot of its own at a known WAL position.

A read is one REPEATABLE READ, READ ONLY transaction on a connection of its own (no table lock
beyond the ACCESS SHARE every SELECT takes). Its first statement takes the snapshot and, in it,
``pg_current_wal_insert_lsn()``: a transaction inserts its commit record before it becomes
visible, so every transaction the snapshot sees has its changes and its commit below that LSN.
Not the write position (``pg_current_wal_lsn()``): under ``synchronous_commit = off`` a commit is
visible before its record is written, and a store that had applied the log up to the write
position could lack it. A change the snapshot does not see commits after it took the snapshot;
its commit record may be below the LSN still (inserted, not yet visible), which costs verify a
look, never a false report. The rows go through the incremental snapshot's reader
(incremental.read_chunk), so they are the events the source would publish for them.

Large values (TOAST) the reader would remember go to a store of its own in a temporary folder,
never the running source's.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2

from cdc.api import SourceRead, TableReader, captured_table, servers
from cdc.api.digest import (
    POSTGRES_SETTINGS,
    RECORD_DIGESTS,
    Digest,
    DigestingReader,
    DigestPlan,
    Kind,
    SourceDigest,
    postgres_hash,
    postgres_record_hash,
    postgres_value,
    renders_into,
)
from cdc.positions import PgLsn
from sources.postgres.catalog import TableMeta, captured_tables, quoted_name
from sources.postgres.config import PostgresConfig
from sources.postgres.deadline import with_connect_timeout
from sources.postgres.errors import wrap
from sources.postgres.incremental import read_chunk, signal_table_id
from sources.postgres.lookup import CatalogLookup
from sources.postgres.snapshot import quote_ident
from sources.postgres.toast import ToastStore
from sources.postgres.types import session_options

log = logging.getLogger(__name__)


class PgTableReader(TableReader, DigestingReader):
    database = "postgresql"  # 14 or later (record digests); else "postgresql<14"

    def __init__(self, config: PostgresConfig) -> None:
        self.cfg = config
        self.setting = servers.setting_of("source", config.name, "dsn")
        dsn = with_connect_timeout(config.dsn.get_secret_value(), config.server_timeout)
        options = session_options()
        self.conn = servers.postgres.connect(dsn, what=f"source {config.name}: connecting to verify",
                                             setting=self.setting, options=options,
                                             application_name=f"cdc-{config.name}-verify"[:63])
        self._scratch = tempfile.TemporaryDirectory(prefix="cdc-verify-")
        self.toast = ToastStore(Path(self._scratch.name) / "toast.db")
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT current_database(), current_setting('server_version_num')::int")
                database, version = cur.fetchone() or (None, 0)
            if version < RECORD_DIGESTS:
                self.database = "postgresql<14"
            self.conn.rollback()
            signals = signal_table_id(config.signal_table, database) if config.signal_table else None
            found = [t for t in captured_tables(self.conn, config.tables, database, config.key_columns)
                     if t.id != signals]
            self.conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        except psycopg2.Error as err:
            self.close()
            raise wrap(err, f"source {config.name}: reading the catalog to verify", setting=self.setting) from err
        self._tables: dict[str, TableMeta] = {str(t.id): t for t in found}
        self.lookup = CatalogLookup(config, self.conn, database, {t.oid: t for t in found}, dsn, options,
                                    in_snapshot=lambda: False, phase=lambda: "verify")

    def tables(self) -> list[str]:
        return sorted(self._tables)

    def read(self, table: str, after: tuple | None, limit: int) -> SourceRead:
        return self._read(table, after, limit, None, f"rows of {table} after {after}")

    def read_keys(self, table: str, keys: Sequence[dict[str, Any]]) -> SourceRead:
        if not keys:
            return SourceRead([], self._position())
        return self._read(table, None, len(keys), self.where_keys(table, keys), f"{len(keys)} keys of {table}")

    def where_keys(self, table: str, keys: Sequence[dict[str, Any]]) -> str:
        meta = self._meta(table)
        names = ", ".join(quote_ident(k) for k in meta.key)
        types = {c.name: c.type_name for c in meta.columns}
        with self.conn.cursor() as cur:
            values = ", ".join("(" + ", ".join(f"{cur.mogrify('%s', (_plain(key.get(k)),)).decode()}::{types[k]}"
                                               for k in meta.key) + ")" for key in keys)
        self.conn.rollback()
        return f"({names}) IN ({values})"

    def digest(self, table: str, plan: DigestPlan, after: int | None, limit: int) -> SourceDigest | None:
        """cdc.api.DigestingReader: the chunk's digest computed here (cdc/api/digest.py): into a
        PostgreSQL store, records cast to the store's column types; else canonical texts."""
        meta = self._meta(table)
        types = {c.name: c.type_name for c in meta.columns}
        if meta.key != (plan.key,) or _kind_of(types.get(plan.key)) is not Kind.INTEGER:
            return None
        records = plan.store == self.database == "postgresql"
        values = []
        for column in plan.columns:
            source_type = types.get(column.name)
            if source_type is None:
                return None
            name = quote_ident(column.name)
            if records:
                if column.kind not in (None, Kind.TEXT) and not renders_into(_kind_of(source_type), column.kind):
                    return None  # e.g. a text column the store keeps as bigint (schema_policy: ignore)
                values.append(_cast(name, source_type, column.sql_type or ""))
            elif renders_into(_kind_of(source_type), column.kind):
                values.append(postgres_value(column, name))
            else:
                return None
        key = quote_ident(plan.key)
        bound = f"WHERE {key} > {int(after)}" if after is not None else ""
        hashed = postgres_record_hash(values) if records else postgres_hash(values)
        sql = (f"SELECT count(*), coalesce(sum(h), 0), max(k) FROM (SELECT {key} AS k, {hashed} AS h "
               f"FROM {quoted_name(meta.id)} {bound} ORDER BY {key} LIMIT {int(limit)}) s")
        try:
            position = self._position(end=False)  # the snapshot the digest below shares
            with self.conn.cursor() as cur:
                if records:
                    cur.execute(POSTGRES_SETTINGS)
                cur.execute(sql)
                row = cur.fetchone()
            self.conn.rollback()
        except psycopg2.Error as err:
            self.conn.rollback()
            if records and _uncastable(err):  # a value the store's type cannot hold: its rows tell
                log.warning("verify: source %s cannot digest %s into the store's types (%s): comparing rows",
                            self.cfg.name, table, str(err).strip().splitlines()[0])
                return None
            raise wrap(err, f"source {self.cfg.name}: digesting rows of {table} after {after} to verify",
                       setting=self.setting) from err
        if row is None:
            raise psycopg2.InterfaceError("the server answered no row")
        return SourceDigest(Digest(int(row[0]), int(row[1])), None if row[2] is None else int(row[2]), position)

    def _read(self, table: str, after: tuple | None, limit: int, where: str | None, what: str) -> SourceRead:
        meta = self._meta(table)
        try:
            position = self._position(end=False)  # the snapshot the read below shares
            events = read_chunk(self.conn, self.lookup, self.toast, meta, after, limit, position.lsn, where)
        except psycopg2.Error as err:
            self.conn.rollback()
            raise wrap(err, f"source {self.cfg.name}: reading {what} to verify", setting=self.setting) from err
        return SourceRead(events, position)

    def _position(self, end: bool = True) -> PgLsn:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
            lsn = int(_one(cur.fetchone()))
        if end:
            self.conn.rollback()
        return PgLsn(lsn)

    def _meta(self, table: str) -> TableMeta:
        return captured_table(self.cfg.name, self._tables, table)

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            toast = getattr(self, "toast", None)
            if toast is not None:
                toast.close()
            self._scratch.cleanup()


def _cast(name: str, source_type: str, store_type: str) -> str:
    """A source column's value as the SQL sink stored it in a PostgreSQL column of ``store_type``
    (sinks/sql/types.py): JSON, arrays, hstore and ranges as jsonb; other types the store keeps
    as text as their text; the rest cast to the store's type (an exact numeric rounded to its
    scale, as the store did)."""
    if store_type == "jsonb":
        return f"{name}::jsonb" if source_type in ("json", "jsonb") else f"to_jsonb({name})"
    if store_type == "text":
        return f"{name}::text"
    if source_type == "real":  # the event carries its shortest text, which the store parsed as a double
        return f"{name}::text::{store_type}"
    return f"{name}::{store_type}"


def _uncastable(err: psycopg2.Error) -> bool:
    """A source value the cast to a store column's type refused: a data exception (class 22,
    e.g. invalid text for a uuid, a number out of range) or no cast between the two types."""
    code = err.pgcode or ""
    return code.startswith("22") or code in ("42804", "42846", "42883")


def _kind_of(type_name: str | None) -> Kind | None:
    """The digest kind a column of this type holds (None: it takes no digest)."""
    if type_name is None:
        return None
    base = type_name.split("(")[0].strip()
    if base.startswith("timestamp"):  # timestamp(3) with time zone
        return Kind.INSTANT if type_name.endswith("with time zone") else Kind.TIMESTAMP
    if base in ("smallint", "integer", "bigint"):
        return Kind.INTEGER
    if base == "numeric":
        return Kind.DECIMAL
    if base in ("text", "character varying"):
        return Kind.TEXT
    if base == "boolean":
        return Kind.BOOLEAN
    if base == "date":
        return Kind.DATE
    return None




def _plain(value: Any) -> Any:
    """A key value as psycopg2 binds it (json and arrays as their text)."""
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _one(row: tuple | None) -> Any:
    if row is None:
        raise psycopg2.InterfaceError("the server answered no row")
    return row[0]
