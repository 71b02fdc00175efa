"""Database errors to the framework's error tree, by error code and class, never by message text.

PostgreSQL and MySQL/MariaDB codes are classified by ``cdc.servers.postgres`` and
``cdc.servers.mysql``, the same modules the sources use, so a code means the same on both sides:
connection and restart errors, deadlocks, serialization failures and lock timeouts are retriable;
a refused login, a missing database or a bad connection option is a ``ConfigError`` naming the
sink's ``url``; a missing grant is a ``PrerequisiteError``; data errors (a value that does not fit
its column, a constraint) are permanent and ``is_data_error`` tells the sink to find the column and
key before it reports one. A PostgreSQL connection that never opened carries no SQLSTATE: libpq's
answer to a ping decides (see cdc/servers/postgres.py).

The embedded targets have no server and are classified here:

    SQLite      retriable: SQLITE_BUSY, SQLITE_LOCKED (primary result codes). Data: constraint/mismatch.
    DuckDB      retriable: TransactionException, IOException, ConnectionException, InterruptException.
                Data: ConversionException, ConstraintException, OutOfRangeException.
"""

from __future__ import annotations

import sqlite3

import sqlalchemy.exc
from sqlalchemy.engine import make_url

from cdc.api import CdcError, servers

Kind = servers.Kind
as_error = servers.as_error
mysql_errors, pg_errors = servers.mysql, servers.postgres

DRIVER_ERRORS: tuple[type[BaseException], ...] = (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, OSError)
for _module, _name in (("psycopg2", "Error"), ("pymysql", "Error"), ("duckdb", "Error")):
    try:
        DRIVER_ERRORS += (getattr(__import__(_module), _name),)
    except ImportError:  # an optional driver that is not installed cannot raise either
        pass

_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
_DUCKDB_RETRIABLE = ("TransactionException", "IOException", "ConnectionException", "InterruptException")
_DUCKDB_DATA = ("ConversionException", "ConstraintException", "OutOfRangeException")


def _driver_error(err: BaseException) -> BaseException:
    return getattr(err, "orig", None) or err


def _is_psycopg2(err: BaseException) -> bool:
    return type(err).__module__.startswith("psycopg2")


def _duckdb_kind(err: BaseException) -> str | None:
    return type(err).__name__ if type(err).__module__.lstrip("_").startswith("duckdb") else None


def _connecting(err: BaseException) -> bool:
    """SQLAlchemy raised ``err`` while opening a connection (no statement was running)."""
    return isinstance(err, sqlalchemy.exc.DBAPIError) and err.statement is None


def _libpq_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def classify(err: BaseException, url: str | None = None) -> tuple[Kind, str]:
    """The kind of ``err`` and a note for its message. ``url``: the target's, to ask a PostgreSQL
    server that refused a connection without a code whether it answers at all."""
    if isinstance(err, sqlalchemy.exc.DBAPIError) and err.connection_invalidated:
        return Kind.RETRIABLE, ""
    if isinstance(err, (sqlalchemy.exc.DisconnectionError, sqlalchemy.exc.TimeoutError, ConnectionError)):
        return Kind.RETRIABLE, ""
    orig = _driver_error(err)
    if _is_psycopg2(orig):
        if pg_errors.sqlstate(orig) is None and _connecting(err) and url is not None:
            return pg_errors.connect_failure(orig, _libpq_dsn(url))
        return pg_errors.classify(orig), ""
    if mysql_errors.errno_of(orig) is not None:
        return mysql_errors.classify(orig), ""
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return Kind.RETRIABLE, ""
        return (Kind.DATA if isinstance(orig, (sqlite3.IntegrityError, sqlite3.DataError)) else Kind.PERMANENT), ""
    kind = _duckdb_kind(orig)
    if kind in _DUCKDB_RETRIABLE:
        return Kind.RETRIABLE, ""
    if kind in _DUCKDB_DATA:
        return Kind.DATA, ""
    return Kind.PERMANENT, ""


def is_retriable(err: BaseException) -> bool:
    return classify(err)[0] is Kind.RETRIABLE


def is_data_error(err: BaseException) -> bool:
    return classify(err)[0] is Kind.DATA


def describe(err: BaseException) -> str:
    """The driver's error with its code, without SQLAlchemy's statement dump."""
    orig = _driver_error(err)
    code = pg_errors.sqlstate(orig) or mysql_errors.errno_of(orig) or getattr(orig, "sqlite_errorname", None)
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return f"{type(orig).__name__}{f' [{code}]' if code else ''}: {text}"


def translate(err: BaseException, what: str, *, setting: str = "the sink's url (or url_file)",
              url: str | None = None, role: str | None = None) -> CdcError:
    """``err`` as the error its code means, saying what failed and which setting to change."""
    if isinstance(err, CdcError):
        return err
    kind, note = classify(err, url)
    return as_error(kind, f"{what}: {describe(err)}" + (f" ({note})" if note else ""), setting=setting, role=role)
