"""PostgreSQL errors of this source as the framework's typed errors: the classification by SQLSTATE
is ``cdc.servers.postgres`` (shared with the SQL sink); what is added here is what only the source
knows: a 55000 while reading the slot means the slot's position is gone, and an error without a
SQLSTATE on the replication connection means that connection broke (the server says nothing
when the network cuts it: psycopg2 then raises a bare ``DatabaseError`` such as "error with
status PGRES_COPY_BOTH and no message from the libpq", or "no COPY in progress"), which a new
connection may not meet again."""

from __future__ import annotations

from cdc.api import servers
from cdc.errors import CdcError, PositionLostError, RetriableError

_LOST = "55000"  # object_not_in_prerequisite_state: e.g. "can no longer get changes from slot"
DEFAULT_SETTING = "the source's dsn (or dsn_file)"


class SlotOverBudget(PositionLostError):
    """The slot held back more WAL than ``max_retained_wal`` and ``on_retained_wal: drop`` dropped
    it: its position is gone by decision, and a new snapshot (``snapshot: when_needed``) follows."""


def wrap(exc: BaseException, what: str, *, on_slot: bool = False, setting: str = DEFAULT_SETTING,
         role: str | None = None) -> CdcError:
    """``on_slot``: the call read from the replication slot, so 55000 means its position is lost."""
    if isinstance(exc, CdcError):
        return exc
    code = servers.postgres.sqlstate(exc)
    if on_slot and code == _LOST:
        return PositionLostError(f"{what}: {servers.postgres.describe(exc)}; the slot's position is gone: drop it and "
                                 "take a new snapshot (snapshot: when_needed does this by itself)")
    if on_slot and code is None:
        return RetriableError(f"{what}: {servers.postgres.describe(exc)}; the replication connection broke")
    return servers.postgres.wrap(exc, what, setting=setting, role=role)


def connect(dsn: str, what: str, *, setting: str = DEFAULT_SETTING, **kwargs):
    """A connection of this source, its failure classified as ``cdc.servers.postgres.connect`` does
    (a refused login or a missing replication line in pg_hba.conf is permanent; a server that is
    down or restarting is retriable)."""
    return servers.postgres.connect(dsn, what=what, setting=setting, **kwargs)
