"""The binlog row decoder on row images captured from a real MariaDB, and on malformed input.

The bytes in ``tests/golden/mysql/rows.json`` come from ``tests/golden/mysql/capture_binlog.py``;
every expected value below follows from its workload (its docstring lists it). The property tests
then cut, flip and splice those bytes: the decoder answers with rows or ``DecodeError`` (naming
a byte offset inside the event), never with another exception. Encoders written here after the
server's own (decimal2bin, my_time_packed_to_binary) check DECIMAL and TIME over random values.
"""

from __future__ import annotations

import base64
import re
import struct
from decimal import Decimal, localcontext

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.errors import DecodeError
from cdc.events import Op, TableId
from sources.mysql.decoder import (
    DATETIME2,
    DELETE_ROWS,
    NEWDECIMAL,
    TIME2,
    TIMESTAMP2,
    UPDATE_ROWS,
    WRITE,
    ColumnSpec,
    RowDecoder,
)
from sources.mysql.types import shortest_float32
from tests.golden.mysql.capture_binlog import load

GOLDEN = load()
SPECS = {name: [ColumnSpec.from_dict(d) for d in specs] for name, specs in GOLDEN["tables"].items()}
DECODERS = {name: RowDecoder(name, specs, ("id",)) for name, specs in SPECS.items()}
EVENTS = [(e["table"], e["kind"], base64.b64decode(e["body"])) for e in GOLDEN["events"]]
OFFSET = re.compile(r"at byte offset (\d+)")

FULL_ROW = {
    "id": 1, "ti": -128, "tiu": 255, "si": -32768, "siu": 65535, "mi": -8388608, "miu": 16777215,
    "i": -2147483648, "iu": 4294967295, "bi": -9223372036854775808, "biu": 18446744073709551615,
    "d1": "-12345678.90", "d2": "12345678901234567890.0123456789", "d3": "99999", "d4": "0.1234",
    "f": 3.14159, "dbl": 2.718281828459045, "ch": "ab", "vc": "héllo wörld", "vl": "café", "tx": "text",
    "mt": "medium text", "bn": "YQAAAA==", "vb": "eHkA", "bl": "YmxvYgBieXRlcw==",
    "j": {"a": [1, 2.5, None], "b": {"c": "d"}}, "e": "medium", "st": ["a", "c"], "b1": 1, "b10": 682,
    "b64": 2**64 - 1, "y": 2024, "dt": "2024-02-29", "dt0": "2024-01-02T03:04:05",
    "dt3": "2024-01-02T03:04:05.123", "dt6": "2024-01-02T03:04:05.123456", "ts0": "2024-01-02T03:04:05Z",
    "ts2": "2024-01-02T03:04:05.50Z", "ts6": "1970-01-01T00:00:01.000001Z", "tm0": "12:34:56",
    "tm1": "-12:34:56.7", "tm4": "838:59:59.9999", "tm6": "-838:59:59.000000",
}
EXTREMES_ROW = {
    "id": 3, "ti": 127, "tiu": 0, "si": 32767, "siu": 0, "mi": 8388607, "miu": 0, "i": 2147483647, "iu": 0,
    "bi": 9223372036854775807, "biu": 0, "d1": "99999999.99", "d2": "-99999999999999999999.9999999999",
    "d3": "-99999", "d4": "-0.9999", "f": -1.5e-10, "dbl": -1.7976931348623157e308, "ch": "", "vc": "",
    "vl": "", "tx": "", "mt": "", "bn": "AAAAAA==", "vb": "", "bl": "", "j": [], "e": "small", "st": [],
    "b1": 0, "b10": 0, "b64": 0, "y": 1901, "dt": "1000-01-01", "dt0": "1000-01-01T00:00:00",
    "dt3": "9999-12-31T23:59:59.999", "dt6": "9999-12-31T23:59:59.999999", "ts0": "2038-01-19T03:14:07Z",
    "ts2": "2038-01-19T03:14:07.99Z", "ts6": "2038-01-19T03:14:07.999999Z", "tm0": "-838:59:59",
    "tm1": "00:00:00.1", "tm4": "-00:00:00.0001", "tm6": "-00:00:01.000001",
}


def decode(table: str, kind: str, body: bytes) -> list:
    decoder = DECODERS[table]
    if kind == "update":
        return [(before, after) for _, before, after in decoder.pairs(body, 0, len(body))]
    return [row for _, row in decoder.rows(body, 0, len(body))]


