"""The runtime's side of the plugin API's contexts (cdc/api/context.py, cdc/api/source.py): the
objects a source and a sink are handed by ``attach``, and the services behind them.

``RuntimeSinkContext`` is what the sink runner (and the worker, for a self-driven sink) builds;
``sink_context(name, ...)`` builds one for a tool or test that runs a sink outside the daemon
with the real services (a Kafka log, the schema topic, the registry, the Spark jars).
``RuntimeSourceContext`` carries the source's ``OffsetTableBook``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from cdc import native
from cdc.api import (
    ConnectorLogger,
    ConnectorStats,
    LogClient,
    NativeCodecs,
    SchemaLookup,
    TableBook,
    dead_letter_topic,
    table_topics,
)
from cdc.log.base import Log
from cdc.offsets import CheckpointFeed, OffsetStore

_COPYTEXT = native.load("cdc._copytext")  # rows as JSON bytes (Sink.raw_rows): their COPY text in C
_WINDOW = native.load("cdc._window")  # copy_rows' lines, key dropped and version last (a bulk load's COPY)


def native_codecs() -> NativeCodecs:
    """The compiled helpers this installation has, asked when a context is made: None each where
    no compiler built them or ``cdc.native`` is off (no raw rows and no bulk loads either then)."""
    if not native.enabled():
        return NativeCodecs()
    return NativeCodecs(_COPYTEXT and _COPYTEXT.copy_rows, _COPYTEXT and _COPYTEXT.unknown_names,
                        _WINDOW and _WINDOW.columns_first)


def _no_dead_letter(name: str) -> Callable[..., None]:
    def refuse(topic: str, partition: int, offset: int, reason: str, key=None, value=None) -> None:
        from cdc.errors import PermanentError

        raise PermanentError(f"sink {name}: no dead-letter writer here; the record at "
                             f"{topic}[{partition}]@{offset} fails: {reason}")
    return refuse


@dataclass(frozen=True)
class RuntimeSinkContext:
    """A ``cdc.api.SinkContext`` (see there for what each member means); the runner hands its own
    callables in, the services are the runtime's."""

    name: str
    topic_prefix: str = "cdc"
    stats: ConnectorStats = None  # type: ignore[assignment]  # set from the name
    schema_for: Callable[..., dict | None] = lambda topic, version=None: None
    shapes_between: Callable[[str, int, int], list[dict]] = lambda topic, after, before: []
    delete_retention_ms: Callable[[str], int | None] = lambda topic: None
    dead_letter_topic: str = ""
    dead_letter: Callable[..., None] = None  # type: ignore[assignment]  # set from the name
    log: Log | None = None
    log_config: Any = None
    logger: ConnectorLogger = field(default=None)  # type: ignore[assignment]  # set from the name
    delete_read: Callable[[str, int, int], bool] = lambda topic, partition, offset: False
    native: NativeCodecs = field(default_factory=native_codecs)

    def __post_init__(self) -> None:
        # Defaults that depend on the name: a context built with only a name is a usable one.
        if self.stats is None:
            object.__setattr__(self, "stats", ConnectorStats(self.name, "sink"))
        if not self.dead_letter_topic:
            object.__setattr__(self, "dead_letter_topic", dead_letter_topic(self.topic_prefix, self.name))
        if self.dead_letter is None:
            object.__setattr__(self, "dead_letter", _no_dead_letter(self.name))
        if self.logger is None:
            object.__setattr__(self, "logger", ConnectorLogger(logging.getLogger(f"cdc.sink.{self.name}"),
                                                               self.name, self.stats))

    def topics_matching(self, globs: Iterable[str]) -> list[str]:
        return [] if self.log is None else table_topics(self.log.topics(), globs)

    def checkpoint_feed(self) -> CheckpointFeed | None:
        return None if self.log is None else CheckpointFeed(self.log, self.topic_prefix)

    # -- services for a sink that reads the log itself --------------------------------------------
    def open_kafka_log(self, bootstrap_servers: str, *, producer_config: dict | None = None,
                       consumer_config: dict | None = None) -> Log:
        from cdc.log.kafka import KafkaLog

        return KafkaLog(bootstrap_servers, producer_config=producer_config, consumer_config=consumer_config)

    # The LogClient a sink hands back is one open_kafka_log made: a Log.
    def schema_book(self, log: LogClient, prefix: str) -> SchemaLookup:
        from cdc.runtime.schemas import SchemaBook

        return SchemaBook(cast(Log, log), prefix)

    def ensure_dead_letter_topic(self, log: LogClient, topic: str, retention_hours: float | None) -> None:
        from cdc.runtime.dead_letters import ensure_topic

        ensure_topic(cast(Log, log), topic, None if retention_hours is None else int(retention_hours * 3_600_000))

    def avro_writer_schema(self, registry_url: str, schema_id: int) -> tuple[str, dict]:
        return avro_writer_schema(registry_url, schema_id)

    def spark_jars(self) -> list[str]:
        from cdc.dev.jars import spark_jars

        return spark_jars()


