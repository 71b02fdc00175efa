"""Kafka Connect JSON (the ``debezium-json`` format) decoded with Spark SQL expressions.

A record of that format carries its Connect schema beside the values (``{"schema", "payload"}``).
The schemas of a topic are few (one per table shape and type-mode setting), so the driver reads
each one once (``ConnectCodecs``, keyed by a hash of the schema's text that every record
carries in the ``codec`` column, see ``parse.envelopes``) and turns each field into a Spark
expression here: the row's JSON is parsed with the field's JSON type, then converted into the
value the ``json`` format gives for the same column, typed as the table's column. So a table
holds the same values whichever format its topic has (tests/integration/test_spark_delta_formats.py),
as the framework's other sinks do through ``cdc/formats/connect_decode.py``.

Conversions, per Debezium logical type (the field's ``name``):

* ``Decimal`` (base64 of Java's ``BigInteger.toByteArray``, scale in the parameters) and
  ``VariableScaleDecimal``: digits from the bytes' hex by 64-bit halves (``conv``), the sign from
  the first bit, the point placed as text, then cast to the column's decimal. Values of more
  than 16 bytes (39 digits and more) fit no Spark decimal; a text column reads them through a
  Python UDF, the only one here;
* ``Date``: ``date_from_unix_date``; ``Timestamp``/``MicroTimestamp``: a ``timestamp_ntz`` from
  the epoch plus microseconds; ``Time``/``MicroTime`` and ``MicroDuration``: the text the
  framework's decoder gives (``HH:MM:SS[.f]``, ``PT<seconds>S``);
* ``Json``: the text parsed once more, so a text column holds the same compact JSON as from the
  ``json`` format (or a VARIANT with ``json_columns: variant``); ``EnumSet``: a JSON array;
  ``Bits``: the integer; ``bigint unsigned`` (written as a wrapped int64): unwrapped;
* ``ZonedTimestamp``, ``decimal.handling.mode`` string or double, ``Uuid``, ``Enum``, bytes and
  the plain Connect types: read as the column's type directly, as in the ``json`` format.

A key with a field of a converted type (a numeric or a date key) is rewritten into the ``json``
format's key text, so MERGE matches the same key from either format.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
TIMES_MS = ("io.debezium.time.Time", "org.apache.kafka.connect.data.Time")
MICRO_TIME = "io.debezium.time.MicroTime"
TIMESTAMPS_MS = ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")
MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
MICRO_DURATION = "io.debezium.time.MicroDuration"
JSON = "io.debezium.data.Json"
ENUM_SET = "io.debezium.data.EnumSet"
BITS = "io.debezium.data.Bits"

# What the envelope parse reads of a Connect JSON value and key (the rest is skipped).
SOURCE = T.StructType([T.StructField("cdc_version", T.LongType()), T.StructField("ts_ms", T.LongType()),
                       T.StructField("cdc_schema_version", T.LongType())])
PAYLOAD = T.StructType([T.StructField("before", T.StringType()), T.StructField("after", T.StringType()),
                        T.StructField("op", T.StringType()), T.StructField("ts_ms", T.LongType()),
                        T.StructField("source", SOURCE)])
KEY = T.StructType([T.StructField("schema", T.StringType()), T.StructField("payload", T.StringType())])

_D38 = T.DecimalType(38, 0)


def _two_64() -> Column:  # literals need a session: made per call, not at import
    return F.lit("18446744073709551616").cast(_D38)


def is_connect(schema_text: Column, payload: Column) -> Column:
    """A record part with Connect JSON's wrapper: a ``schema`` object beside a ``payload``."""
    return schema_text.startswith("{") & payload.isNotNull()


def codec_of(schema_text: Column) -> Column:
    """The id of a Connect schema: a hash of its text (Debezium's converter and ours write the
    same schema as the same text)."""
    return F.xxhash64(schema_text)


# --- the registry of schemas a topic's records carry ---------------------------------------------

@dataclass(frozen=True, slots=True)
class ConnectRow:
    """The field schemas of a row (a value's ``after``/``before`` struct, or a key)."""

    fields: tuple[dict, ...]

    def field(self, name: str) -> dict | None:
        for field in self.fields:
            if field.get("field") == name:
                return field
        return None


