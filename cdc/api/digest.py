"""Chunk digests computed inside the databases: ``cdc verify``'s fast path (cdc/runtime/verify.py).

A chunk of a table whose source and store both compute its digest themselves crosses the
network as a few numbers (a count and a sum from each side), not as its rows. The two sides may
be different databases holding the values in different types (a PostgreSQL ``timestamptz`` in a MariaDB ``DATETIME(6)`` in UTC), so both render
each value into one canonical text first, hash that, and add the hashes up:

* the store (``DigestingSink.digest_plan``) says, per column it holds, which source column it
  holds and in which ``Kind``: the plan. It answers None where it cannot render one of its
  columns canonically (floats, JSON, binary, a database without md5): the chunk is then compared
  row by row, as before;
* the source (``DigestingReader.digest``) renders its columns into the plan's kinds, the values as
  the store should hold them (an exact numeric rounded to the store's scale, half away from zero,
  as the store's database rounds). It answers None where one of its columns does not render into
  the kind asked (a float the store keeps as a decimal);
* a row's text is its values in plan order, each rendered as ``render`` below says, joined by
  ``|``; a text value is prefixed with its length in characters, so no two rows share a text;
* a row's hash is the first 15 hex digits of the MD5 of the text's UTF-8 bytes (60 bits, a
  positive BIGINT in every database); a chunk's digest is its row count and the exact sum of its
  rows' hashes (``Digest``).

Equal digests mean equal chunks but for a collision of the sums: for a given difference in a
chunk, about one chance in 2**60. Unequal digests mean only that the rows must be compared: a
value the two databases render differently (a timestamp out of their common range) costs the row
comparison, never a false report, because the rows then decide.

Between two PostgreSQL databases (14 or later: a PostgreSQL source, a PostgreSQL warehouse)
there is a cheaper way, and it covers every type the SQL sink creates: the store names its
columns' types (``sql_type``), the source casts its values to them (what the sink's write did to
them), and both hash each row with ``hash_record_extended`` (each column's own hash function, no
text made), under the same session settings (``POSTGRES_SETTINGS``): about a fifth of the
canonical rendering's CPU (bench/results/verify_scale.md). Such a hash is equal for equal values
(1.5 and 1.50, as the row comparison has it too).

Only tables keyed by one integer column take this path: the databases then agree on the key's
order, so a source chunk's range is the store's.

``row_text`` is the reference (tests check each database's rendering against it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal
from enum import Enum
from typing import Any, NamedTuple, Protocol, runtime_checkable

from cdc.positions import Position

NULL = "\\N"        # a NULL; no rendered value is this text
UNRENDERED = "\\?"  # a value the database cannot render (PostgreSQL's infinity); nor is this
SEPARATOR = "|"


class Kind(Enum):
    INTEGER = "integer"      # decimal digits: -12
    DECIMAL = "decimal"      # exactly ``scale`` digits after the point: -1.50, 15 (scale 0)
    TEXT = "text"            # its length in characters, a colon, the text: 3:abc
    BOOLEAN = "boolean"      # t or f
    DATE = "date"            # 2026-12-06
    INSTANT = "instant"      # in UTC, microseconds: 2026-12-06 16:40:00.000001
    TIMESTAMP = "timestamp"  # without a zone, as held: 2026-12-06 16:40:00.000001


@dataclass(frozen=True)
class DigestColumn:
    name: str                 # the source column (the event's field) the store column holds
    kind: Kind | None         # None: no canonical text (a float, JSON); only a same-database digest
    scale: int | None = None  # DECIMAL: digits after the point
    sql_type: str | None = None  # the store's type of the column, in its database's words


@dataclass(frozen=True)
class DigestPlan:
    key: str                           # the one integer key column
    columns: tuple[DigestColumn, ...]  # the key among them
    store: str = ""                    # the store's database ("postgresql": 14 or later, record digests)

    @property
    def canonical(self) -> bool:
        """Every column has a canonical text: a digest between different databases works."""
        return all(c.kind is not None for c in self.columns)


class Digest(NamedTuple):
    rows: int
    total: int    # the sum of the rows' hashes


class SourceDigest(NamedTuple):
    """A source chunk's digest: ``last`` the largest key in it (None: no rows), ``position`` as
    ``SourceRead.position``."""

    digest: Digest
    last: int | None
    position: Position


@runtime_checkable
class DigestingSink(Protocol):
    """A ``ReadableSink`` whose store computes chunk digests (declared by naming it among the
    sink's bases)."""

    def digest_plan(self, topic: str) -> DigestPlan | None:
        """How ``topic``'s table renders (None: it cannot; its chunks are compared row by row)."""
        ...

    def digest_range(self, topic: str, plan: DigestPlan, after: int | None, upto: int | None) -> Digest:
        """The digest of the live rows whose key is above ``after`` and not above ``upto`` (None:
        unbounded)."""
        ...


@runtime_checkable
class DigestingReader(Protocol):
    """A ``TableReader`` whose database computes chunk digests. ``database``: which it is; a
    plan whose ``store`` is another is digested in canonical texts."""

    database: str

    def digest(self, table: str, plan: DigestPlan, after: int | None, limit: int) -> SourceDigest | None:
        """The digest of the first ``limit`` rows of ``table`` whose key is above ``after``, in
        one snapshot, rendered as ``plan`` says (None: a column does not render so)."""
        ...


def renders_into(source: Kind | None, kind: Kind | None) -> bool:
    """Whether a source column holding ``source`` values renders into a store column of
    ``kind``: as itself, and an integer in a decimal column too (None: neither renders)."""
    return source is not None and (kind is source or (source is Kind.INTEGER and kind is Kind.DECIMAL))


def render(kind: Kind, value: Any, scale: int | None = None) -> str:
    """One value's canonical text (the reference: each database's SQL renders the same)."""
    if value is None:
        return NULL
    if kind is Kind.INTEGER:
        return str(int(value))
    if kind is Kind.DECIMAL:
        if scale is None:
            raise ValueError("a decimal renders at a scale")
        return format(Decimal(value).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP), "f")
    if kind is Kind.TEXT:
        return f"{len(value)}:{value}"
    if kind is Kind.BOOLEAN:
        return "t" if value else "f"
    if kind is Kind.DATE:
        return value.isoformat() if isinstance(value, date) else str(value)
    if kind is Kind.INSTANT:
        instant = value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
        return instant.isoformat(" ", "microseconds")
    if kind is Kind.TIMESTAMP:
        return value.isoformat(" ", "microseconds") if isinstance(value, datetime) else str(value)
    raise ValueError(f"no rendering for {kind}")


