"""Column types -> Kafka Connect field schemas and value converters, as Debezium's connectors map them.

Input is a column of a schema record (the database's type name: ``numeric(10,2)``,
``timestamp(3) without time zone``, ``int(10) unsigned`` ...) and a value in the ``json`` format's
form (ARCHITECTURE.md, "Types"); output is the Connect schema of the field and a function from
that value to the value Debezium writes. The mappings follow the "how the connector maps data
types" pages of Debezium's PostgreSQL and MySQL connectors, with the type-mode options users set
(``DebeziumOptions``). A value with no Debezium encoding (numeric NaN, a date at infinity)
becomes null; docs/wire-formats.md lists every difference from Debezium's own values.

The mapping runs once per column of a shape; the converters (``connect_values``) run per value,
so each is a small closure over what the column's type fixed (scale, precision, the labels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdc.formats.connect_values import (
    Convert,
    binary_converter,
    bits_converter,
    days,
    decimal_converter,
    duration_micros,
    epoch_micros,
    json_text,
    micros_of_day,
    ms,
    variable_scale_decimal,
    zoned_time,
    zoned_timestamp,
)

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DATE = "io.debezium.time.Date"
TIME_MS = "io.debezium.time.Time"
MICRO_TIME = "io.debezium.time.MicroTime"
TIMESTAMP_MS = "io.debezium.time.Timestamp"
MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
ZONED_TIME = "io.debezium.time.ZonedTime"
MICRO_DURATION = "io.debezium.time.MicroDuration"
YEAR = "io.debezium.time.Year"
CONNECT_DATE = "org.apache.kafka.connect.data.Date"
CONNECT_TIME = "org.apache.kafka.connect.data.Time"
CONNECT_TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
JSON = "io.debezium.data.Json"
UUID = "io.debezium.data.Uuid"
XML = "io.debezium.data.Xml"
ENUM = "io.debezium.data.Enum"
ENUM_SET = "io.debezium.data.EnumSet"
BITS = "io.debezium.data.Bits"

DECIMAL_MODES = ("precise", "string", "double")
TIME_MODES = ("adaptive", "adaptive_time_microseconds", "connect")
BINARY_MODES = ("bytes", "base64", "base64-url-safe", "hex")

# Each connector's default time.precision.mode (Debezium's MySQL connector defaults to
# adaptive_time_microseconds, the PostgreSQL connector to adaptive).
DEFAULT_TIME_MODE = {"mysql": "adaptive_time_microseconds"}


@dataclass(frozen=True, slots=True)
class DebeziumOptions:
    """Debezium's type-mode settings, with its defaults. ``time_precision_mode=None``: each
    connector's own default."""

    decimal_handling_mode: str = "precise"
    time_precision_mode: str | None = None
    binary_handling_mode: str = "bytes"

    def time_mode(self, connector: str) -> str:
        return self.time_precision_mode or DEFAULT_TIME_MODE.get(connector, "adaptive")


@dataclass(frozen=True, slots=True)
class FieldType:
    """A field's Connect schema (without ``field``/``optional``) and its value converter
    (``None``: the ``json`` value is already Debezium's)."""

    schema: dict
    convert: Convert | None = None


# --- schemas ------------------------------------------------------------------------------------

def _plain(kind: str) -> FieldType:
    return FieldType({"type": kind})


def _named(kind: str, name: str, convert: Convert | None = None, version: int | None = 1,
           parameters: dict | None = None) -> FieldType:
    schema: dict = {"type": kind, "name": name}
    if version is not None:
        schema["version"] = version
    if parameters:
        schema["parameters"] = parameters
    return FieldType(schema, convert)


def decimal_type(precision: int | None, scale: int, options: DebeziumOptions, money: bool = False) -> FieldType:
    mode = options.decimal_handling_mode
    if mode == "string":
        return FieldType({"type": "string"}, decimal_converter(scale, mode, money))
    if mode == "double":
        return FieldType({"type": "double"}, decimal_converter(scale, mode, money))
    parameters = {"scale": str(scale)}
    if precision is not None:
        parameters["connect.decimal.precision"] = str(precision)
    return _named("bytes", DECIMAL, decimal_converter(scale, mode, money), parameters=parameters)


