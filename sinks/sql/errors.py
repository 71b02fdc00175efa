"""Database errors to the framework's error tree, by error code and class, never by message text.

Retriable (the same write may succeed later): the connection failed or was lost, the server is
shutting down or out of connections, a deadlock, a serialization failure, a lock timeout, or
(SQLite/DuckDB) the database file is busy or a concurrent transaction conflicted.
Data errors (a value that does not fit its column, a constraint) are permanent; ``is_data_error``
tells the sink to find the column and key before it reports one. Everything else is permanent too.

    PostgreSQL  SQLSTATE classes 08 (connection), 53 (resources), 57 (operator intervention),
                40001, 40P01, 55P03; no SQLSTATE on an OperationalError/InterfaceError means the
                connection broke. Data: classes 22 and 23.
    MySQL       errno 1040 1053 1205 1213 1412 1615 1684 1927 4031 and every client error
                (2000-2999: 2002 2003 2006 2013 2055 ...). Data: 1048 1062 1264 1265 1292 1366 1406 1411 1452 3140 4025.
    SQLite      SQLITE_BUSY, SQLITE_LOCKED (primary result codes). Data: constraint/mismatch.
    DuckDB      TransactionException, IOException, ConnectionException, InterruptException.
                Data: ConversionException, ConstraintException, OutOfRangeException.
"""

from __future__ import annotations

import sqlite3

import sqlalchemy.exc

from cdc.api import CdcError, PermanentError, RetriableError

DRIVER_ERRORS: tuple[type[BaseException], ...] = (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, OSError)
for _module, _name in (("psycopg2", "Error"), ("pymysql", "Error"), ("duckdb", "Error")):
    try:
        DRIVER_ERRORS += (getattr(__import__(_module), _name),)
    except ImportError:  # an optional driver that is not installed cannot raise either
        pass

_PG_RETRIABLE_CLASSES = {"08", "53", "57"}
_PG_RETRIABLE = {"40001", "40P01", "55P03"}
_PG_DATA_CLASSES = {"22", "23"}
# 1412 table definition changed, 1615 re-prepare, 1684 skipped in information_schema: concurrent DDL
_MYSQL_RETRIABLE = {1040, 1053, 1205, 1213, 1412, 1615, 1684, 1927, 4031}
_MYSQL_DATA = {1048, 1062, 1264, 1265, 1292, 1366, 1406, 1411, 1452, 3140, 4025}
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def _driver_error(err: BaseException) -> BaseException:
    return getattr(err, "orig", None) or err


def _pg_code(err: BaseException) -> str | None:
    return getattr(err, "pgcode", None)


def _mysql_errno(err: BaseException) -> int | None:
    if type(err).__module__.startswith("pymysql") and err.args and isinstance(err.args[0], int):
        return err.args[0]
    return None


def _duckdb_kind(err: BaseException) -> str | None:
    return type(err).__name__ if type(err).__module__.lstrip("_").startswith("duckdb") else None


def is_retriable(err: BaseException) -> bool:
    if isinstance(err, sqlalchemy.exc.DBAPIError) and err.connection_invalidated:
        return True
    if isinstance(err, (sqlalchemy.exc.DisconnectionError, sqlalchemy.exc.TimeoutError, ConnectionError)):
        return True
    orig = _driver_error(err)
    if type(orig).__module__.startswith("psycopg2"):
        code = _pg_code(orig)
        if code is None:
            return type(orig).__name__ in ("OperationalError", "InterfaceError")
        return code[:2] in _PG_RETRIABLE_CLASSES or code in _PG_RETRIABLE
    errno = _mysql_errno(orig)
    if errno is not None:
        return errno in _MYSQL_RETRIABLE or 2000 <= errno < 3000
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    kind = _duckdb_kind(orig)
    if kind is not None:
        return kind in ("TransactionException", "IOException", "ConnectionException", "InterruptException")
    return False


def is_data_error(err: BaseException) -> bool:
    orig = _driver_error(err)
    code = _pg_code(orig)
    if code is not None:
        return code[:2] in _PG_DATA_CLASSES
    errno = _mysql_errno(orig)
    if errno is not None:
        return errno in _MYSQL_DATA
    if isinstance(orig, (sqlite3.IntegrityError, sqlite3.DataError)):
        return True
    return _duckdb_kind(orig) in ("ConversionException", "ConstraintException", "OutOfRangeException")


def describe(err: BaseException) -> str:
    """The driver's error with its code, without SQLAlchemy's statement dump."""
    orig = _driver_error(err)
    code = _pg_code(orig) or _mysql_errno(orig) or getattr(orig, "sqlite_errorname", None)
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return f"{type(orig).__name__}{f' [{code}]' if code else ''}: {text}"


def translate(err: BaseException, what: str) -> CdcError:
    """``err`` as a RetriableError or PermanentError that says what failed."""
    if isinstance(err, CdcError):
        return err
    cls = RetriableError if is_retriable(err) else PermanentError
    return cls(f"{what}: {describe(err)}")
