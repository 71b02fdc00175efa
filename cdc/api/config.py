"""The config bases every plugin's pydantic model derives from, and helpers for their fields.

A config file's ``sources:`` and ``sinks:`` entries are validated against the model a plugin
names (``Source.config_model``, ``Sink.config_model``), a subclass of ``SourceConfig`` or
``SinkConfig``: unknown keys are errors, and the fields here mean the same for every plugin
(the runtime reads them: batch sizes, dead letters, restarts after a failure).

A config whose meaning depends on the captured tables' columns (a document sink's joins) also
derives from ``ShapeCheckedConfig``: ``cdc validate`` hands it the newest captured shape of every
table (``CapturedShapes``) and reports what it answers at the file's lines.
"""

from __future__ import annotations

import string
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from cdc.events import Column


def template_fields(template: str, allowed: Iterable[str]) -> list[str]:
    """The placeholders of a name template (``"{schema}.{table}"``) in order, for a config
    validator; ``ValueError`` if it does not parse, or names one outside ``allowed``."""
    allowed = list(allowed)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"not a valid template: {err}") from None
    fields = [name for _, name, _, _ in parsed if name is not None]
    unknown = set(fields) - set(allowed)
    if unknown or "" in fields:
        raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; use "
                         + ", ".join(f"{{{name}}}" for name in allowed))
    return fields


def resolve_config_path(path: str | Path, info: ValidationInfo) -> Path:
    """A relative path in a config file is relative to that file's directory, never to the
    directory the daemon happens to be started from. The loader passes the directory as
    ``context={"base_dir": ...}``; without one (a config built in code) the path stays as written."""
    resolved = Path(path).expanduser()
    base_dir = (info.context or {}).get("base_dir")
    if base_dir is not None and not resolved.is_absolute():
        resolved = Path(base_dir) / resolved
    return resolved.resolve() if resolved.is_absolute() else resolved


# The type of every local path field of a config model (plugins' too): resolved as above.
ConfigPath = Annotated[Path, AfterValidator(resolve_config_path)]


class SnapshotMode(StrEnum):
    INITIAL = "initial"            # snapshot when there is no stored position, then stream
    INITIAL_ONLY = "initial_only"  # snapshot, then stop
    NEVER = "never"                # stream from the current log position, no snapshot
    ALWAYS = "always"              # snapshot at every start, then stream
    WHEN_NEEDED = "when_needed"    # snapshot when there is no usable position (none, or purged)


class RetryFailed(BaseModel):
    """How the daemon starts a connector again after a permanent error (one that no retry of the
    same call helps, but that can heal outside: a grant given, a database created, a lock freed,
    the config file corrected). Retriable errors are retried anyway, without limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=5, ge=0, description="starts after a permanent failure before the "
                                                           "connector stays failed (0: never restart it)")
    backoff: float = Field(default=30.0, gt=0, description="seconds before the first new start; doubles")
    backoff_max: float = Field(default=600.0, gt=0, description="longest wait between two starts")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before start number ``attempt`` (from 1) after a permanent failure."""
        return min(self.backoff * 2 ** (attempt - 1), self.backoff_max)


_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class VerifySchedule(BaseModel):
    """``cdc verify`` of a sink's store run by the daemon in the background (``verify:`` on a
    sink): every ``every`` (seconds, or text such as ``90s``, ``15m``, ``6h``, ``1d``), at most
    ``rows_per_s`` source rows a second. A mismatch is reported (log, ``/metrics``), never stops
    the pipeline."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: float = Field(gt=0, description="seconds between the starts of two passes (or 90s, 15m, 6h, 1d)")
    rows_per_s: float | None = Field(default=None, gt=0, description="source rows read a second at most")

    @field_validator("every", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str) and value[-1:] in _SECONDS:
            try:
                return float(value[:-1]) * _SECONDS[value[-1]]
            except ValueError:
                raise ValueError(f"{value!r} is not a duration (a number of seconds, or 90s, 15m, 6h, 1d)") from None
        return value


class PluginConfig(BaseModel):
    """Base of every plugin config: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="unique name of this connector")
    type: str
    unhealthy_after: float = Field(
        default=60.0, gt=0, description="seconds without progress (blocked, or retrying) after which "
                                        "/healthz answers 503; progress clears it")
    retry_failed: RetryFailed = Field(default_factory=RetryFailed,
                                      description="starting the connector again after a permanent error")