def variable_decimal_type(options: DebeziumOptions) -> FieldType:
    mode = options.decimal_handling_mode
    if mode != "precise":
        return FieldType({"type": "string" if mode == "string" else "double"},
                         str if mode == "string" else decimal_converter(0, "double"))
    schema = {"type": "struct", "name": VARIABLE_SCALE_DECIMAL, "version": 1,
              "doc": "Variable scaled decimal",
              "fields": [{"type": "int32", "optional": False, "field": "scale"},
                         {"type": "bytes", "optional": False, "field": "value"}]}
    return FieldType(schema, variable_scale_decimal)


def date_type(mode: str) -> FieldType:
    return _named("int32", CONNECT_DATE if mode == "connect" else DATE, days)


def time_type(precision: int, mode: str) -> FieldType:
    if mode == "connect":
        return _named("int32", CONNECT_TIME, ms(micros_of_day))
    if mode == "adaptive" and precision <= 3:
        return _named("int32", TIME_MS, ms(micros_of_day))
    return _named("int64", MICRO_TIME, micros_of_day)


def timestamp_type(precision: int, mode: str) -> FieldType:
    if mode == "connect":
        return _named("int64", CONNECT_TIMESTAMP, ms(epoch_micros))
    if precision <= 3:
        return _named("int64", TIMESTAMP_MS, ms(epoch_micros))
    return _named("int64", MICRO_TIMESTAMP, epoch_micros)


_ARGS = re.compile(r"\(([^)]*)\)")


def _split(type_name: str) -> tuple[str, list[str], str]:
    """``timestamp(3) without time zone`` -> (``timestamp without time zone``, ["3"], full)."""
    lowered = type_name.strip().lower()
    match = _ARGS.search(lowered)
    args = [a.strip() for a in match.group(1).split(",")] if match else []
    base = " ".join(_ARGS.sub("", lowered).split())
    return base, args, lowered


def _int_arg(args: list[str], index: int, default: int) -> int:
    try:
        return int(args[index])
    except (IndexError, ValueError):
        return default


def field_type(connector: str, type_name: str, options: DebeziumOptions) -> FieldType:
    """The Connect field type of a column of ``connector``'s database with ``type_name``."""
    if connector == "mysql":
        return mysql_type(type_name, options)
    if connector == "postgresql":
        return postgres_type(type_name, options)
    return _plain("string")


def postgres_type(type_name: str, options: DebeziumOptions) -> FieldType:
    if type_name.endswith("[]"):
        element = postgres_type(type_name[:-2], options)
        schema = {"type": "array", "items": {**element.schema, "optional": True}}
        convert = element.convert
        return FieldType(schema, None if convert is None else
                         (lambda values: [None if v is None else convert(v) for v in values]))
    base, args, _ = _split(type_name)
    mode = options.time_mode("postgresql")
    simple = _POSTGRES_SIMPLE.get(base)
    if simple is not None:
        return simple
    if base in ("numeric", "decimal"):
        if not args:
            return variable_decimal_type(options)
        return decimal_type(_int_arg(args, 0, 0), _int_arg(args, 1, 0), options)
    if base == "money":
        return decimal_type(None, 2, options, money=True)
    if base == "bytea":
        return FieldType({"type": "string" if options.binary_handling_mode != "bytes" else "bytes"},
                         binary_converter(options.binary_handling_mode))
    if base == "date":
        return date_type(mode)
    if base in ("time without time zone", "time"):
        return time_type(_int_arg(args, 0, 6), mode)
    if base in ("timestamp without time zone", "timestamp"):
        return timestamp_type(_int_arg(args, 0, 6), mode)
    if base in ("timestamp with time zone", "timestamptz"):
        return _named("string", ZONED_TIMESTAMP, zoned_timestamp(_int_arg(args, 0, 6)))
    if base in ("time with time zone", "timetz"):
        return _named("string", ZONED_TIME, zoned_time)
    if base == "interval":
        return _named("int64", MICRO_DURATION, duration_micros)
    if base in ("json", "jsonb", "hstore"):
        return _named("string", JSON, json_text)
    if base == "bit" and _int_arg(args, 0, 1) == 1:
        return FieldType({"type": "boolean"}, lambda v: v in ("1", 1, True))
    if base in ("bit", "bit varying"):
        return _named("bytes", BITS, bits_converter(_int_arg(args, 0, 64)),
                      parameters={"length": str(_int_arg(args, 0, 64))})
    return _plain("string")


