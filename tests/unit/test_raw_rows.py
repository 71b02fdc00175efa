"""Rows left as JSON bytes (issue #18): the C scanner and COPY loop of cdc/_decode.c and cdc/_copytext.c against
the Python paths they stand in for.

* ``decode_records(raw_rows=True)`` against ``decode_record``: the same event once ``after`` is
  decoded, and the same records poison (the scanner must refuse everything orjson refuses, or a
  malformed record would reach the store instead of the dead-letter topic);
* ``copy_rows.formatter`` on rows as bytes against ``python_formatter`` on the same rows decoded:
  the same COPY text, byte for byte;
* ``names_outside`` on bytes against the set union of decoded rows.
"""

from __future__ import annotations

import os
import random

import orjson
import pytest

from cdc import native, sink_events
from cdc.events import ChangeEvent, Op, SnapshotMarker, TableId
from cdc.log.base import LogRecord
from cdc.runtime.contexts import native_codecs
from cdc.serde import EnvelopeEncoder
from cdc.sink_events import PoisonRecord, decode_record, decode_records
from sinks.sql import copy_rows
from sinks.sql.plan import ColumnPlan
from sinks.sql.types import Family

NATIVE = native_codecs()


def test_the_c_paths_were_built():
    """As tests/unit/test_encode.py's: CDC_ALLOW_NO_SPEEDUPS=1 says a build without them is expected."""
    if os.environ.get("CDC_ALLOW_NO_SPEEDUPS") == "1":
        return
    if not native.ALLOWED:  # CDC_NATIVE=0: as a build without them
        assert not sink_events.raw_rows_decoded() and NATIVE.copy_rows is None
        return
    assert sink_events.raw_rows_decoded() and NATIVE.copy_rows, \
        "cdc._decode or cdc._copytext was not built: pip install -e . with a C compiler"


def test_the_reference_switch_turns_the_c_paths_off():
    with native.reference():
        assert not sink_events.raw_rows_decoded()
        assert native_codecs() == type(NATIVE)()
        assert all(isinstance(e.after, dict) for e in decode_records(records(20), raw_rows=True)
                   if not isinstance(e, PoisonRecord) and e.after is not None)


needs_c = pytest.mark.skipif(not (sink_events.raw_rows_decoded() and NATIVE.copy_rows), reason="cdc._decode/_copytext not built")

TABLE = TableId("shop", "public", "orders")
STRINGS = ["", "plain", "tab\there", "new\nline", "cr\rx", "back\\slash", 'quote"d', "é ü ß", "日本語", "emoji 😀",
           "\x01\x08\x0c\x1f controls", "\u2028\u2029", "slash/", "\\N", "nul-free \x7f"]


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(12 if depth < 2 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 7, 2**31, -(2**63), 2**63 - 1, 2**64 - 1])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.5, 1e22, 1e-7, 123456.789, 1.7976931348623157e308, -2.5e-300])
    if kind in (4, 5, 6, 7, 8):
        return rng.choice(STRINGS) + str(rng.randrange(1000))
    if kind in (9, 10):
        return {rng.choice(STRINGS): random_value(rng, depth + 1) for _ in range(rng.randrange(3))}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(3))]


def random_row(rng: random.Random, key: int) -> dict:
    row = {"id": key}
    for name in ["a", "b", "c", "j", "x", "é", "tab\tname"]:
        if rng.random() < 0.85:
            row[name] = random_value(rng)
    return row


def records(count: int, seed: int = 3) -> list[LogRecord]:
    rng = random.Random(seed)
    encoder = EnvelopeEncoder("postgresql", "src", "p")
    events = []
    for i in range(count):
        key = rng.randrange(50)
        op = rng.choice([Op.CREATE, Op.UPDATE, Op.READ, Op.DELETE])
        after = None if op is Op.DELETE else random_row(rng, key)
        before = random_row(rng, key) if op is Op.DELETE or rng.random() < 0.3 else None
        fields = {"lsn": i, "txId": 9} if rng.random() < 0.5 else None
        events.append(ChangeEvent(op, TABLE, {"id": key}, before, after, i + 1, 1_700_000_000_000 + i,
                                  SnapshotMarker.FALSE, fields))
    return [LogRecord(r.topic, 0, offset, r.key, r.value, 0) for offset, r in enumerate(encoder.encode(events))]


def decoded(event):
    return event._replace(after=orjson.loads(event.after)) if isinstance(event.after, bytes) else event


def general(record: LogRecord):
    try:
        return decode_record(record)
    except PoisonRecord as err:
        return err


