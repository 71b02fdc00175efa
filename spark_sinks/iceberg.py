"""Iceberg tables of the Spark sink (``table_format: iceberg``): the same rows, bookkeeping and
semantics as its Delta tables (spark_sinks/tables.py), in an Iceberg catalog.

A source table ``<schema>.<table>`` is ``<catalog>.<schema>.<table>``; its delete memory is
``<catalog>._cdc_deletes.<schema>.<table>`` and a rebuild's staging table
``<catalog>._cdc_rebuild.<schema>.<table>`` (nested namespaces: a catalog's listing of
``<schema>`` shows only the rows' tables). The catalog is Spark's ``SparkCatalog``, registered on
the sink's session under ``iceberg.catalog.name`` (``catalog_settings``): ``hadoop`` (the
tables' metadata in the warehouse directory, the sink's ``path``), ``jdbc`` (the metadata
pointers in a database, PostgreSQL's driver is among the jars) or ``rest``.

Tables are Iceberg format version 2, written merge-on-read by default: a MERGE writes the changed
rows and position deletes instead of rewriting every data file a change touches
(``iceberg.write_mode: copy-on-write`` rewrites them, for tables read far more than written).
Row-level commands are Spark's own (MERGE INTO, UPDATE, DELETE), on the source given as a view.

Exactly-once: Iceberg has no transaction id a MERGE could carry as Delta's commits do, so a batch
that re-runs after a crash writes again; every write is version-guarded (a row changes only for
a newer version, a delete is remembered with its version), so the second write changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_sinks.tables import MergeBuilder, TableTarget, quote

log = logging.getLogger(__name__)

CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
# Properties Iceberg reports that are not table properties one may set.
RESERVED = {"current-snapshot-id", "format", "format-version", "provider", "location", "owner",
            "identifier-fields", "sort-order", "current-schema", "default-partition-spec", "snapshot-count"}


def catalog_settings(name: str, settings: Any, warehouse: str) -> dict[str, str]:
    """The session settings that register the Iceberg catalog ``name`` (``settings``: the sink's
    ``iceberg.catalog`` section; ``warehouse``: the sink's ``path``, unless it names its own)."""
    out = {f"spark.sql.catalog.{name}": CATALOG_CLASS, f"spark.sql.catalog.{name}.type": settings.type,
           f"spark.sql.catalog.{name}.warehouse": settings.warehouse or warehouse}
    if settings.uri:
        out[f"spark.sql.catalog.{name}.uri"] = settings.uri
    out.update({f"spark.sql.catalog.{name}.{k}": v for k, v in settings.properties.items()})
    return out


def table_properties(write_mode: str) -> dict[str, str]:
    """The properties of a table the sink creates, before the user's ``table_properties``."""
    # Every commit writes a new metadata file; without delete-after-commit a hadoop catalog's
    # table kept one per micro-batch for ever (1,000 after 1,000 batches: bench/lake_maintenance.py).
    return {"format-version": "2", "write.merge.mode": write_mode, "write.update.mode": write_mode,
            "write.delete.mode": write_mode, "write.metadata.delete-after-commit.enabled": "true",
            "write.metadata.previous-versions-max": "20"}


class IcebergTarget(TableTarget):
    format = "Iceberg"

    def __init__(self, catalog: str, topic: str, prefix: str, mode: str, *, area: str = "") -> None:
        super().__init__(topic, prefix, mode, area=area)
        self.catalog = catalog
        namespace = ((area,) if area else ()) + (self.namespace,)
        self.namespace_ref = ".".join(quote(p) for p in (catalog, *namespace))
        self.deletes_namespace_ref = ".".join(quote(p) for p in (catalog, "_cdc_deletes", *namespace))
        self._ref = f"{self.namespace_ref}.{quote(self.table)}"
        self._deletes_ref = f"{self.deletes_namespace_ref}.{quote(self.table)}"

    @property
    def ref(self) -> str:
        return self._ref

    @property
    def deletes_ref(self) -> str:
        return self._deletes_ref

    @property
    def where(self) -> str:
        return self._ref.replace("`", "")

    def _is_table(self, session: SparkSession, deletes: bool) -> bool:
        return session.catalog.tableExists(self._deletes_ref if deletes else self._ref)

    def frame(self, session: SparkSession, deletes: bool = False) -> DataFrame:
        return session.table(self._deletes_ref if deletes else self._ref)

    def merge_into(self, session: SparkSession, source: DataFrame, on: str) -> MergeBuilder:
        return SqlMerge(session, self._ref, source, on)

    def append_deletes(self, frame: DataFrame, options: dict[str, str]) -> None:
        if self.deletes_exist(frame.sparkSession):
            frame.writeTo(self._deletes_ref).append()
            return
        frame.sparkSession.sql(f"CREATE NAMESPACE IF NOT EXISTS {self.deletes_namespace_ref}")
        # create, not createOrReplace: a memory that exists after all (a stale answer) must fail
        # the batch, which re-runs, rather than be replaced and forget its deletes.
        (frame.writeTo(self._deletes_ref).using("iceberg").tableProperty("format-version", "2")
         .create())

    def replace(self, session: SparkSession, frame: DataFrame, deletes: bool = False) -> None:
        # REPLACE keeps the table's history and properties; the schema becomes the frame's.
        frame.writeTo(self._deletes_ref if deletes else self._ref).using("iceberg").replace()

    def drop(self, session: SparkSession) -> None:
        for ref in (self._ref, self._deletes_ref):
            session.sql(f"DROP TABLE IF EXISTS {ref} PURGE")

    def _create(self, session: SparkSession, struct: T.StructType, properties: dict[str, str]) -> None:
        if self._is_table(session, False):  # a crash after the create: the batch re-runs
            return
        session.sql(f"CREATE NAMESPACE IF NOT EXISTS {self.namespace_ref}")
        writer = session.createDataFrame([], struct).writeTo(self._ref).using("iceberg")
        for name, value in properties.items():
            writer = writer.tableProperty(name, value)
        writer.create()

    def _widen(self, session: SparkSession, widen: list[tuple[str, T.DataType]]) -> list[tuple[str, T.DataType]]:
        """Iceberg widens a decimal's precision in place when its scale stays; anything else the
        sink widens (a decimal's scale, a date to timestamp_ntz) is a rewrite (``recast``)."""
        schema = {f.name.lower(): f.dataType for f in self.schema(session).fields}

        def same_scale(name: str, kind: T.DataType) -> bool:
            old = schema.get(name.lower())
            return isinstance(kind, T.DecimalType) and isinstance(old, T.DecimalType) and old.scale == kind.scale

        in_place = [(name, kind) for name, kind in widen if same_scale(name, kind)]
        super()._widen(session, in_place)
        return [pair for pair in widen if pair not in in_place]

    # -- maintenance (spark_sinks/maintenance.py), by Iceberg's Spark actions --------------------
    def _actions(self, session: SparkSession, deletes: bool) -> tuple[Any, Any]:
        """(SparkActions, the Iceberg table): the actions API through Py4J, which needs no SQL
        extension in the session (its CALL procedures would)."""
        jvm = session.sparkContext._jvm  # noqa: SLF001 - Iceberg's actions have no Python API
        jspark = session._jsparkSession  # noqa: SLF001
        assert jvm is not None
        table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            jspark, self._deletes_ref if deletes else self._ref)
        return jvm.org.apache.iceberg.spark.actions.SparkActions.get(jspark), table

    def compact(self, session: SparkSession, deletes: bool = False) -> str:
        """Small files bin-packed, and every data file a delete file points at rewritten without
        its deleted rows (the deletes then dangle and are dropped); then the delete files left
        are compacted."""
        actions, table = self._actions(session, deletes)
        done = (actions.rewriteDataFiles(table).option("min-input-files", "2")
                .option("delete-file-threshold", "1").option("remove-dangling-deletes", "true").execute())
        deletes_done = actions.rewritePositionDeletes(table).execute()
        return (f"{done.rewrittenDataFilesCount()} files into {done.addedDataFilesCount()}, "
                f"{done.removedDeleteFilesCount()} delete files dropped, "
                f"{deletes_done.rewrittenDeleteFilesCount()} compacted")

    def expire(self, session: SparkSession, older_than_ms: int, retain_hours: float, deletes: bool = False) -> str:
        actions, table = self._actions(session, deletes)
        done = actions.expireSnapshots(table).expireOlderThan(older_than_ms).retainLast(1).execute()
        return (f"{done.deletedManifestListsCount()} snapshots expired, "
                f"{done.deletedDataFilesCount() + done.deletedPositionDeleteFilesCount()} files deleted")

    def remove_orphans(self, session: SparkSession, older_than_ms: int, retain_hours: float,
                       deletes: bool = False) -> str:
        actions, table = self._actions(session, deletes)
        found = actions.deleteOrphanFiles(table).olderThan(older_than_ms).execute().orphanFileLocations().iterator()
        count = 0
        while found.hasNext():
            found.next()
            count += 1
        return f"{count} orphan files removed"