class ConnectCodecs:
    """codec id -> ``ConnectRow``, learnt from the schema texts of the records. Touched only from
    the job's ``foreachBatch`` thread."""

    LIMIT = 10_000  # schemas kept; a topic has one per shape and type-mode setting

    def __init__(self) -> None:
        self._rows: dict[int, ConnectRow] = {}

    def __contains__(self, codec: int) -> bool:
        return codec in self._rows

    def known(self) -> list[int]:
        return list(self._rows)

    def get(self, codec: int) -> ConnectRow:
        return self._rows[codec]

    def learn_value(self, codec: int, schema_text: str) -> None:
        """A value's envelope schema: its rows are the ``after`` (else ``before``) struct."""
        self.learn_value_schema(codec, orjson.loads(schema_text))

    def learn_key(self, codec: int, schema_text: str) -> None:
        self.learn_key_schema(codec, orjson.loads(schema_text))

    def learn_value_schema(self, codec: int, schema: dict) -> None:
        """``learn_value`` with the schema parsed (an ``avro`` record's, converted to Connect's)."""
        parts = {f.get("field"): f for f in schema.get("fields") or []}
        row = parts.get("after") or parts.get("before") or {}
        self._remember(codec, ConnectRow(tuple(row.get("fields") or ())))

    def learn_key_schema(self, codec: int, schema: dict) -> None:
        self._remember(codec, ConnectRow(tuple(schema.get("fields") or ())))

    def _remember(self, codec: int, row: ConnectRow) -> None:
        if len(self._rows) >= self.LIMIT:
            self._rows.clear()
        self._rows[codec] = row


# --- values -----------------------------------------------------------------------------------

def _unscaled_digits(b64: Column, wide: bool) -> Column:
    """Base64 of a big-endian two's complement integer -> its decimal digits, with a ``-``.
    Up to 16 bytes in SQL; ``wide``: longer ones through a Python UDF (else NULL)."""
    hexed = F.hex(F.unbase64(b64))
    negative = F.substring(hexed, 1, 1) >= F.lit("8")
    # A negative number's magnitude is its complement plus one (no 128-bit integers in SQL).
    magnitude_hex = F.lpad(F.when(negative, F.translate(hexed, "0123456789ABCDEF", "FEDCBA9876543210"))
                           .otherwise(hexed), 32, "0")
    high = F.conv(F.substring(magnitude_hex, 1, 16), 16, 10).cast(_D38)
    low = F.conv(F.substring(magnitude_hex, 17, 16), 16, 10).cast(_D38)
    magnitude = high * _two_64() + low
    # Spark's unary minus on a DECIMAL(38,0) of 38 digits drops low digits: the sign goes on as text.
    digits = F.when(negative, F.concat(F.lit("-"), (magnitude + F.lit(1).cast(_D38)).cast("string"))) \
        .otherwise(magnitude.cast("string"))
    fits = F.length(hexed) <= 32
    if not wide:
        return F.when(fits, digits)
    return F.when(fits, digits).otherwise(_wide_unscaled()(F.when(~fits, b64)))


def _wide_unscaled():
    @F.udf(T.StringType())
    def wide_unscaled(b64: str | None) -> str | None:
        return None if b64 is None else str(int.from_bytes(base64.b64decode(b64), "big", signed=True))
    return wide_unscaled


def _place_point(digits: Column, scale: Column | int) -> Column:
    """``-1250`` with scale 2 -> ``-12.50`` (Python's ``format(Decimal(...).scaleb(-scale), "f")``)."""
    scale = F.lit(scale) if isinstance(scale, int) else scale
    negative = digits.startswith("-")
    bare = F.regexp_replace(digits, "^-", "")
    padded = F.lpad(bare, F.greatest(F.length(bare), scale + 1), "0")
    whole = F.substr(padded, F.lit(1), F.length(padded) - scale)
    fraction = F.substr(padded, F.length(padded) - scale + 1, scale)
    text = F.when(scale > 0, F.concat(whole, F.lit("."), fraction)).otherwise(padded)
    return F.when(digits.isNotNull(), F.concat(F.when(negative, F.lit("-")).otherwise(F.lit("")), text))


def _trim_fraction(text: Column) -> Column:
    """``...05.500000`` -> ``...05.5``, ``...05.000000`` -> ``...05``."""
    return F.regexp_replace(text, r"\.?0+$", "")


