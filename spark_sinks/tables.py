"""The tables of one source table: where they live, their bookkeeping, creating and evolving.

``TableTarget`` is what every table format shares; ``DeltaTarget`` (here) and ``IcebergTarget``
(spark_sinks/iceberg.py) are where the formats differ: how a table is named, read, created,
merged into, and replaced. Conditions and assignments are SQL text, which both formats take.

Delta: ``<root>/<schema>/<table>`` holds the rows; ``<root>/_cdc_deletes/<schema>/<table>``
remembers deleted keys with their versions (hard deletes only; a soft-deleted or SCD2-closed row
remembers its own delete). Paths under ``_``-prefixed directories are skipped by Spark's file
listing, so a reader of ``<root>`` never mistakes them for data. Iceberg: the same names in a
catalog's namespaces (``<catalog>.<schema>.<table>``, ``<catalog>._cdc_deletes.<schema>.<table>``).

Table properties carry what the sink must know across restarts, in the table's own log:
``cdc.key`` (the key columns, to notice a key change), ``cdc.mode`` (type1, soft, scd2: a table
is never silently written in another mode), ``cdc.truncated_at`` (the newest truncate's
version: anything older is ignored afterwards) and ``cdc.former_names`` (JSON: a renamed column's
earlier names, newest first, so that rows of a shape before the rename land under the new name).

Renaming a column in Delta needs its column mapping (``delta.columnMapping.mode = name``): the sink
creates its tables with it, and turns it on in a table made without it when the first rename
arrives (a protocol upgrade: readers need Delta reader version 2 or table features).

One writer per table (the sink's query); the driver caches what it read of a table's metadata.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Protocol, cast

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.api import PermanentError
from spark_sinks.evolve import Plan
from spark_sinks.parse import CURRENT, DELETED, KEY, OP, TS, VALID_FROM, VALID_TO, VERSION
from spark_sinks.schemas import TableShape
from spark_sinks.session import conf_within

log = logging.getLogger(__name__)

KEY_PROPERTY, MODE_PROPERTY, TRUNCATED_PROPERTY = "cdc.key", "cdc.mode", "cdc.truncated_at"
FORMER_PROPERTY = "cdc.former_names"
COLUMN_MAPPING = {"delta.columnMapping.mode": "name"}
DELETED_AT = "__cdc_deleted_at"


def bookkeeping(mode: str) -> list[T.StructField]:
    fields = [T.StructField(KEY, T.StringType(), False), T.StructField(VERSION, T.LongType(), True),
              T.StructField(OP, T.StringType(), True), T.StructField(TS, T.LongType(), True)]
    if mode == "soft":
        fields.append(T.StructField(DELETED, T.BooleanType(), True))
    elif mode == "scd2":
        fields += [T.StructField(VALID_FROM, T.LongType(), True), T.StructField(VALID_TO, T.LongType(), True),
                   T.StructField(CURRENT, T.BooleanType(), True)]
    return fields


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def in_source(name: str) -> str:
    """A column of a MERGE's source (alias ``s``), as SQL text."""
    return f"s.{quote(name)}"


def in_target(name: str) -> str:
    """A column of a MERGE's target table (alias ``t``), as SQL text."""
    return f"t.{quote(name)}"


def literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_ref(path: str) -> str:
    return f"delta.{quote(path)}"


def split_topic(topic: str, prefix: str) -> tuple[str, str]:
    """``<prefix>.<schema>.<table>`` -> (schema, table); another name -> ("_", topic)."""
    rest = topic[len(prefix) + 1:] if topic.startswith(prefix + ".") else None
    if rest and "." in rest:
        namespace, table = rest.split(".", 1)
        return namespace, table
    return "_", topic


