"""MySQL/MariaDB errors by errno, for PyMySQL errors (``err.args[0]``).

Unlike libpq, the MySQL client reports every failure with a number, connecting included: the
server's ER_* codes (1000-1999, 3000+) and the client's CR_* codes (2000-2999: the connection
never opened or broke). So every case is decided by the number.
References: https://mariadb.com/kb/en/mariadb-error-codes/ and MySQL's server/client error references.
"""

from __future__ import annotations

from cdc.errors import CdcError
from cdc.servers import Kind, as_error

# Server codes after which the same call may succeed.
_RETRIABLE = {
    1040,  # ER_CON_COUNT_ERROR: too many connections
    1053,  # ER_SERVER_SHUTDOWN
    1152, 1153, 1154, 1155, 1156, 1157, 1158, 1159, 1160, 1161,  # aborted connection, network read/write
    1205,  # ER_LOCK_WAIT_TIMEOUT
    1213,  # ER_LOCK_DEADLOCK
    1317,  # ER_QUERY_INTERRUPTED
    1412,  # ER_TABLE_DEF_CHANGED: concurrent DDL
    1615,  # ER_NEED_REPREPARE: concurrent DDL
    1684,  # ER_WARN_I_S_SKIPPED_TABLE: concurrent DDL
    1927,  # ER_CONNECTION_KILLED (MariaDB)
    4031,  # ER_CLIENT_INTERACTION_TIMEOUT: disconnected for inactivity
}
_CLIENT = range(2000, 3000)  # CR_*: 2002/2003 cannot connect, 2006 gone away, 2013 lost, 2055 ...
_CLIENT_SETTING = {
    2059,  # CR_AUTH_PLUGIN_CANNOT_LOAD: the user's authentication plugin is not supported here
}
_LOGIN = {
    1045,  # ER_ACCESS_DENIED_ERROR: wrong user or password
    1129,  # ER_HOST_IS_BLOCKED: too many failed connects from this host (FLUSH HOSTS)
    1130,  # ER_HOST_NOT_PRIVILEGED: the user may not connect from this host
    1251,  # ER_NOT_SUPPORTED_AUTH_MODE
    1698,  # ER_ACCESS_DENIED_NO_PASSWORD_ERROR
}
_NO_DATABASE = {1049}  # ER_BAD_DB_ERROR
_PRIVILEGE = {
    1044,  # ER_DBACCESS_DENIED_ERROR
    1142,  # ER_TABLEACCESS_DENIED_ERROR
    1143,  # ER_COLUMNACCESS_DENIED_ERROR
    1227,  # ER_SPECIFIC_ACCESS_DENIED_ERROR (REPLICATION SLAVE, RELOAD, BINLOG MONITOR, ...)
    1370,  # ER_PROCACCESS_DENIED_ERROR
}
_DATA = {1048, 1062, 1264, 1265, 1292, 1366, 1406, 1411, 1452, 3140, 4025}


def errno_of(err: BaseException) -> int | None:
    """The error number of a PyMySQL error (None for anything else)."""
    args: tuple = getattr(err, "args", ())
    if type(err).__module__.startswith("pymysql") and args and isinstance(args[0], int):
        return args[0]
    return None


def classify_errno(errno: int) -> Kind:
    if errno in _CLIENT_SETTING:
        return Kind.SETTING
    if errno in _RETRIABLE or errno in _CLIENT:
        return Kind.RETRIABLE
    if errno in _LOGIN:
        return Kind.LOGIN
    if errno in _NO_DATABASE:
        return Kind.NO_DATABASE
    if errno in _PRIVILEGE:
        return Kind.PRIVILEGE
    if errno in _DATA:
        return Kind.DATA
    return Kind.PERMANENT


def classify(err: BaseException) -> Kind:
    errno = errno_of(err)
    if errno is not None:
        return classify_errno(errno)
    if isinstance(err, (ConnectionError, TimeoutError)):  # raised under PyMySQL by the socket
        return Kind.RETRIABLE
    return Kind.PERMANENT


def describe(err: BaseException) -> str:
    args: tuple = getattr(err, "args", ())
    text = str(args[1]) if len(args) > 1 else str(err)
    errno = errno_of(err)
    return (text.strip() or type(err).__name__) + (f" (errno {errno})" if errno is not None else "")


def wrap(err: BaseException, what: str, *, setting: str, role: str | None = None) -> CdcError:
    return as_error(classify(err), f"{what}: {describe(err)}", setting=setting, role=role)
