"""The live schema contract for a cache: which shape a generation's keys are in, and what a new
shape does to it, per ``schema_policy``.

The runtime hands ``write`` batches with one shape per topic (docs/architecture.md, "Schema
changes"), so a table's shape changes between two writes. Per (generation, topic) the sink
*follows* one shape, remembered in ``<namespace>:shape:<topic>`` so a restarted sink (or one
killed between a shape change and its first row) decides the same. A generation meets a topic
first in the topic's newest shape (a first start, a bootstrap, a rebuild), so rows of older
shapes are written into it and a change the sink has already passed never stops it.

A key's value is a whole row (guard.py replaces it), and readers see what a cache holds per
value, so a change matters to them only when the JSON a column's values take changes kind
(``value_kind``: ``int`` -> ``bigint`` or ``varchar(10)`` -> ``text`` changes nothing a reader
sees). For a shape newer than the followed one:

* a new column: every policy takes it; keys get the field from their next change;
* a column whose values change kind, or a dropped column: ``evolve`` takes it (each key holds
  the new kind, or loses the field, from its next change; keys not changed since keep the old),
  ``rebuild`` raises ``RebuildRequired`` (a new generation written from the compacted topic, every
  key in the newest shape, then the pointer switches), ``fail`` stops on a change of kind with
  ``SchemaChangeError`` naming the table, the column, the old and new type and the fix (a dropped
  column is no stop for ``fail``: a key loses the field when next written, like a SQL column
  that becomes NULL);
* a different primary key: ``rebuild`` rebuilds; ``fail`` and ``evolve`` stop, since every key
  of the table would move and the old keys would stay behind as stale entries.

Rows of a shape older than the followed one are written with the followed shape's columns only
(a column dropped since is left out). Values keep the kind they were logged with: a cache does
not convert them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.api import RebuildRequired, SchemaChangeError, SinkEvent

log = logging.getLogger(__name__)

_INTEGER = {"int", "int2", "int4", "int8", "smallint", "integer", "bigint", "tinyint", "mediumint",
            "serial", "bigserial", "smallserial", "year"}
_FLOAT = {"float4", "float8", "real", "double", "double precision", "float"}
_DECIMAL = {"numeric", "decimal", "money"}
_BOOLEAN = {"bool", "boolean"}
_JSON = {"json", "jsonb"}
_BINARY = {"bytea", "blob", "tinyblob", "mediumblob", "longblob", "binary", "varbinary", "bit"}


def value_kind(source_type: str) -> str:
    """The kind of JSON a column of ``source_type`` takes in the change events (the contract's
    type mapping), which is what a cache holds and a reader parses."""
    text = source_type.strip().lower()
    if text.endswith("[]") or text.startswith("_"):
        return "array"
    base = re.sub(r"\(.*?\)", "", text).replace(" unsigned", "").strip()
    for kind, names in (("integer", _INTEGER), ("float", _FLOAT), ("decimal", _DECIMAL),
                        ("boolean", _BOOLEAN), ("json", _JSON), ("binary", _BINARY)):
        if base in names:
            return kind
    return "text"  # text, varchar, char, uuid, enum, dates, times, timestamps, intervals, ...


@dataclass(frozen=True, slots=True)
class Followed:
    version: int
    columns: dict[str, str]       # name -> source type
    key: tuple[str, ...]

    @staticmethod
    def of(record: dict[str, Any]) -> Followed:
        columns = record.get("columns") or []
        return Followed(int(record["version"]), {c["name"]: c["type"] for c in columns},
                        tuple(c["name"] for c in columns if c.get("key")))

    def to_json(self) -> bytes:
        return orjson.dumps({"version": self.version, "columns": self.columns, "key": self.key})

    @staticmethod
    def from_json(data: bytes) -> Followed:
        value = orjson.loads(data)
        return Followed(int(value["version"]), dict(value["columns"]), tuple(value["key"]))


def shape_key(ns: str, topic: str) -> str:
    return f"{ns}:shape:{topic}"


class ShapeFollower:
    """Used from the sink's thread only. ``store_get``/``store_set``: GET/SET on the server."""

    def __init__(self, sink_name: str, policy: str, shape_of: Callable[[SinkEvent], dict | None],
                 newest: Callable[[str], dict | None], store_get: Callable[[str], bytes | None],
                 store_set: Callable[[str, bytes], Any]) -> None:
        self.sink_name = sink_name
        self.policy = policy
        self.shape_of = shape_of
        self.newest = newest
        self.store_get = store_get
        self.store_set = store_set
        self._followed: dict[tuple[str, str], Followed | None] = {}

    def forget(self) -> None:
        self._followed.clear()

    def follow(self, ns: str, first: SinkEvent) -> frozenset[str] | None:
        """Take the shape the rows of ``first``'s topic in this write name (``first``: the topic's
        first event with a source block in it; a write of tombstones alone decides nothing); the columns to keep of rows of an older shape, or None to keep all.
        Raises ``SchemaChangeError`` (``fail``, or a new key) or ``RebuildRequired``."""
        record = self.shape_of(first)
        if record is None or not isinstance(record.get("version"), int) or not record.get("columns"):
            return None  # no shapes from this source (or a dropped table's): rows as they come
        topic = first.topic
        followed = self._load(ns, topic, record)
        shape = Followed.of(record)
        if shape.version < followed.version:
            return frozenset(followed.columns)
        if shape.version == followed.version:
            return None
        self._check(topic, followed, shape, record)
        self._store(ns, topic, shape)
        return None

    def _load(self, ns: str, topic: str, record: dict) -> Followed:
        cached = self._followed.get((ns, topic))
        if cached is not None:
            return cached
        stored = self.store_get(shape_key(ns, topic))
        if stored is not None:
            followed = Followed.from_json(stored)
        else:  # the generation meets the topic first: in its newest shape (or the rows', if newer)
            newest = self.newest(topic)
            candidates = [r for r in (record, newest) if r and isinstance(r.get("version"), int) and r.get("columns")]
            followed = Followed.of(max(candidates, key=lambda r: r["version"]))
            self.store_set(shape_key(ns, topic), followed.to_json())
        self._followed[(ns, topic)] = followed
        return followed

    def _store(self, ns: str, topic: str, shape: Followed) -> None:
        self.store_set(shape_key(ns, topic), shape.to_json())
        self._followed[(ns, topic)] = shape

    def _check(self, topic: str, old: Followed, new: Followed, record: dict) -> None:
        table = ".".join(p for p in (record.get("db"), record.get("schema"), record.get("table")) if p)
        where = f"redis sink {self.sink_name}: table {table} (topic {topic})"
        if old.key != new.key:
            why = f"primary key ({', '.join(old.key)}) -> ({', '.join(new.key)})"
            if self.policy == "rebuild":
                raise RebuildRequired(f"{where}: {why}")
            raise SchemaChangeError(
                f"{where}: source schema change {why}: every key of the table would move and the old "
                f"ones stay behind; nothing of the new shape was written. Fix: cdc rebuild CONFIG "
                f"{self.sink_name} (or schema_policy: rebuild)")
        changed = [(name, old.columns[name], new.columns[name]) for name in old.columns
                   if name in new.columns and value_kind(old.columns[name]) != value_kind(new.columns[name])]
        dropped = [name for name in old.columns if name not in new.columns]
        if not changed and not dropped:
            return
        if self.policy == "rebuild":
            what = ", ".join([f"column {n}: {a} -> {b}" for n, a, b in changed] + [f"column {n} dropped" for n in dropped])
            raise RebuildRequired(f"{where}: {what}")
        if changed and self.policy == "fail":
            name, before, after = changed[0]
            raise SchemaChangeError(
                f"{where}: source schema change column {name}: {before} -> {after} (its values change "
                f"from {value_kind(before)} to {value_kind(after)}); nothing of the new shape was written. "
                f"Fix: cdc rebuild CONFIG {self.sink_name} (readers switch to a generation in the new "
                f"shape), or schema_policy: evolve (each key takes the new type at its next change)")
        log.info("%s: follows shape %d (%s)", where, new.version,
                 ", ".join([f"{n}: {a} -> {b}" for n, a, b in changed] + [f"{n} dropped" for n in dropped]))