class TableTarget:
    """One source table's tables, in a table format (the subclasses)."""

    format = ""
    # Delta: a batch's commits carry transaction ids (job.py), so a re-run batch skips them.
    transactions = False

    def __init__(self, topic: str, prefix: str, mode: str, *, area: str = "") -> None:
        namespace, table = split_topic(topic, prefix)
        self.topic, self.mode, self.area = topic, mode, area
        self.namespace, self.table = namespace, table
        self.name = f"{namespace}.{table}"
        self._exists = False
        # True from create() until the first write: a table this job made and has not written
        # yet holds no row (a MERGE into it needs no matched clauses).
        self.empty = False
        # None: not asked yet. Unlike the table's own existence an absent memory is cached too (a
        # table without deletes would ask each batch): this sink is its one writer, and
        # deletes_written() and forget() keep the answer true.
        self._deletes_exist: bool | None = None
        self._properties: dict[str, str] | None = None
        self._schema: T.StructType | None = None
        # A rebuild's staging table: the earlier names the live table knows (see former_names).
        self.inherited_former: dict[str, list[str]] = {}
        # time.monotonic() of the last purge of the delete memory: a purge runs an hour after the
        # job starts and hourly after, not in every restart's first batch.
        self.purged_at = time.monotonic()
        # time.monotonic() of the last maintenance (spark_sinks/maintenance.py): the first runs one
        # interval after the job starts.
        self.maintained_at = time.monotonic()

    # -- what each format says -------------------------------------------------------------------
    @property
    def ref(self) -> str:
        """The rows' table as SQL names it."""
        raise NotImplementedError

    @property
    def deletes_ref(self) -> str:
        """The delete memory's table as SQL names it."""
        raise NotImplementedError

    @property
    def where(self) -> str:
        """Where the table is, for messages."""
        raise NotImplementedError

    def _is_table(self, session: SparkSession, deletes: bool) -> bool:
        raise NotImplementedError

    def frame(self, session: SparkSession, deletes: bool = False) -> DataFrame:
        """The rows (or the delete memory) as a DataFrame."""
        raise NotImplementedError

    def merge_into(self, session: SparkSession, source: DataFrame, on: str) -> MergeBuilder:
        """A MERGE of ``source`` (alias ``s``) into the rows (alias ``t``) on ``on``."""
        raise NotImplementedError

    def delete(self, session: SparkSession, condition: str | None, deletes: bool = False) -> None:
        """Delete the rows (or memory entries) matching ``condition`` (SQL; None: all)."""
        session.sql(f"DELETE FROM {self.deletes_ref if deletes else self.ref}"
                    f"{f' WHERE {condition}' if condition else ''}")

    def update(self, session: SparkSession, condition: str, assignments: dict[str, str]) -> None:
        sets = ", ".join(f"{quote(name)} = {value}" for name, value in assignments.items())
        session.sql(f"UPDATE {self.ref} SET {sets} WHERE {condition}")

    def append_deletes(self, frame: DataFrame, options: dict[str, str]) -> None:
        """Append ``frame`` to the delete memory, creating it if need be."""
        raise NotImplementedError

    def replace(self, session: SparkSession, frame: DataFrame, deletes: bool = False) -> None:
        """Replace every row (or memory entry) by ``frame``'s, in one commit, with its schema;
        the table keeps its properties."""
        raise NotImplementedError

    def drop(self, session: SparkSession) -> None:
        """Remove the table and its delete memory, if there (a rebuild's staging tables)."""
        raise NotImplementedError

    def _create(self, session: SparkSession, struct: T.StructType, properties: dict[str, str]) -> None:
        raise NotImplementedError

    # -- maintenance (spark_sinks/maintenance.py); each returns what it did, in a few words --------
    def compact(self, session: SparkSession, deletes: bool = False) -> str:
        raise NotImplementedError

    def expire(self, session: SparkSession, older_than_ms: int, retain_hours: float, deletes: bool = False) -> str:
        raise NotImplementedError

    def remove_orphans(self, session: SparkSession, older_than_ms: int, retain_hours: float,
                       deletes: bool = False) -> str:
        raise NotImplementedError

    def _before_evolve(self, session: SparkSession, plan: Plan) -> None:
        """What the format needs before ``plan``'s DDL (a Delta table feature)."""

    def _widen(self, session: SparkSession, widen: list[tuple[str, T.DataType]]) -> list[tuple[str, T.DataType]]:
        """Widen columns in place where the format can; returns the others, which are recast."""
        for name, kind in widen:
            session.sql(f"ALTER TABLE {self.ref} ALTER COLUMN {quote(name)} TYPE {kind.simpleString()}")
            log.info("table %s: column %s widened to %s", self.name, name, kind.simpleString())
        return []

    # -- metadata --------------------------------------------------------------------------------
    def exists(self, session: SparkSession) -> bool:
        if not self._exists:
            self._exists = self._is_table(session, False)
        return self._exists

    def deletes_exist(self, session: SparkSession) -> bool:
        if self._deletes_exist is None:
            self._deletes_exist = self._is_table(session, True)
        return self._deletes_exist

    def schema(self, session: SparkSession) -> T.StructType:
        # Cached: reading it loads the table's snapshot and analyses a plan, a second or more per
        # call on a busy driver. This sink is the table's one writer and drops the cache whenever
        # it changes the schema (create, evolve, forget).
        if self._schema is None:
            self._schema = self.frame(session).schema
        return self._schema

    def properties(self, session: SparkSession) -> dict[str, str]:
        if self._properties is None:
            rows = session.sql(f"SHOW TBLPROPERTIES {self.ref}").collect()
            self._properties = {row["key"]: row["value"] for row in rows}
        return self._properties

    def key(self, session: SparkSession) -> tuple[str, ...] | None:
        value = self.properties(session).get(KEY_PROPERTY)
        return tuple(value.split(",")) if value else None

    def truncated_at(self, session: SparkSession) -> int | None:
        if not self.exists(session):
            return None
        value = self.properties(session).get(TRUNCATED_PROPERTY)
        return int(value) if value else None

    def former_names(self, session: SparkSession) -> dict[str, list[str]]:
        """Column -> its earlier names (newest first), of the renames this table followed."""
        if not self.exists(session):
            return {}
        value = self.properties(session).get(FORMER_PROPERTY)
        return json.loads(value) if value else {}

    def set_properties(self, session: SparkSession, properties: dict[str, str]) -> None:
        pairs = ", ".join(f"{literal(k)} = {literal(v)}" for k, v in properties.items())
        session.sql(f"ALTER TABLE {self.ref} SET TBLPROPERTIES ({pairs})")
        if self._properties is not None:
            self._properties.update(properties)

    def forget(self) -> None:
        """Drop what was cached (the tables were replaced)."""
        self._exists = False
        self.empty = False
        self._deletes_exist = None
        self._properties = None
        self._schema = None

    # -- creating and evolving -------------------------------------------------------------------
    def create(self, session: SparkSession, shape: TableShape, properties: dict[str, str]) -> None:
        # The compacted topic may hold rows written before a rename, under an earlier name.
        former = with_renames(self.inherited_former, shape.earlier)
        ours = {KEY_PROPERTY: ",".join(shape.key), MODE_PROPERTY: self.mode,
                **({FORMER_PROPERTY: json.dumps(former)} if former else {})}
        self._create(session, T.StructType([*shape.struct().fields, *bookkeeping(self.mode)]),
                     {**properties, **ours})
        self._exists = True
        self.empty = True
        self._properties = None
        self._schema = None
        log.info("created %s table %s at %s (%s, key %s)", self.format, self.name, self.where, self.mode,
                 ",".join(shape.key))

    def check_mode(self, session: SparkSession) -> None:
        mode = self.properties(session).get(MODE_PROPERTY)
        if mode is not None and mode != self.mode:
            raise PermanentError(f"table {self.name} at {self.where} was written as {mode}, the sink is "
                                 f"configured for {self.mode}: use another path, or delete the table and "
                                 f"the checkpoint to rebuild it")

    def evolve(self, session: SparkSession, plan: Plan) -> None:
        if plan.changes_table:
            self._schema = None
        if plan.rename:
            self.rename(session, plan.rename, plan.passed)
        self._before_evolve(session, plan)
        if plan.add:
            columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in plan.add)
            session.sql(f"ALTER TABLE {self.ref} ADD COLUMNS ({columns})")
            log.info("table %s: added column(s) %s", self.name, ", ".join(f.name for f in plan.add))
        recasts = list(plan.recast)
        if plan.widen:
            recasts += self._widen(session, plan.widen)
        if recasts:
            self.recast(session, recasts)

    def recast(self, session: SparkSession, recasts: list[tuple[str, T.DataType]]) -> None:
        """Cast columns ((name, new type) pairs) to their new type, every value as Spark casts it,
        by rewriting the table: one commit with the new schema (readers see the table as it was
        until then; a crash before it leaves that, and the batch asks again)."""
        frame = self.frame(session)
        wanted = {name.lower(): kind for name, kind in recasts}
        columns = [F.col(quote(f.name)).cast(wanted[f.name.lower()]).alias(f.name) if f.name.lower() in wanted
                   else F.col(quote(f.name)) for f in frame.schema.fields]
        self.replace(session, frame.select(*columns))
        self._schema = None
        log.info("table %s: column(s) %s cast in place, as the source cast them (the table rewritten)", self.name,
                 ", ".join(f"{name} to {kind.simpleString()}" for name, kind in recasts))

    def rename(self, session: SparkSession, renames: list[tuple[str, str]],
               passed: dict[str, tuple[str, ...]] | None = None) -> None:
        """Rename columns in place ((old, new) pairs), their values kept; ``passed``: new name ->
        the names the column had in the shapes between (newest first), which rows of those shapes
        carry. The earlier names are recorded first: a crash in between leaves a rename that the
        replayed batch makes, never a renamed column whose old name is forgotten."""
        former = with_renames(self.former_names(session),
                              [(new, (*(passed or {}).get(new, ()), old)) for old, new in renames])
        self.set_properties(session, {FORMER_PROPERTY: json.dumps(former)})
        self._before_rename(session)
        for old, new in renames:
            session.sql(f"ALTER TABLE {self.ref} RENAME COLUMN {quote(old)} TO {quote(new)}")
            log.info("table %s: column %s renamed to %s (in place, values kept)", self.name, old, new)

    def _before_rename(self, session: SparkSession) -> None:
        """What the format needs before a column is renamed."""

    def deletes_written(self) -> None:
        self._deletes_exist = True  # the first append created the table


