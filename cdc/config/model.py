"""The config file's typed model: the log, the sources and sinks, the HTTP address.

Sources and sinks are typed as the plugin API's base configs here; the loader validates each item
against its plugin's own ``config_model`` (chosen by ``type``) and stores that instance, so
``config.sources[0]`` is, say, a ``GeneratorConfig`` with every field of that plugin.

Relative paths (every ``ConfigPath`` field: the embedded log's ``path``, the PostgreSQL source's
``state_dir``, ...) are resolved against the directory of the config file, passed as
``context={"base_dir": ...}`` at validation; without one they stay as written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SerializeAsAny,
    field_validator,
    model_validator,
)

from cdc.api import ConfigPath, SinkConfig, SourceConfig
from cdc.config.address import DEFAULT_HTTP, parse_http_address
from cdc.log.base import TopicSettings

TOPIC_PREFIX = r"^[A-Za-z0-9._-]+$"  # the characters Kafka allows in a topic name
LibrdkafkaValue = str | int | float | bool


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaLogConfig(_Section):
    """Kafka as the log."""

    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port...] of the brokers")
    topic_prefix: str = Field(default="cdc", pattern=TOPIC_PREFIX,
                              description="first part of every topic name: <prefix>.<schema>.<table>")
    partitions: int = Field(default=1, ge=1, description="partitions of each topic created")
    replication_factor: int | None = Field(
        default=None, ge=1, description="replicas of each topic created; unset: the cluster's "
                                        "default.replication.factor")
    min_insync_replicas: int | None = Field(
        default=None, ge=1, description="replicas that must have a record before it counts as written "
                                        "(acks=all); unset: the cluster's min.insync.replicas")
    min_compaction_lag_ms: int = Field(default=0, ge=0)
    delete_retention_ms: int = Field(default=86_400_000, ge=0,
                                      description="how long a tombstone outlives its key")
    topic_config: dict[str, str] = Field(default_factory=dict,
                                         description="more configs for the topics created (segment.ms ...)")
    producer: dict[str, LibrdkafkaValue] = Field(default_factory=dict,
                                                 description="extra librdkafka producer settings")
    consumer: dict[str, LibrdkafkaValue] = Field(default_factory=dict,
                                                 description="extra librdkafka consumer settings")
    request_timeout: float = Field(default=15.0, gt=0, le=300,
                                   description="seconds an admin or metadata request may take before the "
                                               "brokers count as unreachable (and the connector retries)")

    @field_validator("topic_config", mode="before")
    @classmethod
    def _values_as_text(cls, value: Any) -> Any:
        # Kafka topic configs are strings on the wire; YAML reads `segment.ms: 3600000` as an int.
        if isinstance(value, dict):
            return {k: str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, (int, float))
                    else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _insync_within_replicas(self) -> KafkaLogConfig:
        rf, isr = self.replication_factor, self.min_insync_replicas
        if rf is not None and isr is not None and isr > rf:
            raise ValueError(f"min_insync_replicas ({isr}) above replication_factor ({rf}): no write could succeed")
        return self


class EmbeddedLogConfig(_Section):
    """The embedded log: files in a local directory, no broker."""

    path: ConfigPath = Field(default=Path("./cdc-data"), validate_default=True,  # so it is resolved too
                             description="directory of the log, relative to the config file's directory")
    topic_prefix: str = Field(default="cdc", pattern=TOPIC_PREFIX)
    partitions: int = Field(default=1, ge=1)
    delete_retention_ms: int = Field(default=86_400_000, ge=0)
    fsync: bool = Field(default=True, description="fsync each write before acknowledging it")



class DebeziumFormatConfig(_Section):
    """Debezium's type-mode options for ``format: debezium-json`` and ``avro`` (Debezium's defaults)."""

    decimal_handling_mode: Literal["precise", "string", "double"] = Field(
        default="precise", description="numeric/decimal as Connect Decimal bytes, as a string, or as a double")
    time_precision_mode: Literal["adaptive", "adaptive_time_microseconds", "connect"] | None = Field(
        default=None, description="temporal encodings; unset: each connector's default (PostgreSQL adaptive, "
                                  "MySQL adaptive_time_microseconds)")
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = Field(
        default="bytes", description="binary columns as Connect bytes or as strings in this encoding")

    def options(self):
        from cdc.formats.connect_types import DebeziumOptions

        return DebeziumOptions(self.decimal_handling_mode, self.time_precision_mode, self.binary_handling_mode)


class SchemaRegistryConfig(_Section):
    """A schema registry with Confluent's REST API (Confluent's, Apicurio's ``/apis/ccompat/v7``)."""

    url: str = Field(description="base URL, e.g. http://127.0.0.1:8081 or http://host:8080/apis/ccompat/v7",
                     pattern=r"^https?://")


