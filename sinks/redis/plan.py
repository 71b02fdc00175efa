"""A batch of sink events -> the script calls that apply it.

Per (topic, key) only the newest change can matter (every call is version-guarded), so the batch
is reduced first: the newest versioned event of each key, and a log tombstone when one came after
it. A key's events are all in one partition, in log order, so "after" is well defined. Per key:

* newest is r/c/u -> a guarded write in the configured format (``invalidate``: a guarded delete
  that remembers the version as live);
* newest is d -> a guarded delete that leaves a tombstone with its version;
* a log tombstone last (a replay of a compacted topic whose delete record is gone) -> delete the
  key whatever its version, keep a stored delete version (guard.py, op ``t``).

A truncate (``t``) names no key: it is returned per table with its newest version, and the sink
deletes the table's keys with that version after the batch's own calls (see sink.py), so keys
written later than the truncate stay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from cdc.api import Op, SinkEvent
from sinks.redis.guard import OP_CODES
from sinks.redis.keys import KeySpace, companion
from sinks.redis.pipeline import Command, row as row_change
from sinks.redis.values import hash_fields, json_value


@dataclass(slots=True)
class Plan:
    commands: list[Command] = field(default_factory=list)
    truncates: dict[tuple[str, str], int] = field(default_factory=dict)


def table_of(event: SinkEvent, known: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """(schema or db, table) of an event; a tombstone (no source block) by its topic."""
    source = event.source
    if source:
        where = (source.get("schema") or source.get("db") or "", source.get("table") or event.table)
        known[event.topic] = where
        return where
    where = known.get(event.topic)
    if where is None:
        parts = event.topic.split(".")
        where = (parts[-2] if len(parts) >= 3 else "", parts[-1])
    return where


def plan_batch(events: list[SinkEvent], keyspace: KeySpace, fmt: str,
               choose: Callable[[dict[str, Any]], dict[str, Any]],
               known_tables: dict[str, tuple[str, str]],
               keep: dict[str, frozenset[str]] | None = None) -> Plan:
    """``keep``: per topic, the columns to keep of its rows (rows of a shape older than the one the
    generation follows; shapes.py)."""
    plan = Plan()
    newest: dict[tuple[str, bytes], SinkEvent] = {}
    tombstoned: dict[tuple[str, bytes], SinkEvent] = {}
    truncate = Op.TRUNCATE
    for event in events:
        if event.op is truncate:
            where = table_of(event, known_tables)
            if event.version > plan.truncates.get(where, event.version - 1):
                plan.truncates[where] = event.version
            continue
        slot = (event.topic, orjson.dumps(event.key))
        if event.op is None:
            tombstoned[slot] = event
            continue
        before = newest.get(slot)
        if before is None or event.version > before.version:
            newest[slot] = event
            tombstoned.pop(slot, None)
    upsert_code = OP_CODES[fmt]
    commands = plan.commands
    delete = Op.DELETE
    for slot, event in newest.items():
        row = keyspace.row_key(*table_of(event, known_tables), event.key)
        keys = (row, companion(row))
        version = str(event.version)
        if event.op is delete:
            commands.append(row_change(keys, "d", version))
        elif slot in tombstoned:
            continue  # the log says the key's latest record is a delete: the tombstone below wins
        elif upsert_code == "x":
            commands.append(row_change(keys, "x", version))
        else:
            after = event.after or {}
            if keep and event.topic in keep:
                columns = keep[event.topic]
                after = {name: value for name, value in after.items() if name in columns}
            row_value = choose(after)
            payload = tuple(hash_fields(row_value)) if upsert_code == "h" else (json_value(row_value),)
            commands.append(row_change(keys, upsert_code, version, payload))
    for slot, event in tombstoned.items():
        if slot in newest and newest[slot].op is delete:
            continue  # its delete is remembered already; the row key is gone
        row = keyspace.row_key(*table_of(event, known_tables), event.key)
        commands.append(row_change((row, companion(row)), "t", "0"))
    return plan