def avro_writer_schema(registry_url: str, schema_id: int) -> tuple[str, dict]:
    """See ``cdc.api.SinkContext``: the Avro JSON text without Avro's logical types (a reader then
    yields the encoded ints and bytes, the forms a Connect JSON payload has), and the Connect
    schema it stands for (the names that say how to convert each field)."""
    import orjson

    from cdc.formats.avro import registry_for, strip_logical_types
    from cdc.formats.avro_schema import to_connect

    avro = registry_for(registry_url).schema(schema_id)
    return orjson.dumps(strip_logical_types(avro)).decode(), to_connect(avro)


def sink_context(name: str, *, log_config: Any = None, topic_prefix: str | None = None,
                 stats: ConnectorStats | None = None) -> RuntimeSinkContext:
    """A context with the runtime's services for a sink run outside the sink runner (a
    self-driven sink under the worker or a launcher, tools, tests): ``log_config`` is the config
    file's ``log`` section the sink finds its topics by."""
    prefix = topic_prefix or getattr(log_config, "topic_prefix", None) or "cdc"
    return RuntimeSinkContext(name, prefix, stats=stats, log_config=log_config)  # type: ignore[arg-type]  # None: made from the name


class OffsetTableBook:
    """Which tables a source's topics are complete for, kept in the offsets topic next to its
    position (``OffsetStore.save_tables``): the ``cdc.api.TableBook`` the runtime hands a source.

    A table added to a source's ``tables:`` while the source was stopped has rows its topic never
    got: the stream only brings changes from now on. The snapshot coordinator records the tables
    its topics are complete for (after a snapshot or a backfill, once the position that ends it
    is stored) and backfills a captured table outside that record (snapshot/coordinator.py). It
    lives here, with the offsets, because a source never reads or writes the log itself. No
    record (the offsets were written before this existed): every table captured now counts as
    complete, and is recorded.

    Threading: the runner's thread (the one that stores offsets)."""

    def __init__(self, offsets: OffsetStore, source: str) -> None:
        self.offsets, self.source = offsets, source

    def load(self) -> frozenset[str] | None:
        return self.offsets.load_tables(self.source)

    def save(self, tables: frozenset[str]) -> None:
        self.offsets.save_tables(self.source, tables)


@dataclass(frozen=True)
class RuntimeSourceContext:
    """A ``cdc.api.SourceContext``."""

    name: str
    stats: ConnectorStats
    table_book: TableBook
    logger: ConnectorLogger = field(default=None)  # type: ignore[assignment]  # set from the name

    def __post_init__(self) -> None:
        if self.logger is None:
            object.__setattr__(self, "logger", ConnectorLogger(logging.getLogger(f"cdc.source.{self.name}"),
                                                               self.name, self.stats))
