"""MySQL/MariaDB errors of this source as the framework's typed errors: the classification by errno
is ``cdc.servers.mysql`` (shared with the SQL sink); what is added here is what only the source
knows: a 1236 from the binlog dump before any event means the stored position is gone."""

from __future__ import annotations

from cdc.api import servers
from cdc.errors import CdcError, PositionLostError, RetriableError

ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
DEFAULT_SETTING = "the source's url (or url_file)"


def wrap(exc: BaseException, what: str, *, reading_binlog: bool = False, setting: str = DEFAULT_SETTING,
         role: str | None = None) -> CdcError:
    """``reading_binlog``: the error came from the binlog dump before any event arrived, so 1236
    means the requested position is not on the server any more."""
    if isinstance(exc, CdcError):
        return exc
    if reading_binlog and servers.mysql.errno_of(exc) == ER_MASTER_FATAL_ERROR_READING_BINLOG:
        return PositionLostError(f"{what}: {servers.mysql.describe(exc)}; the binlog the stored position needs is "
                                 "gone (purged or reset). Recovery: take a new snapshot (snapshot: when_needed "
                                 "does this by itself)")
    if servers.mysql.errno_of(exc) is None:  # a socket or packet failure under the client: the link broke
        return RetriableError(f"{what}: {type(exc).__name__}: {exc}")
    return servers.mysql.wrap(exc, what, setting=setting, role=role)
