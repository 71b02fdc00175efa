"""MySQL/MariaDB values in the contract's JSON form, and the snapshot's text-to-JSON converters.

One representation per type, whichever path a value takes (the binlog decoder in ``decoder.py``
builds the same forms from the binary row image, with the helpers below):

=====================  ===========================================================================
integers               JSON numbers; BIGINT UNSIGNED above 2^63-1 too (a JSON number, not a string)
DECIMAL                a string with exactly the column's scale: ``"-12.50"``
FLOAT                  the shortest decimal that reads back as the same 32-bit float (``3.14159``,
                       not ``3.141590118408203``); DOUBLE as it is
CHAR/VARCHAR/TEXT      strings, decoded from the column's charset (CHAR without trailing spaces)
BINARY/VARBINARY/BLOB  base64 (BINARY(n) padded with zero bytes to n, as the server returns it)
DATE                   ``"2024-02-29"``
DATETIME(fsp)          no zone: ``"2024-01-02T03:04:05.120"`` (exactly fsp fraction digits)
TIMESTAMP(fsp)         UTC (the binlog holds seconds since the epoch): ``"2024-01-02T03:04:05.5Z"``
TIME(fsp)              ``"-12:34:56.78"`` (a duration: may be negative or above 24 hours)
zero dates             ``null`` (a DATE, DATETIME or TIMESTAMP with a zero year-month-day part,
                       ``0000-00-00`` or ``2024-00-10``, is not a date any consumer can parse)
YEAR                   a number (``0`` for YEAR ``0000``)
ENUM                   its label (``""`` for the invalid-value index 0)
SET                    a JSON array of its labels in definition order (``[]`` for the empty set)
BIT(n)                 an unsigned number
JSON                   nested JSON (MariaDB stores it as text: parsed)
GEOMETRY               base64 of the server's internal format (SRID + WKB)
=====================  ===========================================================================
"""

from __future__ import annotations

import binascii
import codecs
import datetime as dt
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.errors import PrerequisiteError

_F32 = struct.Struct("<f")


def shortest_float32(value: float) -> float:
    """The float with the fewest significant digits that is the same 32-bit float as ``value``."""
    pack, unpack = _F32.pack, _F32.unpack
    target = unpack(pack(value))[0]
    for digits in (6, 7, 8):
        candidate = float("%.*g" % (digits, target))
        if unpack(pack(candidate))[0] == target:
            return candidate
    return float("%.9g" % target)


