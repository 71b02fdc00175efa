"""What ``cdc verify`` reads of a Delta sink's tables (``cdc.api.ReadableSink``), a source row in
the forms the tables give back, and how far the sink's query has applied its topics.

The tables are read through a Spark session that ``DeltaSink.start_reading`` opens (the one
already active in the process, else a local one): no streaming query starts, nothing is written,
the checkpoint is only read.

What is compared: the rows readers see, their data columns (the ``__cdc_*`` bookkeeping left
out): every row (type 1), the rows not marked deleted (``soft_delete``), the current version of
each key (``scd2``: the closed versions of its history are not compared). A column the source
dropped keeps its values in the table's older rows (the sink never drops one), so those rows
differ from the source. Key columns must be numbers, text or dates (what ``key_order`` orders
the same in the table and in the source's JSON forms); another type is a ``ConfigError``.

Cost: each chunk is one scan of the table filtered on its key, which Delta narrows to the files
whose key statistics overlap the range (data skipping). A key of one number column is filtered by
the range itself. A key of one text column: by the text bounds, except that ``key_order`` puts
text reading as a number (``007``) before all other text, so a chunk reaching into those keys
reads every key not starting with a letter. A composite key is filtered on its first column that
way. What the filter lets through beyond the range is dropped here. ``stored_forms`` parses the
source rows with the sink's own decoder and the table's column types (``parse.RowDecoder``, what a
MERGE writes): one small Spark job per chunk.

Settling: the sink's position is its query's checkpoint, not a consumer group. Spark writes
``offsets/<N>`` (the end offsets batch N reads up to) before the batch and ``commits/<N>`` after
``foreachBatch`` returned, every MERGE of the batch committed: ``applied_offsets`` gives the
offsets of the newest committed batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.api import ConfigError, PermanentError, StoredRow, in_range, key_order, page
from spark_sinks.connect_json import ConnectCodecs
from spark_sinks.evolve import data_fields
from spark_sinks.parse import CURRENT, DELETED, RowDecoder
from spark_sinks.tables import MODE_PROPERTY, TableTarget, quote

_NUMBERS = (T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.DecimalType)
_KEY_TYPES = (*_NUMBERS, T.StringType, T.DateType)
_ROW = "_cdc_verify_row"


class DeltaReader:
    """Reads of one sink's tables; ``target(topic)`` as the sink writes them."""

    def __init__(self, session: SparkSession, make_target: Callable[..., TableTarget], mode: str,
                 checkpoint: str) -> None:
        """``make_target(topic, mode)``: a topic's tables in the sink's format (tables.targets)."""
        self.session, self.make_target, self.mode, self.checkpoint = session, make_target, mode, checkpoint
        # What was read of each table's metadata (schema, key, mode): read again at the start of
        # each pass over a table (``read_rows``, a ``read_range`` from the first key).
        self._targets: dict[str, TableTarget] = {}

    def target(self, topic: str, fresh: bool = False) -> TableTarget | None:
        """The table of ``topic`` (its own mode, whatever the config says); None: none yet."""
        target = None if fresh else self._targets.get(topic)
        if target is not None:
            return target
        target = self.make_target(topic, self.mode)
        if not target.exists(self.session):
            return None
        mode = target.properties(self.session).get(MODE_PROPERTY)
        if mode and mode != self.mode:
            target = self.make_target(topic, mode)
        self._targets[topic] = target
        return target

    def read_rows(self, topic: str, after: tuple | None = None, limit: int | None = None) -> list[StoredRow]:
        target = self.target(topic, fresh=True)
        return [] if target is None else page(self._select(target, None), after, limit)

    def read_range(self, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
        target = self.target(topic, fresh=after is None)
        if target is None:
            return []
        fields, key = self._key(target)
        # Of a composite key, the first column's range (its ends included) holds every key
        # between: key_order compares column by column.
        narrowing = _range(fields[key[0]], None if after is None else after[0],
                           None if upto is None else upto[0], len(key) == 1)
        return in_range(self._select(target, narrowing), after, upto)

    def read_keys(self, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
        target = self.target(topic)
        if target is None or not keys:
            return []
        fields, key = self._key(target)
        first = fields[key[0]]
        values = {key_order((k[0],)): k[0] for k in keys}.values()
        found = self._select(target, F.col(quote(first.name)).isin([_literal(v, first.dataType) for v in values]))
        wanted = {key_order(k) for k in keys}
        return page([row for row in found if key_order(row.key) in wanted], None, None)

    def stored_forms(self, topic: str, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
        target = self.target(topic)
        if target is None or not rows:
            return [StoredRow(tuple(key.values()), dict(row)) for key, row in rows]
        fields, key = self._key(target)
        struct = T.StructType(list(fields.values()))
        decoder = RowDecoder(struct, {}, ConnectCodecs(), set(), target.former_names(self.session))
        frame = self.session.createDataFrame(
            [(i, orjson.dumps(row).decode()) for i, (_, row) in enumerate(rows)],
            T.StructType([T.StructField(_ROW, T.LongType()), T.StructField("data", T.StringType())]))
        parsed = decoder.prepare(frame)
        columns = [_comparable(column, field) for column, field in zip(decoder.columns(), struct.fields)]
        found = {r[_ROW]: r for r in parsed.select(_ROW, *columns).collect()}
        out = []
        for i in range(len(rows)):
            values = found[i].asDict()
            del values[_ROW]
            out.append(StoredRow(tuple(values[name] for name in key), values))
        return out

    def _key(self, target: TableTarget) -> tuple[dict[str, T.StructField], tuple[str, ...]]:
        """The table's data columns by name, and its key columns (checked: see the docstring)."""
        fields = {f.name: f for f in data_fields(target.schema(self.session))}
        key = target.key(self.session)
        if not key or any(name not in fields for name in key):
            raise ConfigError(f"{target.format} table {target.name} at {target.where} names no key columns it has "
                              f"(table property cdc.key: {key}); it cannot be verified")
        odd = [f"{name} ({fields[name].dataType.simpleString()})" for name in key
               if not isinstance(fields[name].dataType, _KEY_TYPES)]
        if odd:
            raise ConfigError(f"{target.format} table {target.name}: key column {', '.join(odd)} is not a number, text or "
                              f"date, whose order verify can read the same in the table and in the source")
        return fields, key

    def _select(self, target: TableTarget, condition: Column | None) -> list[StoredRow]:
        frame: DataFrame = target.frame(self.session)
        fields, key = self._key(target)
        live = {"soft": ~F.coalesce(F.col(DELETED), F.lit(False)), "scd2": F.col(CURRENT)}.get(target.mode)
        for where in (live, condition):
            if where is not None:
                frame = frame.where(where)
        rows = frame.select(*[_comparable(F.col(quote(name)), field) for name, field in fields.items()]).collect()
        return [StoredRow(tuple(row[name] for name in key), row.asDict()) for row in rows]

    def applied_offsets(self, topic: str) -> dict[int, int]:
        """Per partition of ``topic``, the offset below which the table holds every record (see
        the module docstring); empty before the first batch committed."""
        jvm = self.session.sparkContext._jvm  # noqa: SLF001 - PySpark has no file system API; Hadoop's via Py4J
        assert jvm is not None  # a live session's context has its JVM
        root = jvm.org.apache.hadoop.fs.Path(self.checkpoint)
        fs = root.getFileSystem(self.session.sparkContext._jsc.hadoopConfiguration())  # noqa: SLF001
        commits = jvm.org.apache.hadoop.fs.Path(root, "commits")
        if not fs.exists(commits):
            return {}
        done = [int(s.getPath().getName()) for s in fs.listStatus(commits) if s.getPath().getName().isdigit()]
        if not done:
            return {}
        stream = fs.open(jvm.org.apache.hadoop.fs.Path(root, f"offsets/{max(done)}"))
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return checkpoint_offsets(str(text), topic, f"{self.checkpoint}/offsets/{max(done)}")


def checkpoint_offsets(text: str, topic: str, name: str) -> dict[int, int]:
    """``topic``'s offsets in the text of a Structured Streaming checkpoint's ``offsets/<batch>``
    file (Spark's own layout, pinned by tests/unit/test_spark_checkpoint.py and read for real by
    tests/integration/test_verify_delta.py): "v1", the batch's metadata, then one line per source
    of the query, ``{topic: {partition: offset}}``. ``PermanentError`` naming ``name`` otherwise."""
    lines = text.splitlines()
    if not lines or lines[0] != "v1":
        raise PermanentError(f"{name}: not a Structured Streaming offsets file of version v1 "
                             f"(first line {lines[0][:40] if lines else 'missing'!r})")
    out: dict[int, int] = {}
    for number, line in enumerate(lines[2:], start=3):
        if not line.startswith("{"):
            continue
        try:
            found = json.loads(line).get(topic, {})
            out.update({int(p): int(o) for p, o in found.items()})
        except (ValueError, AttributeError, TypeError) as err:
            raise PermanentError(f"{name}, line {number}: not a source's offsets ({err}): {line[:80]!r}") from err
    return out


def _comparable(column: Column, field: T.StructField) -> Column:
    """A column as both sides are compared: a VARIANT as its JSON text (Python has no equality
    for Spark's variant values)."""
    return F.to_json(column).alias(field.name) if isinstance(field.dataType, T.VariantType) else column.alias(field.name)


def _literal(value: Any, kind: T.DataType) -> Column:
    return F.lit(value).cast(kind)


def _range(field: T.StructField, low: Any, high: Any, low_open: bool) -> Column | None:
    """A filter keeping at least the rows whose ``field`` lies between ``low`` and ``high`` in
    ``key_order`` (``low`` excluded when ``low_open``; None: unbounded); None: nothing narrows it."""
    column, kind = F.col(quote(field.name)), field.dataType
    conditions = []
    if isinstance(kind, _NUMBERS):  # Spark orders numbers by value, as key_order does
        if low is not None:
            conditions.append(column > _literal(low, kind) if low_open else column >= _literal(low, kind))
        if high is not None:
            conditions.append(column <= _literal(high, kind))
    elif isinstance(kind, T.StringType):
        # Text that reads as a finite number comes first in key_order, by value; other text after
        # it, by code point, as Spark compares text. Such a number starts with a digit, a sign, a
        # dot or a space, never with a letter.
        maybe_number = ~column.rlike(r"^\p{L}")
        if low is not None and key_order((low,))[0][0] == 2:
            conditions.append(column > F.lit(str(low)) if low_open else column >= F.lit(str(low)))
        if high is not None:
            below = maybe_number
            if key_order((high,))[0][0] == 2:
                below = below | (column <= F.lit(str(high)))
            conditions.append(below)
    if not conditions:
        return None
    out = conditions[0]
    for condition in conditions[1:]:
        out = out & condition
    return out
