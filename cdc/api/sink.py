"""The sink side of the plugin API: ``Sink``, and ``SelfDrivenSink`` for a sink that reads the
topics itself.

Lifecycle (Kafka Connect's put/flush/preCommit folded into one call: ``write`` returns only once
the batch is durable, and the runtime commits the consumer offsets right after)::

    sink = SinkClass(config)          # or SinkClass(config, generation): write into that generation
    sink.attach(context)              # the runtime's services (cdc/api/context.py); before start()
    sink.start()                      # connect, create what is missing
    sink.write(events)                # durable when it returns; idempotent (events carry versions)
    sink.stop()                       # release connections; called once, after the last write

Threading: ``start``, ``write``, the capabilities' methods and ``stop`` are called from one
thread, one at a time; a sink needs no locks of its own for them. Only a ``SelfDrivenSink``'s
``stop`` may come from another thread (to end ``run``).

Errors: ``err.retriable`` tells the runtime whether to back off and try again or to stop the
connector with the message. In ``write`` a ``RetriableError`` retries the same batch; any other
error splits the batch to find the poison event; a ``SchemaChangeError`` is never poison (the
table needs a decision), and ``RebuildRequired`` starts a rebuild of a ``RebuildableSink``.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from cdc.api.config import SinkConfig
from cdc.api.context import SinkContext, standalone_sink_context
from cdc.api.stats import ConnectorStats
from cdc.errors import PermanentError, ShapeMissingError, ShapeNotYetPublished
from cdc.sink_event import SinkEvent
from cdc.topics import schema_changes_topic


class Sink(ABC):
    """A derived store kept in sync from topics. See the module docstring and cdc/sink_event.py.

    ``write`` gets events in log order per partition (a key's events are in one partition) and
    must be durable when it returns: the runtime commits the consumer offsets right after. It must
    be idempotent and never regress a key (a replay from offset 0 is always safe). Errors: a
    ``RetriableError`` makes the runtime retry the same batch after a backoff; any other error
    makes it split the batch to find the event that fails alone (a poison event).

    ``generation``: the generation of the store to write into (see ``RebuildableSink``); None:
    whatever generation readers see now. A sink without generations ignores it.
    """

    config_model: ClassVar[type[SinkConfig]]

    # The two answers below are read on the sink: a class attribute gives one for every instance, a
    # property may depend on the config or on what start() found.
    @property
    def bootstrap_by_rebuild(self) -> bool:
        """``cdc bootstrap`` fills a new generation and switches readers to it once it caught up,
        instead of writing into the one readers see (for a ``RebuildableSink`` whose readers must
        never see a partly filled store, e.g. a search index)."""
        return False

    @property
    def raw_rows(self) -> bool:
        """True (read before each batch): the runtime may hand an upsert's ``after`` as the JSON
        bytes of the row object, undecoded, when the record is a plain ``json`` envelope (the
        runtime's decoding: cdc/sink_events.py). A sink that writes rows without looking at most of
        their values (the SQL sink's COPY into PostgreSQL) skips building a dict per row."""
        return False

    @classmethod
    def class_for(cls, config: SinkConfig) -> type[Sink]:
        """The class that keeps ``config``'s store: this one, unless the plugin's config chooses
        between stores of different capabilities (an OpenSearch sink of tables or of joined
        documents). The runtime builds and asks capabilities of what this answers."""
        return cls

    def __init__(self, config: SinkConfig, generation: int | None = None) -> None:
        self.config = config
        self.generation = generation  # None: whatever generation readers see now
        # Until the runtime attaches its own: a context with no log and no schemas, so a sink
        # built alone (tests, tools) works.
        self.context: SinkContext = standalone_sink_context(config.name)

    def attach(self, context: SinkContext) -> None:
        """Take the runtime's services; called once, before ``start``."""
        self.context = context

    @property
    def schema_for(self) -> Callable[..., dict | None]:
        """Shorthand for ``context.schema_for``; assigning it replaces the context's (tools, tests)."""
        return self.context.schema_for

    @schema_for.setter
    def schema_for(self, schema_for: Callable[..., dict | None]) -> None:
        self.context = _ShapesGiven(self.context, schema_for)

    def shape_of(self, event: SinkEvent) -> dict | None:
        """The schema record ``event`` names in ``source.schema_version`` (the topic's newest when
        it names none; None when the source publishes no shapes). Call it with the first event of a
        topic in a write (a write has one shape per topic).

        A named version the schema topic does not hold raises ``ShapeNotYetPublished`` (retriable:
        the runtime retries the batch) until it has been missing for ``config.schema_wait``
        seconds, then ``ShapeMissingError`` naming the event's topic, partition, offset, table and
        the version: the sink stops there and its offset is never committed past the row."""
        version = event.source.get("schema_version") if event.source else None
        try:
            return self.context.schema_for(event.topic, version)
        except ShapeNotYetPublished as err:
            if err.waited < self.config.schema_wait:
                raise
            where = f"{event.topic}[{event.partition}]@{event.offset}"
            table = ".".join(p for p in (event.source.get("db"), event.source.get("schema"),
                                         event.source.get("table")) if p)
            raise ShapeMissingError(
                f"sink {self.config.name}: the row at {where} (table {table}) names schema version "
                f"{version}, which {schema_changes_topic(self.context.topic_prefix)} has not delivered in "
                f"{err.waited:.0f}s (schema_wait); the sink stopped before it and committed nothing past "
                f"it. Check that the capture daemon publishing these rows writes its shapes to that topic "
                f"(the same topic_prefix), then start the sink again", topic=event.topic,
                partition=event.partition, offset=event.offset, table=table, version=version) from err

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def write(self, events: list[SinkEvent]) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...


class SelfDrivenSink(Sink):
    """A sink that consumes the topics itself and owns its position (e.g. a Spark streaming query
    and its checkpoint). The runtime attaches the context and calls ``run``, never ``write``.

    ``run(stop_event, report)`` starts, runs until ``stop_event`` is set (or the sink has nothing
    more to do), stops, and returns; ``report(stats)`` is to be called about once a second.
    ``stop`` may be called from another thread. Errors as for ``write``: a ``RetriableError``
    makes the runtime restart it after a backoff, any other ``CdcError`` stops the connector.
    """

    runs_itself: ClassVar[bool] = True  # the older spelling of isinstance(sink, SelfDrivenSink)
    # The log formats (``log.format``) it decodes itself, past the runtime's decoding; the runtime
    # refuses to start it on a log of another format.
    formats: ClassVar[tuple[str, ...]] = ("json",)

    @abstractmethod
    def run(self, stop_event: threading.Event, *,
            report: Callable[[ConnectorStats], None] | None = None) -> None: ...

    def write(self, events: list[SinkEvent]) -> None:
        raise PermanentError(f"sink {self.config.name} ({self.config.type}) reads its topics itself: "
                             f"run it with run()")


class _ShapesGiven:
    """A context whose shapes a tool or test gives (``sink.schema_for = ...``); the rest is the
    wrapped context's."""

    def __init__(self, context: SinkContext, schema_for: Callable[..., dict | None]) -> None:
        self._context = context
        self.schema_for = schema_for

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)