class SqlMerge:
    """A ``MERGE INTO`` statement built clause by clause, as ``DeltaMergeBuilder`` is (conditions
    and values are SQL text over ``s``, the source, and ``t``, the table)."""

    def __init__(self, session: SparkSession, ref: str, source: DataFrame, on: str) -> None:
        self.session, self.ref, self.source, self.on = session, ref, source, on
        self.clauses: list[str] = []

    @staticmethod
    def _when(kind: str, condition: str | None) -> str:
        return f"WHEN {kind}{f' AND ({condition})' if condition else ''} THEN"

    def whenMatchedDelete(self, condition: str | None = None) -> SqlMerge:  # noqa: N802 - Delta's names
        self.clauses.append(f"{self._when('MATCHED', condition)} DELETE")
        return self

    def whenMatchedUpdate(self, condition: str | None = None, set: dict[str, str] | None = None) -> SqlMerge:  # noqa: N802, A002
        sets = ", ".join(f"{name} = {value}" for name, value in (set or {}).items())
        self.clauses.append(f"{self._when('MATCHED', condition)} UPDATE SET {sets}")
        return self

    def whenNotMatchedInsert(self, condition: str | None = None, values: dict[str, str] | None = None) -> SqlMerge:  # noqa: N802
        values = values or {}
        self.clauses.append(f"{self._when('NOT MATCHED', condition)} INSERT ({', '.join(values)}) "
                            f"VALUES ({', '.join(values.values())})")
        return self

    def execute(self) -> None:
        # session.sql formats its text with str.format: the source is {source}, other braces doubled.
        text = " ".join((f"MERGE INTO {self.ref} t USING", "{source} s", "ON", self.on, *self.clauses))
        body = text.replace("{", "{{").replace("}", "}}").replace("{{source}}", "{source}")
        self.session.sql(body, source=self.source)
