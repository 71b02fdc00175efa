"""Avro binary encoding of the schemas ``avro_schema.to_avro`` makes, compiled once per schema into
one closure per type, so writing a record is a walk of plain function calls.

fastavro's per-record entry points resolve every union by trying its branches against the value
(for a ``["null", record]`` that validates the whole row) and look the logical types up per
value; the schemas here are known when a table's shape is, so all of that is decided once. The
output is byte for byte what fastavro writes (tests/unit/test_avro_write.py checks it). Values are
the Avro forms: ``bytes`` for bytes and decimals (unscaled two's complement), ints for dates,
times and timestamps; a missing field is written as its default, or is an error if it has none.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from cdc import native

Writer = Callable[[bytearray, Any], None]
Encoder = Callable[[bytes, Any], bytes]

_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_FLOAT = struct.Struct("<f").pack
_DOUBLE = struct.Struct("<d").pack


def write_long(out: bytearray, n: int) -> None:
    """Zigzag varint (Avro's int and long alike)."""
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise OverflowError(f"{n} is out of an Avro long's range")
    n = (n << 1) ^ (n >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _string(out: bytearray, value: str) -> None:
    data = value.encode()
    write_long(out, len(data))
    out += data


def _bytes(out: bytearray, value: bytes) -> None:
    write_long(out, len(value))
    out += value


def _boolean(out: bytearray, value: bool) -> None:
    out.append(1 if value else 0)


def _float(out: bytearray, value: float) -> None:
    out += _FLOAT(value)


def _double(out: bytearray, value: float) -> None:
    out += _DOUBLE(value)


def _null(out: bytearray, value: None) -> None:
    if value is not None:
        raise TypeError(f"an Avro null needs None, got {type(value).__name__}")


_PRIMITIVES: dict[str, Writer] = {"string": _string, "bytes": _bytes, "int": write_long, "long": write_long,
                                  "boolean": _boolean, "float": _float, "double": _double, "null": _null}


class _Compiler:
    def __init__(self) -> None:
        self.named: dict[str, Writer] = {}

    def compile(self, schema: Any, namespace: str | None = None) -> Writer:
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVES[schema]
            full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            return self._reference(full)
        if isinstance(schema, list):
            return self._union(schema, namespace)
        kind = schema["type"]
        if kind == "record":
            return self._record(schema, namespace)
        if kind == "array":
            return self._array(self.compile(schema["items"], namespace))
        if kind == "map":
            return self._map(self.compile(schema["values"], namespace))
        if isinstance(kind, (dict, list)) or kind not in _PRIMITIVES:
            return self.compile(kind, namespace)
        return _PRIMITIVES[kind]  # a primitive with attributes (logicalType, connect.*): the same bytes

    def _reference(self, full: str) -> Writer:
        named = self.named

        def by_name(out: bytearray, value: Any) -> None:
            named[full](out, value)

        if full not in named:
            raise ValueError(f"Avro schema names {full!r} before defining it")
        return by_name

    def _union(self, branches: list, namespace: str | None) -> Writer:
        if len(branches) != 2 or "null" not in branches:
            raise ValueError(f"only [null, T] and [T, null] unions are compiled, not {branches!r}")
        null_index = branches.index("null")
        inner = self.compile(branches[1 - null_index], namespace)
        null_byte, value_byte = (0, 2) if null_index == 0 else (2, 0)  # zigzag(0), zigzag(1)

        def union(out: bytearray, value: Any) -> None:
            if value is None:
                out.append(null_byte)
            else:
                out.append(value_byte)
                inner(out, value)

        return union

    def _record(self, schema: dict, namespace: str | None) -> Writer:
        name = schema["name"]
        own_namespace = schema.get("namespace", namespace)
        full = name if "." in name or not own_namespace else f"{own_namespace}.{name}"
        fields: list[tuple[str, Writer, Any, bool]] = []

        def record(out: bytearray, value: dict) -> None:
            get = value.get
            for field_name, write, default, has_default in fields:
                item = get(field_name, _MISSING)
                if item is _MISSING:
                    if not has_default:
                        raise ValueError(f"{full}: field {field_name!r} is missing and has no default")
                    item = default
                write(out, item)

        self.named[full] = record  # before the fields: a record may refer to itself
        for field in schema["fields"]:
            fields.append((field["name"], self.compile(field["type"], own_namespace or None),
                           field.get("default"), "default" in field))
        return record

    @staticmethod
    def _array(items: Writer) -> Writer:
        def array(out: bytearray, values: list) -> None:
            if values:
                write_long(out, len(values))
                for value in values:
                    items(out, value)
            out.append(0)

        return array

    @staticmethod
    def _map(values: Writer) -> Writer:
        def map_(out: bytearray, mapping: dict) -> None:
            if mapping:
                write_long(out, len(mapping))
                for key, value in mapping.items():
                    _string(out, key)
                    values(out, value)
            out.append(0)

        return map_


_MISSING = object()


def compile_writer(schema: Any) -> Writer:
    """``writer(out, value)`` appends ``value`` in Avro binary to the bytearray ``out``."""
    return _Compiler().compile(schema)


# --- the same walk in C (cdc/_avro.c) -----------------------------------------------------------

_avro = native.load("cdc._avro")
# The node kinds of a program, as cdc/_avro.c numbers them; a primitive's node is its number.
_P_NULL, _P_BOOLEAN, _P_LONG, _P_FLOAT, _P_DOUBLE, _P_BYTES, _P_STRING = range(7)
_K_UNION, _K_RECORD, _K_ARRAY, _K_MAP = range(7, 11)
_P_KINDS = {"null": _P_NULL, "boolean": _P_BOOLEAN, "int": _P_LONG, "long": _P_LONG, "float": _P_FLOAT,
            "double": _P_DOUBLE, "bytes": _P_BYTES, "string": _P_STRING}


class _Recursive(Exception):
    """A record that refers to itself: its program would be a cycle, so only the closures write it."""


class _Programs:
    """A schema as the nested tuples cdc/_avro.c walks (see its header), checked as ``_Compiler``
    checks it."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}

    def compile(self, schema: Any, namespace: str | None = None) -> Any:
        if isinstance(schema, str):
            if schema in _P_KINDS:
                return _P_KINDS[schema]
            full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            if full not in self.named:
                raise ValueError(f"Avro schema names {full!r} before defining it")
            if self.named[full] is None:
                raise _Recursive(full)
            return self.named[full]
        if isinstance(schema, list):
            if len(schema) != 2 or "null" not in schema:
                raise ValueError(f"only [null, T] and [T, null] unions are compiled, not {schema!r}")
            null_index = schema.index("null")
            return (_K_UNION, null_index == 0, self.compile(schema[1 - null_index], namespace))
        kind = schema["type"]
        if kind == "record":
            name = schema["name"]
            own_namespace = schema.get("namespace", namespace)
            full = name if "." in name or not own_namespace else f"{own_namespace}.{name}"
            self.named[full] = None
            fields = tuple((f["name"], f.get("default"), "default" in f, self.compile(f["type"], own_namespace or None))
                           for f in schema["fields"])
            made = self.named[full] = (_K_RECORD, full, fields)
            return made
        if kind == "array":
            return (_K_ARRAY, self.compile(schema["items"], namespace))
        if kind == "map":
            return (_K_MAP, self.compile(schema["values"], namespace))
        if isinstance(kind, (dict, list)) or kind not in _P_KINDS:
            return self.compile(kind, namespace)
        return _P_KINDS[kind]


def compile_encoder(schema: Any) -> Encoder:
    """``encode(header, value)``: the bytes ``header`` followed by ``value`` in Avro binary. The
    walk runs in C where cdc/_avro.c was built (and ``cdc.native`` is on), else the closures of
    ``compile_writer``: the same bytes either way."""
    write = compile_writer(schema)

    def by_closures(header: bytes, value: Any) -> bytes:
        out = bytearray(header)
        write(out, value)
        return bytes(out)

    if _avro is None:
        return by_closures
    try:
        program = _Programs().compile(schema)
    except _Recursive:
        return by_closures
    in_c = _avro.write
    enabled = native.enabled

    def encode(header: bytes, value: Any) -> bytes:
        if enabled():
            return in_c(program, value, header)
        return by_closures(header, value)

    return encode