def same(raw, reference) -> bool:
    if isinstance(reference, PoisonRecord):
        return isinstance(raw, PoisonRecord) and str(raw) == str(reference)
    return not isinstance(raw, PoisonRecord) and decoded(raw) == reference


@needs_c
def test_scanned_records_decode_as_the_general_path_decodes_them():
    batch = records(600)
    out = decode_records(batch, raw_rows=True)
    assert sum(isinstance(e.after, bytes) for e in out) > 300  # the upserts were left as bytes
    assert all(e.after is None for e in out if e.op is Op.DELETE or e.op is None)
    for record, event in zip(batch, out):
        assert same(event, general(record)), record
    assert decode_records(batch, raw_rows=False) == [general(r) for r in batch]


ENVELOPE = (b'{"before":null,"after":{"id":1,"s":"x"},"op":"u","ts_ms":5,'
            b'"source":{"table":"orders","version":7},"transaction":null}')
ODD = [
    ENVELOPE, b" " + ENVELOPE + b"\n", ENVELOPE + b"x", ENVELOPE[:-1], ENVELOPE.replace(b"1,", b"1,,"),
    ENVELOPE.replace(b'"x"', b'"\\ud800"'), ENVELOPE.replace(b'"x"', b'"\\udc00"'),
    ENVELOPE.replace(b'"x"', b'"\\ud83d\\ude00"'), ENVELOPE.replace(b'"x"', b'"\xff"'),
    ENVELOPE.replace(b'"x"', b'"\xc0\xaf"'), ENVELOPE.replace(b'"x"', b'"\xed\xa0\x80"'),
    ENVELOPE.replace(b'"x"', b'"a\tb"'), ENVELOPE.replace(b'"x"', b'"\\q"'), ENVELOPE.replace(b'"x"', b"1e400"),
    ENVELOPE.replace(b'"x"', b"18446744073709551616"), ENVELOPE.replace(b'"x"', b"-9223372036854775809"),
    ENVELOPE.replace(b'"x"', b"1234567890123456789012345678901234567890"), ENVELOPE.replace(b'"x"', b"-0"),
    ENVELOPE.replace(b'"x"', b"NaN"), ENVELOPE.replace(b'"x"', b"01"), ENVELOPE.replace(b'"x"', b"1."),
    ENVELOPE.replace(b'"x"', b"-"), ENVELOPE.replace(b'"x"', b"tru"), ENVELOPE.replace(b'"x"', b"[1,]"),
    ENVELOPE.replace(b'"x"', b"[" * 2000 + b"]" * 2000), ENVELOPE.replace(b'"x"', b"[" * 20 + b"]" * 20),
    ENVELOPE.replace(b'"op":"u"', b'"op":"q"'), ENVELOPE.replace(b'"op":"u"', b'"op":"\\u0075"'),
    ENVELOPE.replace(b'"op":"u"', b'"op":1'), ENVELOPE.replace(b'"op":"u",', b""),
    ENVELOPE.replace(b'"version":7', b'"version":"7"'), ENVELOPE.replace(b'"version":7', b'"version":7.0'),
    ENVELOPE.replace(b'"version":7', b'"version":true'), ENVELOPE.replace(b',"version":7', b""),
    ENVELOPE.replace(b'"ts_ms":5', b'"ts_ms":5.5'), ENVELOPE.replace(b'"ts_ms":5', b'"ts_ms":"5"'),
    ENVELOPE.replace(b'"ts_ms":5', b'"ts_ms":null'), ENVELOPE.replace(b'"ts_ms":5', b'"ts_ms":99999999999999999999'),
    ENVELOPE.replace(b'"after":{"id":1,"s":"x"}', b'"after":[1]'),
    ENVELOPE.replace(b'"before":null', b'"before":{"id":0}'), ENVELOPE.replace(b'"before":null', b'"before":3'),
    ENVELOPE.replace(b'"after"', b'"\\u0061fter"'), ENVELOPE + b"" + b"",
    ENVELOPE.replace(b'"op":"u"', b'"op":"d","op":"u"'), ENVELOPE.replace(b'"s":"x"', b'"s":"x","s":"y"'),
    ENVELOPE.replace(b'"source":{', b'"source":[').replace(b'7},', b'7],'),
    b'{"schema":{"type":"struct"},"payload":{"op":"c","after":{"id":1},"source":{"version":1}}}',
    b"", b"null", b"[]", b"{}", b'"x"',
]


@needs_c
@pytest.mark.parametrize("value", ODD, ids=range(len(ODD)))
def test_an_odd_value_is_poison_or_an_event_exactly_as_the_general_path_says(value):
    record = LogRecord("p.shop.public.orders", 0, 1, b'{"id":1}', value, 0)
    [event] = decode_records([record], raw_rows=True)
    assert same(event, general(record))


