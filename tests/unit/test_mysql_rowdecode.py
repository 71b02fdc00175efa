"""The C row decoder (sources/mysql/_rowdecode.c) against the generated Python decoder.

The Python decoder is the reference. On the row images captured from MariaDB (every type), on
those images cut, flipped and spliced, and on generated rows of random values, the C decoder
either makes exactly the Python decoder's events (and count) or hands the event back (None);
it never takes an event the Python decoder refuses.
"""

from __future__ import annotations

import base64
import os
import struct
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc import native
from cdc.errors import DecodeError
from cdc.events import TableId
from sources.mysql import c_decoder
from sources.mysql import decoder as dec
from sources.mysql.decoder import DELETE_ROWS, UPDATE_ROWS, WRITE, ColumnSpec, RowDecoder
from tests.damage import damage
from tests.golden.mysql.capture_binlog import load
from tests.unit.test_mysql_decoder import decimal2bin


def test_the_c_decoder_is_built():
    """setup.py builds it wherever a C compiler is; CDC_ALLOW_NO_SPEEDUPS=1 says a build without
    it is expected, as CDC_NATIVE=0 does."""
    if os.environ.get("CDC_ALLOW_NO_SPEEDUPS") == "1" or not native.ALLOWED:
        return
    assert c_decoder._rowdecode is not None, "sources.mysql._rowdecode was not built: pip install -e . with a C compiler"


needs_c = pytest.mark.skipif(c_decoder._rowdecode is None, reason="not built (see the test above)")
GOLDEN = load()
SPECS = {name: [ColumnSpec.from_dict(d) for d in specs] for name, specs in GOLDEN["tables"].items()}
KIND = {"write": WRITE, "update": UPDATE_ROWS, "delete": DELETE_ROWS}
EVENTS = [(e["table"], KIND[e["kind"]], base64.b64decode(e["body"])) for e in GOLDEN["events"]]
TID = TableId("db", None, "t")


def both(specs, kind: int, body: bytes, key=("id",), tx_id="0-1-5"):
    """(C result or None, Python result or the DecodeError's type)."""
    decoder = RowDecoder("db.t", specs, key)
    assert decoder.program is not None
    args = (kind, body, 0, len(body), "x", TID, 1 << 32, 1_700_000_000_000, "binlog.000001", 4, "0-1-5", tx_id, 7, 3)
    made = decoder.program.events(*(a for i, a in enumerate(args) if i != 4))
    decoder.program = None
    try:
        reference = decoder.events(*args)
    except DecodeError:
        reference = DecodeError
    return (None if made is None else (made[0], made[2])), reference


@needs_c
def test_a_decoder_made_under_the_reference_switch_keeps_the_python_decoder():
    specs = next(iter(SPECS.values()))
    with native.reference():
        assert RowDecoder("db.t", specs, ("id",)).program is None
    assert RowDecoder("db.t", specs, ("id",)).program is not None


@needs_c
def test_every_golden_event_is_taken_and_equal():
    for table, kind, body in EVENTS:
        made, reference = both(SPECS[table], kind, body)
        assert made is not None, (table, kind)
        assert made == reference
        for event in made[0]:
            event.check()


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(EVENTS), st.data())
def test_a_damaged_event_is_never_taken_unless_the_python_decoder_agrees(event, data):
    table, kind, body = event
    made, reference = both(SPECS[table], kind, damage(data, body))
    if made is not None:
        assert made == reference


# --- generated rows -------------------------------------------------------------------------------

def _int(size: int, signed: bool):
    bits = size * 8
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return st.integers(low, high).map(lambda v: v.to_bytes(size, "little", signed=signed))


def _decimal(precision: int, scale: int):
    digits = st.integers(-(10 ** precision - 1), 10 ** precision - 1)
    return digits.map(lambda n: decimal2bin(Decimal(n).scaleb(-scale), precision, scale))


def _datetime2(fsp: int):
    width = (fsp + 1) // 2
    return st.tuples(st.integers(0, 9999), st.integers(0, 12), st.integers(0, 31), st.integers(0, 23),
                     st.integers(0, 59), st.integers(0, 59), st.integers(0, 10 ** (2 * width) - 1)).map(
        lambda t: ((((t[0] * 13 + t[1]) << 5 | t[2]) << 17 | t[3] << 12 | t[4] << 6 | t[5]) + 0x8000000000)
        .to_bytes(5, "big") + t[6].to_bytes(width, "big"))


def _timestamp2(fsp: int):
    width = (fsp + 1) // 2
    return st.tuples(st.integers(0, 2 ** 32 - 1), st.integers(0, 10 ** (2 * width) - 1)).map(
        lambda t: t[0].to_bytes(4, "big") + t[1].to_bytes(width, "big"))


def _text(prefix: int):
    return st.text(max_size=20).map(lambda s: len(s.encode()).to_bytes(prefix, "little") + s.encode())


