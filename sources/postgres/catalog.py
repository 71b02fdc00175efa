"""What the source needs to know from the catalog, and whether the server is set up for capture.

Every failed prerequisite raises ``PrerequisiteError`` with the fix, so a first run tells the
operator exactly what to change (wal_level, slots, privileges, keys).
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field

from cdc.errors import PrerequisiteError
from cdc.events import TableId

log = logging.getLogger(__name__)

SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")


class TableGone(PrerequisiteError):
    """The relation is no longer in the catalog (dropped); its WAL may still hold changes."""


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
        cur.execute("SELECT current_user, rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user")
        role, may_replicate = cur.fetchone()
        if not may_replicate:
            raise PrerequisiteError(f"the role {role} has no REPLICATION privilege: ALTER ROLE {_ident(role)} "
                                    "WITH REPLICATION")
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
            raise TableGone(f"table with oid {oid} does not exist (dropped while capturing?)")
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


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def schema_of(table: TableId) -> str:
    """A PostgreSQL table's schema (a TableId has None there only for MySQL)."""
    schema = table.schema
    assert schema is not None, f"{table}: a PostgreSQL table without its schema"
    return schema


def quoted_name(table: TableId) -> str:
    """The table's ``"schema"."table"``, quoted for SQL text."""
    return f"{_ident(schema_of(table))}.{_ident(table.table)}"


def _table_list(tables: list[TableMeta]) -> str:
    return ", ".join(quoted_name(t.id) for t in tables)


def check_readable(conn, tables: list[TableMeta]) -> None:
    """The snapshot reads every captured table: the role needs SELECT on each."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_user, array_agg(c.oid) FILTER (WHERE NOT has_table_privilege(c.oid, 'SELECT')) "
                    "FROM pg_class c WHERE c.oid = ANY(%s::oid[])", ([t.oid for t in tables],))
        role, unreadable = cur.fetchone()
    conn.rollback()
    if unreadable:
        names = _table_list([t for t in tables if t.oid in set(unreadable)])
        raise PrerequisiteError(f"the role {role} may not read {names}, which the snapshot needs: "
                                f"GRANT SELECT ON {names} TO {_ident(role)}")


# The comment a publication this project created carries: `cdc drop` drops only those.
PUBLICATION_COMMENT = "created by cdc source {source}"


def ensure_publication(conn, name: str, globs: list[str], tables: list[TableMeta], manage: bool,
                       created_by: str | None = None) -> None:
    """The publication exists and covers ``tables``.

    ``schema.*`` globs (all of them) on PostgreSQL 15+ publish the whole schema, so tables created
    later are captured too; but ``FOR TABLES IN SCHEMA`` needs a superuser. A publication made here
    gets the comment ``PUBLICATION_COMMENT`` naming ``created_by``, so ``cdc drop`` knows it is ours. Any other role gets a
    publication ``FOR TABLE`` the matching tables, which PostgreSQL allows to the owner of each table
    with CREATE on the database; a table created later is added at the next start (its rows from
    before that are not in the stream). A missing grant is named with the statement that fixes it.
    """
    with conn.cursor() as cur:
        exists = _one(cur, "SELECT count(*) FROM pg_publication WHERE pubname = %s", (name,))
        version = int(_one(cur, "SHOW server_version_num"))
        cur.execute("SELECT current_user, rolsuper, has_database_privilege(current_database(), 'CREATE'), "
                    "current_database() FROM pg_roles WHERE rolname = current_user")
        role, superuser, may_create, database = cur.fetchone()
        schemas = sorted({g[:-2] for g in globs if g.endswith(".*") and "*" not in g[:-2]})
        whole_schemas = version >= 150000 and all(g.endswith(".*") and "*" not in g[:-2] for g in globs)
        if not exists:
            if not manage:
                raise PrerequisiteError(f"publication {name} does not exist (manage_publication is off): "
                                        f"CREATE PUBLICATION {_ident(name)} FOR TABLE ...")
            if not superuser and not may_create:
                raise PrerequisiteError(
                    f"the role {role} may not create the publication {name}: GRANT CREATE ON DATABASE "
                    f"{_ident(database)} TO {_ident(role)}, or let a table owner create it (CREATE PUBLICATION "
                    f"{_ident(name)} FOR TABLE ...) and set manage_publication: false")
            if whole_schemas and superuser:
                cur.execute(f"CREATE PUBLICATION {_ident(name)} FOR TABLES IN SCHEMA "
                            + ", ".join(_ident(s) for s in schemas))
            elif tables:
                _check_owned(cur, name, role, tables)
                if whole_schemas:
                    log.info("the role %s is not a superuser: publication %s lists the %d tables of %s; a table "
                             "created later is added at the next start", role, name, len(tables), globs)
                cur.execute(f"CREATE PUBLICATION {_ident(name)} FOR TABLE {_table_list(tables)}")
            else:
                raise PrerequisiteError(f"no table matches {globs}: nothing to capture")
            if created_by is not None:
                cur.execute(f"COMMENT ON PUBLICATION {_ident(name)} IS %s",
                            (PUBLICATION_COMMENT.format(source=created_by),))
        else:
            cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,))
            published = {(s, t) for s, t in cur.fetchall()}
            missing = [t for t in tables if (t.id.schema, t.id.table) not in published]
            if missing:
                if not manage:
                    raise PrerequisiteError(f"publication {name} lacks {_table_list(missing)} (manage_publication "
                                            f"is off): ALTER PUBLICATION {_ident(name)} ADD TABLE "
                                            f"{_table_list(missing)}")
                _check_owned(cur, name, role, missing)
                cur.execute(f"ALTER PUBLICATION {_ident(name)} ADD TABLE {_table_list(missing)}")
                log.warning("added %s to publication %s: they are streamed from now on; rows they got before "
                            "are captured only by a snapshot", _table_list(missing), name)
    conn.commit()


def _check_owned(cur, publication: str, role: str, tables: list[TableMeta]) -> None:
    """PostgreSQL adds a table to a publication only for its owner (or a member of the owning role)."""
    cur.execute("SELECT array_agg(c.oid) FILTER (WHERE NOT pg_has_role(c.relowner, 'USAGE')) "
                "FROM pg_class c WHERE c.oid = ANY(%s::oid[])", ([t.oid for t in tables],))
    foreign = set(cur.fetchone()[0] or ())
    if foreign:
        names = _table_list([t for t in tables if t.oid in foreign])
        raise PrerequisiteError(
            f"the role {role} does not own {names}, and only a table's owner may add it to publication "
            f"{publication}: ALTER TABLE ... OWNER TO {_ident(role)} for each (or GRANT the owning role to "
            f"{_ident(role)}), or let the owner run CREATE PUBLICATION {_ident(publication)} FOR TABLE {names} "
            "(ALTER PUBLICATION ... ADD TABLE for a new one) and set manage_publication: false")
