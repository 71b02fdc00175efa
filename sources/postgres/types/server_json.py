"""SQL expressions that make PostgreSQL itself print a column's JSON value, as the converters would.

The snapshot's hot path: ``row_to_json`` over these expressions lets the server build each row's
JSON in its own process (on another core than ours) instead of Python converting every column's
text. It is used only when every column of a table has an expression here; a table with a column
that has none (json/jsonb, arrays, ranges, multiranges, hstore) is read through the converters.

``row_to_json`` prints by the column's type (domains by their base type): bool as true/false,
int2/int4/int8/float4/float8/numeric as a number when the output text is a valid JSON number and
as a string otherwise (float ``NaN``/``Infinity`` become strings, as ``to_float`` keeps them),
date/timestamp/timestamptz in its own ISO format, arrays and composites as JSON structures, types
with a cast to json through that cast, and everything else as its output text in a string. Where
that differs from the converters, the expression hands it the output text instead (``concat``
gives a value's output-function text, without the cast functions ``::text`` may pick: inet's
adds ``/32``, bpchar's drops the padding):

* numeric, date, composites, enums, every non-built-in type (an extension may cast its type to
  json) and the built-ins not known to print as a string: the output text, as ``as_text`` keeps it.
* timestamp/timestamptz: the text reshaped like ``timestamp_to_iso``/``timestamptz_to_iso``.
* bytea: base64 without line breaks, like ``bytea_to_base64``.
* oid: a number (row_to_json would print it as a string).

The values equal the converters' (tests/integration/test_pg_types_live.py checks every type);
the bytes may differ in spacing of numbers (``1.5e+300`` for ``1.5e300``) and in which
characters are escaped, which no JSON reader sees.
"""

from __future__ import annotations

from collections.abc import Mapping

from sources.postgres.types.catalog import BUILTIN_TYPES, TypeInfo, TypeKind

_AS_IS = frozenset({16, 20, 21, 23, 700, 701})  # bool, int8, int2, int4, float4, float8
# Built-in types row_to_json prints as their output text in a string, as the converters keep them:
# text, varchar, bpchar, name, "char", uuid, time, timetz, interval, inet, cidr, macaddr,
# macaddr8, money, bit, varbit, xml. Other built-ins go through concat (to be sure of the text).
_STRING = frozenset({25, 1043, 1042, 19, 18, 2950, 1083, 1266, 1186, 869, 650, 829, 774, 790, 1560, 1562, 142})
_NONE = frozenset({114, 3802})                  # json, jsonb: kept on the converter path
_MAX_DEPTH = 16


def _text(column: str) -> str:
    """The output-function text of ``column``, NULL kept NULL (``concat`` alone makes it '')."""
    return f"CASE WHEN {column} IS NULL THEN NULL ELSE concat({column}) END"


def json_expression(type_oid: int, catalog: Mapping[int, TypeInfo], column: str, _depth: int = 0) -> str | None:
    """An expression over ``column`` (quoted SQL) whose ``row_to_json`` value equals what
    ``converter_for(type_oid)`` makes of the column's text; None when there is none."""
    if _depth > _MAX_DEPTH or type_oid in _NONE:
        return None
    if type_oid in _AS_IS or type_oid in _STRING:
        return column
    if type_oid == 26:  # oid
        return f"{column}::int8"
    if type_oid == 17:  # bytea
        return f"translate(encode({column}, 'base64'), E'\\n', '')"
    if type_oid == 1114:  # timestamp: 'T' for the space, BC values as printed
        text = f"concat({column})"
        return (f"CASE WHEN {column} IS NULL THEN NULL WHEN {text} LIKE '%C' THEN {text} "
                f"ELSE replace({text}, ' ', 'T') END")
    if type_oid == 1184:  # timestamptz under TimeZone=UTC: '... +00' becomes '...Z'
        text = f"concat({column})"
        return (f"CASE WHEN {column} IS NULL THEN NULL WHEN {text} LIKE '%+00' "
                f"THEN replace(left({text}, -3), ' ', 'T') || 'Z' ELSE {text} END")
    info = catalog.get(type_oid) or BUILTIN_TYPES.get(type_oid)
    if info is None:
        return _text(column)
    if info.kind is TypeKind.DOMAIN:
        return json_expression(info.base_oid, catalog, column, _depth + 1)
    if info.kind in (TypeKind.ARRAY, TypeKind.RANGE, TypeKind.MULTIRANGE) or info.name == "hstore":
        return None
    return _text(column)  # numeric, date, enums, composites, other and non-built-in types


# How the reader makes each column's JSON from its COPY text instead (sources/postgres/copy_json.py):
# one kind per expression above, the same decisions in the same order.
RAW, FLOAT, BOOL, STRING, TIMESTAMP, TIMESTAMPTZ, BYTEA = range(1, 8)
_KIND_AS_IS = {16: BOOL, 20: RAW, 21: RAW, 23: RAW, 700: FLOAT, 701: FLOAT}


def json_kind(type_oid: int, catalog: Mapping[int, TypeInfo], _depth: int = 0) -> int | None:
    """The kind of value ``json_expression(type_oid, ...)`` makes row_to_json print: None where
    that has no expression."""
    if _depth > _MAX_DEPTH or type_oid in _NONE:
        return None
    if type_oid in _AS_IS:
        return _KIND_AS_IS[type_oid]
    if type_oid in _STRING:
        return STRING
    if type_oid == 26:  # oid, as int8
        return RAW
    if type_oid == 17:
        return BYTEA
    if type_oid == 1114:
        return TIMESTAMP
    if type_oid == 1184:
        return TIMESTAMPTZ
    info = catalog.get(type_oid) or BUILTIN_TYPES.get(type_oid)
    if info is None:
        return STRING
    if info.kind is TypeKind.DOMAIN:
        return json_kind(info.base_oid, catalog, _depth + 1)
    if info.kind in (TypeKind.ARRAY, TypeKind.RANGE, TypeKind.MULTIRANGE) or info.name == "hstore":
        return None
    return STRING
