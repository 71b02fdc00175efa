"""Converters for single values: PostgreSQL text output (under ``SESSION_SETTINGS``) to JSON-ready Python.

Each converter takes the text of a non-NULL value and returns what goes into the event. They run
for every column of every change, so they are builtins where possible (``int``, ``str``) and
otherwise slice text instead of parsing it: the session settings fix the text's shape.

What is kept as PostgreSQL prints it, and why:

* numeric and money: exact decimal text (``"12.50"``, ``"NaN"``, ``"$1,234.50"``). money's text
  carries a currency symbol and separators (from ``lc_monetary=C``); it is not a number.
* date, time, interval: already ISO-8601 under ``DateStyle=ISO`` and ``IntervalStyle=iso_8601``.
  Fractions of seconds are printed without trailing zeros (``"03:04:05.5"``), and kept so.
* ``infinity``/``-infinity`` (date, timestamp, timestamptz) and BC values (``"0044-03-15 BC"``,
  ``"0044-03-15 12:00:00+00 BC"``): ISO-8601 has no form a consumer would parse the same way, so
  they stay as printed. A consumer that parses timestamps must expect these strings.
* timetz (``"10:00:00+02"``): a time with an offset has no UTC instant; kept as printed.
* float NaN/Infinity/-Infinity: JSON has no such numbers; the strings ``"NaN"``, ``"Infinity"``,
  ``"-Infinity"`` stand for them (float4 values are printed shortest, so 0.1::float4 is 0.1).
* uuid, inet, cidr, macaddr, bit strings, xml, tsvector, geometric types, pg_lsn, composite
  values and any type not known here: the text as printed.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Callable
from typing import Any

import orjson

Converter = Callable[[str], Any]

# The identity on str. Text-like types use the builtin itself, so a caller may skip the call
# with ``converter is str``.
as_text: Converter = str


def to_float(text: str) -> float | str:
    value = float(text)
    # x - x is 0.0 for every finite float and NaN for NaN and the infinities: keep those as text.
    return value if value - value == 0.0 else text


to_bool: Converter = {"t": True, "f": False}.__getitem__


_ESCAPED_BYTEA = re.compile(rb"\\(\\|[0-7]{3})")


def _unescape_bytea(match: re.Match) -> bytes:
    code = match.group(1)
    return b"\\" if code == b"\\" else bytes((int(code, 8),))


def bytea_to_base64(text: str) -> str:
    """``\\x00ff`` (bytea_output=hex) to ``"AP8="``. The older escape format is read too."""
    if text.startswith("\\x"):
        data = bytes.fromhex(text[2:])
    else:
        data = _ESCAPED_BYTEA.sub(_unescape_bytea, text.encode("latin-1"))
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def timestamp_to_iso(text: str) -> str:
    """``2024-01-02 03:04:05.5`` to ``2024-01-02T03:04:05.5``; infinities and BC values as printed."""
    if text[-1] == "C":  # ' BC'
        return text
    return text.replace(" ", "T", 1)


def timestamptz_to_iso(text: str) -> str:
    """``2024-01-02 03:04:05.123456+00`` to ``2024-01-02T03:04:05.123456Z``.

    With ``TimeZone=UTC`` every finite AD value ends in ``+00``. Any other offset means the
    session settings were not applied; that is refused rather than passed on, because the same
    instant would then serialize differently in snapshot and stream.
    """
    if text[-3:] == "+00":
        return text[:-3].replace(" ", "T", 1) + "Z"
    if text[-1] == "C" or text[-1] == "y":  # ' BC', 'infinity', '-infinity'
        return text
    raise ValueError(f"timestamptz {text!r} is not in UTC: the session must run with TimeZone=UTC")


def _json_number(text: str) -> Any:
    # orjson refuses numbers outside double range; keep their text instead of losing them.
    value = float(text)
    if value - value != 0.0:
        return text
    if "." in text or "e" in text or "E" in text:
        return value
    number = int(text)
    # Like orjson: integers that fit 64 bits stay integers, larger ones become floats.
    return number if -(1 << 63) <= number < (1 << 64) else value


def json_value(text: str) -> Any:
    """json/jsonb text to nested Python values, as orjson reads them.

    Lossy where JSON consumers are: integers beyond 64 bits become floats (as orjson does).
    Numbers beyond double range (possible in ``json``, which keeps its input text, and in jsonb,
    which stores numeric) become strings of their digits instead of failing the row.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text, parse_int=_json_number, parse_float=_json_number)


# Scalar converters by built-in type OID. Types not listed here are kept as text.
SCALAR_CONVERTERS: dict[int, Converter] = {
    16: to_bool,
    17: bytea_to_base64,
    20: int, 21: int, 23: int, 26: int,          # int8, int2, int4, oid
    700: to_float, 701: to_float,                 # float4, float8
    114: json_value, 3802: json_value,            # json, jsonb
    1114: timestamp_to_iso,
    1184: timestamptz_to_iso,
}