def _clock(micros: Column) -> Column:
    """Microseconds of a (MySQL: maybe negative or past 24 h) time -> ``[-]HH:MM:SS[.f]``."""
    whole = F.abs(micros)
    seconds = F.floor(whole / 1_000_000)
    fraction = whole % 1_000_000
    clock = F.format_string("%s%02d:%02d:%02d", F.when(micros < 0, F.lit("-")).otherwise(F.lit("")),
                            F.floor(seconds / 3600), F.floor(seconds / 60) % 60, seconds % 60)
    text = F.when(fraction > 0, F.concat(clock, _trim_fraction(F.format_string(".%06d", fraction)))).otherwise(clock)
    return F.when(micros.isNotNull(), text)


def _duration(micros: Column) -> Column:
    """MicroDuration -> ``PT<seconds>[.f]S`` (the framework's decoder's form)."""
    whole = F.abs(micros)
    fraction = whole % 1_000_000
    text = F.concat(F.lit("PT"), F.floor(whole / 1_000_000).cast("string"),
                    F.when(fraction > 0, _trim_fraction(F.format_string(".%06d", fraction))).otherwise(F.lit("")),
                    F.lit("S"))
    return F.when(micros.isNotNull(), F.concat(F.when(micros < 0, F.lit("-")).otherwise(F.lit("")), text))


def _local_timestamp(micros: Column) -> Column:
    return F.lit("1970-01-01 00:00:00").cast(T.TimestampNTZType()) + micros * F.expr("INTERVAL '0.000001' SECOND")