class SourceConfig(PluginConfig):
    tables: list[str] = Field(default_factory=lambda: ["*"],
                              description="tables to capture, as schema.table globs")
    snapshot: SnapshotMode = SnapshotMode.INITIAL
    max_batch_events: int = Field(default=4096, ge=1, description="events per batch at most")


class SinkConfig(PluginConfig):
    topics: list[str] = Field(min_length=1, description="topics to consume, as globs")
    verify: VerifySchedule | None = Field(default=None, description="run `cdc verify` of this sink's store in "
                                                                    "the background (a sink that can read it back)")
    batch_size: int = Field(default=2000, ge=1, description="events per write at most")
    batch_wait_ms: int = Field(default=200, ge=0, description="how long to gather a batch")
    on_poison: Literal["dead_letter", "stop"] = Field(
        default="dead_letter", description="a record that fails even alone: set aside, or stop the sink")
    dead_letter_topic: str | None = Field(default=None, description="default: <prefix>.dead-letter.<name>")
    dead_letter_retention_hours: float | None = Field(
        default=720.0, gt=0, description="how long the dead-letter topic keeps each letter (null: for ever); "
                                         "the topic is not compacted, so every letter stays until then")
    schema_wait: float = Field(
        default=300.0, gt=0, description="seconds to wait for a schema version that rows name and the "
                                         "schema topic does not hold; then the sink stops at that row")
    scale_out: Literal["single", "group"] = Field(
        default="single", description="single: one process reads every partition of the topics; group: "
                                      "every process running this sink joins one Kafka consumer group and "
                                      "the partitions are shared among them (Kafka only; no rebuilds)")
    bulk_window_mb: int = Field(
        default=512, ge=1, description="a rebuild or bootstrap of a sink that bulk-loads (BulkLoadableSink) "
                                       "reduces the history to the newest version per key in memory, in "
                                       "windows of at most this many MiB (keys, newest rows, the window's "
                                       "tables; about 200 MiB per million keys of 100-byte rows); a history "
                                       "with more takes several windows, each loaded before the next is read")


# A place in a plugin's config, relative to it: ("documents", 0, "children", 1, "foreign_key").
FieldPath = tuple[str | int, ...]


@dataclass(frozen=True)
class CapturedShape:
    """A table's newest shape as its source published it: ``source`` (the source's name),
    ``table`` (``schema.table``, MySQL ``db.table``), its ``columns`` in the table's order (``key``
    marks the record key's columns), and the shape's ``version`` (None for a shape from before
    shapes had versions)."""

    source: str | None
    table: str
    columns: tuple[Column, ...]
    version: int | None = None

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> CapturedShape:
        """The shape a ``<prefix>.schema-changes`` record's value (``SinkContext.schema_for``) holds."""
        return cls(record.get("source"), f"{record.get('schema') or record.get('db')}.{record['table']}",
                   tuple(Column(c["name"], c["type"], bool(c.get("key")), c.get("nullable", True), c.get("default"),
                                c.get("renamed_from")) for c in record.get("columns") or []),
                   record.get("version"))

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)

    @property
    def key(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.key)


@dataclass(frozen=True)
class CapturedShapes:
    """The newest shape of every table captured under a log's topic ``prefix``, by topic."""

    prefix: str
    by_topic: Mapping[str, CapturedShape]

    def topic_of(self, table: str) -> str:
        return f"{self.prefix}.{table}"

    def of(self, table: str) -> CapturedShape | None:
        """The shape of ``table`` (``schema.table``), or None when none was published yet."""
        return self.by_topic.get(self.topic_of(table))


class ShapeCheckedConfig(ABC):
    """A capability of a plugin's config model (named among its bases): settings that can only be
    checked against the captured tables' columns. ``cdc validate`` (unless ``--offline``) reads the
    newest shape of every table from the log and calls ``check_shapes`` on each config that
    ``needs_shapes()``; each problem is a path inside this config and a message, reported at that
    path's line of the file. Called without a running pipeline, on the caller's thread."""

    def needs_shapes(self) -> bool:
        """False when nothing in this config depends on shapes (the log is then not read for it)."""
        return True

    @abstractmethod
    def check_shapes(self, shapes: CapturedShapes) -> list[tuple[FieldPath, str]]: ...
