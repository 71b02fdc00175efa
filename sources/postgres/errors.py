"""PostgreSQL errors as the framework's typed errors, classified by SQLSTATE, never by message."""

from __future__ import annotations

import psycopg2

from cdc.errors import CdcError, PermanentError, PositionLostError, RetriableError

# SQLSTATE classes and codes after which the same call may succeed.
_RETRIABLE_CLASSES = ("08", "53", "57", "58")  # connection, resources, operator intervention, system
_RETRIABLE_CODES = {"40001", "40P01", "55P03", "55006"}  # serialization, deadlock, lock, object in use
_LOST_CODES = {"55000"}  # object_not_in_prerequisite_state: e.g. "can no longer get changes from slot"


def wrap(exc: psycopg2.Error, what: str, *, on_slot: bool = False) -> CdcError:
    """``on_slot``: the call read from the replication slot, so 55000 means its position is lost."""
    code = getattr(exc, "pgcode", None)
    detail = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    message = f"{what}: {detail}" + (f" (SQLSTATE {code})" if code else "")
    if code is None:  # no answer from a server: the connection broke or never opened
        return RetriableError(message)
    if code in _RETRIABLE_CODES or code[:2] in _RETRIABLE_CLASSES:
        return RetriableError(message)
    if code in _LOST_CODES and on_slot:
        return PositionLostError(message + "; the slot's position is gone: drop it and take a new snapshot "
                                 "(snapshot: when_needed does this by itself)")
    return PermanentError(message)