def all_types() -> list[tuple[str, list]]:
    return [(kind, decode(table, kind, body)) for table, kind, body in EVENTS if table == "all_types"]


def test_the_golden_events_are_the_workload():
    kinds = [(t, k) for t, k, _ in EVENTS]
    assert kinds[:7] == [("all_types", "write")] * 4 + [("all_types", "update")] * 2 + [("all_types", "delete")]
    assert {k for t, k in kinds[7:]} == {"write", "update"} and all(t == "narrow" for t, _ in kinds[7:])


def test_a_full_row_of_every_type():
    (kind, rows), = all_types()[:1]
    assert rows == [FULL_ROW]


def test_nulls_extremes_and_zero_dates():
    events = all_types()
    assert events[1][1] == [dict.fromkeys(FULL_ROW, None) | {"id": 2}]
    assert events[2][1] == [EXTREMES_ROW]
    zero = events[3][1][0]
    assert zero["id"] == 4 and zero["y"] == 0  # YEAR 0000
    # Zero dates (and a zero month) are null: no consumer can parse them.
    assert zero["dt"] is zero["dt0"] is zero["dt6"] is zero["ts0"] is zero["ts6"] is None


def test_updates_carry_both_images_and_deletes_the_old_row():
    events = all_types()
    (before, after), = events[4][1]
    assert before == FULL_ROW
    assert after == FULL_ROW | {"vc": "changed", "bi": 42, "j": {"k": True}}
    (before, after), = events[5][1]
    assert (before["id"], after["id"]) == (2, 20)
    assert events[6] == ("delete", [EXTREMES_ROW])


def test_multi_row_events_of_the_narrow_table():
    writes = [row for t, k, body in EVENTS if t == "narrow" and k == "write" for row in decode(t, k, body)]
    assert [r["id"] for r in writes] == list(range(1, 301))
    assert sum(1 for t, k, _ in EVENTS if t == "narrow" and k == "write") > 1  # several rows per event
    r = writes[5]  # id 6: seq % 2 == 0, seq % 3 == 0
    assert r == {"id": 6, "label": "label 6 " * 20, "tags": ["t9"], "qty": 6, "price": "6.750"}
    assert writes[2]["tags"] == ["t0", "t9"] and writes[3]["tags"] == []
    updates = [pair for t, k, body in EVENTS if t == "narrow" and k == "update" for pair in decode(t, k, body)]
    assert len(updates) == 300
    assert all(a["qty"] == -b["qty"] and a["price"] == "-" + b["price"] for b, a in updates)


def test_events_carry_versions_keys_and_transaction_orders():
    table = TableId("golden", None, "narrow")
    decoder = DECODERS["narrow"]
    body = next(b for t, k, b in EVENTS if t == "narrow" and k == "write")
    events, count = decoder.events(WRITE, body, 0, len(body), "x", table, 1000, 5, "binlog.000007", 77, "0-1-9",
                                   "0-1-9", 10, 3)
    assert count == len(events) == len(decoder.rows(body, 0, len(body)))
    for i, event in enumerate(events):
        event.check()
        assert event.op is Op.CREATE and event.key == {"id": i + 1} and event.before is None
        assert event.source_fields == {"file": "binlog.000007", "pos": 77, "row": i, "gtid": "0-1-9"}
        assert tuple(event.transaction) == ("0-1-9", 11 + i, 4 + i)
    offsets = [offset for offset, _ in decoder.rows(body, 0, len(body))]
    assert [e.version for e in events] == [1000 + o for o in offsets]
    assert offsets == sorted(set(offsets))  # strictly increasing within the event

    deleted, _ = decoder.events(DELETE_ROWS, body, 0, len(body), "x", table, 0, 5, "f.1", 1, None, None, 0, 0)
    assert all(e.op is Op.DELETE and e.after is None and e.before and e.transaction is None for e in deleted)


def test_an_update_that_moves_the_key_is_a_delete_and_a_create():
    body = [b for t, k, b in EVENTS if t == "all_types" and k == "update"][1]
    events, count = DECODERS["all_types"].events(UPDATE_ROWS, body, 0, len(body), "x",
                                                  TableId("g", None, "all_types"), 0, 0, "f.1", 4, "g", "g", 0, 0)
    assert count == 2 and [e.op for e in events] == [Op.DELETE, Op.CREATE]
    assert [e.key for e in events] == [{"id": 2}, {"id": 20}]
    assert events[0].version == events[1].version
    assert [e.transaction.total_order for e in events] == [1, 2]
    body = [b for t, k, b in EVENTS if t == "all_types" and k == "update"][0]
    events, count = DECODERS["all_types"].events(UPDATE_ROWS, body, 0, len(body), "x",
                                                  TableId("g", None, "all_types"), 0, 0, "f.1", 4, None, None, 0, 0)
    assert count == 1 and events[0].op is Op.UPDATE and events[0].before["vc"] == "héllo wörld"


