"""Record headers: every data record's ``source.version`` and source name, tombstones included.

A tombstone (a null value after a delete) has no envelope, so without a header it carries no
version: a sink that met one alone had to guess what it deletes (see cdc/sink_events.py). Every
record the capture publishes into a table's topic, and every schema record, carries:

* ``cdc.version``: the event's ``source.version`` as ASCII decimal (``b"23456789"``), so any
  consumer reads it as text (kcat, Spark SQL ``CAST(CAST(value AS STRING) AS BIGINT)``); a
  tombstone carries its delete's version, a truncate and a schema record their own;
* ``cdc.source``: the source connector's name (versions compare only within one source).

Headers are a list of ``(name, value bytes or None)`` pairs, confluent-kafka's own form, in the
order they were written; a name may repeat, and the last one counts (Kafka's rule for a lookup).
A record written before headers existed has none (``None``), and reads as before.

``pack``/``unpack``: the bytes the embedded log stores a record's headers as (its ``headers``
column) and the bulk reader packs them in (cdc/_rdconsume.c): per header a little-endian int32
name length, the name (UTF-8), an int32 value length (-1: null) and the value. Both run in C
where cdc/_speedups.c is built (a record each on the embedded log's paths); the Python functions
here are the reference (tests/unit/test_headers.py compares them).
"""

from __future__ import annotations

import struct

VERSION = "cdc.version"
SOURCE = "cdc.source"

Headers = list[tuple[str, bytes | None]]

_INT32 = struct.Struct("<i")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def source_header(name: str) -> tuple[str, bytes]:
    """The ``cdc.source`` header of a source named ``name`` (made once per encoder)."""
    return (SOURCE, name.encode())


def record_headers(version: int, source: tuple[str, bytes]) -> Headers:
    """The headers of a record of version ``version`` from ``source`` (``source_header``)."""
    return [(VERSION, b"%d" % version), source]


def version_of(headers: Headers | None) -> int | None:
    """The ``cdc.version`` header as an int, None when there is none; ``ValueError`` when it is not
    a decimal int64 (``-``, then 1 to 19 ASCII digits). cdc/_speedups.c reads it by the same rule."""
    if not headers:
        return None
    found = None
    for name, value in headers:
        if name == VERSION:
            found = value if value is not None else b""
    if found is None:
        return None
    if type(found) is not bytes:
        raise ValueError(f"the {VERSION} header is not bytes but {type(found).__name__}")
    digits = found[1:] if found[:1] == b"-" else found
    if not 0 < len(digits) <= 19 or not digits.isdigit():
        raise ValueError(f"the {VERSION} header is not a decimal integer: {found[:40]!r}")
    version = int(found)
    if not _INT64_MIN <= version <= _INT64_MAX:
        raise ValueError(f"the {VERSION} header does not fit in 64 bits: {found!r}")
    return version


def pack(headers: Headers | None) -> bytes | None:
    """``headers`` as bytes (see the module docstring); None for none."""
    if _speedups is not None and USE_SPEEDUPS:
        return _speedups.pack_headers(headers)
    return _pack(headers)


def unpack(data: bytes | None) -> Headers | None:
    """``pack``'s bytes back as headers; ``ValueError`` for bytes that are not that."""
    if _speedups is not None and USE_SPEEDUPS:
        return _speedups.unpack_headers(data)
    return _unpack(data)


def _pack(headers: Headers | None) -> bytes | None:
    if not headers:
        return None
    out = bytearray()
    for name, value in headers:
        encoded = name.encode()
        out += _INT32.pack(len(encoded))
        out += encoded
        if value is None:
            out += _INT32.pack(-1)
        else:
            out += _INT32.pack(len(value))
            out += value
    return bytes(out)


def _unpack(data: bytes | None) -> Headers | None:
    if data is None:
        return None
    out: Headers = []
    at, end = 0, len(data)
    while at < end:
        name, at = _field(data, at, end)
        value, at = _field(data, at, end)
        if name is None:
            raise ValueError("not packed headers: a header without a name")
        out.append((name.decode(), value))
    return out


def _field(data: bytes, at: int, end: int) -> tuple[bytes | None, int]:
    if end - at < 4:
        raise ValueError("not packed headers: a length runs past the end")
    (size,) = _INT32.unpack_from(data, at)
    at += 4
    if size < 0:
        return None, at
    if end - at < size:
        raise ValueError("not packed headers: a header runs past the end")
    return data[at:at + size], at + size


USE_SPEEDUPS = True  # tests turn it off to compare the two
try:  # the same in C (cdc/_speedups.c), built by setup.py where a compiler is found
    from cdc import _speedups
except ImportError:  # pragma: no cover - a build without a compiler
    _speedups = None
