"""Schema evolution: what a table needs when its source's columns change.

Compared are the source columns a table was made for (``cdc_sink_tables``) and the schema record
the rows name (``source.schema_version``); only when the source publishes no shape at all, the
values themselves:

* a column the table lacks -> added (nullable); from a record with the record's type, from a value
  with the type inferred from it;
* a column the source dropped -> nothing: it stays, NULL from then on (the values lack it);
* a column the source renamed (its ``renamed_from``, see ``renamed_columns``) -> renamed in place
  by every policy but ``fail``, which stops: its values stay, under the new name;
* a column whose *target* type would now differ, or a different set of key columns -> a type
  change, for ``schema_policy`` to decide. Types are compared after mapping (``types.signature``),
  so varchar(10) -> varchar(20) or int -> bigint is no change here. ``widens`` says which type
  changes the target can make in place without losing a value, or by the very cast the source
  made (an integer or numeric into a double: ``casts_alike``); ``evolve`` makes those.

A column that was only inferred from values (no record had named it) takes the record's word
without a comparison: nothing changed in the source, only our guess was rougher.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cdc.api import earlier_names, renames_to_follow
from sinks.sql.bookkeeping import SourceColumn, TableEntry
from sinks.sql.types import Family, grows, infer_type, is_double, parse_type, target_type

KEY = "(primary key)"


@dataclass(frozen=True, slots=True)
class Incompatible:
    column: str        # KEY when the key columns change
    old: str
    new: str

    def __str__(self) -> str:
        return f"column {self.column}: {self.old} -> {self.new}"


def record_columns(record: dict[str, Any]) -> list[SourceColumn]:
    return [SourceColumn(c["name"], str(c["type"]), bool(c.get("key")),
                         was=(c["renamed_from"],) if c.get("renamed_from") else ())
            for c in record.get("columns") or ()]


def renamed_columns(entry: TableEntry, record: dict[str, Any], between: Sequence[dict[str, Any]] = ()
                    ) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """(new name -> old name, new name -> the names it had in between, newest first) of the
    columns that ``record`` says the source renamed (a column's ``renamed_from``) and that
    ``entry`` has under the old name only. A rename the source did not recognise looks like a
    dropped column and a new one, and is followed as those.

    ``between``: the shapes after the one ``entry`` follows and before ``record``, oldest first.
    A ``renamed_from`` names the column's name in the shape just before, so the renames of every
    one of them are chained (label -> title in one, note -> memo -> remark over two): only their
    renames, not their columns, which ``record`` decides. The names in between are those rows of
    the skipped shapes, read later, carry their values under."""
    found = renames_to_follow(earlier_names((*between, record)), entry.columns)
    return ({new: old for new, (old, _) in found.items()},
            {new: passed for new, (_, passed) in found.items() if passed})


def with_key(columns: list[SourceColumn], key_names: Iterable[str]) -> list[SourceColumn]:
    """``columns`` with the event key's columns marked as key, when the record marks none
    (a table without a primary key, keyed by configuration in the source)."""
    if any(c.key for c in columns):
        return columns
    names = set(key_names)
    return [SourceColumn(c.name, c.type, c.name in names, c.inferred, c.was) for c in columns]


def diff(entry: TableEntry, columns: list[SourceColumn],
         signature: Callable[[str, bool], str]) -> tuple[list[SourceColumn], list[Incompatible]]:
    """(columns to add, incompatible changes) from ``entry``'s columns to ``columns``."""
    added: list[SourceColumn] = []
    incompatible: list[Incompatible] = []
    for column in columns:
        old = entry.columns.get(column.name)
        if old is None:
            added.append(SourceColumn(column.name, column.type, False, was=column.was))
        elif not old.inferred and signature(old.type, old.key) != signature(column.type, old.key):
            incompatible.append(Incompatible(column.name, old.type, column.type))
    old_key = entry.key
    new_key = [c.name for c in columns if c.key]
    if new_key and set(new_key) != set(old_key):
        incompatible.append(Incompatible(KEY, ", ".join(old_key), ", ".join(new_key)))
    return added, incompatible


def infer_columns(rows: Iterable[dict[str, Any]], known: set[str], key_names: Iterable[str]) -> list[SourceColumn]:
    """Columns of ``rows`` missing from ``known``, typed by their first non-NULL value (TEXT when
    every value is NULL), in the order they first appear."""
    keys = set(key_names)
    found: dict[str, str | None] = {}
    for row in rows:
        if row.keys() <= known:
            continue
        for name, value in row.items():
            if name in known:
                continue
            if found.get(name) is None:
                found[name] = infer_type(value)
    return [SourceColumn(name, type_ or "text", name in keys, inferred=True) for name, type_ in found.items()]


def widens(old: str, new: str, kind: str, *, mariadb: bool = False) -> bool:
    """True when the target (``kind``) can change a non-key column from source type ``old`` to
    ``new`` in place and every value it holds ends as the source's does: a numeric with no fewer
    integer and fractional digits, an integer into such a numeric, an integer, numeric or string
    into text (each value kept), and an integer or numeric into an 8-byte float (``casts_alike``:
    each value rounded as the source rounded it). SQLite cannot change a column's type; a float
    or a date is never converted (their text and rounding differ between databases)."""
    if kind == "sqlite":
        return False
    old_family, _, _ = parse_type(old)
    new_family, _, _ = parse_type(new)
    if new_family is Family.FLOAT:
        return casts_alike(old, new, kind, mariadb=mariadb)
    if new_family is Family.TEXT and old_family is Family.TEXT and kind in ("mysql", "mariadb"):
        return grows(old, new, kind)  # strings keep their length there: only a longer one holds all
    if new_family is Family.TEXT:
        return old_family in (Family.INTEGER, Family.NUMERIC, Family.TEXT)
    if new_family is not Family.NUMERIC or old_family not in (Family.INTEGER, Family.NUMERIC):
        return False
    new_type = _numeric_type(new, kind, mariadb)
    if new_type.precision is None:  # PostgreSQL's unbounded numeric holds every value
        return True
    new_int, new_scale = new_type.precision - (new_type.scale or 0), new_type.scale or 0
    if old_family is Family.INTEGER:
        return new_int >= 20  # every integer is BIGINT here: 19 digits and a sign
    old_type = _numeric_type(old, kind, mariadb)
    if old_type.precision is None:
        return False
    return new_scale >= (old_type.scale or 0) and new_int >= old_type.precision - (old_type.scale or 0)


def _numeric_type(type_name: str, kind: str, mariadb: bool) -> sa.Numeric:
    """The target's type for a source type of the NUMERIC family (types.target_type: a Numeric)."""
    numeric = target_type(type_name, kind, key=False, mariadb=mariadb)
    assert isinstance(numeric, sa.Numeric), f"{type_name}: {numeric!r} is not a numeric type"
    return numeric


# DuckDB casts a DECIMAL to DOUBLE by dividing its integer by a power of ten; the one rounding
# of that division is the correctly rounded value while the integer is exact as a double, which
# 15 digits are (below 2**53). Wider ones add a second rounding.
DUCKDB_EXACT_DIGITS = 15


def casts_alike(old: str, new: str, kind: str, *, mariadb: bool = False) -> bool:
    """True when the target's ``ALTER`` of a column from source type ``old`` to ``new`` gives
    every value it holds the very value the source's own conversion gave it, so that rows the
    source changed without logging them (its ALTER rewrote them) still equal the target's: an
    integer or numeric into an 8-byte float. The source's cast is correctly rounded (PostgreSQL
    and MySQL/MariaDB parse a numeric's text with strtod; an integer is converted by the CPU), and
    so is the target's: the same functions on PostgreSQL and MySQL/MariaDB, and DuckDB's up to
    ``DUCKDB_EXACT_DIGITS`` digits. A 4-byte float would round twice."""
    old_family, _, _ = parse_type(old)
    if not is_double(new) or old_family not in (Family.INTEGER, Family.NUMERIC):
        return False
    if kind == "duckdb" and old_family is Family.NUMERIC:
        precision = _numeric_type(old, kind, mariadb).precision
        return precision is not None and precision <= DUCKDB_EXACT_DIGITS
    return True