_POSTGRES_SIMPLE = {
    "boolean": _plain("boolean"),
    "smallint": _plain("int16"),
    "integer": _plain("int32"),
    "bigint": _plain("int64"),
    "oid": _plain("int64"),
    "real": _plain("float"),
    "double precision": _plain("double"),
    "uuid": _named("string", UUID),
    "xml": _named("string", XML),
}


_MYSQL_INTS = {  # (signed, unsigned) Connect types, bigint.unsigned.handling.mode=long
    "tinyint": ("int16", "int16"), "smallint": ("int16", "int32"), "mediumint": ("int32", "int32"),
    "int": ("int32", "int64"), "integer": ("int32", "int64"), "bigint": ("int64", "int64"),
}
_MYSQL_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext"}
_MYSQL_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_LABELS = re.compile(r"'((?:[^']|'')*)'")


def _labels(full: str) -> str:
    return ",".join(m.replace("''", "'") for m in _LABELS.findall(full))


def mysql_type(type_name: str, options: DebeziumOptions) -> FieldType:
    base, args, full = _split(type_name)
    unsigned = "unsigned" in base.split()
    word = base.split()[0] if base else base
    mode = options.time_mode("mysql")
    if word == "bigint" and unsigned:
        # bigint.unsigned.handling.mode=long: Java's long, so values past 2^63-1 wrap to negative
        return FieldType({"type": "int64"}, lambda v: v - (1 << 64) if v >= 1 << 63 else v)
    if word in _MYSQL_INTS:
        return _plain(_MYSQL_INTS[word][1 if unsigned else 0])
    if word in ("decimal", "numeric", "dec", "fixed"):
        return decimal_type(_int_arg(args, 0, 10), _int_arg(args, 1, 0), options)
    if word == "float":
        return _plain("double" if len(args) == 2 or _int_arg(args, 0, 0) > 23 else "float")
    if word in ("double", "real"):
        return _plain("double")
    if word in ("bool", "boolean"):
        return _plain("boolean")
    if word in _MYSQL_TEXT:
        return _plain("string")
    if word in _MYSQL_BINARY:
        return FieldType({"type": "string" if options.binary_handling_mode != "bytes" else "bytes"},
                         binary_converter(options.binary_handling_mode))
    if word == "date":
        return date_type(mode)
    if word == "datetime":
        return timestamp_type(_int_arg(args, 0, 0), mode)
    if word == "timestamp":
        return _named("string", ZONED_TIMESTAMP, zoned_timestamp(None))
    if word == "time":
        return time_type(_int_arg(args, 0, 0), mode)
    if word == "year":
        return _named("int32", YEAR)
    if word == "json":
        return _named("string", JSON, json_text)
    if word == "enum":
        return _named("string", ENUM, parameters={"allowed": _labels(full)})
    if word == "set":
        return _named("string", ENUM_SET, lambda labels: ",".join(labels), parameters={"allowed": _labels(full)})
    if word == "bit":
        length = _int_arg(args, 0, 1)
        if length == 1:
            return FieldType({"type": "boolean"}, bool)
        return _named("bytes", BITS, bits_converter(length), parameters={"length": str(length)})
    return FieldType({"type": "bytes"})  # geometry and other types the json format gives as base64
