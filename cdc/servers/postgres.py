"""PostgreSQL errors by SQLSTATE, and connection failures by what libpq can tell.

On an open connection every server error carries a SQLSTATE (``err.pgcode``), classified by
``classify_code``. An error without one was raised by the client: an OperationalError or
InterfaceError there means the connection broke (retriable); other classes are client-side misuse.

Connecting is different: psycopg2 gives NO SQLSTATE for a connection that never opened, whatever
the cause (libpq keeps the server's code to itself), and a classification must not read the message
text. So ``connect`` decides in two steps, from things libpq reports as values:

1. Before connecting, the DSN is checked on the client (``dsn_problem``): ``parse_dsn`` refuses an
   unknown option or a malformed string, and the options with a fixed set of values (``sslmode``
   and its kin) are checked here, since libpq only checks them when it connects. Either is a
   ``ConfigError`` naming the option and the setting that holds it.
2. After a failed connect, libpq's ``PQping`` on the same DSN says whether the server answers at
   all. It is the function behind ``pg_isready`` and decides from the SQLSTATE it receives:
   no answer (refused, unreachable, timed out) -> retriable: the server or network is down;
   rejected (57P03: starting up, shutting down, in recovery) -> retriable: a restart is under way;
   options libpq cannot use -> ``ConfigError``; and an answer -> the server is up and refused this
   login (wrong password 28P01, no pg_hba.conf entry or no such role 28000, no such database
   3D000): a ``ConfigError`` naming the setting to change. A server that answers without SSL while
   the DSN demands it (sslmode=require and stricter) never answers an SSL attempt; a second ping
   with sslmode=disable tells that case apart as a setting to change.

Known limit: a server out of connections (53300, "too many clients") also answers and refuses, so
at connect time it is taken as permanent like a refused login; the message carries the server's
words so the operator sees which. On an open connection 53300 is retriable as usual.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from enum import IntEnum

import psycopg2
import psycopg2.extensions

from cdc.errors import CdcError
from cdc.servers import Kind, as_error

# SQLSTATE classes and codes: https://www.postgresql.org/docs/current/errcodes-appendix.html
_RETRIABLE_CLASSES = {"08", "53", "57"}   # connection exception, insufficient resources, operator intervention
_RETRIABLE_CODES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available
    "55006",  # object_in_use (a replication slot held by another process)
    "58000",  # system_error
    "58030",  # io_error
}
_LOGIN_CLASS = "28"                # invalid_authorization_specification, invalid_password
_NO_DATABASE = "3D000"             # invalid_catalog_name
_PRIVILEGE = "42501"               # insufficient_privilege
_DATA_CLASSES = {"22", "23"}       # data exception, integrity constraint violation

# libpq options whose values libpq checks only when it connects.
_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
}
_SSL_DEMANDED = ("require", "verify-ca", "verify-full")


def sqlstate(err: BaseException) -> str | None:
    return getattr(err, "pgcode", None)


def classify_code(code: str) -> Kind:
    if code in _RETRIABLE_CODES or code[:2] in _RETRIABLE_CLASSES:
        return Kind.RETRIABLE
    if code[:2] == _LOGIN_CLASS:
        return Kind.LOGIN
    if code == _NO_DATABASE:
        return Kind.NO_DATABASE
    if code == _PRIVILEGE:
        return Kind.PRIVILEGE
    if code[:2] in _DATA_CLASSES:
        return Kind.DATA
    return Kind.PERMANENT


def classify(err: BaseException) -> Kind:
    """A psycopg2 error raised on an open connection (see the module docstring for connecting)."""
    code = sqlstate(err)
    if code is not None:
        return classify_code(code)
    if isinstance(err, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return Kind.RETRIABLE  # raised by the client: the connection broke
    return Kind.PERMANENT


def describe(err: BaseException) -> str:
    """The error's first line and its SQLSTATE."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    code = sqlstate(err)
    return first + (f" (SQLSTATE {code})" if code else "")


