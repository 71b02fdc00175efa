"""What the source needs to know from the catalog, and whether the server is set up for capture.

Every failed prerequisite raises ``PrerequisiteError`` with the fix, so a first run tells the
operator exactly what to change (wal_level, slots, privileges, keys).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from cdc.errors import PrerequisiteError
from cdc.events import TableId

SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")


@dataclass(frozen=True, slots=True)
class ColumnMeta:
    name: str
    type_oid: int
    type_name: str        # format_type(): "numeric(10,2)", "character varying(20)", "text[]"
    not_null: bool


@dataclass(slots=True)
class TableMeta:
    oid: int
    id: TableId
    columns: tuple[ColumnMeta, ...]
    key: tuple[str, ...]          # the event key: primary key, or configured key columns
    replica_identity: str         # d(efault) f(ull) i(ndex) n(othing)
    pages: int = 0                # relpages, for snapshot chunking (an estimate)
    extra: dict = field(default_factory=dict)


def _one(cur, sql: str, args: tuple = ()):
    cur.execute(sql, args)
    row = cur.fetchone()
    return row[0] if row else None


def check_server(conn) -> None:
    """wal_level, slot and sender limits, privileges, encoding: each with its fix."""
    with conn.cursor() as cur:
        if int(_one(cur, "SHOW server_version_num")) < 100000:
            raise PrerequisiteError("PostgreSQL 10 or newer is needed (pgoutput)")
        wal_level = _one(cur, "SHOW wal_level")
        if wal_level != "logical":
            raise PrerequisiteError(f"wal_level is {wal_level}; logical decoding needs wal_level=logical: "
                                    "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL")
        cur.execute("SELECT current_setting('max_replication_slots')::int, "
                    "(SELECT count(*) FROM pg_replication_slots), "
                    "current_setting('max_wal_senders')::int, "
                    "(SELECT count(*) FROM pg_stat_replication)")
        slots, used_slots, senders, used_senders = cur.fetchone()
        if slots == 0 or senders == 0:
            raise PrerequisiteError(f"max_replication_slots={slots}, max_wal_senders={senders}: both must be "
                                    "at least 1 (ALTER SYSTEM SET ...; restart)")
        if used_senders >= senders:
            raise PrerequisiteError(f"all {senders} WAL senders are in use (max_wal_senders): raise it "
                                    "(ALTER SYSTEM SET max_wal_senders = ...; restart)")
        cur.execute("SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user")
        if not cur.fetchone()[0]:
            raise PrerequisiteError("the role has no REPLICATION privilege: ALTER ROLE <role> WITH REPLICATION")
        encoding = _one(cur, "SHOW server_encoding")
        if encoding != "UTF8":
            raise PrerequisiteError(f"server_encoding is {encoding}; the source reads UTF8 text only")
        conn.rollback()
        # used_slots is only informative: our own slot may be among them.
        del used_slots


def check_free_slot(conn) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('max_replication_slots')::int, count(*) FROM pg_replication_slots")
        limit, used = cur.fetchone()
    conn.rollback()
    if used >= limit:
        raise PrerequisiteError(f"all {limit} replication slots are taken (max_replication_slots): drop an "
                                "unused one (SELECT pg_drop_replication_slot(...)) or raise the limit")


_TABLES_SQL = """
SELECT c.oid, n.nspname, c.relname, c.relreplident, c.relpages
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND n.nspname NOT LIKE 'pg_temp%%'
ORDER BY n.nspname, c.relname
"""

_COLUMNS_SQL = """
SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
"""

_PK_SQL = """
SELECT a.attname FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord
"""


def matches(schema: str, table: str, globs: list[str]) -> bool:
    name = f"{schema}.{table}"
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def table_meta(conn, oid: int, database: str, key_columns: dict[str, list[str]]) -> TableMeta:
    """The shape and key of one table (by oid). A table with no usable key is refused here."""
    with conn.cursor() as cur:
        cur.execute("SELECT n.nspname, c.relname, c.relreplident, c.relpages FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,))
        row = cur.fetchone()
        if row is None:
            raise PrerequisiteError(f"table with oid {oid} does not exist (dropped while capturing?)")
        schema, name, identity, pages = row
        cur.execute(_COLUMNS_SQL, (oid,))
        columns = tuple(ColumnMeta(*r) for r in cur.fetchall())
        cur.execute(_PK_SQL, (oid,))
        key = tuple(r[0] for r in cur.fetchall())
    conn.rollback()
    qualified = f"{schema}.{name}"
    if not key:
        configured = key_columns.get(qualified)
        if not configured:
            raise PrerequisiteError(
                f"table {qualified} has no primary key: add one, or give its event key in the source's "
                f"key_columns ({{'{qualified}': [col, ...]}}) and set REPLICA IDENTITY FULL on it")
        unknown = set(configured) - {c.name for c in columns}
        if unknown:
            raise PrerequisiteError(f"key_columns of {qualified} names unknown columns {sorted(unknown)}")
        if identity != "f":
            raise PrerequisiteError(f"table {qualified} has no primary key, so updates and deletes carry no "
                                    f"old key: ALTER TABLE {qualified} REPLICA IDENTITY FULL")
        key = tuple(configured)
    if identity == "n":
        raise PrerequisiteError(f"table {qualified} has REPLICA IDENTITY NOTHING: its updates and deletes "
                                f"cannot be captured (ALTER TABLE {qualified} REPLICA IDENTITY DEFAULT)")
    return TableMeta(oid, TableId(database, schema, name), columns, key, identity, max(pages, 0))


def captured_tables(conn, globs: list[str], database: str,
                    key_columns: dict[str, list[str]]) -> list[TableMeta]:
    with conn.cursor() as cur:
        cur.execute(_TABLES_SQL)
        rows = cur.fetchall()
    conn.rollback()
    return [table_meta(conn, oid, database, key_columns) for oid, schema, name, _, _ in rows
            if matches(schema, name, globs)]


def ensure_publication(conn, name: str, globs: list[str], tables: list[TableMeta], manage: bool) -> None:
    """The publication exists and covers ``tables``; ``schema.*`` globs publish the whole schema,
    so tables created later are captured too (PostgreSQL 15+)."""
    with conn.cursor() as cur:
        exists = _one(cur, "SELECT count(*) FROM pg_publication WHERE pubname = %s", (name,))
        version = int(_one(cur, "SHOW server_version_num"))
        schemas = sorted({g[:-2] for g in globs if g.endswith(".*") and "*" not in g[:-2]})
        whole_schemas = version >= 150000 and all(g.endswith(".*") and "*" not in g[:-2] for g in globs)
        if not exists:
            if not manage:
                raise PrerequisiteError(f"publication {name} does not exist (manage_publication is off): "
                                        f"CREATE PUBLICATION {name} FOR TABLE ...")
            if whole_schemas:
                cur.execute(f'CREATE PUBLICATION "{name}" FOR TABLES IN SCHEMA '
                            + ", ".join(f'"{s}"' for s in schemas))
            elif tables:
                cur.execute(f'CREATE PUBLICATION "{name}" FOR TABLE '
                            + ", ".join(f'"{t.id.schema}"."{t.id.table}"' for t in tables))
            else:
                raise PrerequisiteError(f"no table matches {globs}: nothing to capture")
        else:
            cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,))
            published = {(s, t) for s, t in cur.fetchall()}
            missing = [t for t in tables if (t.id.schema, t.id.table) not in published]
            if missing:
                if not manage:
                    raise PrerequisiteError(f"publication {name} lacks {[str(t.id) for t in missing]} "
                                            "(manage_publication is off): ALTER PUBLICATION ... ADD TABLE ...")
                cur.execute(f'ALTER PUBLICATION "{name}" ADD TABLE '
                            + ", ".join(f'"{t.id.schema}"."{t.id.table}"' for t in missing))
    conn.commit()
