"""What ``cdc verify`` reads of a SQL sink's store (cdc.api.ReadableSink), and a source row in
the forms the store gives back.

Cost: where a table's key is one integer column, a chunk is one range query on the key (its
index), in the key's order, which is ``key_order``, and a second look one ``IN`` query on it, so
a pass reads each row once. For any other key the text order of the target may differ
from ``key_order``, so each call reads the whole table and filters it here: correct, but a pass
over N rows in C chunks reads N x C rows (verify such tables with a large ``--chunk``).

``stored_forms`` binds each value through the converter a write uses for the target (values.py),
and rounds an exact numeric to the scale of its column (plan.column_plans, the sink's own
mapping), so the comparison sees what a write of that row would have stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Protocol

from cdc.api import PermanentError, StoredRow, in_range, key_order, page
from cdc.api.digest import (
    POSTGRES_SETTINGS,
    RECORD_DIGESTS,
    Digest,
    DigestColumn,
    DigestPlan,
    Kind,
    mysql_hash,
    mysql_value,
    postgres_hash,
    postgres_record_hash,
    postgres_value,
)
from sinks.sql.bookkeeping import Bookkeeping, TableEntry
from sinks.sql.config import SqlSinkConfig
from sinks.sql.generations import Generations
from sinks.sql.plan import DELETED, ColumnPlan, column_plans
from sinks.sql.target import Target
from sinks.sql.types import Family, parse_type
from sinks.sql.values import converter


class SqlSink(Protocol):
    """What these reads use of the sink (sink.py)."""

    config: SqlSinkConfig
    target: Target | None
    books: Bookkeeping
    generations: Generations

    def read_rows(self, topic: str, after: tuple | None = None, limit: int | None = None) -> list[StoredRow]: ...


def read_range(sink: SqlSink, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
    entry = _entry(sink, topic)
    if entry is None:
        return []
    if not _integer_key(entry):
        return in_range(sink.read_rows(topic), after, upto)
    name = _target(sink).quote(entry.key[0])
    bounds = [f"{name} > {int(after[0])}"] if after is not None else []
    bounds += [f"{name} <= {int(upto[0])}"] if upto is not None else []
    return _select(sink, entry, bounds, order=name)  # the database's order of an integer is key_order's


def read_keys(sink: SqlSink, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
    entry = _entry(sink, topic)
    if entry is None or not keys:
        return []
    if not _integer_key(entry):
        wanted = {key_order(key) for key in keys}
        return [row for row in page(sink.read_rows(topic), None, None) if key_order(row.key) in wanted]
    listed = ", ".join(str(int(key[0])) for key in keys)
    return page(_select(sink, entry, [f"{_target(sink).quote(entry.key[0])} IN ({listed})"]), None, None)


def stored_forms(sink: SqlSink, topic: str, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
    entry = _entry(sink, topic)
    if entry is None:
        return [StoredRow(tuple(key.values()), dict(row)) for key, row in rows]
    target = _target(sink)
    plans = column_plans(entry, target.dialect, target.kind, target.mariadb, set())
    convert = [(plan.name, _storing(plan, target.kind)) for plan in plans]
    key_names = entry.key
    out = []
    for key, row in rows:
        stored = {name: None if (value := row.get(name)) is None and (value := key.get(name)) is None
                  else to_store(value) for name, to_store in convert}
        out.append(StoredRow(tuple([stored[name] for name in key_names]), stored))
    return out


# What each family's column holds, as a digest renders it (cdc/api/digest.py); the others (floats,
# JSON, binary, times of day, UUIDs) take none.
_DIGEST_KINDS = {Family.INTEGER: Kind.INTEGER, Family.NUMERIC: Kind.DECIMAL, Family.TEXT: Kind.TEXT,
                 Family.BOOLEAN: Kind.BOOLEAN, Family.DATE: Kind.DATE, Family.TIMESTAMP: Kind.TIMESTAMP,
                 Family.TIMESTAMPTZ: Kind.INSTANT}
_RENDER = {"postgresql": (postgres_value, postgres_hash), "mysql": (mysql_value, mysql_hash)}


def digest_plan(sink: SqlSink, topic: str) -> DigestPlan | None:
    """cdc.api.DigestingSink, for tables keyed by one integer column. PostgreSQL: every column,
    with its type as the catalog has it (a PostgreSQL source digests records cast to them);
    MySQL/MariaDB: where every column renders canonically (an exact numeric at its scale)."""
    entry = _entry(sink, topic)
    target = _target(sink)
    if entry is None or not _integer_key(entry) or target.kind not in _RENDER:
        return None
    version, types = _postgres_types(sink, entry) if target.kind == "postgresql" else (0, {})
    records = version >= RECORD_DIGESTS
    columns = []
    for plan in column_plans(entry, target.dialect, target.kind, target.mariadb, set()):
        kind = _DIGEST_KINDS.get(plan.family)
        scale = getattr(plan.type, "scale", None) if kind is Kind.DECIMAL else None
        if kind is Kind.DECIMAL and scale is None:
            kind = None
        if kind is None and not records:
            return None
        columns.append(DigestColumn(plan.name, kind, scale, types.get(plan.name)))
    if records and any(c.sql_type is None for c in columns):
        return None
    # A PostgreSQL before 14 takes canonical digests only (as the source's reader names it).
    store = "postgresql" if records else "postgresql<14" if target.kind == "postgresql" else target.kind
    return DigestPlan(entry.key[0], tuple(columns), store)


def _postgres_types(sink: SqlSink, entry: TableEntry) -> tuple[int, dict[str, str]]:
    """The server's version number, and the table's column types as its catalog has them."""
    target = _target(sink)
    with target.engine.begin() as conn:
        cursor = conn.connection.cursor()
        try:
            cursor.execute("SELECT current_setting('server_version_num')::int")
            [version] = cursor.fetchone() or (0,)
            cursor.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                           "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                           (target.qualified(entry.physical),))
            return version, dict(cursor.fetchall())
        finally:
            cursor.close()


def digest_range(sink: SqlSink, topic: str, plan: DigestPlan, after: int | None, upto: int | None) -> Digest:
    """The digest of the live rows with keys in (after, upto], computed by the target: record
    digests on PostgreSQL when the plan is PostgreSQL's, else canonical ones (cdc/api/digest.py)."""
    entry = _entry(sink, topic)
    if entry is None:
        return Digest(0, 0)
    target = _target(sink)
    q = target.quote
    conditions = [f"{q(plan.key)} > {int(after)}"] if after is not None else []
    conditions += [f"{q(plan.key)} <= {int(upto)}"] if upto is not None else []
    if sink.config.soft_delete:
        conditions.append(f"{q(DELETED)} = FALSE")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    records = target.kind == "postgresql" and plan.store == "postgresql"
    if records:
        hashed = postgres_record_hash([q(c.name) for c in plan.columns])
    else:
        value, row_hash = _RENDER[target.kind]
        hashed = row_hash([value(c, q(c.name)) for c in plan.columns])
    with target.engine.begin() as conn:
        cursor = conn.connection.cursor()
        try:
            if records:
                cursor.execute(POSTGRES_SETTINGS)
            cursor.execute(f"SELECT count(*), coalesce(sum({hashed}), 0) FROM {target.qualified(entry.physical)}{where}")
            row = cursor.fetchone()
        finally:
            cursor.close()
    if row is None:
        raise PermanentError(f"sql sink {sink.config.name}: the target answered no row to a count")
    return Digest(int(row[0]), int(row[1]))


