"""The compiled Avro writer writes what fastavro writes, byte for byte (fastavro is the reference
here: the registry's and Connect's readers read its output)."""

from __future__ import annotations

from io import BytesIO

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.formats.avro_schema import to_avro
from cdc.formats.avro_write import compile_writer
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


def _ours(schema, value) -> bytes:
    out = bytearray()
    compile_writer(schema)(out, value)
    return bytes(out)


@settings(max_examples=300, deadline=None)
@given(values)
def test_the_same_bytes_as_fastavro(value):
    assert _ours(SCHEMA, value) == _fastavro(SCHEMA, value)


def test_an_envelope_with_a_named_row_type_and_defaults_for_missing_fields():
    schema = to_avro(ENVELOPE)
    row = {"id": 1, "sm": -3, "price": b"\x04\xd2", "cd": 19000, "ts": 1_704_164_645_500_000,
           "n": {"scale": 2, "value": b"\x01"}, "tags": ["a", None]}
    for value in ({"before": None, "after": row, "op": "c"}, {"before": row, "after": None, "snapshot": None,
                                                                "op": "d"}):
        assert _ours(schema, value) == _fastavro(schema, value)


def test_a_missing_field_without_a_default_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'op'"):
        _ours(to_avro(ENVELOPE), {"before": None, "after": None})