def wrap(err: BaseException, what: str, *, setting: str, role: str | None = None) -> CdcError:
    """An error on an open connection as the framework's error that its SQLSTATE means."""
    return as_error(classify(err), f"{what}: {describe(err)}", setting=setting, role=role)


# --- before and after connecting -------------------------------------------------------------------

def dsn_problem(dsn: str) -> str | None:
    """What is wrong with ``dsn`` as libpq will see it, or None."""
    try:
        options = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as err:
        return str(err).strip()  # libpq's words name the option: 'invalid connection option "foo"'
    for option, choices in _CHOICES.items():
        value = options.get(option)
        if value is not None and value not in choices:
            return f"{option}={value!r} is not one of {', '.join(choices)}"
    return None


class Ping(IntEnum):
    """libpq's PGPing."""
    OK = 0            # the server answered (and maybe refused us)
    REJECT = 1        # the server is up but accepts no connections now (57P03)
    NO_RESPONSE = 2   # nothing answered
    NO_ATTEMPT = 3    # the options are unusable: no attempt was made
    UNKNOWN = -1      # no libpq to ask: the system has none (apt's libpq5)


def _pq_ping():
    # psycopg2 does not wrap PQping. It takes only a conninfo string and shares no state with any
    # connection, so the system's libpq serves, whichever libpq psycopg2 itself runs on.
    name = ctypes.util.find_library("pq")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).PQping
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_char_p], ctypes.c_int
    return function


_PQPING = _pq_ping()


def ping(dsn: str) -> Ping:
    if _PQPING is None:
        return Ping.UNKNOWN
    try:
        options = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return Ping.NO_ATTEMPT
    if "connect_timeout" not in options:
        dsn = psycopg2.extensions.make_dsn(dsn, connect_timeout=10)
    return Ping(_PQPING(dsn.encode()))


def connect_failure(err: BaseException, dsn: str) -> tuple[Kind, str]:
    """Why a connection did not open, and a note for the message (see the module docstring)."""
    code = sqlstate(err)
    if code is not None:
        return classify_code(code), ""
    answer = ping(dsn)
    if answer is Ping.NO_RESPONSE:
        sslmode = psycopg2.extensions.parse_dsn(dsn).get("sslmode")  # parsed by ping already
        if sslmode in _SSL_DEMANDED and ping(psycopg2.extensions.make_dsn(dsn, sslmode="disable")) is Ping.OK:
            return Kind.SETTING, (f"the server answers without SSL, but not with sslmode={sslmode} (it has no "
                                  "SSL, or the sslrootcert/sslcert settings do not fit it)")
        return Kind.RETRIABLE, "the server does not answer"
    if answer is Ping.REJECT:
        return Kind.RETRIABLE, "the server accepts no connections now (starting up, shutting down or recovering)"
    if answer is Ping.NO_ATTEMPT:
        return Kind.SETTING, "libpq cannot use these connection options"
    if answer is Ping.OK:
        return Kind.REFUSED, "the server answers, and refused this connection"
    return Kind.RETRIABLE, "libpq's PQping is not available to tell more"


def role_of(dsn: str) -> str | None:
    try:
        return psycopg2.extensions.parse_dsn(dsn).get("user")
    except psycopg2.ProgrammingError:
        return None


def connect(dsn: str, *, what: str, setting: str, **kwargs) -> psycopg2.extensions.connection:
    """``psycopg2.connect(dsn, **kwargs)``, each failure as the framework's error that names the
    setting to change, or retriable when the server is down or restarting."""
    problem = dsn_problem(dsn)
    if problem is not None:
        raise as_error(Kind.SETTING, f"{what}: {problem}", setting=setting)
    try:
        return psycopg2.connect(dsn, **kwargs)
    except psycopg2.Error as err:
        kind, note = connect_failure(err, dsn)
        message = f"{what}: {describe(err)}" + (f" ({note})" if note else "")
        if kind is Kind.REFUSED:
            message += "; a server out of connections (too many clients) is refused the same way"
        raise as_error(kind, message, setting=setting, role=role_of(dsn)) from err
