"""Values in the ``json`` format's forms -> the values Debezium writes, one converter per type.

Each runs per value of a column (``connect_types`` chooses them once per column), so the common
forms take a short path (an exact decimal printed at the column's scale, a six-digit timestamptz)
before the general one. A value with no Debezium encoding (numeric NaN, a date at infinity)
becomes None.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from collections.abc import Callable
from decimal import Context, Decimal, InvalidOperation
from typing import Any

Convert = Callable[[Any], Any]

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)
# Decimal's default context keeps 28 digits: scaling a wider numeric with it rounds the value.
_EXACT = Context(prec=100_000)


def java_big_integer_bytes(n: int) -> bytes:
    """``n`` as Java's ``BigInteger.toByteArray``: minimal big-endian two's complement."""
    return n.to_bytes((n if n >= 0 else ~n).bit_length() // 8 + 1, "big", signed=True)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unscaled(text: str, scale: int) -> int | None:
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    if not number.is_finite():
        return None  # NaN/Infinity: a Connect Decimal has no such value
    return int(number.scaleb(scale, _EXACT).to_integral_value(context=_EXACT))


def _money_text(text: str) -> str:
    negative = text.startswith("-") or text.startswith("(")
    digits = re.sub(r"[^0-9.]", "", text)
    return "-" + digits if negative else digits


def decimal_converter(scale: int, mode: str, money: bool = False) -> Convert:
    def precise(value: Any) -> Any:
        text = _money_text(value) if money else str(value)
        # The common case without Decimal: the json format prints exactly the column's scale.
        whole, dot, fraction = text.partition(".")
        if len(fraction) == scale and (dot or not scale) and "e" not in text and "N" not in text:
            try:
                return _b64(java_big_integer_bytes(int(whole + fraction)))
            except ValueError:
                pass
        unscaled = _unscaled(text, scale)
        return None if unscaled is None else _b64(java_big_integer_bytes(unscaled))

    def as_string(value: Any) -> Any:
        # Debezium reads money as a double: its string is the double's (1234.5, 1000.0)
        return repr(float(_money_text(value))) if money else str(value)

    def as_double(value: Any) -> Any:
        number = float(_money_text(value) if money else value)
        return number if number - number == 0 else None

    return {"precise": precise, "string": as_string, "double": as_double}[mode]


def variable_scale_decimal(value: Any) -> Any:
    text = str(value)
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    if not number.is_finite():
        return None
    scale = max(0, -int(number.as_tuple().exponent))  # an int: the number is finite
    return {"scale": scale, "value": _b64(java_big_integer_bytes(int(number.scaleb(scale, _EXACT))))}


def days(value: str) -> int | None:
    try:
        return (dt.date.fromisoformat(value) - _EPOCH_DATE).days
    except ValueError:  # infinity, BC
        return None


def micros_of_day(value: str) -> int | None:
    """``[-]HH:MM:SS[.ffffff]`` (a MySQL TIME may be negative or past 24 h) -> microseconds."""
    text = value
    sign = 1
    if text.startswith("-"):
        sign, text = -1, text[1:]
    try:
        whole, _, fraction = text.partition(".")
        hours, minutes, seconds = whole.split(":")
        micros = int((fraction + "000000")[:6]) if fraction else 0
        return sign * (((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1_000_000 + micros)
    except ValueError:
        return None


def epoch_micros(value: str) -> int | None:
    try:
        return (dt.datetime.fromisoformat(value) - _EPOCH) // _MICRO
    except ValueError:  # infinity, BC
        return None


def ms(micros: Convert) -> Convert:
    def convert(value: Any) -> Any:
        us = micros(value)
        return None if us is None else us // 1000
    return convert


def zoned_time(value: str) -> str:
    """``10:00:00+02`` (timetz) -> ``08:00:00Z``: Debezium writes a timetz in UTC."""
    match = re.match(r"^(\d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d)(?::?(\d\d))?(?::?(\d\d))?$", value)
    if match is None:
        return value
    clock, hours, minutes, seconds = match.groups()
    sign = -1 if hours.startswith("-") else 1
    offset = dt.timedelta(hours=int(hours), minutes=sign * int(minutes or 0), seconds=sign * int(seconds or 0))
    moment = dt.datetime.combine(_EPOCH_DATE, dt.time.fromisoformat(clock)) - offset
    return moment.time().isoformat() + "Z"


_DURATION = re.compile(r"^(-)?P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?"
                       r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?[\d.]+)S)?)?$")
DAYS_PER_MONTH = 365.25 / 12


def duration_micros(value: str) -> int | None:
    """An ISO-8601 interval (IntervalStyle=iso_8601) -> microseconds, with Debezium's average month."""
    match = _DURATION.match(value)
    if match is None:
        return None
    neg, years, months, day_count, hours, minutes, seconds = match.groups()
    total_days = (int(years or 0) * 12 + int(months or 0)) * DAYS_PER_MONTH + int(day_count or 0)
    micros = round(total_days * 86_400_000_000) + (int(hours or 0) * 3600 + int(minutes or 0) * 60) * 1_000_000
    micros += round(Decimal(seconds or "0") * 1_000_000)
    return -micros if neg else micros


def json_text(value: Any) -> str:
    """JSON text spaced as PostgreSQL prints jsonb (``{"a": [1, 2]}``), which is also how most
    json and MariaDB JSON input is written: Debezium passes the server's text on."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def zoned_timestamp(digits: int | None) -> Convert:
    """``...05.5Z`` with the fraction as Debezium prints it: PostgreSQL's connector pads it to the
    column's precision (``digits``), the MariaDB connector trims trailing zeros (``None``)."""
    def convert(value: str) -> str:
        if digits == 6 and len(value) == 27 and value[19] == ".":
            return value  # the common case: YYYY-MM-DDTHH:MM:SS.ffffffZ already
        if not value.endswith("Z"):
            return value  # infinity, BC: as the json format has them
        body = value[:-1]
        whole, dot, fraction = body.partition(".")
        if digits is None:
            fraction = fraction.rstrip("0")
        else:
            fraction = (fraction + "0" * digits)[:digits]
        return whole + ("." + fraction if fraction else "") + "Z"
    return convert


def binary_converter(mode: str) -> Convert | None:
    if mode in ("bytes", "base64"):
        return None  # the json format's base64 is both Connect JSON's bytes and the base64 string
    if mode == "hex":
        return lambda value: base64.b64decode(value).hex()
    return lambda value: base64.urlsafe_b64encode(base64.b64decode(value)).decode("ascii")


def bits_converter(length: int) -> Convert:
    width = (length + 7) // 8

    def convert(value: Any) -> Any:
        number = int(value, 2) if isinstance(value, str) else int(value)
        return _b64(number.to_bytes(width, "little"))
    return convert