def _storing(plan: ColumnPlan, kind: str) -> Callable[[Any], Any]:
    """What the target makes of a value of ``plan``'s column, as a read gives it back: the
    converter a write binds it with, an exact numeric rounded to the column's scale as the
    database rounds it (half away from zero; SQLite keeps no scale), an instant in PostgreSQL
    with its zone."""
    to_store = converter(plan.family, kind)
    if plan.family is Family.TIMESTAMPTZ and kind == "postgresql":
        return _instant  # a write binds it as naive UTC; a read gives it back with its zone
    scale = getattr(plan.type, "scale", None)
    if plan.family is not Family.NUMERIC or scale is None or kind == "sqlite":
        return to_store
    step = Decimal(1).scaleb(-scale)

    def rounded(value: Any) -> Decimal:
        number = to_store(value)
        return (number if type(number) is Decimal else Decimal(number)).quantize(step, rounding=ROUND_HALF_UP)
    return rounded


def _instant(value: Any) -> datetime:
    """An instant with its zone (one without is UTC, as a write takes it)."""
    if not isinstance(value, str):
        raise TypeError(f"timestamps arrive as ISO-8601 text, not {type(value).__name__}")
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _entry(sink: SqlSink, topic: str) -> TableEntry | None:
    generation = sink.generations.current()
    with _target(sink).engine.begin() as conn:
        return next((e for e in sink.books.entries(conn, generation).values() if e.topic == topic), None)


def _select(sink: SqlSink, entry: TableEntry, conditions: list[str], order: str | None = None) -> list[StoredRow]:
    q, columns = _target(sink).quote, list(entry.columns)
    if sink.config.soft_delete:
        conditions = [*conditions, f"{q(DELETED)} = FALSE"]
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    where += f" ORDER BY {order}" if order else ""
    with _target(sink).engine.begin() as conn:
        # The driver's own cursor: its plain tuples, without a Row object made for each.
        cursor = conn.connection.cursor()
        try:
            cursor.execute(f"SELECT {', '.join(q(c) for c in columns)} FROM "
                           f"{_target(sink).qualified(entry.physical)}{where}")
            rows = cursor.fetchall()
        finally:
            cursor.close()
    key = [columns.index(name) for name in entry.key]
    if len(key) == 1:
        [at] = key
        return [StoredRow((row[at],), dict(zip(columns, row))) for row in rows]
    return [StoredRow(tuple([row[i] for i in key]), dict(zip(columns, row))) for row in rows]


def _target(sink: SqlSink) -> Target:
    target = sink.target
    if target is None:
        raise PermanentError(f"sql sink {sink.config.name}: call start() first")
    return target


def _integer_key(entry: TableEntry) -> bool:
    keys = entry.key
    return len(keys) == 1 and parse_type(entry.columns[keys[0]].type)[0] is Family.INTEGER