def test_type_names_for_schema_records():
    names = {s.name: s.type_name for s in SPECS["all_types"]}
    assert names["d1"] == "decimal(10,2)" and names["biu"] == "bigint unsigned" and names["j"] == "json"
    assert names["dt3"] == "datetime(3)" and names["e"] == "enum('small','medium','large')"
    assert names["bn"] == "binary(4)" and names["tx"] == "text" and names["b10"] == "bit(10)"


# --- malformed input ------------------------------------------------------------------------------

fuzz = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
sample = st.sampled_from(EVENTS)


def decode_or_error(table: str, kind: str, body: bytes):
    try:
        return decode(table, kind, body)
    except DecodeError as err:
        match = OFFSET.search(str(err))
        assert match, f"no offset in: {err}"
        assert 0 <= int(match.group(1)) <= len(body), str(err)
        return None


@fuzz
@given(sample, st.data())
def test_a_truncated_event_is_an_error_or_whole_rows(event, data):
    table, kind, body = event
    cut = data.draw(st.integers(0, len(body) - 1))
    result = decode_or_error(table, kind, body[:cut])
    if result is not None:  # cut exactly between two rows: a prefix of the rows
        assert result == decode(table, kind, body)[:len(result)]


@fuzz
@given(sample, st.data())
def test_corrupted_bytes_give_rows_or_a_decode_error(event, data):
    table, kind, body = event
    corrupted = bytearray(body)
    for _ in range(data.draw(st.integers(1, 8))):
        corrupted[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    decode_or_error(table, kind, bytes(corrupted))


@fuzz
@given(st.sampled_from(sorted(DECODERS)), st.sampled_from(["write", "update"]), st.binary(max_size=400))
def test_random_bytes_give_rows_or_a_decode_error(table, kind, body):
    decode_or_error(table, kind, body)


def test_a_truncated_event_names_the_table_and_offset():
    table, kind, body = EVENTS[0]
    with pytest.raises(DecodeError, match=r"row of all_types at byte offset 0 runs past the end"):
        decode(table, kind, body[:-3])


# --- values over their whole range ----------------------------------------------------------------

def decimal2bin(value: Decimal, precision: int, scale: int) -> bytes:
    """MySQL's decimal2bin: base-10^9 groups, big-endian, negative values inverted, sign bit set."""
    dig2bytes = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
    negative = value < 0
    digits = format(abs(value), f".{scale}f")
    whole, _, frac = digits.partition(".")
    intg = precision - scale
    whole = whole.lstrip("0").rjust(intg, "0")[-intg:] if intg else ""
    out = b""
    lead = intg % 9
    if lead:
        out += int(whole[:lead]).to_bytes(dig2bytes[lead], "big")
    for i in range(lead, intg, 9):
        out += int(whole[i:i + 9]).to_bytes(4, "big")
    for i in range(0, scale - scale % 9, 9):
        out += int(frac[i:i + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(frac[scale - scale % 9:]).to_bytes(dig2bytes[scale % 9], "big")
    raw = bytearray(out)
    if negative:
        raw = bytearray(b ^ 0xFF for b in raw)
    raw[0] ^= 0x80
    return bytes(raw)


@st.composite
def decimals(draw):
    precision = draw(st.integers(1, 65))
    scale = draw(st.integers(0, min(precision, 30)))
    digits = draw(st.text("0123456789", min_size=precision, max_size=precision))
    value = Decimal(f"{digits[:precision - scale] or '0'}.{digits[precision - scale:] or '0'}")
    if draw(st.booleans()):
        value = value.copy_negate()  # exact: unary minus would round to the context's 28 digits
    return precision, scale, value


@settings(max_examples=500, deadline=None)
@given(decimals())
def test_decimal_round_trip(case):
    with localcontext(prec=100):  # 65 digits are more than the default context keeps
        check_decimal(*case)


def check_decimal(precision: int, scale: int, value: Decimal) -> None:
    spec = ColumnSpec("v", NEWDECIMAL, nullable=False, precision=precision, scale=scale)
    body = b"\x00" + decimal2bin(value, precision, scale)
    (_, row), = RowDecoder("t", [spec]).rows(body, 0, len(body))
    expected = format(value, f".{scale}f")
    if Decimal(expected) == 0:
        expected = expected.lstrip("-")
    assert row["v"] == expected


def time2bin(negative: bool, hours: int, minutes: int, seconds: int, micros: int, fsp: int) -> bytes:
    """my_time_packed_to_binary."""
    micros = micros // 10 ** (6 - fsp) * 10 ** (6 - fsp)
    packed = (((hours << 12) | (minutes << 6) | seconds) << 24) + micros
    if negative:
        packed = -packed
    if fsp == 0:
        return ((packed >> 24) + 0x800000).to_bytes(3, "big")
    if fsp <= 2:
        whole, frac = packed >> 24, int((packed % (1 << 24) if packed >= 0 else -((-packed) % (1 << 24))) / 10000)
        return (whole + 0x800000).to_bytes(3, "big") + struct.pack(">b" if frac < 0 else ">B", frac)
    if fsp <= 4:
        whole = packed >> 24
        frac = int((packed % (1 << 24) if packed >= 0 else -((-packed) % (1 << 24))) / 100)
        return (whole + 0x800000).to_bytes(3, "big") + struct.pack(">h", frac)
    return (packed + 0x800000000000).to_bytes(6, "big")


@settings(max_examples=500, deadline=None)
@given(st.booleans(), st.integers(0, 838), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999999),
       st.integers(0, 6))
def test_time_round_trip(negative, hours, minutes, seconds, micros, fsp):
    micros = micros // 10 ** (6 - fsp) * 10 ** (6 - fsp)
    negative = negative and (hours or minutes or seconds or micros)
    spec = ColumnSpec("v", TIME2, nullable=False, fsp=fsp)
    body = b"\x00" + time2bin(bool(negative), hours, minutes, seconds, micros, fsp)
    (_, row), = RowDecoder("t", [spec]).rows(body, 0, len(body))
    fraction = ("." + f"{micros:06d}"[:fsp]) if fsp else ""
    assert row["v"] == f"{'-' if negative else ''}{hours:02d}:{minutes:02d}:{seconds:02d}{fraction}"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2**31 - 1), st.integers(0, 999999), st.integers(0, 6))
