"""What one write does to one table: the reduced changes and the table's typed columns.

The sink builds a ``TablePlan`` per topic of a batch (after any DDL), and hands the plans to the
applier of its dialect (``apply_staged`` or ``apply_generic``) inside the write's transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from cdc.api import SinkEvent
from sinks.sql.bookkeeping import TableEntry
from sinks.sql.reduce import TopicChanges, version_of
from sinks.sql.types import Family, parse_type, target_type

VERSION, DELETED = "__cdc_version", "__cdc_deleted"


class PlanFailed(Exception):
    """A database error while applying ``plan`` (None: while staging the plans of a write)."""

    def __init__(self, plan: TablePlan | None, error: BaseException) -> None:
        super().__init__(str(error))
        self.plan, self.error = plan, error


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    name: str
    family: Family
    type: sa.types.TypeEngine
    sql_type: str              # compiled for the target's dialect
    key: bool
    skipped: bool              # schema_policy ignore: the source type no longer fits; written as NULL


@dataclass(slots=True)
class TablePlan:
    changes: TopicChanges
    tbl: str                               # the physical table: data and bookkeeping key
    entry: TableEntry | None               # None: no table yet (only bookkeeping to do)
    columns: list[ColumnPlan] = field(default_factory=list)
    watermark: int | None = None           # the truncate watermark after this batch's truncate

    @property
    def key_columns(self) -> list[ColumnPlan]:
        return [c for c in self.columns if c.key]

    def live_upserts(self) -> Collection[tuple[bytes, SinkEvent]]:
        """Upserts at or above the truncate watermark (key JSON, event)."""
        mark = self.watermark
        items = self.changes.upserts.items()
        return items if mark is None else [(k, e) for k, e in items if version_of(e) >= mark]

    def live_deletes(self) -> list[tuple[bytes, SinkEvent]]:
        mark = self.watermark
        items = self.changes.deletes.items()
        return list(items) if mark is None else [(k, e) for k, e in items if version_of(e) >= mark]


def column_plans(entry: TableEntry, dialect: sa.engine.Dialect, kind: str, mariadb: bool,
                 skipped: set[str]) -> list[ColumnPlan]:
    plans = []
    for column in entry.columns.values():
        type_ = target_type(column.type, kind, key=column.key, mariadb=mariadb)
        plans.append(ColumnPlan(column.name, parse_type(column.type)[0], type_,
                                str(type_.compile(dialect=dialect)), column.key, column.name in skipped))
    return plans


def key_values(event_key: dict[str, Any], before: dict[str, Any] | None, names: list[str]) -> dict[str, Any]:
    """The table's key columns for a delete: from the event key, else from the old row (the
    table's key may differ from the event's after a key change under ``schema_policy: ignore``)."""
    if all(name in event_key for name in names):
        return event_key
    row = dict(before or {})
    row.update(event_key)
    return row