def _timestamp_text(moment: Column) -> Column:
    return _trim_fraction(F.date_format(moment, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"))


def _json_text(text: Column) -> Column:
    """JSON text as Spark prints a nested object it reads as a string (compact): the ``json``
    format's form of the same column."""
    return F.from_json(F.concat(F.lit('{"v":'), text, F.lit("}")), "v string").getField("v")


def _bits(b64: Column) -> Column:
    """Bits (little-endian bytes) -> the integer's digits."""
    pairs = F.regexp_extract_all(F.hex(F.unbase64(b64)), F.lit("(..)"), 1)
    return F.conv(F.array_join(F.reverse(pairs), ""), 16, 10)


@dataclass(frozen=True, slots=True)
class FieldReader:
    """How one field is read: the JSON type to parse it with, and the expression from the parsed
    value (``convert(parsed)``) to the column's value."""

    json_type: T.DataType
    convert: Callable[[Column], Column]


def _reader(field: dict | None, target: T.DataType) -> FieldReader:
    """The reader of ``field`` (a Connect field schema; None: the row has no such field) into a
    column of type ``target`` (StringType: the ``json`` format's text form)."""
    text = isinstance(target, T.StringType)

    def typed(value: Column, kind: T.DataType) -> Column:
        return value if kind == target else value.cast(target)

    if field is None:
        return FieldReader(target, lambda v: v)
    name, kind = field.get("name"), field.get("type")
    if name == DECIMAL:
        scale = int((field.get("parameters") or {}).get("scale", 0))
        return FieldReader(T.StringType(), lambda v: typed(_place_point(_unscaled_digits(v, text), scale),
                                                           T.StringType()))
    if name == VARIABLE_SCALE_DECIMAL:
        struct = T.StructType([T.StructField("scale", T.IntegerType()), T.StructField("value", T.StringType())])
        return FieldReader(struct, lambda v: typed(_place_point(_unscaled_digits(v.getField("value"), text),
                                                                v.getField("scale")), T.StringType()))
    if name in DATES:
        return FieldReader(T.IntegerType(), lambda v: typed(F.date_from_unix_date(v), T.DateType()))
    if name in TIMES_MS:
        return FieldReader(T.LongType(), lambda v: typed(_clock(v * 1000), T.StringType()))
    if name == MICRO_TIME:
        return FieldReader(T.LongType(), lambda v: typed(_clock(v), T.StringType()))
    if name in TIMESTAMPS_MS or name == MICRO_TIMESTAMP:
        factor = 1000 if name in TIMESTAMPS_MS else 1

        def timestamp(v: Column) -> Column:
            moment = _local_timestamp(v * factor if factor != 1 else v)
            return _timestamp_text(moment) if text else typed(moment, T.TimestampNTZType())
        return FieldReader(T.LongType(), timestamp)
    if name == MICRO_DURATION:
        return FieldReader(T.LongType(), lambda v: typed(_duration(v), T.StringType()))
    if name == JSON:
        if isinstance(target, T.VariantType):
            return FieldReader(T.StringType(), F.parse_json)
        return FieldReader(T.StringType(), lambda v: typed(_json_text(v), T.StringType()))
    if name == ENUM_SET:
        return FieldReader(T.StringType(), lambda v: typed(
            F.when(v == "", F.lit("[]")).otherwise(F.to_json(F.split(v, ","))), T.StringType()))
    if name == BITS:
        return FieldReader(T.StringType(), lambda v: typed(_bits(v), T.StringType()))
    if kind == "int64" and target == T.DecimalType(20, 0):
        # MySQL bigint unsigned, written as Java's long (bigint.unsigned.handling.mode=long)
        return FieldReader(T.LongType(), lambda v: F.when(v < 0, v.cast(target) + _two_64()).otherwise(v.cast(target)))
    if kind in ("double", "float") and isinstance(target, T.DecimalType):
        return FieldReader(T.DoubleType(), lambda v: v.cast(target))  # decimal.handling.mode=double
    return FieldReader(target, lambda v: v)


def row_reader(field: dict | None, target: T.DataType) -> FieldReader:
    """The reader of a row's Connect ``field`` (None: the row has no such field) into a column of
    type ``target``."""
    return _reader(field, target)


_KEY_TYPES = {"int8": T.LongType(), "int16": T.LongType(), "int32": T.LongType(), "int64": T.LongType(),
              "float32": T.DoubleType(), "float64": T.DoubleType(), "float": T.DoubleType(),
              "double": T.DoubleType(), "boolean": T.BooleanType()}


def _unsigned(field: dict, struct: T.StructType) -> bool:
    """A MySQL ``bigint unsigned`` (the table's ``decimal(20,0)``), written as a wrapped int64."""
    names = {f.name: f.dataType for f in struct.fields}
    return field.get("type") == "int64" and names.get(field.get("field", "")) == T.DecimalType(20, 0)


def _double_decimal(field: dict, struct: T.StructType) -> T.DecimalType | None:
    """The table's decimal type of a key field written as a double (decimal.handling.mode=double)."""
    kind = {f.name: f.dataType for f in struct.fields}.get(field.get("field", ""))
    return kind if field.get("type") in ("double", "float") and isinstance(kind, T.DecimalType) else None


def key_needs_rewrite(row: ConnectRow, struct: T.StructType) -> bool:
    """True when a key's payload differs from the ``json`` format's key (a converted type)."""
    return any(f.get("name") in _CONVERTED or _unsigned(f, struct) or _double_decimal(f, struct)
               for f in row.fields)


def key_text(payload: Column, row: ConnectRow, struct: T.StructType) -> Column:
    """A Connect key's payload (JSON text) -> the ``json`` format's key text: converted fields as
    the ``json`` format's text forms, the others as they are, in the key's order."""
    parse, readers, names = [], [], []
    for field in row.fields:
        if field.get("name") in _CONVERTED:
            reader = _reader(field, T.StringType())
        elif _unsigned(field, struct):
            reader = _reader(field, T.DecimalType(20, 0))
        elif (decimal := _double_decimal(field, struct)) is not None:  # as the json format's decimal text
            reader = FieldReader(T.DoubleType(), _decimal_text(decimal))
        else:
            reader = FieldReader(_KEY_TYPES.get(field.get("type", ""), T.StringType()), lambda v: v)
        parse.append(T.StructField(field["field"], reader.json_type))
        readers.append(reader)
        names.append(field["field"])
    parsed = F.from_json(payload, T.StructType(parse))
    return F.to_json(F.struct(*[r.convert(parsed.getField(n)).alias(n) for n, r in zip(names, readers)]))


def _decimal_text(decimal: T.DecimalType) -> Callable[[Column], Column]:
    return lambda value: value.cast(decimal).cast(T.StringType())


_CONVERTED = frozenset({DECIMAL, VARIABLE_SCALE_DECIMAL, *DATES, *TIMES_MS, MICRO_TIME, *TIMESTAMPS_MS,
                        MICRO_TIMESTAMP, MICRO_DURATION, JSON, ENUM_SET, BITS})