class MergeBuilder(Protocol):
    """The clauses of a MERGE, as Delta's ``DeltaMergeBuilder`` takes them (SQL text)."""

    def whenMatchedDelete(self, condition: str | None = None) -> MergeBuilder: ...  # noqa: N802

    def whenMatchedUpdate(self, condition: str | None = None, set: dict[str, str] | None = None) -> MergeBuilder: ...  # noqa: N802, A002

    def whenNotMatchedInsert(self, condition: str | None = None, values: dict[str, str] | None = None) -> MergeBuilder: ...  # noqa: N802

    def execute(self) -> None: ...


class DeltaTarget(TableTarget):
    """Delta tables at ``<root>/[<area>/]<schema>/<table>``, by path."""

    format = "Delta"
    transactions = True

    def __init__(self, root: str, topic: str, prefix: str, mode: str, *, area: str = "") -> None:
        super().__init__(topic, prefix, mode, area=area)
        root = root.rstrip("/")
        self.root = root
        self.path = f"{root}/{area + '/' if area else ''}{self.namespace}/{self.table}"
        self.deletes_path = f"{root}/_cdc_deletes/{area + '/' if area else ''}{self.namespace}/{self.table}"

    @property
    def ref(self) -> str:
        return table_ref(self.path)

    @property
    def deletes_ref(self) -> str:
        return table_ref(self.deletes_path)

    @property
    def where(self) -> str:
        return self.path

    def _is_table(self, session: SparkSession, deletes: bool) -> bool:
        return DeltaTable.isDeltaTable(session, self.deletes_path if deletes else self.path)

    def frame(self, session: SparkSession, deletes: bool = False) -> DataFrame:
        return DeltaTable.forPath(session, self.deletes_path if deletes else self.path).toDF()

    def merge_into(self, session: SparkSession, source: DataFrame, on: str) -> MergeBuilder:
        return DeltaTable.forPath(session, self.path).alias("t").merge(source.alias("s"), on)  # type: ignore[return-value]

    def delete(self, session: SparkSession, condition: str | None, deletes: bool = False) -> None:
        DeltaTable.forPath(session, self.deletes_path if deletes else self.path).delete(condition)

    def update(self, session: SparkSession, condition: str, assignments: dict[str, str]) -> None:
        DeltaTable.forPath(session, self.path).update(condition, cast("dict[str, str | Column]", assignments))

    def append_deletes(self, frame: DataFrame, options: dict[str, str]) -> None:
        frame.write.format("delta").mode("append").options(**options).save(self.deletes_path)

    def replace(self, session: SparkSession, frame: DataFrame, deletes: bool = False) -> None:
        (frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
         .save(self.deletes_path if deletes else self.path))

    def drop(self, session: SparkSession) -> None:
        for path in (self.path, self.deletes_path):
            remove_path(session, path)

    def _create(self, session: SparkSession, struct: T.StructType, properties: dict[str, str]) -> None:
        builder = DeltaTable.createIfNotExists(session).location(self.path).addColumns(struct)
        for name, value in {**COLUMN_MAPPING, **properties}.items():
            builder = builder.property(name, value)
        builder.execute()

    def compact(self, session: SparkSession, deletes: bool = False) -> str:
        found = DeltaTable.forPath(session, self.deletes_path if deletes else self.path).optimize().executeCompaction()
        metrics = found.first()["metrics"]  # type: ignore[index]
        return f"{metrics['numFilesRemoved']} files into {metrics['numFilesAdded']}"

    def expire(self, session: SparkSession, older_than_ms: int, retain_hours: float, deletes: bool = False) -> str:
        """Delta drops log entries older than ``delta.logRetentionDuration`` itself, at its next
        checkpoint (every ten commits): the retention is set on the table, if it differs."""
        want = f"interval {max(1, round(retain_hours * 3600))} seconds"
        wanted = {"delta.logRetentionDuration": want, "delta.deletedFileRetentionDuration": want}
        ref = self.deletes_ref if deletes else self.ref
        have = {row["key"]: row["value"] for row in session.sql(f"SHOW TBLPROPERTIES {ref}").collect()}
        changed = {k: v for k, v in wanted.items() if have.get(k) != v}
        if changed:
            pairs = ", ".join(f"{literal(k)} = {literal(v)}" for k, v in changed.items())
            session.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ({pairs})")
            if not deletes and self._properties is not None:
                self._properties.update(changed)
        return f"log retention {want}"

    def remove_orphans(self, session: SparkSession, older_than_ms: int, retain_hours: float,
                       deletes: bool = False) -> str:
        # VACUUM refuses less than 7 days unless told the reader of older versions is known: the
        # user's retain_hours is that. It lists the table's files in as many Spark tasks as
        # parallelPartitionDiscovery.parallelism says, 10,000 by default: minutes of task overhead
        # for a table of a few hundred files; the session's parallelism lists them in a second.
        tasks = str(max(2, session.sparkContext.defaultParallelism))
        with conf_within(session, {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
                                   "spark.sql.sources.parallelPartitionDiscovery.parallelism": tasks}):
            DeltaTable.forPath(session, self.deletes_path if deletes else self.path).vacuum(retain_hours)
        return f"vacuumed at {retain_hours:g} h"

    def _before_evolve(self, session: SparkSession, plan: Plan) -> None:
        new_types = [f.dataType for f in plan.add] + [kind for _, kind in plan.widen]
        if any(isinstance(kind, T.TimestampNTZType) for kind in new_types):
            # A table created with such a column has the feature; one that gains it must ask.
            if self.properties(session).get("delta.feature.timestampNtz") != "supported":
                self.set_properties(session, {"delta.feature.timestampNtz": "supported"})

    def _widen(self, session: SparkSession, widen: list[tuple[str, T.DataType]]) -> list[tuple[str, T.DataType]]:
        """In place (Delta's type widening, a metadata change) only in a table with
        ``delta.enableTypeWidening`` (``table_properties``): readers without that table feature,
        delta-rs among them, cannot read such a table at all. Otherwise the table is rewritten
        with the wider type (``recast``), and stays readable."""
        if self.properties(session).get("delta.enableTypeWidening") != "true":
            return widen
        return super()._widen(session, widen)

    def _before_rename(self, session: SparkSession) -> None:
        if self.properties(session).get("delta.columnMapping.mode", "none") == "none":
            # A table made without column mapping (before the sink made its tables with it, or
            # table_properties turned it off): Delta renames only with it, and upgrades the
            # table's protocol to have it.
            self.set_properties(session, COLUMN_MAPPING)
            log.info("table %s: column mapping turned on (mode name), to rename columns", self.name)


def remove_path(session: SparkSession, path: str) -> None:
    """Delete a directory tree on whatever file system ``path`` names (Hadoop's FileSystem)."""
    # PySpark has no public file system API: Hadoop's is reached through Py4J only.
    jvm = session.sparkContext._jvm  # noqa: SLF001
    assert jvm is not None  # a live session's context has its JVM
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    hadoop_path.getFileSystem(session.sparkContext._jsc.hadoopConfiguration()).delete(hadoop_path, True)  # noqa: SLF001


def with_renames(former: dict[str, list[str]], renamed) -> dict[str, list[str]]:
    """``former`` (column -> earlier names, newest first) after the renames ``renamed`` ((new
    name, its earlier names newest first) pairs): the new name inherits the earlier names of
    each of those."""
    out = {name: list(names) for name, names in former.items()}
    for new, olds in renamed:
        earlier = [n for old in olds for n in (old, *out.pop(old, []))]
        out[new] = [n for n in dict.fromkeys([*earlier, *out.get(new, [])]) if n != new]
    return out
