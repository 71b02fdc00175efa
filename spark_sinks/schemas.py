"""Table shapes from ``<prefix>.schema-changes``, as Spark schemas.

The driver reads the schema topic through the framework's ``SchemaLookup`` (``SinkContext.schema_book``): again only
when its end offsets moved, and then only what it gained, so asking for a table's shape each
micro-batch costs one metadata request. A source publishes a table's new shape before the first
event that has it, but on another topic: a micro-batch can hold an event whose column the reader
has not seen yet. ``TableShape.missing`` tells the caller, which then refreshes (and, if the
column is still unknown, stores it as text rather than drop it).

A table follows its topic's newest shape, which may be several shapes past the one it had (a sink
stopped over several DDL statements, two renames between two batches). A column's
``renamed_from`` names it in the shape just before only, so a shape carries the earlier names of
its columns over the topic's whole history (``TableShape.earlier``, cdc.api's ``earlier_names``):
``note -> memo -> remark`` renames a table's ``note`` to ``remark``, and rows under ``memo``,
read later, land there too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import types as T

from cdc.api import SchemaLookup, earlier_names, schema_changes_topic
from spark_sinks.types import is_double, spark_type

log = logging.getLogger(__name__)

OLDEST = -1 << 63


@dataclass(frozen=True)
class TableShape:
    """A table's data columns in source order, and its key columns."""

    columns: tuple[tuple[str, T.DataType], ...]
    key: tuple[str, ...]
    from_schema_record: bool   # False: inferred from the values' names, every column text
    # (column, its earlier names, newest first) of the columns the source renamed in this shape or
    # an earlier one (``renamed_from``, chained over the topic's shapes)
    earlier: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The columns whose source type is an 8-byte float (``types.is_double``; a 4-byte one is a
    # double here too), and the double columns that an earlier shape of the topic had as a
    # decimal or text: rows of those shapes carry a JSON string there (``parse.RowDecoder``).
    doubles: frozenset[str] = frozenset()
    was_text: frozenset[str] = frozenset()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    @property
    def former_names(self) -> set[str]:
        """Every earlier name of a column: rows of an older shape carry its values under it."""
        return {old for _, olds in self.earlier for old in olds}

    def with_former(self, former: dict[str, list[str]]) -> dict[str, list[str]]:
        """A table's earlier names (``former``: column -> names, newest first, the renames it
        followed) and after them those this shape knows of its columns: a table made before the
        shapes' renames were chained may lack some, which rows of those shapes still carry."""
        out = {name: list(names) for name, names in former.items()}
        for name, olds in self.earlier:
            out[name] = list(dict.fromkeys([*out.get(name, ()), *olds]))
        return out

    def struct(self) -> T.StructType:
        return T.StructType([T.StructField(name, kind, True) for name, kind in self.columns])

    def missing(self, seen: set[str]) -> list[str]:
        known = {name.lower() for name in self.names}
        return sorted(name for name in seen if name.lower() not in known)

    def with_text_columns(self, names: list[str]) -> TableShape:
        return TableShape(self.columns + tuple((n, T.StringType()) for n in names), self.key,
                          self.from_schema_record, self.earlier, self.doubles, self.was_text)

    @staticmethod
    def from_record(record: dict, json_columns: str = "string", before: Sequence[dict] = ()) -> TableShape:
        """The shape of schema record ``record``; ``before``: the topic's records before it,
        oldest first (whose renames it chains)."""
        columns = tuple((c["name"], spark_type(c["type"], json_columns)) for c in record["columns"])
        key = tuple(c["name"] for c in record["columns"] if c.get("key"))
        names = earlier_names((*before, record))
        earlier = tuple((name, olds) for name, olds in names.items() if olds)
        doubles = frozenset(c["name"] for c in record["columns"] if is_double(c["type"]))
        current = {old: name for name, olds in names.items() for old in olds} | {n: n for n, _ in columns}
        was_text = frozenset(
            current[c["name"]] for shape in before for c in shape.get("columns") or ()
            if c.get("name") in current and isinstance(dict(columns).get(current[c["name"]]), T.DoubleType)
            and isinstance(spark_type(str(c.get("type")), json_columns), (T.DecimalType, T.StringType)))
        return TableShape(columns, key, True, earlier, doubles, was_text)

    @staticmethod
    def inferred(seen: set[str], key: tuple[str, ...]) -> TableShape:
        """No schema record: the names found in the values, key columns first, all as text."""
        rest = sorted(n for n in seen if n not in key)
        return TableShape(tuple((n, T.StringType()) for n in (*key, *rest)), key, False)


class SchemaRegistry:
    """topic -> the schema records of its table: the newest, and those before it. Thread-safe."""

    def __init__(self, book: SchemaLookup | None, prefix: str, json_columns: str = "string") -> None:
        self.prefix = prefix
        self.json_columns = json_columns   # the Spark type of json/jsonb columns (types.spark_type)
        self.topic = schema_changes_topic(prefix)
        self._book = book  # the schema topic's shapes (None: only those given to ``remember``)
        self._remembered: dict[str, list[dict]] = {}   # topic -> records given to ``remember``, in order
        self._lock = threading.Lock()

    def record(self, topic: str) -> dict | None:
        """The newest schema record of ``topic`` (None: none published), read again first."""
        with self._lock:
            return self._newest(topic)

    def shape(self, topic: str) -> TableShape | None:
        """The newest shape of ``topic`` (read again first), see ``shape_of``."""
        record = self.record(topic)
        return self.shape_of(topic, record) if record is not None else None

    def shape_of(self, topic: str, record: dict) -> TableShape:
        """The shape of ``topic``'s schema record ``record``, with the earlier names of its
        columns over the records before it."""
        with self._lock:
            return TableShape.from_record(record, self.json_columns, self._before(topic, record))

    def remember(self, topic: str, record: dict) -> None:
        """Use ``record`` for ``topic`` as its newest shape, after those remembered before (for
        callers without a log: benchmarks, tools)."""
        with self._lock:
            self._remembered.setdefault(topic, []).append(record)

    def _newest(self, topic: str) -> dict | None:
        if self._book is not None:
            self._book.refresh()
            record = self._book.schema_for(topic)
            if record is not None:
                return record
        remembered = self._remembered.get(topic)
        return remembered[-1] if remembered else None

    def _before(self, topic: str, record: dict) -> list[dict]:
        """The records of ``topic`` before ``record``, oldest first."""
        remembered = self._remembered.get(topic)
        if remembered and remembered[-1] is record:
            return remembered[:-1]
        version = record.get("version")
        if self._book is None or not isinstance(version, int):
            return []
        return self._book.shapes_between(topic, OLDEST, version)
