"""The values pgoutput decodes to (``pgoutput.PgOutputDecoder``): one frozen message type per
message of the protocol, and the column values of a tuple.

Values: LSNs are ints, timestamps the raw int64 microseconds since 2000-01-01 UTC
(``pg_time_to_unix_ms`` converts). A tuple has one entry per column: ``None`` (NULL),
``UNCHANGED_TOAST`` (a TOASTed value the change did not touch: the server does not send it), ``str``
(text format) or ``bytes`` (binary format).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

PG_EPOCH_UNIX_MS: Final = 946_684_800_000  # 2000-01-01T00:00:00Z in Unix epoch milliseconds


def pg_time_to_unix_ms(time_us: int) -> int:
    """A pgoutput timestamp (µs since 2000-01-01 UTC) as milliseconds since 1970-01-01 UTC."""
    return time_us // 1000 + PG_EPOCH_UNIX_MS


class UnchangedToast:
    """The type of ``UNCHANGED_TOAST``: a column value the server did not send because it is
    TOASTed and the change did not modify it. Compare with ``is``; it survives pickling."""

    __slots__ = ()
    _instance: UnchangedToast | None = None

    def __new__(cls) -> UnchangedToast:
        if cls._instance is None:
            cls._instance = object.__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"  # pickles as a reference to the module attribute: stays a singleton


UNCHANGED_TOAST: Final = UnchangedToast()

TupleData = tuple[str | bytes | UnchangedToast | None, ...]


# --- transactions ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Begin:                       # 'B'
    final_lsn: int
    commit_time_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:                      # 'C'
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Origin:                      # 'O': the transaction was replayed from another node
    origin_lsn: int
    name: str


# --- schema and changes (xid is set inside a stream block only) ------------------------------

@dataclass(frozen=True, slots=True)
class Column:
    is_key: bool                   # part of the replica identity (every column under FULL)
    name: str
    type_oid: int
    type_modifier: int


@dataclass(frozen=True, slots=True)
class Relation:                    # 'R'
    xid: int | None
    oid: int
    namespace: str                 # "pg_catalog" where the protocol sends ""
    name: str
    replica_identity: str          # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:                        # 'Y': a non-built-in column type
    xid: int | None
    oid: int
    namespace: str
    name: str


# The per-row messages are NamedTuples, made with tuple.__new__ (pgoutput.py): one is decoded per
# change, and a frozen dataclass cost about 1 µs to construct, a tuple about 0.1 µs.


class Insert(NamedTuple):          # 'I'
    xid: int | None
    relation_oid: int
    new: TupleData


class Update(NamedTuple):          # 'U'
    xid: int | None
    relation_oid: int
    old_kind: str | None           # None (no old values), 'K' (old key only) or 'O' (whole old row)
    old: TupleData | None
    new: TupleData


class Delete(NamedTuple):          # 'D'
    xid: int | None
    relation_oid: int
    old_kind: str                  # 'K' or 'O'
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:                    # 'T'
    xid: int | None
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:                     # 'M': pg_logical_emit_message()
    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


# --- streaming (protocol 2+) -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StreamStart:                 # 'S'
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:                  # 'E'
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:                # 'c'
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:                 # 'A'; subxid == xid when the whole transaction aborted
    xid: int
    subxid: int
    abort_lsn: int | None = None   # protocol 4 with streaming 'parallel' only
    abort_time_us: int | None = None


# --- two-phase commit (protocol 3+) ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BeginPrepare:                # 'b'
    prepare_lsn: int
    end_lsn: int
    prepare_time_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class _PrepareFields:              # 'P' and 'p' carry the same fields; each keeps its own type
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare(_PrepareFields):     # 'P'
    pass


@dataclass(frozen=True, slots=True)
class CommitPrepared:              # 'K'
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:            # 'r'
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time_us: int
    rollback_time_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare(_PrepareFields):  # 'p': prepares a streamed transaction
    pass


PgOutputMessage = (Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate
                   | Message | StreamStart | StreamStop | StreamCommit | StreamAbort | BeginPrepare
                   | Prepare | CommitPrepared | RollbackPrepared | StreamPrepare)
