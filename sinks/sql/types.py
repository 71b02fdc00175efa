"""Source type names to portable target column types, and types inferred from values.

A schema record names each column's type as the source database prints it: PostgreSQL's
``format_type`` (``integer``, ``numeric(10,2)``, ``timestamp(3) with time zone``, ``text[]``,
``jsonb``) or MySQL's column type (``int unsigned``, ``decimal(10,2)``, ``datetime(6)``,
``enum('a','b')``). Each maps to a ``Family`` (how values arrive and convert) and, per dialect, to
a SQLAlchemy type. Choices, and why:

* every integer is BIGINT: widening a column in the source (int -> bigint) is then no change at
  all here. ``bigint unsigned`` does not fit and is NUMERIC(20,0).
* numeric(p,s) keeps p and s; an unbounded numeric is NUMERIC on PostgreSQL, DECIMAL(65,30) on
  MySQL and DECIMAL(38,10) on DuckDB (their widest; DuckDB's default would round to 3 places).
  SQLite stores what its NUMERIC affinity makes of the exact text.
* json, jsonb, arrays, hstore and ranges (all nested JSON in the event) are JSONB on PostgreSQL
  and JSON elsewhere.
* MySQL ``timestamp`` is a UTC instant: it maps like PostgreSQL's ``timestamp with time zone``.
  On MySQL both kinds of timestamp are DATETIME(6) holding UTC (its TIMESTAMP ends in 2038).
* MySQL cannot index TEXT or BLOB: key columns become VARCHAR/VARBINARY there, with a binary
  no-pad collation so that keys that differ in case or trailing blanks stay different rows.
* PostgreSQL's ``time without time zone`` is a time of day (TIME); MySQL's bare ``time`` is a
  duration that may be negative or above 24 hours, which only MySQL's TIME holds: it is TEXT.
* every other name (money, interval, inet, enums, sets, domains, bit strings, xml, geometry ...) is
  TEXT; a value that is not a string is stored as its JSON text.
* on MySQL targets a string keeps its type: varchar(n) and char(n) up to ``MYSQL_VARCHAR_MAX``
  characters are VARCHAR(n), MySQL's enum('a','b') is the same ENUM; only longer or other strings
  are LONGTEXT. A string that grows in the source (a longer varchar, an enum with labels added at
  its end) is changed in place under every ``schema_policy``, like a new column (``grows``).

The *signature* of a column (its compiled target type) is what schema evolution compares: a
source change that maps to the same target type (varchar(10) -> varchar(20), int -> bigint) is no
change here.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql


class Family(Enum):
    INTEGER = "integer"
    NUMERIC = "numeric"
    FLOAT = "float"
    BOOLEAN = "boolean"
    TEXT = "text"
    DATE = "date"
    TIME = "time"
    TIMESTAMP = "timestamp"        # without time zone
    TIMESTAMPTZ = "timestamptz"    # an instant, arriving as ISO-8601 UTC
    JSON = "json"
    BINARY = "binary"              # arriving as base64
    UUID = "uuid"


_NAMES: dict[str, Family] = {}
for _family, _names in {
    Family.INTEGER: "smallint integer int bigint int2 int4 int8 tinyint mediumint serial bigserial "
                    "smallserial serial2 serial4 serial8 oid year",
    Family.NUMERIC: "numeric decimal dec fixed",
    Family.FLOAT: "real float4 float8 float double double_precision",
    Family.BOOLEAN: "boolean bool",
    Family.DATE: "date",
    Family.TIME: "time_without_time_zone",
    Family.TIMESTAMP: "timestamp_without_time_zone datetime",
    Family.TIMESTAMPTZ: "timestamp timestamp_with_time_zone timestamptz",
    Family.JSON: "json jsonb hstore array",
    Family.BINARY: "bytea blob tinyblob mediumblob longblob binary varbinary",
    Family.UUID: "uuid",
}.items():
    for _name in _names.split():
        _NAMES[_name.replace("_", " ")] = _family

# "name(args) suffix": numeric(10,2), timestamp(3) with time zone, int(11) unsigned
_TYPE = re.compile(r"([a-z][a-z0-9_ ]*?)\s*(?:\(([^()]*)\))?((?:\s+[a-z]+)*)\s*")


def parse_type(type_name: str) -> tuple[Family, tuple[int, ...], bool]:
    """(family, numeric arguments, unsigned) of a source type name."""
    text = type_name.strip().lower()
    if text.endswith("]") or text.startswith("_") or text.endswith("range"):
        return Family.JSON, (), False           # arrays (text[], _int4), ranges, multiranges
    match = _TYPE.fullmatch(text)
    if match is None:
        return Family.TEXT, (), False           # enum('a','b'), set(...), anything exotic
    name = " ".join(f"{match.group(1)} {match.group(3)}".split())
    unsigned = name.endswith(" unsigned") or name.endswith(" zerofill")
    name = name.replace(" unsigned", "").replace(" zerofill", "")
    args = tuple(int(a) for a in (match.group(2) or "").split(",") if a.strip().isdigit())
    family = _NAMES.get(name, Family.TEXT)
    if family is Family.INTEGER and unsigned and name in ("bigint", "int8"):
        return Family.NUMERIC, (20, 0), False
    return family, args, unsigned


# 8-byte floats, as PostgreSQL's format_type and MySQL's column type print them. ``float`` is
# not one of them: MySQL's is 4 bytes; ``double(m,d)`` rounds every value it stores.
_DOUBLES = frozenset({"double precision", "float8", "double"})


def is_double(type_name: str) -> bool:
    """True for an 8-byte float type without arguments."""
    return type_name.strip().lower() in _DOUBLES


def varchar_length(type_name: str) -> int | None:
    text = type_name.strip().lower()
    match = re.fullmatch(r"(?:character varying|varchar|character|char|nvarchar|nchar)\s*\((\d+)\)", text)
    return int(match.group(1)) if match else None


def target_type(type_name: str, dialect: str, *, key: bool, mariadb: bool = False) -> sa.types.TypeEngine:
    """The column type for a source type on ``dialect`` (an engine's ``dialect.name``)."""
    family, args, _ = parse_type(type_name)
    is_mysql = dialect in ("mysql", "mariadb")
    if family is Family.INTEGER:
        return sa.BigInteger()
    if family is Family.NUMERIC:
        if len(args) >= 1:
            precision, scale = args[0], args[1] if len(args) > 1 else 0
            limit = 38 if dialect == "duckdb" else 65 if is_mysql else 1000
            return sa.Numeric(min(precision, limit), min(scale, precision, limit, 30 if is_mysql else limit))
        if is_mysql:
            return sa.Numeric(65, 30)
        return sa.Numeric(38, 10) if dialect == "duckdb" else sa.Numeric()
    if family is Family.FLOAT:
        return sa.Double()
    if family is Family.BOOLEAN:
        return sa.Boolean()
    if family is Family.DATE:
        return sa.Date()
    if family is Family.TIME:
        return mysql.TIME(fsp=6) if is_mysql else sa.Time()
    if family in (Family.TIMESTAMP, Family.TIMESTAMPTZ):
        if is_mysql:
            return mysql.DATETIME(fsp=6)
        return sa.DateTime(timezone=family is Family.TIMESTAMPTZ)
    if family is Family.JSON:
        return postgresql.JSONB() if dialect == "postgresql" else sa.JSON()
    if family is Family.BINARY:
        if is_mysql:
            return mysql.VARBINARY(255) if key else mysql.LONGBLOB()
        return sa.LargeBinary()
    if family is Family.UUID:
        if dialect == "postgresql":
            return postgresql.UUID(as_uuid=False)
        return _mysql_key_varchar(36, mariadb) if is_mysql else sa.String(36)
    if is_mysql:  # TEXT
        if key:
            length = varchar_length(type_name)
            return _mysql_key_varchar(length if length and length <= 768 else 255, mariadb)
        return _mysql_string(type_name)
    return sa.Text()


# Longer varchars become LONGTEXT: MySQL counts a row's VARCHARs against 65,535 bytes (4 per
# utf8mb4 character), and a source of another character set may fit more than the target would.
MYSQL_VARCHAR_MAX = 1024
_LABEL = re.compile(r"'((?:[^']|'')*)'")


def enum_labels(type_name: str) -> list[str] | None:
    """The labels of MySQL's ``enum('a','b')``; None for any other type."""
    text = type_name.strip()
    if not text.lower().startswith("enum(") or not text.endswith(")"):
        return None
    return [label.replace("''", "'") for label in _LABEL.findall(text[5:-1])]


def _mysql_string(type_name: str) -> mysql.ENUM | mysql.VARCHAR | mysql.LONGTEXT:
    labels = enum_labels(type_name)
    if labels:
        return mysql.ENUM(*labels, charset="utf8mb4", collation="utf8mb4_bin")
    length = varchar_length(type_name)
    if length is not None and length <= MYSQL_VARCHAR_MAX:
        return mysql.VARCHAR(length, charset="utf8mb4")
    return mysql.LONGTEXT()


def grows(old: str, new: str, dialect: str) -> bool:
    """True when a non-key string column of source type ``old`` on a MySQL target holds every
    value of ``new`` after an in-place change that loses nothing: a varchar at least as long, an
    enum whose labels begin with the old ones (their order is their stored number), LONGTEXT."""
    if dialect not in ("mysql", "mariadb"):
        return False
    if parse_type(old)[0] is not Family.TEXT or parse_type(new)[0] is not Family.TEXT:
        return False
    before, after = _mysql_string(old), _mysql_string(new)
    if isinstance(after, mysql.LONGTEXT):
        return True
    longest = (max(map(len, before.enums), default=0) if isinstance(before, mysql.ENUM)
               else None if isinstance(before, mysql.LONGTEXT) else before.length)
    if isinstance(after, mysql.ENUM):
        return isinstance(before, mysql.ENUM) and list(after.enums[:len(before.enums)]) == list(before.enums)
    return longest is not None and after.length is not None and after.length >= longest


def _mysql_key_varchar(length: int, mariadb: bool) -> sa.types.TypeEngine:
    return mysql.VARCHAR(length, collation="utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin")


def signature(column_type: sa.types.TypeEngine, dialect: sa.engine.Dialect) -> str:
    """The compiled type: equal signatures mean the column does not need to change."""
    return str(column_type.compile(dialect=dialect))


def infer_type(value: Any) -> str | None:
    """A source-like type name for a value, when no schema record says (None: cannot tell)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double precision"
    if isinstance(value, (dict, list)):
        return "jsonb"
    return "text"
