"""A batch of sink events -> the script calls that apply it.

Per (topic, key) only the newest change can matter (every call is version-guarded), so the batch
is reduced first: the newest versioned event of each key, and a log tombstone when one came after
it. A key's events are all in one partition, in log order, so "after" is well defined. Per key:

* newest is r/c/u -> a guarded write in the configured format (``invalidate``: a guarded delete
  that remembers the version as live);
* newest is d, or a log tombstone with a version (its delete's, from its header) -> a guarded
  delete that leaves a tombstone with its version;
* a log tombstone without a version last (written before records had headers; a replay of a
  compacted topic whose delete record is gone) -> delete the key whatever its version, keep a
  stored delete version (guard.py, op ``t``).

The reduction runs over the whole batch first; the commands are then made lazily, one per key as
the pipeline takes them, each packed as RESP in a few bytes formats (no per-argument packing
later), so the server applies one pipeline while the next is made.

A truncate (``t``) names no key: it is returned per table with its newest version, and the sink
deletes the table's keys with that version after the batch's own calls (see sink.py), so keys
written later than the truncate stay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cdc.api import Op, SinkEvent
from sinks.redis.guard import OP_CODES
from sinks.redis.keys import KeySpace, companion, encode_key
from sinks.redis.pipeline import Command
from sinks.redis.pipeline import row as row_change
from sinks.redis.resp import pack_args
from sinks.redis.values import hash_fields, json_value

# Only a tombstone written before records had headers has none (the runtime's decoding, cdc/sink_events.py).
_NO_VERSION = "a change event without a version"


@dataclass(slots=True)
class Plan:
    commands: Iterable[Command] = ()     # made as they are taken (see plan_batch)
    truncates: dict[tuple[str, str], int] = field(default_factory=dict)


def table_of(event: SinkEvent, known: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """(schema or db, table) of an event; a tombstone (no source block) by its topic."""
    source = event.source
    if source:
        where = (source.get("schema") or source.get("db") or "", source.get("table") or event.table)
        known[event.topic] = where
        return where
    found = known.get(event.topic)
    if found is None:
        parts = event.topic.split(".")
        found = (parts[-2] if len(parts) >= 3 else "", parts[-1])
    return found


def plan_batch(events: list[SinkEvent], keyspace: KeySpace, fmt: str,
               choose: Callable[[dict[str, Any]], dict[str, Any]],
               known_tables: dict[str, tuple[str, str]],
               keep: dict[str, frozenset[str]] | None = None) -> Plan:
    """``keep``: per topic, the columns to keep of its rows (rows of a shape older than the one the
    generation follows; shapes.py).

    The hot path of a write (bench/redis_sink.py): the row key is built once per event and is the
    reduction's key too (it encodes table and primary key, stably and without collisions), and
    each change is packed as RESP here, once, in a few bytes formats (pipeline.row_tail's layout).
    """
    plan = Plan()
    newest: dict[str, tuple[int, SinkEvent]] = {}  # row key -> its newest change and that one's version
    tombstoned: dict[str, SinkEvent] = {}
    heads: dict[str, tuple[str, str]] = {}   # topic -> the key template around {key}
    truncate, delete = Op.TRUNCATE, Op.DELETE
    parts_of = keyspace.parts
    for event in events:
        op, version = event.op, event.version
        if op is truncate:
            assert version is not None, _NO_VERSION
            where = table_of(event, known_tables)
            if version > plan.truncates.get(where, version - 1):
                plan.truncates[where] = version
            continue
        if event.source:  # one table per topic: its template parts once per batch
            parts = heads.get(event.topic)
            if parts is None:
                parts = heads[event.topic] = parts_of(*table_of(event, known_tables))
        else:
            parts = parts_of(*table_of(event, known_tables))
        row = parts[0] + encode_key(event.key) + parts[1]
        if op is None:
            if version is None:
                tombstoned[row] = event
                continue
            event = event._replace(op=delete)  # versioned: its delete, guarded like one
        assert version is not None, _NO_VERSION
        before = newest.get(row)
        if before is None or version > before[0]:
            newest[row] = version, event
            tombstoned.pop(row, None)
    plan.commands = _commands(newest, tombstoned, keyspace, OP_CODES[fmt], choose, keep)
    return plan


def _commands(newest: dict[str, tuple[int, SinkEvent]], tombstoned: dict[str, SinkEvent], keyspace: KeySpace,
              upsert_code: str, choose: Callable[[dict[str, Any]], dict[str, Any]],
              keep: dict[str, frozenset[str]] | None) -> Iterator[Command]:
    """The guarded change of each key, packed, made one at a time as the pipeline takes them (so
    a pipeline is sent while the next is made)."""
    delete = Op.DELETE
    ns = keyspace.ns.encode()
    upsert_op = b"$1\r\n%b\r\n" % upsert_code.encode()
    for row, (event_version, event) in newest.items():
        if event.op is not delete and row in tombstoned:
            continue  # the log says the key's latest record is a delete: the tombstone below wins
        row_bytes = row.encode()
        companion_bytes = b"%b:v:{%b}" % (ns, row_bytes)
        keys = (row, companion_bytes.decode())
        packed_keys = b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(row_bytes), row_bytes, len(companion_bytes),
                                                             companion_bytes)
        digits = b"%d" % event_version
        version = b"$%d\r\n%b\r\n" % (len(digits), digits)
        if event.op is delete:
            yield Command("row", keys, (), (0, packed_keys, b"$1\r\nd\r\n" + version, b""))
        elif upsert_code == "x":
            yield Command("row", keys, (), (0, packed_keys, upsert_op + version, b""))
        else:
            after = event.after or {}
            assert not isinstance(after, bytes), "rows come as dicts: the sink does not ask for raw_rows"
            if keep and event.topic in keep:
                columns = keep[event.topic]
                after = {name: value for name, value in after.items() if name in columns}
            row_value = choose(after)
            if upsert_code == "h":
                fields = hash_fields(row_value)
                yield Command("row", keys, (), (len(fields), packed_keys, upsert_op + version, pack_args(fields)))
            else:
                value = json_value(row_value)
                yield Command("row", keys, (), (1, packed_keys, upsert_op + version,
                                                b"$%d\r\n%b\r\n" % (len(value), value)))
    for row in tombstoned:
        if row in newest and newest[row][1].op is delete:
            continue  # its delete is remembered already; the row key is gone
        yield row_change((row, companion(row)), "t", "0")
