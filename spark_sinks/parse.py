"""Kafka records to change rows: the envelope parsed with an explicit schema, per-key reduction.

Everything here is Spark SQL expressions (no Python UDFs), so executors need only Spark, and the
JSON is tokenized by Spark's own parser. The envelope is parsed once with ``before``/``after``
declared as strings: Spark keeps a nested object's JSON text for a string field, so a row's
columns are parsed later, with the table's own schema, only for the rows that survive the
per-key reduction.
"""

from __future__ import annotations

import re
from typing import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.api import INTERNAL_TOPICS_LOOKAHEAD

# Bookkeeping columns of the tables; every one begins with this prefix.
PREFIX = "__cdc_"
KEY, VERSION, OP, TS = "__cdc_key", "__cdc_version", "__cdc_op", "__cdc_ts_ms"
DELETED = "__cdc_deleted"
VALID_FROM, VALID_TO, CURRENT = "__cdc_valid_from", "__cdc_valid_to", "__cdc_current"

UPSERTS = ("r", "c", "u")
ROW_OPS = ("r", "c", "u", "d")

ENVELOPE = T.StructType([
    T.StructField("before", T.StringType()),
    T.StructField("after", T.StringType()),
    T.StructField("op", T.StringType()),
    T.StructField("ts_ms", T.LongType()),
    T.StructField("source", T.StructType([
        T.StructField("version", T.LongType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("schema_version", T.LongType()),   # the shape the row names (docs/architecture.md)
    ])),
    # Spark's PERMISSIVE parsing puts the text of a record it cannot read (not JSON, or a field of
    # the wrong type) here and leaves the other fields NULL.
    T.StructField("_corrupt_record", T.StringType()),
])


def topic_pattern(globs: Iterable[str]) -> str:
    """The Java regex for Kafka's ``subscribePattern``: any of ``globs`` (fnmatch syntax), never
    the framework's own topics (offsets, schema changes, dead letters)."""
    alternatives = []
    for glob in globs:
        out, i = [], 0
        while i < len(glob):
            ch = glob[i]
            if ch == "*":
                out.append(".*")
            elif ch == "?":
                out.append(".")
            elif ch == "[" and "]" in glob[i + 1:]:
                end = glob.index("]", i + 1)
                body = glob[i + 1:end]
                negate = body.startswith("!")
                body = re.sub(r"([\\\[\]^])", r"\\\1", body[1:] if negate else body)
                out.append(f"[{'^' if negate else ''}{body}]")
                i = end
            else:
                out.append(re.escape(ch) if not ch.isalnum() else ch)
            i += 1
        alternatives.append("".join(out))
    return f"{INTERNAL_TOPICS_LOOKAHEAD}(?:{'|'.join(alternatives)})"


def envelopes(raw: DataFrame) -> DataFrame:
    """Kafka source rows -> one row per record: topic, partition, offset, ``__cdc_key`` (the key's
    JSON), ``op`` (NULL for a tombstone), ``version``, ``ts_ms`` (the source's commit time),
    ``data`` (the row's JSON: after, else before, else the key), ``poison`` (why the record is
    not a change event, or NULL) and ``raw`` (a poison record's value)."""
    # Two projections: the envelope is parsed once, its fields read from the result (Spark does
    # not merge projections that would repeat an expensive expression).
    parsed = raw.select("topic", "partition", "offset", F.col("key").cast("string").alias(KEY),
                        F.col("value").cast("string").alias("value"),
                        F.from_json(F.col("value").cast("string"), ENVELOPE).alias("env"))
    env, value, key = F.col("env"), F.col("value"), F.col(KEY)
    tombstone = value.isNull()
    op = env.getField("op")
    version = env.getField("source").getField("version")
    poison = (F.when(~tombstone & env.getField("_corrupt_record").isNotNull(),
                     F.lit("not JSON, or a field of the wrong type"))
              .when(~tombstone & ~F.coalesce(op.isin(*ROW_OPS, "t"), F.lit(False)), F.lit("no known op"))
              .when(~tombstone & version.isNull(), F.lit("no integer source.version"))
              .when(key.isNull() & (tombstone | (op != "t")), F.lit("no key")))
    return parsed.select(
        "topic", "partition", "offset", KEY, op.alias("op"), version.alias("version"),
        env.getField("source").getField("ts_ms").alias("ts_ms"),
        env.getField("source").getField("schema_version").alias("schema_version"),
        F.coalesce(env.getField("after"), env.getField("before"), key).alias("data"),
        poison.alias("poison"),
        F.when(poison.isNotNull(), value).alias("raw"),   # kept only for the dead-letter topic
    )


def row_changes(rows: DataFrame) -> DataFrame:
    """The records that change rows: upserts, deletes (versioned) and tombstones (op NULL)."""
    return rows.where(F.col("poison").isNull() & (F.col("op").isNull() | F.col("op").isin(*ROW_OPS)))


def latest_per_key(changes: DataFrame) -> DataFrame:
    """One row per key: the record with the highest version (ties: the later offset).

    A tombstone has no version; it says only that the key's latest record is a delete. Any
    versioned record of the key in the batch outranks it (the delete before a tombstone says
    the same, with a version; an insert after one is newer). A key with nothing but tombstones
    keeps one, as a delete of unknown version (op ``d``, version NULL)."""
    order = F.struct(F.col("op").isNotNull().cast("int"), F.coalesce("version", F.lit(-(1 << 63))),
                     F.col("offset"), F.col("partition"))
    payload = F.struct(F.coalesce("op", F.lit("d")).alias("op"), "version", "ts_ms", "data")
    return (changes.groupBy(KEY).agg(F.max_by(payload, order).alias("r"))
            .select(KEY, "r.op", "r.version", "r.ts_ms", "r.data"))


def columns_of(data: Column, struct: T.StructType, casts: dict[str, T.DataType],
               former: dict[str, list[str]] | None = None) -> list[Column]:
    """The table's data columns from the row JSON ``data``: parsed with ``struct`` (the source's
    types), each cast to its column's type where that differs (``casts``). A column with earlier
    names (``former``: column -> names, newest first) takes its value from the first of them
    that a row has when the row lacks the column: a row of a shape before a rename."""
    names = {field.name for field in struct.fields}
    former = {name: [old for old in olds if old not in names]
              for name, olds in (former or {}).items() if name in names}
    extra: dict[str, T.StructField] = {}   # an earlier name, read with its column's type
    for field in struct.fields:
        for old in former.get(field.name, ()):
            extra.setdefault(old, T.StructField(old, field.dataType, True))
    parsed = F.from_json(data, T.StructType([*struct.fields, *extra.values()]))
    out = []
    for field in struct.fields:
        value = parsed.getField(field.name)
        if former.get(field.name):
            value = F.coalesce(value, *(parsed.getField(old) for old in former[field.name]))
        target = casts.get(field.name)
        if target is not None and target != field.dataType:
            value = value.cast(target)
        out.append(value.alias(field.name))
    return out
