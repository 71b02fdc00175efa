"""The C row decoder (``sources/mysql/_rowdecode.c``): the program it runs for one row shape, or
None where it was not built, ``cdc.native`` is off when the decoder is made, or a column's type is
not one it takes (``decoder.RowDecoder`` then keeps its generated Python decoder).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cdc import native
from cdc.events import ChangeEvent, Op, SnapshotMarker, TransactionInfo
from sources.mysql import values
from sources.mysql.columns import (
    BIT,
    BLOB,
    DATE,
    DATETIME,
    DATETIME2,
    DOUBLE,
    ENUM,
    FLOAT,
    GEOMETRY,
    INT24,
    LONG,
    LONG_BLOB,
    LONGLONG,
    MEDIUM_BLOB,
    NEWDECIMAL,
    SET,
    SHORT,
    STRING,
    TIME,
    TIME2,
    TIMESTAMP,
    TIMESTAMP2,
    TINY,
    TINY_BLOB,
    VAR_STRING,
    VARCHAR,
    YEAR,
    ColumnSpec,
    string_converter,
)
from sources.mysql.types import shortest_float32
from sources.mysql.values import make_time2

_rowdecode = native.load("sources.mysql._rowdecode")

_INT_BYTES = {TINY: 1, SHORT: 2, INT24: 3, LONG: 4, LONGLONG: 8}


def _c_string(s: ColumnSpec) -> Callable[[bytes], Any] | None:
    """What the C decoder calls on a string column's bytes; None: it decodes UTF-8 itself."""
    convert = string_converter(s)
    if convert == "utf-8":
        return None
    if isinstance(convert, str):
        return lambda raw: str(raw, convert)
    return convert


_PY_FIXED = {TIME: (values.time, 3), DATETIME: (values.datetime, 8), TIMESTAMP: (values.timestamp, 4)}


def c_program(specs: Sequence[ColumnSpec], names: Sequence[str], key_index: Sequence[int]) -> Any:
    """The C decoder of this row shape, or None (not built, or a column type it does not take:
    MySQL's binary JSON; those tables keep the Python decoder). TIME and the pre-5.6 temporal
    types are decoded by their Python functions, called from C."""
    if _rowdecode is None or not native.enabled() or not key_index:
        return None
    c = _rowdecode
    ops: list[tuple[int, int, int, int, Any]] = []  # (op, nullable, width, arg, what it calls or reads)
    for s in specs:
        t, nullable = s.type, int(s.nullable)
        if t in _INT_BYTES:
            ops.append((c.INT, nullable, _INT_BYTES[t], int(not s.unsigned), None))
        elif t == FLOAT:
            ops.append((c.FLOAT, nullable, 0, 0, shortest_float32))
        elif t == DOUBLE:
            ops.append((c.DOUBLE, nullable, 0, 0, None))
        elif t == YEAR:
            ops.append((c.YEAR, nullable, 0, 0, None))
        elif t == NEWDECIMAL and 1 <= s.precision <= 65 and 0 <= s.scale <= min(30, s.precision):
            ops.append((c.DECIMAL, nullable, s.precision, s.scale, None))
        elif t == DATE:
            ops.append((c.DATE, nullable, 0, 0, None))
        elif t in (DATETIME2, TIMESTAMP2) and 0 <= s.fsp <= 6:
            ops.append((c.DATETIME2 if t == DATETIME2 else c.TIMESTAMP2, nullable, s.fsp, 0, None))
        elif t in (VARCHAR, VAR_STRING, STRING):
            ops.append((c.STR, nullable, 2 if s.length > 255 else 1, 0, _c_string(s)))
        elif t in (BLOB, GEOMETRY, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB) and 1 <= s.length <= 4:
            ops.append((c.STR, nullable, s.length, 0, _c_string(s)))
        elif t == ENUM and s.length in (1, 2):
            ops.append((c.ENUM, nullable, s.length, 0, ("",) + s.labels))
        elif t == BIT and 1 <= (s.length + 7) // 8 <= 8:
            ops.append((c.BIT, nullable, (s.length + 7) // 8, 0, None))
        elif t == SET and 1 <= s.length <= 8:
            ops.append((c.SET, nullable, s.length, 0, s.labels))
        elif t == TIME2 and 0 <= s.fsp <= 6:
            ops.append((c.PYFIXED, nullable, 3 + (s.fsp + 1) // 2, 0, make_time2(s.fsp)))
        elif t in _PY_FIXED:
            decode, width = _PY_FIXED[t]
            ops.append((c.PYFIXED, nullable, width, 0, decode))
        else:
            return None
    return c.Program(tuple(ops), tuple(names), tuple(key_index),
                     (ChangeEvent, TransactionInfo, Op.CREATE, Op.UPDATE, Op.DELETE, SnapshotMarker.FALSE))
