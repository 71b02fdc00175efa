"""Decode pgoutput, PostgreSQL's logical replication protocol, versions 1 to 4.

Implements https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
(the writer is ``src/backend/replication/logical/proto.c``). One payload (the data of one XLogData
message of the replication stream) decodes to one frozen message value.

Streaming rule: between Stream Start (``S``) and Stream Stop (``E``) the data messages (``R Y I U D T
M``) carry a 4-byte xid right after the type byte; elsewhere they do not. The xid is the one of the
(sub)transaction that made the change, so it may be a subtransaction of the streamed one: a Stream
Abort names both. ``PgOutputDecoder`` follows Stream Start/Stop to know which form it is reading and
puts the xid (or ``None``) on the message. Streamed transactions end *outside* the block with Stream
Commit (``c``), Stream Abort (``A``) or, with two-phase, Stream Prepare (``p``).

Values: LSNs are ints, timestamps the raw int64 microseconds since 2000-01-01 UTC
(``pg_time_to_unix_ms`` converts). A tuple has one entry per column: ``None`` (NULL),
``UNCHANGED_TOAST`` (a TOASTed value the change did not touch: the server does not send it), ``str``
(text format) or ``bytes`` (binary format). Any malformed payload raises ``DecodeError`` naming the
message type, the byte offset and what was expected there. The message types are in
``pgoutput_messages`` (re-exported here).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from cdc.errors import DecodeError
from sources.postgres.pgoutput_messages import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    UnchangedToast,
    Update,
    pg_time_to_unix_ms,
)

__all__ = [
    "UNCHANGED_TOAST", "Begin", "BeginPrepare", "Column", "Commit", "CommitPrepared", "Delete",
    "Insert", "Message", "Origin", "PgOutputDecoder", "PgOutputMessage", "Prepare", "Relation",
    "RollbackPrepared", "StreamAbort", "StreamCommit", "StreamPrepare", "StreamStart", "StreamStop",
    "Truncate", "TupleData", "Type", "UnchangedToast", "Update", "pg_time_to_unix_ms",
]

# The per-row messages are made without NamedTuple's __new__ (see pgoutput_messages).
_new = tuple.__new__

# --- errors ----------------------------------------------------------------------------------

_NAMES = {"B": "Begin", "C": "Commit", "O": "Origin", "R": "Relation", "Y": "Type", "I": "Insert",
          "U": "Update", "D": "Delete", "T": "Truncate", "M": "Message", "S": "Stream Start",
          "E": "Stream Stop", "c": "Stream Commit", "A": "Stream Abort", "b": "Begin Prepare",
          "P": "Prepare", "K": "Commit Prepared", "r": "Rollback Prepared", "p": "Stream Prepare"}


def _error(code: int, p: bytes, offset: int, expected: str, found: str | None = None) -> DecodeError:
    letter = chr(code)
    what = (f"{_NAMES[letter]} message ('{letter}')" if letter in _NAMES
            else f"message of unknown type 0x{code:02x}")
    if found is None:
        found = "but the payload ends there" if offset >= len(p) else f"found byte 0x{p[offset]:02x}"
    return DecodeError(f"pgoutput {what} at byte offset {offset}: expected {expected}, {found} "
                       f"(payload of {len(p)} bytes)")


def _short(code: int, p: bytes, pos: int, fields: tuple[tuple[str, int], ...]) -> DecodeError:
    """The error for fixed-size ``fields`` at ``pos`` that do not fit: names the first that does not."""
    for name, size in fields:
        if pos + size > len(p):
            return _error(code, p, pos, f"{name} ({size} byte{'s' if size > 1 else ''})",
                          f"but only {max(len(p) - pos, 0)} remain")
        pos += size
    raise AssertionError("fields fit")


def _take(st: struct.Struct, p: bytes, pos: int, code: int, fields: tuple[tuple[str, int], ...]) -> tuple:
    """``st`` unpacked at ``pos``, or the error naming the first of its ``fields`` that is cut off."""
    if pos + st.size > len(p):
        raise _short(code, p, pos, fields)
    return st.unpack_from(p, pos)


def _exact(st: struct.Struct, p: bytes, code: int, fields: tuple[tuple[str, int], ...]) -> tuple:
    """The fields of a fixed-size message: its type byte, then ``st``, then nothing."""
    values = _take(st, p, 1, code, fields)
    if len(p) != 1 + st.size:
        raise _trailing(code, p, 1 + st.size)
    return values


def _string(p: bytes, pos: int, code: int, what: str) -> tuple[str, int]:
    end = p.find(b"\0", pos)
    if end < 0:
        raise _error(code, p, pos, f"{what} (a NUL-terminated string)", "but no NUL byte follows")
    try:
        return p[pos:end].decode(), end + 1
    except UnicodeDecodeError as err:
        raise _error(code, p, pos + err.start, f"{what} in UTF-8") from None


def _trailing(code: int, p: bytes, pos: int) -> DecodeError:
    return _error(code, p, pos, "the end of the message", f"but {len(p) - pos} more bytes follow")


# --- data messages: (payload, offset after the type byte and optional xid, xid) -> message -----

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_COLUMN_TYPE = struct.Struct("!Ii")          # type OID, type modifier
_TRUNCATE = struct.Struct("!IB")             # relation count, options
_MESSAGE = struct.Struct("!BQ")              # flags, LSN

_OID = (("the relation OID", 4),)
_OID_KIND = (("the relation OID", 4), ("a tuple kind byte", 1))


def _tuple(p: bytes, pos: int, code: int) -> tuple[TupleData, int]:
    """Tuple data at ``pos``: (values, offset after it)."""
    size = len(p)
    if pos + 2 > size:
        raise _short(code, p, pos, (("the column count", 2),))
    ncols = p[pos] << 8 | p[pos + 1]
    pos += 2
    values: list = []
    append = values.append
    unpack_length = _U32.unpack_from
    left = ncols
    start = 0
    try:
        while left:  # one pass per column; a while loop is the cheapest loop here
            left -= 1
            kind = p[pos]
            if kind == 116:  # 't' text
                start = pos + 5
                pos = start + unpack_length(p, pos + 1)[0]
                if pos > size:
                    pos = start - 4
                    raise _error(code, p, pos, f"a length within the payload for column {ncols - left}",
                                 f"found {unpack_length(p, pos)[0]} with {size - start} bytes left")
                append(p[start:pos].decode())
            elif kind == 110:  # 'n' NULL
                append(None)
                pos += 1
            elif kind == 117:  # 'u' unchanged TOAST
                append(UNCHANGED_TOAST)
                pos += 1
            elif kind == 98:  # 'b' binary
                start = pos + 5
                pos = start + unpack_length(p, pos + 1)[0]
                if pos > size:
                    pos = start - 4
                    raise _error(code, p, pos, f"a length within the payload for column {ncols - left}",
                                 f"found {unpack_length(p, pos)[0]} with {size - start} bytes left")
                append(p[start:pos])
            else:
                raise _error(code, p, pos, f"the kind of column {ncols - left} of {ncols} (n, u, t or b)")
    except IndexError:
        raise _error(code, p, pos, f"the kind of column {ncols - left} of {ncols}") from None
    except struct.error:
        raise _short(code, p, pos + 1, ((f"the value length of column {ncols - left} of {ncols}", 4),)) from None
    except UnicodeDecodeError as err:
        raise _error(code, p, start + err.start, f"UTF-8 text in column {ncols - left} of {ncols}") from None
    return tuple(values), pos


def _insert(p: bytes, pos: int, xid: int | None) -> Insert:
    if pos + 5 > len(p):
        raise _short(73, p, pos, _OID_KIND)
    if p[pos + 4] != 78:  # 'N'
        raise _error(73, p, pos + 4, "'N' (a new tuple)")
    new, end = _tuple(p, pos + 5, 73)
    if end != len(p):
        raise _trailing(73, p, end)
    return _new(Insert, (xid, _U32.unpack_from(p, pos)[0], new))


def _update(p: bytes, pos: int, xid: int | None) -> Update:
    if pos + 5 > len(p):
        raise _short(85, p, pos, _OID_KIND)
    old_kind = old = None
    kind = p[pos + 4]
    end = pos + 5
    if kind == 75 or kind == 79:  # 'K' old key, 'O' old row
        old_kind = "K" if kind == 75 else "O"
        old, end = _tuple(p, end, 85)
        if end >= len(p):
            raise _error(85, p, end, "'N' (the new tuple)")
        kind = p[end]
        end += 1
    if kind != 78:
        raise _error(85, p, end - 1, "'K', 'O' (old values) or 'N' (the new tuple)" if old is None
                     else "'N' (the new tuple)")
    new, end = _tuple(p, end, 85)
    if end != len(p):
        raise _trailing(85, p, end)
    return _new(Update, (xid, _U32.unpack_from(p, pos)[0], old_kind, old, new))


def _delete(p: bytes, pos: int, xid: int | None) -> Delete:
    if pos + 5 > len(p):
        raise _short(68, p, pos, _OID_KIND)
    kind = p[pos + 4]
    if kind != 75 and kind != 79:
        raise _error(68, p, pos + 4, "'K' (old key) or 'O' (old row)")
    old, end = _tuple(p, pos + 5, 68)
    if end != len(p):
        raise _trailing(68, p, end)
    return _new(Delete, (xid, _U32.unpack_from(p, pos)[0], "K" if kind == 75 else "O", old))


def _relation(p: bytes, pos: int, xid: int | None) -> Relation:
    (oid,) = _take(_U32, p, pos, 82, _OID)
    namespace, pos = _string(p, pos + 4, 82, "the namespace")
    name, pos = _string(p, pos, 82, "the relation name")
    if pos + 3 > len(p):
        raise _short(82, p, pos, (("the replica identity", 1), ("the column count", 2)))
    identity = chr(p[pos])
    if identity not in "dnfi":
        raise _error(82, p, pos, "a replica identity (d, n, f or i)")
    (ncols,) = _U16.unpack_from(p, pos + 1)
    pos += 3
    columns = []
    for i in range(1, ncols + 1):
        if pos >= len(p):
            raise _error(82, p, pos, f"the flags of column {i} of {ncols}")
        is_key = bool(p[pos] & 1)
        column_name, pos = _string(p, pos + 1, 82, f"the name of column {i}")
        type_oid, type_modifier = _take(_COLUMN_TYPE, p, pos, 82, ((f"the type OID of column {i}", 4),
                                                                  (f"the type modifier of column {i}", 4)))
        pos += 8
        columns.append(Column(is_key, column_name, type_oid, type_modifier))
    if pos != len(p):
        raise _trailing(82, p, pos)
    return Relation(xid, oid, namespace or "pg_catalog", name, identity, tuple(columns))


def _type(p: bytes, pos: int, xid: int | None) -> Type:
    (oid,) = _take(_U32, p, pos, 89, (("the type OID", 4),))
    namespace, pos = _string(p, pos + 4, 89, "the namespace")
    name, pos = _string(p, pos, 89, "the type name")
    if pos != len(p):
        raise _trailing(89, p, pos)
    return Type(xid, oid, namespace or "pg_catalog", name)


def _truncate(p: bytes, pos: int, xid: int | None) -> Truncate:
    count, options = _take(_TRUNCATE, p, pos, 84, (("the relation count", 4), ("the options", 1)))
    pos += 5
    if pos + 4 * count > len(p):
        raise _error(84, p, pos, f"{count} relation OIDs ({4 * count} bytes)",
                     f"but only {len(p) - pos} bytes remain")
    oids = struct.unpack_from(f"!{count}I", p, pos)
    if pos + 4 * count != len(p):
        raise _trailing(84, p, pos + 4 * count)
    return Truncate(xid, oids, bool(options & 1), bool(options & 2))


def _logical_message(p: bytes, pos: int, xid: int | None) -> Message:
    flags, lsn = _take(_MESSAGE, p, pos, 77, (("the flags", 1), ("the LSN", 8)))
    prefix, pos = _string(p, pos + 9, 77, "the prefix")
    (length,) = _take(_U32, p, pos, 77, (("the content length", 4),))
    pos += 4
    if pos + length > len(p):
        raise _error(77, p, pos - 4, "a content length within the payload",
                     f"found {length} with {len(p) - pos} bytes left")
    if pos + length != len(p):
        raise _trailing(77, p, pos + length)
    return Message(xid, bool(flags & 1), lsn, prefix, p[pos:pos + length])


_DATA: dict[int, Callable[[bytes, int, int | None], PgOutputMessage]] = {
    82: _relation, 89: _type, 73: _insert, 85: _update, 68: _delete, 84: _truncate, 77: _logical_message}

# --- control messages: (decoder, payload) -> message ------------------------------------------

_BEGIN = struct.Struct("!QqI")
_BEGIN_FIELDS = (("the final LSN", 8), ("the commit timestamp", 8), ("the xid", 4))
_COMMIT = struct.Struct("!BQQq")
_COMMIT_FIELDS = (("the flags", 1), ("the commit LSN", 8), ("the end LSN", 8), ("the commit timestamp", 8))
_ORIGIN = struct.Struct("!Q")
_STREAM_START = struct.Struct("!IB")
_STREAM_COMMIT = struct.Struct("!IBQQq")
_STREAM_ABORT = struct.Struct("!II")
_STREAM_ABORT_INFO = struct.Struct("!IIQq")  # protocol 4, streaming 'parallel'
_STREAM_ABORT_FIELDS = (("the xid", 4), ("the subtransaction xid", 4))
_BEGIN_PREPARE = struct.Struct("!QQqI")
_PREPARE = struct.Struct("!BQQqI")           # also Commit Prepared and Stream Prepare
_ROLLBACK_PREPARED = struct.Struct("!BQQqqI")
_PREPARE_FIELDS = (("the flags", 1), ("the LSN", 8), ("the end LSN", 8), ("the timestamp", 8), ("the xid", 4))
_ROLLBACK_PREPARED_FIELDS = (("the flags", 1), ("the prepare end LSN", 8), ("the rollback end LSN", 8),
                             ("the prepare timestamp", 8), ("the rollback timestamp", 8), ("the xid", 4))


def _outside_stream(dec: PgOutputDecoder, code: int, p: bytes) -> None:
    if dec._stream_xid is not None:
        raise _error(code, p, 0, f"no {_NAMES[chr(code)]} inside the stream block of xid {dec._stream_xid}",
                     "but no Stream Stop came first")


def _needs_protocol(dec: PgOutputDecoder, code: int, p: bytes, version: int) -> None:
    if dec.protocol_version < version:
        raise _error(code, p, 0, f"a message type of protocol version {dec.protocol_version}",
                     f"but {_NAMES[chr(code)]} needs version {version} or later")


def _begin(dec: PgOutputDecoder, p: bytes) -> Begin:
    _outside_stream(dec, 66, p)
    return Begin(*_exact(_BEGIN, p, 66, _BEGIN_FIELDS))


def _commit(dec: PgOutputDecoder, p: bytes) -> Commit:
    _outside_stream(dec, 67, p)
    return Commit(*_exact(_COMMIT, p, 67, _COMMIT_FIELDS))


def _origin(dec: PgOutputDecoder, p: bytes) -> Origin:
    (lsn,) = _take(_ORIGIN, p, 1, 79, (("the origin LSN", 8),))
    name, pos = _string(p, 9, 79, "the origin name")
    if pos != len(p):
        raise _trailing(79, p, pos)
    return Origin(lsn, name)


def _stream_start(dec: PgOutputDecoder, p: bytes) -> StreamStart:
    _needs_protocol(dec, 83, p, 2)
    _outside_stream(dec, 83, p)
    xid, first = _exact(_STREAM_START, p, 83, (("the xid", 4), ("the first-segment flag", 1)))
    if first > 1:
        raise _error(83, p, 5, "a first-segment flag of 0 or 1")
    dec._stream_xid = xid
    return StreamStart(xid, first == 1)


def _stream_stop(dec: PgOutputDecoder, p: bytes) -> StreamStop:
    _needs_protocol(dec, 69, p, 2)
    if dec._stream_xid is None:
        raise _error(69, p, 0, "a Stream Start before a Stream Stop", "but no stream block is open")
    if len(p) != 1:
        raise _trailing(69, p, 1)
    dec._stream_xid = None
    return _STREAM_STOP


def _stream_commit(dec: PgOutputDecoder, p: bytes) -> StreamCommit:
    _needs_protocol(dec, 99, p, 2)
    _outside_stream(dec, 99, p)
    return StreamCommit(*_exact(_STREAM_COMMIT, p, 99, (("the xid", 4),) + _COMMIT_FIELDS))


def _stream_abort(dec: PgOutputDecoder, p: bytes) -> StreamAbort:
    _needs_protocol(dec, 65, p, 2)
    _outside_stream(dec, 65, p)
    if len(p) <= 9 or dec.protocol_version < 4:
        return StreamAbort(*_exact(_STREAM_ABORT, p, 65, _STREAM_ABORT_FIELDS))
    return StreamAbort(*_exact(_STREAM_ABORT_INFO, p, 65, _STREAM_ABORT_FIELDS + (
        ("the abort LSN", 8), ("the abort timestamp", 8))))


def _two_phase(cls: type, code: int, st: struct.Struct, fields: tuple[tuple[str, int], ...]):
    """The decoder of a two-phase message (protocol 3+): its fixed fields, the GID, nothing after."""
    def decode(dec: PgOutputDecoder, p: bytes):
        _needs_protocol(dec, code, p, 3)
        _outside_stream(dec, code, p)
        values = _take(st, p, 1, code, fields)
        gid, pos = _string(p, 1 + st.size, code, "the GID")
        if pos != len(p):
            raise _trailing(code, p, pos)
        return cls(*values, gid)
    return decode


_STREAM_STOP = StreamStop()
_CONTROL = {66: _begin, 67: _commit, 79: _origin, 83: _stream_start, 69: _stream_stop,
            99: _stream_commit, 65: _stream_abort,
            98: _two_phase(BeginPrepare, 98, _BEGIN_PREPARE, _PREPARE_FIELDS[1:]),
            80: _two_phase(Prepare, 80, _PREPARE, _PREPARE_FIELDS),
            75: _two_phase(CommitPrepared, 75, _PREPARE, _PREPARE_FIELDS),
            114: _two_phase(RollbackPrepared, 114, _ROLLBACK_PREPARED, _ROLLBACK_PREPARED_FIELDS),
            112: _two_phase(StreamPrepare, 112, _PREPARE, _PREPARE_FIELDS)}


class PgOutputDecoder:
    """Decodes the payloads of one replication connection, in the order received.

    It keeps one piece of state, whether a stream block is open, so use one decoder per
    connection (or ``reset()`` it when the connection restarts). Not thread-safe.
    """

    __slots__ = ("protocol_version", "_stream_xid")

    def __init__(self, protocol_version: int) -> None:
        if protocol_version not in (1, 2, 3, 4):
            raise ValueError(f"pgoutput protocol version {protocol_version} is not one of 1, 2, 3, 4")
        self.protocol_version = protocol_version
        self._stream_xid: int | None = None

    @property
    def stream_xid(self) -> int | None:
        """The xid of the open stream block (between Stream Start and Stop), else None."""
        return self._stream_xid

    def reset(self) -> None:
        """Forget an open stream block: the server restarts streaming on a new connection."""
        self._stream_xid = None

    def decode(self, payload: bytes) -> PgOutputMessage:
        """One payload (``bytes``) -> its message; ``DecodeError`` if it is malformed."""
        try:
            code = payload[0]
        except IndexError:
            raise DecodeError("pgoutput payload is empty: expected a message type byte at byte offset 0") from None
        data = _DATA.get(code)
        if data is not None:
            if self._stream_xid is None:
                return data(payload, 1, None)
            if len(payload) < 5:
                raise _short(code, payload, 1, (("the xid of a streamed change", 4),))
            return data(payload, 5, _U32.unpack_from(payload, 1)[0])
        control = _CONTROL.get(code)
        if control is None:
            raise _error(code, payload, 0, f"a message type ({', '.join(sorted(_NAMES))})")
        return control(self, payload)