@st.composite
def columns(draw):
    """(ColumnSpec, strategy of its bytes in a row image)."""
    kind = draw(st.sampled_from(["int", "decimal", "datetime2", "timestamp2", "date", "varchar", "text", "enum",
                                 "set", "bit", "double", "float", "year", "binary"]))
    nullable = draw(st.booleans())
    if kind == "int":
        code, size = draw(st.sampled_from([(dec.TINY, 1), (dec.SHORT, 2), (dec.INT24, 3), (dec.LONG, 4),
                                           (dec.LONGLONG, 8)]))
        unsigned = draw(st.booleans())
        return ColumnSpec("c", code, nullable, unsigned), _int(size, not unsigned)
    if kind == "decimal":
        precision = draw(st.integers(1, 65))
        scale = draw(st.integers(0, min(30, precision)))
        return ColumnSpec("c", dec.NEWDECIMAL, nullable, precision=precision, scale=scale), _decimal(precision, scale)
    if kind in ("datetime2", "timestamp2"):
        fsp = draw(st.integers(0, 6))
        if kind == "datetime2":
            return ColumnSpec("c", dec.DATETIME2, nullable, fsp=fsp), _datetime2(fsp)
        return ColumnSpec("c", dec.TIMESTAMP2, nullable, fsp=fsp), _timestamp2(fsp)
    if kind == "date":
        return ColumnSpec("c", dec.DATE, nullable), st.binary(min_size=3, max_size=3)
    if kind == "varchar":
        length = draw(st.sampled_from([40, 1000]))
        return ColumnSpec("c", dec.VARCHAR, nullable, length=length, charset="utf8mb4"), _text(2 if length > 255 else 1)
    if kind == "text":
        width = draw(st.integers(1, 4))
        charset = draw(st.sampled_from(["utf8mb4", "latin1", "binary"]))
        return ColumnSpec("c", dec.BLOB, nullable, length=width, charset=charset), st.binary(max_size=20).map(
            lambda b: len(b).to_bytes(width, "little") + b) if charset != "utf8mb4" else _text(width)
    if kind == "binary":
        return ColumnSpec("c", dec.STRING, nullable, length=6, charset="binary"), st.binary(max_size=6).map(
            lambda b: bytes([len(b)]) + b)
    if kind == "enum":
        labels = ("a", "b", "c")
        return ColumnSpec("c", dec.ENUM, nullable, length=1, labels=labels), st.integers(0, 3).map(lambda i: bytes([i]))
    if kind == "set":
        labels = tuple("abcdefghij")
        return ColumnSpec("c", dec.SET, nullable, length=2, labels=labels), st.binary(min_size=2, max_size=2)
    if kind == "bit":
        bits = draw(st.integers(1, 64))
        return ColumnSpec("c", dec.BIT, nullable, length=bits), st.binary(min_size=(bits + 7) // 8,
                                                                          max_size=(bits + 7) // 8)
    if kind == "double":
        return ColumnSpec("c", dec.DOUBLE, nullable), st.floats(allow_nan=False).map(lambda f: struct.pack("<d", f))
    if kind == "float":
        return ColumnSpec("c", dec.FLOAT, nullable), st.floats(width=32, allow_nan=False).map(
            lambda f: struct.pack("<f", f))
    return ColumnSpec("c", dec.YEAR, nullable), st.binary(min_size=1, max_size=1)


@st.composite
def tables(draw):
    key = ColumnSpec("id", dec.LONG, False)
    rest = draw(st.lists(columns(), min_size=1, max_size=8))
    specs = [key] + [ColumnSpec(**{**spec.to_dict(), "name": f"c{i}"}) for i, (spec, _) in enumerate(rest)]
    strategies = [_int(4, True)] + [strategy for _, strategy in rest]
    return specs, strategies


@st.composite
def images(draw, specs, strategies):
    nulls, body = 0, b""
    for i, (spec, strategy) in enumerate(zip(specs, strategies)):
        if spec.nullable and draw(st.booleans()):
            nulls |= 1 << i
        else:
            body += draw(strategy)
    return nulls.to_bytes((len(specs) + 7) // 8, "little") + body


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tables(), st.sampled_from([WRITE, UPDATE_ROWS, DELETE_ROWS]), st.data())
def test_generated_rows_give_the_python_decoders_events(table, kind, data):
    specs, strategies = table
    rows = data.draw(st.lists(images(specs, strategies), min_size=1, max_size=4))
    if kind == UPDATE_ROWS:
        body = b"".join(data.draw(st.sampled_from([row, rows[0]])) + row for row in rows)
    else:
        body = b"".join(rows)
    made, reference = both(specs, kind, body, tx_id=data.draw(st.sampled_from([None, "0-1-5"])))
    # Every generated value is one the C code prints itself (it leaves to Python only bytes no
    # server writes: DATETIME2 before year 0, DECIMAL groups beyond their digits, bad UTF-8).
    assert reference is not DecodeError and made is not None
    assert made == reference
