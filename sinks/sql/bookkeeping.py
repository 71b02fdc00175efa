"""The sink's own tables, kept in the target schema beside the data.

    cdc_sink_generations(sink, generation, state)   state: current | open | retired
    cdc_sink_tables(sink, generation, tbl, topic, columns, schema_version)
                                                   the tables a generation has, and the source
                                                   columns each follows (for schema evolution)
    cdc_sink_deletes(tbl, key_json, version, at)    deleted keys' versions (tbl: physical table)
    cdc_sink_state(tbl, truncated_before)          truncate watermarks (tbl: physical table)

Deletes and watermarks are per physical table (``orders__g2``), so dropping a generation drops
its memory with it, and a rebuild starts from a clean slate. ``cdc_sink_tables`` exists because
the target's own column types cannot say which source type a column was made for (varchar(10)
and varchar(20) are both TEXT here); schema evolution compares source types, and knows which
columns were only inferred from values.

On MySQL the deletes table keys on VARBINARY ``key_json``: InnoDB indexes at most 3072 bytes,
which TEXT cannot be indexed in and 4-byte characters would quarter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection

from sinks.sql.target import Target

GENERATIONS, TABLES, DELETES, STATE = "cdc_sink_generations", "cdc_sink_tables", "cdc_sink_deletes", "cdc_sink_state"
CURRENT, OPEN, RETIRED = "current", "open", "retired"


@dataclass(frozen=True, slots=True)
class SourceColumn:
    name: str
    type: str              # the source's type name, or the one inferred from values
    key: bool = False
    inferred: bool = False
    # Earlier names of the column (newest first): the source renamed it, and rows written before
    # that carry their value under such a name (see tables.py, "renamed columns").
    was: tuple[str, ...] = ()


@dataclass(slots=True)
class TableEntry:
    """A row of cdc_sink_tables."""

    name: str                             # the view readers use; the table is <name>__g<generation>
    generation: int
    topic: str
    columns: dict[str, SourceColumn]      # in table order, without the __cdc_ columns
    schema_version: int | None            # the schema record followed (None: inferred from values)

    @property
    def physical(self) -> str:
        return physical_name(self.name, self.generation)

    @property
    def key(self) -> list[str]:
        return [c.name for c in self.columns.values() if c.key]


def physical_name(name: str, generation: int) -> str:
    return f"{name}__g{generation}"


def metadata(target: Target) -> sa.MetaData:
    is_mysql = target.kind == "mysql"
    key_json = mysql.VARBINARY(2800) if is_mysql else sa.Text()
    meta = sa.MetaData(schema=target.schema)
    sa.Table(GENERATIONS, meta,
             sa.Column("sink", sa.String(200), primary_key=True),
             sa.Column("generation", sa.Integer, primary_key=True, autoincrement=False),
             sa.Column("state", sa.String(16), nullable=False))
    sa.Table(TABLES, meta,
             sa.Column("sink", sa.String(200), primary_key=True),
             sa.Column("generation", sa.Integer, primary_key=True, autoincrement=False),
             sa.Column("tbl", sa.String(200), primary_key=True),
             sa.Column("topic", sa.Text, nullable=False),
             sa.Column("columns", sa.Text, nullable=False),
             sa.Column("schema_version", sa.BigInteger))
    sa.Table(DELETES, meta,
             sa.Column("tbl", sa.String(64 if is_mysql else 255), primary_key=True),
             sa.Column("key_json", key_json, primary_key=True),
             sa.Column("version", sa.BigInteger, nullable=False),
             sa.Column("at", mysql.DATETIME(fsp=6) if is_mysql else sa.DateTime, nullable=False,
                       quote=True))  # "at": reserved in DuckDB
    sa.Table(STATE, meta,
             sa.Column("tbl", sa.String(255), primary_key=True),
             sa.Column("truncated_before", sa.BigInteger, nullable=False))
    return meta


class Bookkeeping:
    """Reads and writes the tables above on a caller's connection (in the caller's transaction)."""

    def __init__(self, target: Target, sink: str) -> None:
        self.target = target
        self.sink = sink
        self.meta = metadata(target)
        self.t = {name: self.meta.tables[f"{target.schema}.{name}" if target.schema else name]
                  for name in (GENERATIONS, TABLES, DELETES, STATE)}
        q = target.qualified
        self.remember_sql = target.upsert_sql(DELETES, ["tbl", "key_json", "version", "at"],
                                               ["tbl", "key_json"], guard="version")
        self.watermark_sql = target.upsert_sql(STATE, ["tbl", "truncated_before"], ["tbl"],
                                                guard="truncated_before")
        self._entry_sql = target.upsert_sql(TABLES, ["sink", "generation", "tbl", "topic", "columns",
                                                     "schema_version"], ["sink", "generation", "tbl"], None)
        self._state_sql = target.upsert_sql(GENERATIONS, ["sink", "generation", "state"],
                                            ["sink", "generation"], None)
        self.deletes_table = q(DELETES)

    def create(self, conn: Connection) -> None:
        self.target.create_schema(conn)
        self.meta.create_all(conn, checkfirst=True)

    # --- generations ----------------------------------------------------------------------------

    def current(self, conn: Connection, lock: str | None = None) -> int | None:
        """The generation readers see. ``lock="share"`` holds it until the transaction ends (a
        writer: a switch then waits for writes still going to the old generation);
        ``lock="update"`` is the switch's side. Only PostgreSQL and MySQL have row locks; a SQLite
        transaction here holds the database's write lock anyway (BEGIN IMMEDIATE)."""
        table = self.t[GENERATIONS]
        query = sa.select(table.c.generation).where(table.c.sink == self.sink, table.c.state == CURRENT)
        if lock and self.target.kind in ("postgresql", "mysql"):
            query = query.with_for_update(read=lock == "share")
        return conn.execute(query).scalar()

    def states(self, conn: Connection) -> dict[int, str]:
        table = self.t[GENERATIONS]
        rows = conn.execute(sa.select(table.c.generation, table.c.state).where(table.c.sink == self.sink))
        return dict(rows.all())

    def set_state(self, conn: Connection, generation: int, state: str) -> None:
        conn.exec_driver_sql(self._state_sql, (self.sink, generation, state))

    def forget_generation(self, conn: Connection, generation: int) -> None:
        table = self.t[GENERATIONS]
        conn.execute(sa.delete(table).where(table.c.sink == self.sink, table.c.generation == generation))

    # --- tables of a generation -----------------------------------------------------------------

    def entries(self, conn: Connection, generation: int) -> dict[str, TableEntry]:
        table = self.t[TABLES]
        rows = conn.execute(sa.select(table.c.tbl, table.c.topic, table.c.columns, table.c.schema_version)
                            .where(table.c.sink == self.sink, table.c.generation == generation))
        return {name: TableEntry(name, generation, topic, _columns(columns), version)
                for name, topic, columns, version in rows}

    def entry(self, conn: Connection, generation: int, name: str) -> TableEntry | None:
        table = self.t[TABLES]
        row = conn.execute(sa.select(table.c.topic, table.c.columns, table.c.schema_version)
                           .where(table.c.sink == self.sink, table.c.generation == generation,
                                  table.c.tbl == name)).first()
        if row is None:
            return None
        topic, columns, version = row
        return TableEntry(name, generation, topic, _columns(columns), version)

    def save_entry(self, conn: Connection, entry: TableEntry) -> None:
        columns = orjson.dumps([{"name": c.name, "type": c.type, "key": c.key, "inferred": c.inferred}
                                | ({"was": list(c.was)} if c.was else {}) for c in entry.columns.values()]).decode()
        conn.exec_driver_sql(self._entry_sql, (self.sink, entry.generation, entry.name, entry.topic,
                                               columns, entry.schema_version))

    def forget_entries(self, conn: Connection, generation: int, physical: Iterable[str]) -> None:
        table = self.t[TABLES]
        conn.execute(sa.delete(table).where(table.c.sink == self.sink, table.c.generation == generation))
        names = list(physical)
        if names:
            for name in (DELETES, STATE):
                conn.execute(sa.delete(self.t[name]).where(self.t[name].c.tbl.in_(names)))

    # --- deletes and truncates ------------------------------------------------------------------

    def remember_deletes(self, conn: Connection, tbl: str, deletes: list[tuple[str, int]], at: datetime) -> None:
        if deletes:
            conn.exec_driver_sql(self.remember_sql, [(tbl, key, version, at) for key, version in deletes])

    def deleted_versions(self, conn: Connection, tbl: str, keys: list[str]) -> dict[str, int]:
        """The remembered delete version of each of ``keys`` that has one."""
        table = self.t[DELETES]
        found: dict[str, int] = {}
        if not keys or conn.execute(sa.select(table.c.tbl).where(table.c.tbl == tbl).limit(1)).first() is None:
            return found
        binary = self.target.kind == "mysql"  # VARBINARY: compare bytes
        for start in range(0, len(keys), 500):
            chunk = [k.encode() for k in keys[start:start + 500]] if binary else keys[start:start + 500]
            rows = conn.execute(sa.select(table.c.key_json, table.c.version)
                                .where(table.c.tbl == tbl, table.c.key_json.in_(chunk)))
            for key, version in rows:
                found[key.decode() if isinstance(key, bytes) else key] = version
        return found

    def watermarks(self, conn: Connection, tbls: list[str]) -> dict[str, int]:
        table = self.t[STATE]
        rows = conn.execute(sa.select(table.c.tbl, table.c.truncated_before).where(table.c.tbl.in_(tbls)))
        return dict(rows.all())

    def raise_watermark(self, conn: Connection, tbl: str, version: int) -> None:
        conn.exec_driver_sql(self.watermark_sql, (tbl, version))

    def prune_deletes(self, conn: Connection, tbls: list[str], before: datetime) -> int:
        if not tbls:
            return 0
        table = self.t[DELETES]
        return conn.execute(sa.delete(table).where(table.c.tbl.in_(tbls), table.c.at < before)).rowcount


def _columns(text: str) -> dict[str, SourceColumn]:
    return {c["name"]: SourceColumn(**{**c, "was": tuple(c.get("was") or ())}) for c in orjson.loads(text)}
