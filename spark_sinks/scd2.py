"""SCD type 2: one row per version of a key, valid from its version until the next change.

Each row holds the data of one version and ``__cdc_valid_from`` (its version), ``__cdc_valid_to``
(the version of the key's next change, a delete included; NULL while current) and
``__cdc_current``. A delete closes the key's current row and adds none; a later insert opens a
new one. Versions are the source's (PostgreSQL LSNs, MySQL binlog positions); ``__cdc_ts_ms``
holds each version's commit time.

Per micro-batch and table, every record of the batch is kept (not only a key's newest), minus
exact duplicates (same key and version) and records no newer than what the table already holds
for the key (its newest ``valid_from`` or ``valid_to``): history is appended, never rewritten,
so a late record older than the key's history is dropped, as type 1 drops it. One MERGE then
closes each key's current row at the batch's first version of it and inserts the new versions,
each closed at the next one (the usual "merge key" union: close rows join on the key, new rows
carry a NULL merge key and never match).

A tombstone alone (its delete compacted away) closes the current row at its version, its delete's
(its header); one from before headers, with ``valid_to`` left NULL: the key is gone, when is unknown. A truncate at V closes every current row older than V at V.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_sinks.parse import CURRENT, KEY, OP, TS, VALID_FROM, VALID_TO, VERSION
from spark_sinks.tables import TRUNCATED_PROPERTY, TableTarget, in_source, in_target, quote

MERGE_KEY, CLOSE_AT = "__merge_key", "__close_at"


def newer_than_history(session: SparkSession, target: TableTarget, changes: DataFrame) -> DataFrame:
    """``changes`` (versioned records and tombstones) without duplicates and without records
    no newer than the key's history in the table."""
    versioned = changes.where(F.col("version").isNotNull()).dropDuplicates([KEY, "version"])
    tombstones = (changes.where(F.col("version").isNull()).select(KEY).distinct()
                  .join(versioned.select(KEY), KEY, "left_anti")
                  .select(KEY, F.lit("d").alias("op"), F.lit(None).cast("long").alias("version"),
                          F.lit(None).cast("long").alias("ts_ms"), F.lit(None).cast("string").alias("data"),
                          F.lit(None).cast("long").alias("codec")))
    history = (target.frame(session)
               .join(versioned.select(KEY).distinct(), KEY, "left_semi")
               .groupBy(KEY).agg(F.max(F.greatest(VALID_FROM, F.coalesce(VALID_TO, VALID_FROM))).alias("__seen")))
    fresh = (versioned.join(history, KEY, "left")
             .where(F.col("__seen").isNull() | (F.col("version") > F.col("__seen")))
             .select(KEY, F.coalesce("op", F.lit("d")).alias("op"), "version", "ts_ms", "data", "codec"))
    return fresh.unionByName(tombstones)


def merge(session: SparkSession, target: TableTarget, rows: DataFrame, data_columns: list[str]) -> None:
    """``rows``: the fresh records (__cdc_key, __cdc_op, __cdc_version, __cdc_ts_ms and the data
    columns, parsed)."""
    by_key = Window.partitionBy(KEY).orderBy(F.col(VERSION).asc_nulls_first())
    ordered = (rows.withColumn("__next", F.lead(VERSION).over(by_key))
               .withColumn("__first", F.row_number().over(by_key) == 1))
    new_rows = ordered.where(F.col(OP) != "d").select(
        F.lit(None).cast("string").alias(MERGE_KEY), F.lit(None).cast("long").alias(CLOSE_AT),
        *[F.col(quote(c)) for c in data_columns], KEY, VERSION, OP, TS, F.col(VERSION).alias(VALID_FROM),
        F.col("__next").alias(VALID_TO), F.col("__next").isNull().alias(CURRENT))
    closers = ordered.where(F.col("__first")).select(
        F.col(KEY).alias(MERGE_KEY), F.col(VERSION).alias(CLOSE_AT),
        *[F.lit(None).cast(rows.schema[c].dataType).alias(c) for c in data_columns], KEY,
        *[F.lit(None).cast(t).alias(c) for c, t in ((VERSION, "long"), (OP, "string"), (TS, "long"),
                                                     (VALID_FROM, "long"), (VALID_TO, "long"))],
        F.lit(None).cast("boolean").alias(CURRENT))
    source = new_rows.unionByName(closers)
    insert = {quote(c): in_source(c) for c in (*data_columns, KEY, VERSION, OP, TS, VALID_FROM, VALID_TO, CURRENT)}
    (target.merge_into(session, source, f"{in_target(KEY)} = {in_source(MERGE_KEY)} AND {in_target(CURRENT)}")
     .whenMatchedUpdate(set={quote(VALID_TO): in_source(CLOSE_AT), quote(CURRENT): "false"})
     .whenNotMatchedInsert(condition=f"{in_source(MERGE_KEY)} IS NULL", values=insert)
     .execute())


def truncate(session: SparkSession, target: TableTarget, version: int) -> None:
    current = target.truncated_at(session)
    if current is None or version > current:
        target.set_properties(session, {TRUNCATED_PROPERTY: str(version)})
    target.update(session, f"{quote(CURRENT)} AND {quote(VALID_FROM)} < {int(version)}",
                  {VALID_TO: str(int(version)), CURRENT: "false"})
