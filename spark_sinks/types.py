"""Source column types to Spark types, and which type changes a Delta table can follow.

A schema record names each column's type as the source prints it: PostgreSQL's ``format_type``
(``integer``, ``numeric(10,2)``, ``timestamp(3) with time zone``, ``text[]``) or MySQL's column type
(``int unsigned``, ``decimal(10,2)``, ``datetime(6)``). Values arrive in the event contract's JSON
forms, which Spark's ``from_json`` reads for these types directly (checked in the tests):

* every integer is ``bigint``: widening a source column (int -> bigint) is then no change at all;
  ``bigint unsigned`` does not fit and is ``decimal(20,0)``;
* ``numeric(p,s)`` is ``decimal(p,s)`` up to Spark's 38 digits; an unbounded ``numeric`` (or one
  wider than 38) is ``string``, the exact text, because any fixed scale would round some values;
* float types are ``double`` (``"NaN"``/``"Infinity"`` strings parse as such);
* ``timestamp with time zone`` (and MySQL ``timestamp``) is ``timestamp``, an instant;
  ``timestamp without time zone`` (MySQL ``datetime``) is ``timestamp_ntz``. The source's strings
  for infinities and BC dates do not parse and are NULL in the table;
* ``bytea``/blobs (base64 in the event) are ``binary``;
* json and jsonb are ``string`` (their JSON text) by default; with the sink's
  ``json_columns: variant`` they are Spark 4's ``variant`` (queried with ``variant_get`` and
  ``:`` paths, without parsing the text again on every read);
* arrays, ranges, hstore, time, interval, uuid, enums and anything else are ``string``: nested
  JSON is kept as its JSON text.
"""

from __future__ import annotations

import re

from pyspark.sql import types as T

_INTEGERS = frozenset(
    "smallint integer int bigint int2 int4 int8 tinyint mediumint serial bigserial smallserial "
    "serial2 serial4 serial8 oid year".split())
_DECIMALS = frozenset("numeric decimal dec fixed".split())
_FLOATS = frozenset({"real", "float4", "float8", "float", "double", "double precision"})
_INSTANTS = frozenset({"timestamp with time zone", "timestamptz", "timestamp"})
_LOCAL_TIMES = frozenset({"timestamp without time zone", "datetime"})
_BINARIES = frozenset("bytea blob tinyblob mediumblob longblob binary varbinary".split())

# "name(args) suffix": numeric(10,2), timestamp(3) with time zone, int(11) unsigned
_TYPE = re.compile(r"([a-z][a-z0-9_ ]*?)\s*(?:\(([^()]*)\))?((?:\s+[a-z]+)*)\s*")

MAX_PRECISION = 38  # Spark's DecimalType
_JSON = frozenset({"json", "jsonb"})


def spark_type(type_name: str, json_columns: str = "string") -> T.DataType:
    """The Spark type of a column whose source type is ``type_name``; ``json_columns`` (string or
    variant) is the type of json/jsonb columns."""
    text = type_name.strip().lower()
    if text.endswith("]") or text.startswith("_") or text.endswith("range"):
        return T.StringType()            # arrays (text[], _int4), ranges: their JSON text
    match = _TYPE.fullmatch(text)
    if match is None:
        return T.StringType()            # enum('a','b'), set(...), anything exotic
    name = " ".join(f"{match.group(1)} {match.group(3)}".split())
    unsigned = " unsigned" in name or " zerofill" in name
    name = name.replace(" unsigned", "").replace(" zerofill", "")
    args = [int(a) for a in (match.group(2) or "").split(",") if a.strip().isdigit()]
    if name in _INTEGERS:
        return T.DecimalType(20, 0) if unsigned and name in ("bigint", "int8") else T.LongType()
    if name in _DECIMALS:
        if not args or args[0] > MAX_PRECISION:
            return T.StringType()
        precision, scale = args[0], args[1] if len(args) > 1 else 0
        return T.DecimalType(precision, min(scale, precision))
    if name in _FLOATS:
        return T.DoubleType()
    if name in ("boolean", "bool"):
        return T.BooleanType()
    if name == "date":
        return T.DateType()
    if name in _INSTANTS:
        return T.TimestampType()
    if name in _LOCAL_TIMES:
        return T.TimestampNTZType()
    if name in _BINARIES:
        return T.BinaryType()
    if name in _JSON and json_columns == "variant":
        return T.VariantType()
    return T.StringType()


# 8-byte floats, as PostgreSQL's format_type and MySQL's column type print them (MySQL's
# ``float`` is 4 bytes; ``double(m,d)`` rounds every value it stores).
_DOUBLES = frozenset({"double precision", "float8", "double"})


def is_double(type_name: str) -> bool:
    return type_name.strip().lower() in _DOUBLES


def fits(value_type: T.DataType, column_type: T.DataType) -> bool:
    """True when every value of ``value_type`` can be stored in a column of ``column_type``
    without loss (so a source change to ``value_type`` needs no change of the column)."""
    if value_type == column_type or isinstance(column_type, T.StringType):
        return True
    if isinstance(value_type, T.DecimalType):
        if isinstance(column_type, T.DecimalType):
            return (column_type.scale >= value_type.scale
                    and column_type.precision - column_type.scale >= value_type.precision - value_type.scale)
        return False
    if isinstance(value_type, T.LongType):
        return isinstance(column_type, T.DecimalType) and column_type.precision - column_type.scale >= 19
    if isinstance(value_type, T.DateType):
        return isinstance(column_type, (T.TimestampNTZType,))
    return False


def widening(old: T.DataType, new: T.DataType) -> bool:
    """True when Delta's type widening can change a column from ``old`` to ``new`` in place
    (a metadata change, existing files untouched): decimals that grow, a date to timestamp_ntz."""
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return (new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
                and new.precision > old.precision)
    return isinstance(old, T.DateType) and isinstance(new, T.TimestampNTZType)


def recast(old: T.DataType, new: T.DataType) -> bool:
    """True when a column of ``old`` that becomes ``new`` in the source can take the source's own
    cast of every value it holds: a decimal or a bigint into a double (given an 8-byte float in
    the source, ``TableShape.doubles``). Spark's cast rounds to the nearest double, as the
    sources' do (Java's ``BigDecimal.doubleValue`` and long-to-double conversion; PostgreSQL and
    MySQL/MariaDB parse a numeric's text with strtod); Delta's type widening cannot make either
    change, so the table is rewritten (``TableTarget.recast``)."""
    return isinstance(new, T.DoubleType) and isinstance(old, (T.DecimalType, T.LongType))
