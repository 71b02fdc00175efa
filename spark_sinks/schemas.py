"""Table shapes from ``<prefix>.schema-changes``, as Spark schemas.

The driver reads the compacted schema topic (small: one record per table) through the framework's
log client, and again only when its end offsets moved, so asking for a table's shape each
micro-batch costs one metadata request. A source publishes a table's new shape before the first
event that has it, but on another topic: a micro-batch can hold an event whose column the reader
has not seen yet. ``TableShape.missing`` tells the caller, which then refreshes (and, if the
column is still unknown, stores it as text rather than drop it).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import orjson
from pyspark.sql import types as T

from cdc.api import Log, schema_changes_topic
from spark_sinks.types import spark_type

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableShape:
    """A table's data columns in source order, and its key columns."""

    columns: tuple[tuple[str, T.DataType], ...]
    key: tuple[str, ...]
    from_schema_record: bool   # False: inferred from the values' names, every column text
    # (new name, old name) of the columns the source says it renamed (a column's ``renamed_from``)
    renamed: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def struct(self) -> T.StructType:
        return T.StructType([T.StructField(name, kind, True) for name, kind in self.columns])

    def missing(self, seen: set[str]) -> list[str]:
        known = {name.lower() for name in self.names}
        return sorted(name for name in seen if name.lower() not in known)

    def with_text_columns(self, names: list[str]) -> TableShape:
        return TableShape(self.columns + tuple((n, T.StringType()) for n in names), self.key,
                          self.from_schema_record, self.renamed)

    @staticmethod
    def from_record(record: dict, json_columns: str = "string") -> TableShape:
        columns = tuple((c["name"], spark_type(c["type"], json_columns)) for c in record["columns"])
        key = tuple(c["name"] for c in record["columns"] if c.get("key"))
        renamed = tuple((c["name"], c["renamed_from"]) for c in record["columns"] if c.get("renamed_from"))
        return TableShape(columns, key, True, renamed)

    @staticmethod
    def inferred(seen: set[str], key: tuple[str, ...]) -> TableShape:
        """No schema record: the names found in the values, key columns first, all as text."""
        rest = sorted(n for n in seen if n not in key)
        return TableShape(tuple((n, T.StringType()) for n in (*key, *rest)), key, False)


class SchemaRegistry:
    """topic -> the newest schema record of its table. Thread-safe."""

    def __init__(self, log_: Log | None, prefix: str, json_columns: str = "string") -> None:
        self._log = log_
        self.prefix = prefix
        self.json_columns = json_columns   # the Spark type of json/jsonb columns (types.spark_type)
        self.topic = schema_changes_topic(prefix)
        self._records: dict[str, dict] = {}
        self._ends: dict | None = None
        self._lock = threading.Lock()

    def record(self, topic: str, *, refresh: bool = True) -> dict | None:
        with self._lock:
            if refresh:
                self._refresh()
            return self._records.get(topic)

    def shape(self, topic: str, *, refresh: bool = True) -> TableShape | None:
        record = self.record(topic, refresh=refresh)
        return TableShape.from_record(record, self.json_columns) if record is not None else None

    def remember(self, topic: str, record: dict) -> None:
        """Use ``record`` for ``topic`` until the schema topic says otherwise (for callers without
        a log: benchmarks, tools)."""
        with self._lock:
            self._records[topic] = record

    def _refresh(self) -> None:
        if self._log is None or (self._ends is None and self.topic not in self._log.topics()):
            return
        ends = self._log.end_offsets(self.topic)
        if ends == self._ends:
            return
        for record in self._log.read_all(self.topic):  # (partition, offset) order: newest last
            if record.value is None:
                continue
            value = orjson.loads(record.value)
            name = f"{self.prefix}.{value.get('schema') or value['db']}.{value['table']}"
            self._records[name] = value
        self._ends = ends
        log.debug("schema records read: %d tables", len(self._records))
