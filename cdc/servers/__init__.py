"""Database server errors, classified by their code: one module per server kind.

    postgres.py   SQLSTATE of psycopg2 errors; what libpq can tell when there is none (a
                  connection that never opened); the DSN checked before connecting
    mysql.py      MySQL/MariaDB errno of PyMySQL errors (client errors 2000-2999 included)

Sources and sinks both classify through these modules, so a code means the same everywhere. A
classification is a ``Kind``; ``as_error`` turns it into the framework's error tree (cdc/errors.py)
with a message that names what to change: ``setting`` names the config field ("the dsn (or
dsn_file) of source shop"), ``role`` the database user. Plugins may import this package (cdc.api
documents it). Nothing here looks at message text: the server's message is only passed on.
"""

from __future__ import annotations

from enum import StrEnum

from cdc.errors import CdcError, ConfigError, PermanentError, PrerequisiteError, RetriableError


class Kind(StrEnum):
    RETRIABLE = "retriable"    # the same call may succeed later: network, restart, lock, deadlock
    LOGIN = "login"            # the server refused the login: user, password, host rules
    NO_DATABASE = "no_database"  # the database named in the settings does not exist
    REFUSED = "refused"        # the server answered and refused the connection, without saying why
    SETTING = "setting"        # a connection option the client or server rejects
    PRIVILEGE = "privilege"    # logged in, but the role lacks a grant
    DATA = "data"              # a value that does not fit, a constraint
    PERMANENT = "permanent"    # anything else that a retry cannot fix


def setting_of(plugin: str, name: str, field: str) -> str:
    """How a message names the config field to change: a secret field also has its ``_file`` form."""
    return f"the {field} (or {field}_file) of {plugin} {name}"


def as_error(kind: Kind, message: str, *, setting: str, role: str | None = None) -> CdcError:
    """``message`` (what failed, with the server's words and code) as the error ``kind`` means,
    with the fix: the setting to change or the grant to make."""
    if kind is Kind.RETRIABLE:
        return RetriableError(message)
    if kind is Kind.LOGIN:
        return ConfigError(f"{message}; the server refused the login: correct the user or password in "
                           f"{setting}, or let the server admit {_who(role)} from this host")
    if kind is Kind.NO_DATABASE:
        return ConfigError(f"{message}; the database named in {setting} does not exist: correct the name, "
                           "or create the database")
    if kind is Kind.REFUSED:
        return ConfigError(f"{message}; correct the user, password or database name in {setting}, or let "
                           f"the server admit {_who(role)} from this host")
    if kind is Kind.SETTING:
        return ConfigError(f"{message}; correct the connection options in {setting}")
    if kind is Kind.PRIVILEGE:
        return PrerequisiteError(f"{message}; grant {_who(role)} the privilege this needs")
    return PermanentError(message)


def _who(role: str | None) -> str:
    return f"the role {role}" if role else "the role in the settings"
