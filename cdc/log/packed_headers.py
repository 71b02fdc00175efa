"""Record headers (cdc/headers.py) as the bytes the embedded log stores them in (its ``headers``
column) and the bulk reader packs them in (cdc/_rdconsume.c): per header a little-endian int32
name length, the name (UTF-8), an int32 value length (-1: null) and the value. ``pack`` and
``unpack`` run in C where cdc/_records.c is built and ``cdc.native`` is on (a record each on
the embedded log's paths); the Python functions here are the reference
(tests/unit/test_headers.py compares them).
"""

from __future__ import annotations

import struct

from cdc import native
from cdc.headers import Headers

_INT32 = struct.Struct("<i")


def pack(headers: Headers | None) -> bytes | None:
    """``headers`` as bytes (see the module docstring); None for none."""
    if _records is not None and native.enabled():
        return _records.pack_headers(headers)
    return _pack(headers)


def unpack(data: bytes | None) -> Headers | None:
    """``pack``'s bytes back as headers; ``ValueError`` for bytes that are not that."""
    if _records is not None and native.enabled():
        return _records.unpack_headers(data)
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


_records = native.load("cdc._records")  # the same in C
