"""Schema changes ordered with the rows they govern, on both sides of the log.

The rule (docs/architecture.md, "Schema changes"): a table's shape as of version S governs its
rows with ``version >= S`` up to the next shape. Each shape is one record of
``<prefix>.schema-changes`` keyed by (source, table, S), and every row's envelope names the shape
it was written under in ``source.schema_version``. So:

* the capture side (``segments``) publishes a batch's shapes first, then encodes its rows in
  segments, moving a table's ``schema_version`` forward exactly before its first row of the new
  shape: rows of the old shape earlier in the same batch still name the old one;
* the sink side (``split_by_schema``) hands a sink batches in which each topic has one shape, so
  a sink changes a table between two writes, never in the middle of one: rows of the old shape
  are written before the table changes, rows of the new one after.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from cdc import native
from cdc.events import ChangeEvent, SchemaChange, TableId


def segments(events: list[ChangeEvent], changes: Sequence[SchemaChange]
             ) -> Iterator[tuple[dict[TableId, int], list[ChangeEvent]]]:
    """``(shapes to take on, events)`` in order: before encoding each segment, set each named
    table's ``schema_version``; the last segment may be empty (shapes whose rows come later).

    A table's shape applies from the first of its events whose version reaches the shape's: a
    change's rows have versions at or above it (PostgreSQL: the LSN of the first change after the
    Relation message; MySQL: the binlog position of the DDL or table map), and the events of
    one table are in version order.
    """
    pending: dict[TableId, list[SchemaChange]] = {}
    for change in sorted(changes, key=lambda c: c.version):
        pending.setdefault(change.table, []).append(change)
    before: dict[TableId, int] = {}
    start = 0
    for index, event in enumerate(events):
        waiting = pending.get(event.table)
        if not waiting or waiting[0].version > event.version:
            continue
        if index > start:
            yield before, events[start:index]
            before, start = {}, index
        while waiting and waiting[0].version <= event.version:
            before[event.table] = waiting.pop(0).version
        if not waiting:
            del pending[event.table]
    yield before, events[start:]
    if pending:
        yield {table: waiting[-1].version for table, waiting in pending.items()}, []


def split_by_schema(events: list) -> list[list]:
    """``events`` (sink events, in order) cut where a topic's ``source.schema_version`` changes,
    so that each part has one shape per topic. Tombstones (no source) never cut. Where setup.py
    built it, ``cdc/_decode.c`` runs this loop in C (0.4 us an event in Python, on every
    write); this loop is the reference (tests/unit/test_schema_order.py compares them)."""
    if _decode is not None and native.enabled() and type(events) is list:
        from_c = _decode.split_by_schema(events)
        if from_c is not None:  # None: something the C loop does not take; this loop decides
            return from_c
    parts: list[list] = []
    shapes: dict[str, int] = {}
    start = 0
    for index, event in enumerate(events):
        version = event.source.get("schema_version") if event.source else None
        if version is None:
            continue
        seen = shapes.get(event.topic)
        if seen is not None and seen != version:
            parts.append(events[start:index])
            start = index
            shapes = {}
        shapes[event.topic] = version
    parts.append(events[start:])
    return parts


_decode = native.load("cdc._decode")  # the same loop in C
