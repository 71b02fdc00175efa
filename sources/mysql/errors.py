"""MySQL/MariaDB errors as the framework's typed errors, classified by errno, never by message."""

from __future__ import annotations

import pymysql

from cdc.errors import CdcError, PermanentError, PositionLostError, PrerequisiteError, RetriableError

# Client-side: the connection broke or never opened (CR_* codes), and server-side conditions
# that pass: too many connections, lock wait timeout, deadlock, query interrupted, shutdown.
_RETRIABLE = {2002, 2003, 2006, 2013, 2055, 1040, 1053, 1205, 1213, 1317, 1927, 1160, 1161}
_DENIED = {1044, 1045, 1142, 1143, 1227, 1370}  # access denied (db, user, table, column, privilege)
ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236


def errno_of(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def wrap(exc: BaseException, what: str, *, reading_binlog: bool = False) -> CdcError:
    """``reading_binlog``: the error came from the binlog dump before any event arrived, so 1236
    means the requested position is not on the server any more."""
    if isinstance(exc, CdcError):
        return exc
    code = errno_of(exc)
    detail = (str(exc.args[1]) if len(getattr(exc, "args", ())) > 1 else str(exc)) or type(exc).__name__
    message = f"{what}: {detail}" + (f" (errno {code})" if code else "")
    if code is None or code in _RETRIABLE or isinstance(exc, (ConnectionError, TimeoutError)):
        return RetriableError(message)
    if code in _DENIED:
        return PrerequisiteError(message + "; grant the privilege named (GRANT ... ON *.* TO <user>)")
    if code == ER_MASTER_FATAL_ERROR_READING_BINLOG and reading_binlog:
        return PositionLostError(message + "; the binlog the stored position needs is gone (purged or reset). "
                                 "Recovery: take a new snapshot (snapshot: when_needed does this by itself)")
    if isinstance(exc, pymysql.err.OperationalError) and code >= 2000:
        return RetriableError(message)
    return PermanentError(message)
