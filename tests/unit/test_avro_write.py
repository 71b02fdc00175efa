"""The compiled Avro writer writes what fastavro writes, byte for byte (fastavro is the reference
here: the registry's and Connect's readers read its output), both ways it runs: its closures and
their walk in C (cdc/_avro.c)."""

from __future__ import annotations

from io import BytesIO

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc import native
from cdc.formats.avro_schema import to_avro
from cdc.formats.avro_write import compile_encoder, compile_writer
from tests.unit.test_avro_schema import ENVELOPE

SCHEMA = {"type": "record", "name": "R", "namespace": "t", "fields": [
    {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
    {"name": "f", "type": "float"}, {"name": "d", "type": "double"}, {"name": "b", "type": "boolean"},
    {"name": "s", "type": "string"}, {"name": "by", "type": "bytes"},
    {"name": "ol", "type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}],
     "default": None},
    {"name": "snap", "type": ["string", "null"], "default": "false"},
    {"name": "dec", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}],
     "default": None},
    {"name": "arr", "type": ["null", {"type": "array", "items": ["null", "string"]}], "default": None},
    {"name": "m", "type": {"type": "map", "values": "long"}},
    {"name": "inner", "type": ["null", {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]}],
     "default": None},
    {"name": "again", "type": ["null", "t.In"], "default": None},
]}

values = st.fixed_dictionaries({
    "i": st.integers(-2**31, 2**31 - 1), "l": st.integers(-2**63, 2**63 - 1),
    "f": st.floats(width=32, allow_nan=False), "d": st.floats(allow_nan=False), "b": st.booleans(),
    "s": st.text(), "by": st.binary(), "ol": st.none() | st.integers(-2**63, 2**63 - 1),
    "snap": st.none() | st.text(max_size=5), "dec": st.none() | st.binary(min_size=1, max_size=8),
    "arr": st.none() | st.lists(st.none() | st.text(max_size=4), max_size=4),
    "m": st.dictionaries(st.text(max_size=3), st.integers(-1000, 1000), max_size=3),
    "inner": st.none() | st.fixed_dictionaries({"x": st.integers(-5, 5)}),
    "again": st.none() | st.fixed_dictionaries({"x": st.integers(-5, 5)}),
})


def _fastavro(schema, value) -> bytes:
    out = BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def _closures(schema, value) -> bytes:
    out = bytearray()
    compile_writer(schema)(out, value)
    return bytes(out)


def _in_c(schema, value) -> bytes:
    return compile_encoder(schema)(b"", value)


C_BUILT = native.load("cdc._avro") is not None and native.enabled()
WAYS = [_closures, pytest.param(_in_c, marks=pytest.mark.skipif(not C_BUILT, reason="cdc/_avro.c not built"))]


def test_the_c_writer_is_built_where_a_compiler_is():
    # The test environment builds every extension (scripts/setup); a missing one would hide here.
    assert C_BUILT


@pytest.mark.parametrize("_ours", WAYS)
@settings(max_examples=300, deadline=None)
@given(value=values)
def test_the_same_bytes_as_fastavro(_ours, value):
    assert _ours(SCHEMA, value) == _fastavro(SCHEMA, value)


def test_the_encoder_puts_the_header_first_and_runs_the_closures_under_the_reference_switch():
    value = {"before": None, "after": None, "op": "c"}
    schema = to_avro(ENVELOPE)
    encode = compile_encoder(schema)
    with native.reference():
        by_closures = encode(b"\x00\x00\x00\x00\x07", value)
    assert by_closures == b"\x00\x00\x00\x00\x07" + _fastavro(schema, value)
    assert encode(b"\x00\x00\x00\x00\x07", value) == by_closures


def test_a_self_referring_record_is_written_by_the_closures():
    schema = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "long"}, {"name": "next", "type": ["null", "Node"], "default": None}]}
    value = {"v": 1, "next": {"v": -2, "next": None}}
    assert compile_encoder(schema)(b"", value) == _fastavro(schema, value)


@pytest.mark.parametrize("_ours", WAYS)
def test_an_envelope_with_a_named_row_type_and_defaults_for_missing_fields(_ours):
    schema = to_avro(ENVELOPE)
    row = {"id": 1, "sm": -3, "price": b"\x04\xd2", "cd": 19000, "ts": 1_704_164_645_500_000,
           "n": {"scale": 2, "value": b"\x01"}, "tags": ["a", None]}
    for value in ({"before": None, "after": row, "op": "c"}, {"before": row, "after": None, "snapshot": None,
                                                                "op": "d"}):
        assert _ours(schema, value) == _fastavro(schema, value)


@pytest.mark.parametrize("_ours", WAYS)
def test_a_missing_field_without_a_default_is_an_error_naming_it(_ours):
    with pytest.raises(ValueError, match="'op'"):
        _ours(to_avro(ENVELOPE), {"before": None, "after": None})


@pytest.mark.parametrize("_ours", WAYS)
@pytest.mark.parametrize(("field", "bad", "error"), [
    ("i", "7", TypeError), ("s", 7, (TypeError, AttributeError)), ("by", "text", TypeError),
    ("l", 2**64, OverflowError), ("f", 1e300, OverflowError), ("inner", {"y": 1}, ValueError)])
def test_a_wrong_value_is_a_typed_error(_ours, field, bad, error):
    good = {"i": 1, "l": 2, "f": 1.5, "d": 2.5, "b": True, "s": "x", "by": b"y", "m": {}}
    with pytest.raises(error):
        _ours(SCHEMA, {**good, field: bad})


@pytest.mark.skipif(not C_BUILT, reason="cdc/_avro.c not built")
def test_the_c_writer_names_the_record_and_field_of_a_wrong_value():
    good = {"i": 1, "l": 2, "f": 1.5, "d": 2.5, "b": True, "s": "x", "by": b"y", "m": {}}
    with pytest.raises(TypeError, match=r"^t\.R\.s: an Avro string needs str, got int$"):
        _in_c(SCHEMA, {**good, "s": 7})
    with pytest.raises(ValueError, match=r"^t\.R\.inner: t\.In: field 'x' is missing and has no default$"):
        _in_c(SCHEMA, {**good, "inner": {"y": 1}})