@needs_c
def test_mutated_values_never_pass_where_the_general_path_refuses_them():
    rng = random.Random(11)
    batch = records(200, seed=5)
    mutated = []
    for record in batch:
        if record.value is None:
            continue
        for _ in range(8):
            value = bytearray(record.value)
            for _ in range(rng.randrange(1, 3)):
                at = rng.randrange(len(value))
                value[at] = rng.choice([rng.randrange(256), ord('"'), ord("\\"), ord("}"), ord(","), ord("e")])
            mutated.append(record._replace(value=bytes(value)))
    out = decode_records(mutated, raw_rows=True)
    poison = 0
    for record, event in zip(mutated, out):
        reference = general(record)
        poison += isinstance(reference, PoisonRecord)
        assert same(event, reference), record.value
    assert poison > 100  # the mutations did make poison records


def columns() -> list[ColumnPlan]:
    def plan(name, family, skipped=False):
        return ColumnPlan(name, family, None, "text", name == "id", skipped)
    return [plan("id", Family.INTEGER), plan("a", Family.TEXT), plan("b", Family.FLOAT), plan("c", Family.BOOLEAN),
            plan("j", Family.JSON), plan("x", Family.TEXT, skipped=True), plan("é", Family.TEXT),
            plan("tab\tname", Family.TEXT), plan("absent", Family.INTEGER)]


@needs_c
def test_copy_lines_from_bytes_are_the_lines_of_the_decoded_rows():
    events = [e for e in decode_records(records(800, seed=9), raw_rows=True)
              if not isinstance(e, PoisonRecord) and isinstance(e.after, bytes)]
    by_hand = [b'{"id":1,"a":18446744073709551616,"b":-9223372036854775809,"c":-0}',
               b'{"id":2,"a":1E2,"b":1.50,"c":-0.0,"j":1.50,"x":"skipped"}',
               b'{"id":3,"a":123456789012345678901234567890,"b":1e-400,"j":"\\u00e9\\n","\\u00e9":"\\t"}',
               b'{ "id" : 4 , "a" : [ 1 , { "b" : 2 } ] , "tab\\tname" : "\\ud83d\\ude00\\/" }']
    events += [events[0]._replace(after=after) for after in by_hand]
    pairs = [(orjson.dumps(e.key) if i % 5 else b'{"id":"a\\\\b"}', e) for i, e in enumerate(events)]
    fast = copy_rows.formatter(columns(), NATIVE.copy_rows)(pairs)
    reference = copy_rows.python_formatter(columns())([(k, decoded(e)) for k, e in pairs])
    assert fast.count(b"\n") == len(pairs) > 300
    assert fast == reference


@needs_c
def test_copy_lines_of_a_mixed_batch_hold_every_row_once():
    events = [e for e in decode_records(records(60), raw_rows=True) if isinstance(e.after, bytes)]
    pairs = [(orjson.dumps(e.key), e if i % 2 else decoded(e)) for i, e in enumerate(events)]
    fast = copy_rows.formatter(columns(), NATIVE.copy_rows)(pairs)
    reference = copy_rows.python_formatter(columns())([(k, decoded(e)) for k, e in pairs])
    assert sorted(fast.splitlines()) == sorted(reference.splitlines())


@needs_c
def test_a_member_name_with_an_escaped_backslash_falls_back_to_the_decoded_row():
    value = ENVELOPE.replace(b'"s":"x"', b'"a\\\\b":"x","a":"y"')
    event = decode_records([LogRecord("t", 0, 0, b'{"id":1}', value, 0)], raw_rows=True)[0]
    assert isinstance(event.after, bytes)
    pairs = [(b'{"id":1}', event)]
    reference = copy_rows.python_formatter(columns())([(b'{"id":1}', decoded(event))])
    assert copy_rows.formatter(columns(), NATIVE.copy_rows)(pairs) == reference


@needs_c
def test_names_outside_the_table_from_bytes_and_dicts():
    rows = [b'{"id":1,"a":2,"new":3}', {"id": 2, "other": 1}, b'{"\\u00e9t\\u00e9":1,"a\\\\b":2,"\\u0061":3}', b"{}"]
    assert copy_rows.names_outside(rows, {"id", "a"}, NATIVE.unknown_names) == {"new", "other", "été", "a\\b"}
    assert copy_rows.names_outside([b'{"id":1}'], {"id"}, NATIVE.unknown_names) == set()