def row_text(plan: DigestPlan, row: dict[str, Any]) -> str:
    return SEPARATOR.join(render(_kind(c), row.get(c.name), c.scale) for c in plan.columns)


def _kind(column: DigestColumn) -> Kind:
    if column.kind is None:
        raise ValueError(f"column {column.name} has no canonical text")
    return column.kind


def row_hash(text: str) -> int:
    return int(hashlib.md5(text.encode()).hexdigest()[:15], 16)


def digest_of(plan: DigestPlan, rows: Sequence[dict[str, Any]]) -> Digest:
    return Digest(len(rows), sum(row_hash(row_text(plan, row)) for row in rows))


# --- SQL renderings, for the plugins of each database -------------------------------------------

# Each kind's canonical text in SQL, per database: ``{c}`` the column's expression, ``{s}`` the scale.
_POSTGRES = {
    Kind.INTEGER: "({c})::text",
    Kind.DECIMAL: "round(({c})::numeric, {s})::text",
    Kind.TEXT: "length({c})::text || ':' || ({c})::text",
    Kind.BOOLEAN: "CASE WHEN {c} THEN 't' ELSE 'f' END",
    Kind.DATE: "to_char({c}, 'YYYY-MM-DD')",
    Kind.INSTANT: "to_char(({c}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
    Kind.TIMESTAMP: "to_char({c}, 'YYYY-MM-DD HH24:MI:SS.US')",
}
_MYSQL = {  # DATETIME columns hold UTC (the SQL sink's), so an instant is one too
    Kind.INTEGER: "CAST({c} AS CHAR)",
    Kind.DECIMAL: "CAST(ROUND({c}, {s}) AS CHAR)",
    Kind.TEXT: "CONCAT(CHAR_LENGTH({c}), ':', {c})",
    Kind.BOOLEAN: "IF({c}, 't', 'f')",
    Kind.DATE: "DATE_FORMAT({c}, '%Y-%m-%d')",
    Kind.INSTANT: "DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')",
    Kind.TIMESTAMP: "DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')",
}


def postgres_value(of: DigestColumn, column: str) -> str:
    """``column`` (an SQL expression of a PostgreSQL value of a type that holds ``of.kind``) as
    its canonical text; the session's TimeZone does not matter."""
    text = _POSTGRES[_kind(of)].format(c=column, s=int(of.scale or 0))
    return f"CASE WHEN ({column}) IS NULL THEN '{NULL}' ELSE coalesce({text}, '{UNRENDERED}') END"


def postgres_hash(values: Sequence[str]) -> str:
    """The row hash of the rendered ``values`` (a BIGINT)."""
    joined = " || '|' || ".join(values)
    return f"('x' || substr(md5({joined}), 1, 15))::bit(60)::bigint"


# What the casts of a record digest depend on (a real read as its text), the same on both sides.
POSTGRES_SETTINGS = ("SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, MDY'; "
                     "SET LOCAL IntervalStyle = 'postgres'; SET LOCAL extra_float_digits = 1; "
                     "SET LOCAL bytea_output = 'hex'")


def postgres_record_hash(values: Sequence[str]) -> str:
    """The record digest's row hash of these SQL expressions (a BIGINT; PostgreSQL 14 or later)."""
    return f"hash_record_extended(ROW({', '.join(values)}), 0)"


RECORD_DIGESTS = 140000  # the server_version_num from which PostgreSQL has hash_record_extended


def mysql_value(of: DigestColumn, column: str) -> str:
    """As ``postgres_value``, for MySQL/MariaDB."""
    text = _MYSQL[_kind(of)].format(c=column, s=int(of.scale or 0))
    # MySQL reads a backslash in a literal as an escape: each is doubled.
    return f"IF({column} IS NULL, '{_mysql(NULL)}', COALESCE({text}, '{_mysql(UNRENDERED)}'))"


def mysql_hash(values: Sequence[str]) -> str:
    return f"CAST(CONV(SUBSTRING(MD5(CONCAT_WS('|', {', '.join(values)})), 1, 15), 16, 10) AS UNSIGNED)"


def _mysql(text: str) -> str:
    return text.replace("\\", "\\\\")