def parse_json(raw: bytes | str) -> Any:
    """MariaDB JSON text -> nested JSON. Text that is not JSON (the json_valid check can be
    switched off) stays a JSON string rather than stopping the stream."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")


def b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


# --- character sets -----------------------------------------------------------------------------

# MySQL's latin1 is Windows-1252, except that the five bytes cp1252 leaves undefined map to the
# C1 control characters of the same value (as the server converts them to utf8mb4).
_LATIN1_TABLE = "".join(
    bytes([b]).decode("cp1252") if b not in (0x81, 0x8D, 0x8F, 0x90, 0x9D) else chr(b) for b in range(256))


def _decode_mysql_latin1(data: bytes) -> str:
    return codecs.charmap_decode(data, "strict", _LATIN1_TABLE)[0]


_PY_CODECS = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "ascii": "ascii", "latin2": "iso8859-2",
              "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be",
              "cp1250": "cp1250", "cp1251": "cp1251", "cp1256": "cp1256", "cp1257": "cp1257",
              "cp850": "cp850", "cp852": "cp852", "cp866": "cp866", "greek": "iso8859-7", "hebrew": "iso8859-8",
              "latin5": "iso8859-9", "latin7": "iso8859-13", "koi8r": "koi8-r", "koi8u": "koi8-u",
              "sjis": "shift_jis", "cp932": "cp932", "ujis": "euc_jp", "eucjpms": "euc_jp", "euckr": "euc_kr",
              "gbk": "gbk", "gb2312": "gb2312", "big5": "big5", "tis620": "tis-620", "macroman": "mac-roman"}


def charset_name(collation_id: int) -> str:
    """The character set of a collation id (63 is ``binary``)."""
    from pymysql.charset import charset_by_id

    if collation_id == 63:
        return "binary"
    try:
        return charset_by_id(collation_id).name  # type: ignore[attr-defined]  # types-PyMySQL lacks Charset.name
    except KeyError:
        # MariaDB's newer collation ids (UCA 14 and friends, 2048+) are utf8mb4/utf8mb3 ones.
        if collation_id >= 2048:
            return "utf8mb4" if (collation_id >> 8) % 2 == 0 else "utf8mb3"
        raise PrerequisiteError(f"unknown collation id {collation_id}: this connector cannot decode its text") from None


def python_codec(charset: str) -> str | None:
    """The Python codec of a MySQL character set (None for MySQL's latin1, which has its own table)."""
    if charset == "latin1":
        return None
    codec = _PY_CODECS.get(charset)
    if codec is None:
        raise PrerequisiteError(f"character set {charset} has no Python codec here: convert the column to "
                                "utf8mb4 (ALTER TABLE ... CONVERT TO CHARACTER SET utf8mb4)")
    return codec


def text_decoder(charset: str) -> Callable[[bytes], str]:
    """bytes in ``charset`` -> str, failing loudly on bytes the charset does not have."""
    codec = python_codec(charset)
    if codec is None:
        return _decode_mysql_latin1
    return lambda data: str(data, codec)


# --- dates and times ----------------------------------------------------------------------------

_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


def format_fraction(micros: int, fsp: int) -> str:
    """``.ffffff`` cut to ``fsp`` digits, or nothing when fsp is 0."""
    return "." + ("%06d" % micros)[:fsp] if fsp else ""


def format_timestamp(seconds: int, micros: int, fsp: int) -> str | None:
    """Seconds since the epoch (UTC) as ISO-8601 with Z; 0 is the zero timestamp: None."""
    if seconds == 0 and micros == 0:
        return None
    days, rest = divmod(seconds, 86400)
    day = dt.date.fromordinal(_EPOCH_ORDINAL + days)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return "%04d-%02d-%02dT%02d:%02d:%02d%sZ" % (day.year, day.month, day.day, hour, minute, second,
                                                 format_fraction(micros, fsp))


def format_datetime(year: int, month: int, day: int, hour: int, minute: int, second: int, micros: int,
                    fsp: int) -> str | None:
    if month == 0 or day == 0:
        return None
    return "%04d-%02d-%02dT%02d:%02d:%02d%s" % (year, month, day, hour, minute, second,
                                               format_fraction(micros, fsp))


def format_time(negative: bool, hours: int, minutes: int, seconds: int, micros: int, fsp: int) -> str:
    return "%s%02d:%02d:%02d%s" % ("-" if negative else "", hours, minutes, seconds, format_fraction(micros, fsp))


# --- the snapshot's converters: text protocol values -> contract JSON -------------------------------

@dataclass(frozen=True, slots=True)
class ColumnType:
    """What the converters need to know of a column, from information_schema (or a DDL statement)."""

    data_type: str            # information_schema DATA_TYPE: "int", "varchar", "datetime" ...
    column_type: str          # COLUMN_TYPE: "int(11) unsigned", "enum('a','b')", "decimal(10,2)"
    fsp: int = 0              # DATETIME_PRECISION
    json: bool = False        # MariaDB JSON: LONGTEXT with a json_valid() check
    binary: bool = False      # a binary string type (BINARY, VARBINARY, BLOB) or charset binary
    length: int = 0           # BINARY(n): n

    @property
    def unsigned(self) -> bool:
        return self.column_type.endswith("unsigned") or " unsigned " in self.column_type


INTEGER_TYPES = {"tinyint", "smallint", "mediumint", "int", "bigint"}
BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
TEXT_TYPES = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext"}
SPATIAL_TYPES = {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                 "multipolygon", "geometrycollection"}


def select_expression(name: str, column: ColumnType) -> str:
    """How the snapshot selects a column: FLOAT through DOUBLE, whose text is exact (FLOAT's own
    text has 6 significant digits and loses bits that the binlog keeps)."""
    quoted = "`" + name.replace("`", "``") + "`"
    if column.data_type == "float":
        return f"CAST({quoted} AS DOUBLE)"
    return quoted


def _text(value: Any) -> str:
    return value if isinstance(value, str) else bytes(value).decode("utf-8")


def _datetime_text(value: Any) -> str | None:
    text = _text(value)
    if text[5:7] == "00" or text[8:10] == "00":
        return None
    return text.replace(" ", "T", 1)


def _timestamp_text(value: Any) -> str | None:
    text = _datetime_text(value)
    return None if text is None else text + "Z"


def _date_text(value: Any) -> str | None:
    text = _text(value)
    return None if text[5:7] == "00" or text[8:10] == "00" else text


def _set_text(value: Any) -> list[str]:
    text = _text(value)
    return text.split(",") if text else []


def _binary(length: int) -> Callable[[Any], str]:
    if length:
        return lambda value: b64(bytes(value).ljust(length, b"\0"))
    return lambda value: b64(bytes(value))


def text_converter(column: ColumnType) -> Callable[[Any], Any]:
    """A converter from the value pymysql returns without conversions (``conv={}``: bytes for
    numbers and binary strings, str for text) to the contract's JSON form. NULLs never reach it."""
    kind = column.data_type
    if kind in INTEGER_TYPES or kind == "year":
        return int
    if kind == "decimal":
        return _text
    if kind == "float":
        return lambda value: shortest_float32(float(value))
    if kind == "double":
        return float
    if kind == "bit":
        return lambda value: int.from_bytes(bytes(value), "big")
    if kind == "date":
        return _date_text
    if kind == "datetime":
        return _datetime_text
    if kind == "timestamp":
        return _timestamp_text
    if kind == "time":
        return _text
    if kind == "enum":
        return _text
    if kind == "set":
        return _set_text
    if column.json:
        return parse_json
    if column.binary or kind in BINARY_TYPES:
        return _binary(column.length if kind == "binary" else 0)
    if kind in SPATIAL_TYPES:
        return _binary(0)
    if kind in TEXT_TYPES:
        return _text
    raise PrerequisiteError(f"column type {column.column_type} is not supported by the mysql source")