def test_timestamp_round_trip(seconds, micros, fsp):
    import datetime as dt

    width = (fsp + 1) // 2
    stored = micros // 10 ** (6 - 2 * width) if width else 0
    spec = ColumnSpec("v", TIMESTAMP2, nullable=False, fsp=fsp)
    body = b"\x00" + seconds.to_bytes(4, "big") + stored.to_bytes(width, "big")
    (_, row), = RowDecoder("t", [spec]).rows(body, 0, len(body))
    text = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{stored * 10 ** (6 - 2 * width):06d}"[:fsp] if width else ""
    assert row["v"] == text + ("." + digits if fsp else "") + "Z"


@settings(max_examples=300, deadline=None)
@given(st.datetimes(), st.integers(0, 6))
def test_datetime_round_trip(value, fsp):
    width = (fsp + 1) // 2
    ym = value.year * 13 + value.month
    packed = (((ym << 5) | value.day) << 17) | (value.hour << 12) | (value.minute << 6) | value.second
    stored = value.microsecond // 10 ** (6 - 2 * width) if width else 0
    body = b"\x00" + (packed + 0x8000000000).to_bytes(5, "big") + stored.to_bytes(width, "big")
    spec = ColumnSpec("v", DATETIME2, nullable=False, fsp=fsp)
    (_, row), = RowDecoder("t", [spec]).rows(body, 0, len(body))
    digits = f"{stored * 10 ** (6 - 2 * width):06d}"[:fsp] if width else ""
    assert row["v"] == value.strftime("%Y-%m-%dT%H:%M:%S").rjust(19, "0") + ("." + digits if fsp else "")


@settings(max_examples=500, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float32_is_shortest_and_exact(value):
    shown = shortest_float32(value)
    assert struct.unpack("<f", struct.pack("<f", shown))[0] == value
    digits = len(repr(abs(shown)).replace(".", "").lstrip("0").split("e")[0].rstrip("0") or "0")
    assert digits <= 9
