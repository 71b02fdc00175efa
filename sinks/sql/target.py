"""One target database: its engine, session settings and the dialect-specific SQL the sink needs.

Four dialects, four sets of habits:

* PostgreSQL (psycopg2): transactional DDL; ``CREATE OR REPLACE VIEW`` only when columns are added
  at the end, otherwise DROP + CREATE VIEW in the same transaction.
* MySQL/MariaDB (pymysql): DDL commits implicitly, so the sink runs DDL before the data
  transaction (it is idempotent); views are swapped with one multi-table ``RENAME TABLE``, which
  is atomic. Sessions run in UTC, strict mode and READ COMMITTED (fewer gap-lock deadlocks).
* SQLite (sqlite3): the driver does not open a transaction before DDL by itself; every
  transaction here is ``BEGIN IMMEDIATE`` (DDL included), which also takes the write lock up front
  so two writers never deadlock upgrading a read lock.
* DuckDB (duckdb-engine): transactional DDL, ``CREATE OR REPLACE VIEW``.

``upsert_sql`` writes the single-row version-guarded upsert that the executemany path (MySQL,
SQLite) and the bookkeeping use: ``ON CONFLICT ... DO UPDATE ... WHERE x.guard < excluded.guard``,
or on MySQL ``ON DUPLICATE KEY UPDATE c = IF(VALUES(guard) > guard, VALUES(c), c)`` with the guard
assigned last (MySQL evaluates the assignments in order, each seeing the ones before).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url

from cdc.api import ConfigError
from sinks.sql.errors import DRIVER_ERRORS

T = TypeVar("T")

KINDS = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite", "duckdb": "duckdb"}


def normalize_url(url: str) -> sa.engine.URL:
    """The URL with a driver this project installs (``mysql://`` -> ``mysql+pymysql://``)."""
    parsed = make_url(url)
    if parsed.drivername in ("mysql", "mariadb"):
        parsed = parsed.set(drivername=f"{parsed.drivername}+pymysql")
    elif parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed


class Target:
    """The engine and SQL of one target; thread-safe as SQLAlchemy engines are."""

    def __init__(self, url: str, schema: str | None, application_name: str, connect_timeout: int = 15) -> None:
        parsed = normalize_url(url)
        kind = KINDS.get(parsed.get_backend_name())
        if kind is None:
            raise ConfigError(f"sql sink: unsupported database {parsed.get_backend_name()!r}; "
                              f"use postgresql, mysql/mariadb, sqlite or duckdb")
        if kind == "sqlite" and schema:
            raise ConfigError("sql sink: SQLite has no schemas; leave `schema` unset")
        if kind == "mysql" and not (schema or parsed.database):
            raise ConfigError("sql sink: name the MySQL database in the URL or in `schema`")
        self.kind = kind
        self.schema = schema
        self.engine = _engine(parsed, kind, application_name, connect_timeout)
        self.dialect = self.engine.dialect
        # Always quoted: a source column may be a reserved word of some dialect (DuckDB's "at").
        self.quote = self.dialect.identifier_preparer.quote_identifier
        self.param = "?" if kind in ("sqlite", "duckdb") else "%s"

    @property
    def mariadb(self) -> bool:
        return bool(getattr(self.dialect, "is_mariadb", False))

    def qualified(self, name: str) -> str:
        return f"{self.quote(self.schema)}.{self.quote(name)}" if self.schema else self.quote(name)

    def max_identifier(self) -> int:
        return {"postgresql": 63, "mysql": 64}.get(self.kind, 1000)

    # --- DDL ------------------------------------------------------------------------------------

    def run_ddl(self, work: Callable[[Connection], T]) -> T:
        """``work(conn)`` in a transaction of its own, once more if it fails: two sink processes
        doing the same idempotent DDL at the same moment can collide (PostgreSQL then reports a
        duplicate in its catalog); the second attempt finds the work done."""
        try:
            with self.engine.begin() as conn:
                return work(conn)
        except DRIVER_ERRORS:
            with self.engine.begin() as conn:
                return work(conn)

    def create_schema(self, conn: Connection) -> None:
        if not self.schema:
            return
        if self.kind == "mysql":
            conn.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS {self.quote(self.schema)}")
        else:
            conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {self.quote(self.schema)}")

    def columns_of(self, conn: Connection, table: str) -> list[str] | None:
        """The table's column names, or None if there is no such table."""
        # Not SQLAlchemy's inspector: duckdb-engine's reflection queries PostgreSQL catalogs.
        if self.kind == "sqlite":
            names = [row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({self.quote(table)})")]
        else:
            here = "DATABASE()" if self.kind == "mysql" else "current_schema()"
            schema = self.param if self.schema else here
            names = [row[0] for row in conn.exec_driver_sql(
                f"SELECT column_name FROM information_schema.columns WHERE table_schema = {schema} "
                f"AND table_name = {self.param} ORDER BY ordinal_position",
                (self.schema, table) if self.schema else (table,))]
        return names or None

    def create_table(self, conn: Connection, table: str, columns: list[tuple[str, sa.types.TypeEngine]],
                     key: list[str], extra: list[sa.Column]) -> None:
        """CREATE TABLE IF NOT EXISTS: the columns (all nullable but the key), then ``extra``."""
        metadata = sa.MetaData(schema=self.schema)
        sa.Table(table, metadata,
                 *[sa.Column(name, type_, primary_key=name in key, nullable=name not in key,
                             autoincrement=False, quote=True) for name, type_ in columns],
                 *extra, quote=True)
        metadata.create_all(conn, checkfirst=True)

    def add_column(self, conn: Connection, table: str, name: str, type_: sa.types.TypeEngine) -> None:
        conn.exec_driver_sql(f"ALTER TABLE {self.qualified(table)} ADD COLUMN {self.quote(name)} "
                             f"{type_.compile(dialect=self.dialect)}")

    def change_column_type(self, conn: Connection, table: str, name: str, type_: sa.types.TypeEngine,
                           view: str | None) -> None:
        """Change a (non-key) column's type in place, converting the values it holds (only asked
        for widenings, see evolve.widens). PostgreSQL refuses while a view uses the column: the
        view (``view``, when it shows this table) goes first, in the same transaction, and the
        caller points it again; readers wait on the lock meanwhile and never miss it."""
        column, sql_type = self.quote(name), type_.compile(dialect=self.dialect)
        if self.kind == "mysql":
            conn.exec_driver_sql(f"ALTER TABLE {self.qualified(table)} MODIFY COLUMN {column} {sql_type} NULL")
            return
        if self.kind == "postgresql":
            if view is not None:
                conn.exec_driver_sql(f"DROP VIEW IF EXISTS {self.qualified(view)}")
            conn.exec_driver_sql(f"ALTER TABLE {self.qualified(table)} ALTER COLUMN {column} TYPE {sql_type} "
                                 f"USING {column}::{sql_type}")
            return
        conn.exec_driver_sql(f"ALTER TABLE {self.qualified(table)} ALTER COLUMN {column} TYPE {sql_type}")

    def lock_view(self, conn: Connection, view: str) -> None:
        """PostgreSQL: take ``view`` (and through it its table) before DDL on the table. A reader
        locks a view before the table behind it; DDL that locked the table first and then
        replaces the view waits for such a reader while the reader waits for it: a deadlock that
        PostgreSQL ends by failing one of them, perhaps the reader's query."""
        if self.kind != "postgresql":
            return
        if conn.exec_driver_sql("SELECT to_regclass(%s)", (self.qualified(view),)).scalar() is not None:
            conn.exec_driver_sql(f"LOCK TABLE {self.qualified(view)} IN ACCESS EXCLUSIVE MODE")

    def rename_column(self, conn: Connection, table: str, old: str, new: str, view: str | None) -> None:
        """Rename a column in place, its values kept. PostgreSQL keeps a view's column names, so
        the view (``view``, when it shows this table) goes first and the caller points it again,
        in the same transaction (readers wait on the lock). MySQL/MariaDB commit the DDL at once:
        its view names the old column until the caller points it again a moment later."""
        if self.kind == "postgresql" and view is not None:
            conn.exec_driver_sql(f"DROP VIEW IF EXISTS {self.qualified(view)}")
        conn.exec_driver_sql(f"ALTER TABLE {self.qualified(table)} RENAME COLUMN {self.quote(old)} TO {self.quote(new)}")

    def drop_table(self, conn: Connection, table: str) -> None:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {self.qualified(table)}")

    def point_view(self, conn: Connection, view: str, table: str) -> None:
        """Make ``view`` show ``table`` (``SELECT *``, expanded now: call again after ADD COLUMN)."""
        body = f"SELECT * FROM {self.qualified(table)}"
        if self.kind == "postgresql":
            try:
                with conn.begin_nested():
                    conn.exec_driver_sql(f"CREATE OR REPLACE VIEW {self.qualified(view)} AS {body}")
                return
            except sa.exc.DBAPIError:  # columns not just appended: replace the view instead
                conn.exec_driver_sql(f"DROP VIEW IF EXISTS {self.qualified(view)}")
        elif self.kind == "sqlite":
            conn.exec_driver_sql(f"DROP VIEW IF EXISTS {self.qualified(view)}")
        conn.exec_driver_sql(f"{'CREATE' if self.kind in ('postgresql', 'sqlite') else 'CREATE OR REPLACE'}"
                             f" VIEW {self.qualified(view)} AS {body}")

    def switch_views(self, conn: Connection, views: dict[str, str]) -> None:
        """Point every view of ``views`` (view -> table) at its table, all at once for readers.

        PostgreSQL, SQLite, DuckDB: in the caller's transaction. MySQL: new views under scratch
        names, then one ``RENAME TABLE`` that swaps them all in (atomic), then the old ones go.
        """
        if self.kind != "mysql":
            for view, table in views.items():
                self.point_view(conn, view, table)
            return
        existing = set(sa.inspect(conn).get_view_names(schema=self.schema))
        renames, retired = [], []
        for view, table in views.items():
            if view not in existing:
                conn.exec_driver_sql(f"CREATE OR REPLACE VIEW {self.qualified(view)} AS "
                                     f"SELECT * FROM {self.qualified(table)}")
                continue
            tag = hashlib.sha1(view.encode()).hexdigest()[:12]
            fresh, old = f"cdc_new_{tag}", f"cdc_old_{tag}"
            conn.exec_driver_sql(f"DROP VIEW IF EXISTS {self.qualified(old)}")
            conn.exec_driver_sql(f"CREATE OR REPLACE VIEW {self.qualified(fresh)} AS "
                                 f"SELECT * FROM {self.qualified(table)}")
            renames += [f"{self.qualified(view)} TO {self.qualified(old)}",
                        f"{self.qualified(fresh)} TO {self.qualified(view)}"]
            retired.append(old)
        if renames:
            conn.exec_driver_sql("RENAME TABLE " + ", ".join(renames))
        for old in retired:
            conn.exec_driver_sql(f"DROP VIEW IF EXISTS {self.qualified(old)}")

    # --- DML ------------------------------------------------------------------------------------

    def upsert_sql(self, table: str, columns: Iterable[str], key: Iterable[str], guard: str | None) -> str:
        """INSERT of one row of ``columns`` (placeholders in order) that updates the non-key
        columns of an existing row, only where its ``guard`` is older when a guard is given."""
        columns, key = list(columns), set(key)
        names = ", ".join(self.quote(c) for c in columns)
        values = ", ".join([self.param] * len(columns))
        head = f"INSERT INTO {self.qualified(table)} "
        updates = [c for c in columns if c not in key and c != guard] + ([guard] if guard else [])
        if self.kind == "mysql":
            q = self.quote
            if guard:
                g = q(guard)
                sets = [f"{q(c)} = IF(VALUES({g}) > {g}, VALUES({q(c)}), {q(c)})" for c in updates]
            else:
                sets = [f"{q(c)} = VALUES({q(c)})" for c in updates]
            if not sets:  # only key columns: nothing to update, but stay an upsert
                first = q(columns[0])
                sets = [f"{first} = {first}"]
            return f"{head}({names}) VALUES ({values}) ON DUPLICATE KEY UPDATE {', '.join(sets)}"
        conflict = ", ".join(self.quote(c) for c in columns if c in key)
        if not updates:
            return f"{head}AS x ({names}) VALUES ({values}) ON CONFLICT ({conflict}) DO NOTHING"
        assignments = ", ".join(f"{self.quote(c)} = excluded.{self.quote(c)}" for c in updates)
        where = f" WHERE x.{self.quote(guard)} < excluded.{self.quote(guard)}" if guard else ""
        return f"{head}AS x ({names}) VALUES ({values}) ON CONFLICT ({conflict}) DO UPDATE SET {assignments}{where}"


def _engine(url: sa.engine.URL, kind: str, application_name: str, connect_timeout: int) -> sa.engine.Engine:
    # A connect timeout unless the URL sets one: a server that accepts and never answers must not
    # hold a (re)connect for ever (see deadline.py for the writes themselves).
    if kind == "postgresql":
        args: dict = {"application_name": application_name[:63]}
        if "connect_timeout" not in url.query:
            args["connect_timeout"] = connect_timeout
        return sa.create_engine(url, pool_pre_ping=True, connect_args=args)
    if kind == "mysql":
        args = {"charset": "utf8mb4"}
        if "connect_timeout" not in url.query:
            args["connect_timeout"] = connect_timeout
        engine = sa.create_engine(url, pool_pre_ping=True, isolation_level="READ COMMITTED", connect_args=args)

        @event.listens_for(engine, "connect")
        def _session(dbapi_connection, _record):
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SET SESSION time_zone = '+00:00', "
                               "sql_mode = 'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'")
        return engine
    if kind == "sqlite":
        engine = sa.create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_connection, _record):
            dbapi_connection.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin_immediate(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        return engine
    return sa.create_engine(url)
