"""The ``type: delta`` sink's settings.

::

    sinks:
      - name: lake
        type: delta
        topics: ["cdc.public.*"]
        path: ./lake                      # one Delta table per source table: <path>/<schema>/<table>
        checkpoint: ./lake-checkpoint     # Spark's offsets and commits: the sink's position
        trigger_seconds: 5
        soft_delete: false
        scd2: false
        delete_retention_hours: 168
        json_columns: string              # or variant: json/jsonb as Spark 4's VARIANT
        # kafka: {bootstrap_servers: "broker:9092"}   # default: the log's brokers
        # spark: {master: "local[*]", conf: {spark.sql.shuffle.partitions: "8"}}

``batch_size`` and ``batch_wait_ms`` of the base config do not apply: Spark sizes the batches
(``trigger_seconds``, ``max_offsets_per_trigger``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cdc.api import SinkConfig

# The properties of a Delta table the sink creates, unless table_properties says otherwise.
DELTA_PROPERTIES = {"delta.enableDeletionVectors": "true"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeltaKafkaConfig(_Section):
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port...] of the brokers")
    options: dict[str, str] = Field(
        default_factory=dict,
        description="Kafka consumer settings for Spark's Kafka source, without the 'kafka.' "
                    "prefix (security.protocol, sasl.mechanism ...)")


class SparkSettings(_Section):
    master: str = Field(default="local[*]", description="the Spark master when cdc run starts Spark "
                                                        "itself (spark-submit sets its own)")
    conf: dict[str, str] = Field(default_factory=dict, description="more Spark settings")
    jars: list[str] | None = Field(default=None, description="the Kafka source and Delta jars; default: "
                                                             "the ones `cdc dev up` resolved")
    driver_memory: str = "2g"


class IcebergCatalog(_Section):
    type: Literal["hadoop", "jdbc", "rest"] = Field(
        default="hadoop", description="hadoop: the tables' metadata in the warehouse directory; jdbc: in a "
                                      "database (uri: jdbc:postgresql://...); rest: an Iceberg REST catalog")
    name: str = Field(default="cdc", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                      description="the catalog's name in Spark SQL: tables are <name>.<schema>.<table>")
    uri: str | None = Field(default=None, description="jdbc and rest: where the catalog is")
    warehouse: str | None = Field(default=None, description="where data files go; default: the sink's path")
    properties: dict[str, str] = Field(
        default_factory=dict, description="more catalog properties (jdbc.user, jdbc.password, credential, ...)")

    @model_validator(mode="after")
    def _uri(self) -> IcebergCatalog:
        if self.type != "hadoop" and not self.uri:
            raise ValueError(f"an Iceberg {self.type} catalog needs its uri")
        return self


class IcebergSettings(_Section):
    catalog: IcebergCatalog = Field(default_factory=IcebergCatalog)
    write_mode: Literal["merge-on-read", "copy-on-write"] = Field(
        default="merge-on-read", description="how MERGE, UPDATE and DELETE change a table: merge-on-read "
                                             "writes position deletes beside new rows (cheap writes, reads "
                                             "merge them until compaction); copy-on-write rewrites the "
                                             "data files a change touches")


class MaintenanceSettings(_Section):
    interval_minutes: float = Field(
        default=60, ge=0, description="how often each table is maintained (0: never); the first one "
                                      "interval after the sink starts")
    compact: bool = Field(default=True, description="compact small files (Delta OPTIMIZE; Iceberg "
                                                    "rewrite_data_files, delete files applied)")
    retain_hours: float = Field(
        default=168, gt=0, description="snapshots (Iceberg) and log versions (Delta) older than this are "
                                       "expired, and files older than this that no kept version needs are "
                                       "removed: time travel and readers reach back this far")
    orphan_files: bool = Field(default=True, description="remove unreferenced files (Delta VACUUM; Iceberg "
                                                         "remove_orphan_files)")


class DeltaSinkConfig(SinkConfig):
    type: Literal["delta"] = "delta"
    table_format: Literal["delta", "iceberg"] = Field(
        default="delta", description="delta: Delta tables under path; iceberg: Iceberg tables in the catalog "
                                     "of the iceberg section")
    path: str = Field(description="root of the Delta tables (a directory or a URI: s3a://, abfss://); "
                                  "table <schema>.<table> is <path>/<schema>/<table>. Iceberg: the "
                                  "warehouse, unless iceberg.catalog.warehouse names another")
    iceberg: IcebergSettings = Field(default_factory=IcebergSettings)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    checkpoint: str = Field(description="the streaming query's checkpoint (offsets and batch commits): "
                                        "delete it together with the tables to start over")
    trigger_seconds: float = Field(default=5.0, ge=0, description="seconds between micro-batches "
                                                                  "(0: one right after another)")
    available_now: bool = Field(default=False, description="process what the topics hold now, then stop")
    soft_delete: bool = Field(default=False, description="keep deleted rows, marked __cdc_deleted = true")
    scd2: bool = Field(default=False, description="keep history: one row per version, with "
                                                  "__cdc_valid_from/__cdc_valid_to (SCD type 2)")
    delete_retention_hours: float = Field(
        default=168, gt=0, description="how long a deleted key's version is remembered (hard deletes), so "
                                       "a late older insert cannot bring the row back; keep it above the "
                                       "topics' delete.retention.ms")
    schema_policy: Literal["fail", "evolve", "rebuild"] = Field(
        default="fail", description="a source change of a column's type or key, or a renamed column: fail "
                                    "stops at any (a widening too), evolve widens and renames in place where "
                                    "no value is lost and stops otherwise, rebuild does the same in place or "
                                    "rebuilds the table from the compacted topic")
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest", description="where a new checkpoint starts: earliest builds the tables from "
                                        "the compacted topics (a bootstrap)")
    max_offsets_per_trigger: int | None = Field(default=1_000_000, ge=1,
                                                description="records per micro-batch at most")
    fail_on_data_loss: bool = Field(
        default=False, description="fail when offsets the checkpoint expects are gone; compaction "
                                   "removes offsets by design, so the default is false")
    table_properties: dict[str, str] = Field(
        default_factory=dict,
        description="properties of the tables created; Delta's default turns on deletion vectors (a "
                    "MERGE marks rows instead of rewriting whole files)")
    json_columns: Literal["string", "variant"] = Field(
        default="string", description="the type of json/jsonb columns: string (their JSON text) or "
                                      "variant (Spark 4's VARIANT: semi-structured, queried by path; a "
                                      "table already holding one as string keeps it as string)")
    topic_prefix: str | None = Field(default=None, description="default: the log's topic_prefix")
    kafka: DeltaKafkaConfig | None = Field(default=None, description="default: the log's brokers")
    spark: SparkSettings = Field(default_factory=SparkSettings)

    @field_validator("path", "checkpoint", mode="after")
    @classmethod
    def _resolve(cls, value: str, info: ValidationInfo) -> str:
        """A local relative path is relative to the config file's directory, like the embedded log."""
        if "://" in value:
            return value
        path = Path(value).expanduser()
        base_dir = (info.context or {}).get("base_dir")
        if base_dir is not None and not path.is_absolute():
            path = Path(base_dir) / path
        return str(path.resolve()) if path.is_absolute() else str(path)

    @model_validator(mode="before")
    @classmethod
    def _default_properties(cls, data: Any) -> Any:
        if isinstance(data, dict) and "table_properties" not in data and data.get("table_format", "delta") == "delta":
            return {**data, "table_properties": dict(DELTA_PROPERTIES)}
        return data

    @model_validator(mode="after")
    def _one_delete_mode(self) -> DeltaSinkConfig:
        if self.scd2 and self.soft_delete:
            raise ValueError("scd2 keeps deleted rows as closed history already; do not set soft_delete too")
        if self.table_format == "iceberg" and self.json_columns == "variant":
            raise ValueError("json_columns: variant needs Iceberg format version 3, which the sink does not "
                             "write yet; use json_columns: string with table_format: iceberg")
        return self
