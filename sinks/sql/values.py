"""Event values (the contract's JSON forms) to what each driver binds for a target column.

Used by the executemany path (MySQL/MariaDB, SQLite); PostgreSQL and DuckDB convert on the
server instead (see ``apply_staged``). A converter takes a non-NULL value and returns the bound value, or
raises ``ValueError``/``TypeError``/``ArithmeticError``, which the sink reports as a data error
naming the table, key and column.

Per dialect, because the drivers differ:

* SQLite has no date, time or decimal types: timestamps are stored as SQLAlchemy's SQLite text
  (``YYYY-MM-DD HH:MM:SS.ffffff``, UTC for instants) so SQLAlchemy reads them back as datetimes,
  and exact numerics are bound as their text (SQLite keeps them exact when its NUMERIC affinity
  can, as it does for any text).
* MySQL DATETIME has no zone: instants are bound as naive UTC (the session runs with
  ``time_zone = '+00:00'``).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import orjson

from sinks.sql.types import Family

Converter = Callable[[Any], Any]

_SQLITE_DATETIME = "%04d-%02d-%02d %02d:%02d:%02d.%06d"


def _to_int(value: Any) -> int:
    if type(value) is int:
        return value
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{value!r} is not an integer")
    return int(value)


def _to_float(value: Any) -> float:
    return float(value)  # also the contract's "NaN", "Infinity", "-Infinity"


def _to_decimal(value: Any) -> Decimal:
    return Decimal(value if isinstance(value, str) else repr(value))


def _to_decimal_text(value: Any) -> str:
    return str(_to_decimal(value))


# 1 and 0 are keys too: they hash and compare equal to True and False.
_TRUE = {True: True, False: False, "true": True, "false": False, "t": True, "f": False}


def _to_bool(value: Any) -> bool:
    try:
        return _TRUE[value]
    except (KeyError, TypeError):
        raise ValueError(f"{value!r} is not a boolean") from None


def _to_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _to_json_text(value: Any) -> str:
    return orjson.dumps(value).decode()


def _to_bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"binary values arrive as base64 text, not {type(value).__name__}")
    return base64.b64decode(value, validate=True)


def _parse_datetime(value: Any) -> datetime:
    if not isinstance(value, str):
        raise TypeError(f"timestamps arrive as ISO-8601 text, not {type(value).__name__}")
    return datetime.fromisoformat(value)  # 'infinity' and BC values raise: no such datetime here


def _naive(value: Any) -> datetime:
    parsed = _parse_datetime(value)
    return parsed if parsed.tzinfo is None else parsed.astimezone(UTC).replace(tzinfo=None)


def _naive_utc(value: Any) -> datetime:
    """An instant as naive UTC; a value without an offset is taken as UTC already."""
    parsed = _parse_datetime(value)
    return parsed if parsed.tzinfo is None else parsed.astimezone(UTC).replace(tzinfo=None)


def _sqlite_datetime(parsed: datetime) -> str:
    return _SQLITE_DATETIME % (parsed.year, parsed.month, parsed.day, parsed.hour, parsed.minute,
                               parsed.second, parsed.microsecond)


def _to_date(value: Any) -> date:
    return date.fromisoformat(value)


def _to_time(value: Any) -> time:
    return time.fromisoformat(value)


def _sqlite_time(value: Any) -> str:
    parsed = time.fromisoformat(value)
    return "%02d:%02d:%02d.%06d" % (parsed.hour, parsed.minute, parsed.second, parsed.microsecond)


_COMMON: dict[Family, Converter] = {
    Family.INTEGER: _to_int,
    Family.NUMERIC: _to_decimal,
    Family.FLOAT: _to_float,
    Family.BOOLEAN: _to_bool,
    Family.TEXT: _to_text,
    Family.DATE: _to_date,
    Family.TIME: _to_time,
    Family.TIMESTAMP: _naive,
    Family.TIMESTAMPTZ: _naive_utc,
    Family.JSON: _to_json_text,
    Family.BINARY: _to_bytes,
    Family.UUID: _to_text,
}

_BY_DIALECT: dict[str, dict[Family, Converter]] = {
    "sqlite": {**_COMMON,
               Family.NUMERIC: _to_decimal_text,
               Family.DATE: lambda v: _to_date(v).isoformat(),
               Family.TIME: _sqlite_time,
               Family.TIMESTAMP: lambda v: _sqlite_datetime(_naive(v)),
               Family.TIMESTAMPTZ: lambda v: _sqlite_datetime(_naive_utc(v))},
    "mysql": _COMMON,
}
_BY_DIALECT["mariadb"] = _BY_DIALECT["mysql"]


def converter(family: Family, dialect: str) -> Converter:
    """The converter for values of ``family`` columns on ``dialect`` (sqlite, mysql/mariadb)."""
    return _BY_DIALECT.get(dialect, _COMMON)[family]