class LogConfig(_Section):
    """Exactly one of ``kafka`` or ``embedded``; neither means the embedded log with its defaults."""

    model_config = ConfigDict(json_schema_extra={"not": {"required": ["kafka", "embedded"]}})

    kafka: KafkaLogConfig | None = None
    embedded: EmbeddedLogConfig | None = None
    format: Literal["json", "debezium-json", "avro"] = Field(
        default="json", description="how sources write records: json (schemaless, readable), debezium-json "
                                    "(Kafka Connect JSON with schemas and Debezium's encodings) or avro (the same "
                                    "schemas and values in Avro, Confluent's wire format, schemas in "
                                    "schema_registry); sinks read all three")
    debezium: DebeziumFormatConfig = Field(default_factory=DebeziumFormatConfig,
                                           description="type modes of the debezium-json and avro formats")
    schema_registry: SchemaRegistryConfig | None = Field(
        default=None, description="the schema registry of the avro format (sources register, sinks read)")

    @model_validator(mode="after")
    def _avro_needs_a_registry(self) -> LogConfig:
        if self.format == "avro" and self.schema_registry is None:
            raise ValueError("format avro needs schema_registry: {url: ...} (a registry with Confluent's API)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _exactly_one(cls, data: Any) -> Any:
        if data is None:
            return {"embedded": {}}
        if not isinstance(data, dict):
            return data
        if "kafka" in data and "embedded" in data:
            raise ValueError("give either kafka or embedded, not both")
        if "kafka" not in data:
            return {**data, "embedded": data.get("embedded") or {}}
        return data

    @property
    def kind(self) -> str:
        return "kafka" if self.kafka is not None else "embedded"

    @property
    def topic_prefix(self) -> str:
        return self.backend.topic_prefix

    @property
    def backend(self) -> KafkaLogConfig | EmbeddedLogConfig:
        return self.kafka if self.kafka is not None else self.embedded or EmbeddedLogConfig()

    def topic_settings(self) -> TopicSettings:
        """How topics the pipeline creates are set up."""
        if self.kafka is not None:
            k = self.kafka
            return TopicSettings(partitions=k.partitions, replication_factor=k.replication_factor,
                                 min_insync_replicas=k.min_insync_replicas,
                                 min_compaction_lag_ms=k.min_compaction_lag_ms,
                                 delete_retention_ms=k.delete_retention_ms, extra=dict(k.topic_config))
        e = self.backend
        return TopicSettings(partitions=e.partitions, delete_retention_ms=e.delete_retention_ms)


class AppConfig(_Section):
    """A whole config file."""

    # Validated (not constructed) when absent, so the embedded log's path gets the file's directory.
    log: LogConfig = Field(default_factory=dict, validate_default=True)
    sources: list[SerializeAsAny[SourceConfig]] = Field(default_factory=list)
    sinks: list[SerializeAsAny[SinkConfig]] = Field(default_factory=list)
    http: str | None = Field(default=DEFAULT_HTTP,
                             description="host:port of the status and metrics server; null for none")
    http_token: SecretStr | None = Field(default=None, description="bearer token that commands to the "
                                         "daemon (restart, pause, ...) must carry; needed off loopback")
    http_token_file: ConfigPath | None = Field(default=None, description="a file holding http_token")

    @field_validator("http")
    @classmethod
    def _check_http(cls, value: str | None) -> str | None:
        if value is not None:
            parse_http_address(value)
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> AppConfig:
        names = [c.name for c in [*self.sources, *self.sinks]]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"source and sink names must be unique: {', '.join(duplicates)}")
        return self

    @model_validator(mode="after")
    def _groups_need_kafka(self) -> AppConfig:
        grouped = [c.name for c in self.sinks if getattr(c, "scale_out", "single") == "group"]
        if grouped and self.log.kind != "kafka":
            raise ValueError(f"sinks {', '.join(grouped)}: scale_out: group shares the topics' partitions through "
                             f"Kafka consumer groups; the embedded log has none (use log.kafka, or scale_out: single)")
        return self

    def token(self) -> str | None:
        """The daemon's command token: ``http_token``, or the contents of ``http_token_file``."""
        if self.http_token is not None:
            return self.http_token.get_secret_value()
        if self.http_token_file is not None:
            try:
                return self.http_token_file.read_text().strip() or None
            except OSError as err:
                from cdc.errors import ConfigError

                raise ConfigError(f"http_token_file: {self.http_token_file}: {err.strerror}") from None
        return None

    def http_address(self) -> tuple[str, int] | None:
        """(host, port) to serve HTTP on, or None when ``http: null``."""
        return parse_http_address(self.http) if self.http is not None else None

    def source(self, name: str) -> SourceConfig:
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(f"no source named {name!r}")

    def sink(self, name: str) -> SinkConfig:
        for sink in self.sinks:
            if sink.name == name:
                return sink
        raise KeyError(f"no sink named {name!r}")
