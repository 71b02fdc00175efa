"""The plugin API: what a source or sink plugin is written against, and all it may import of the
framework (with the leaf modules ``cdc.events``, ``cdc.positions``, ``cdc.errors``,
``cdc.sink_event``, ``cdc.headers``, ``cdc.topics``, ``cdc.servers`` and ``cdc.units``). It depends on nothing else of the
framework: what a plugin needs from the runtime comes through the context it is handed
(tests/unit/test_layers.py checks both). docs/plugins.md is the guide.

Plugins are found through entry points: ``cdc.sources`` and ``cdc.sinks`` map a ``type`` name to a
class. A plugin is built from its config and its saved position alone; nothing else is hidden in
its constructor.

    config.py        the config bases (PluginConfig, SourceConfig, SinkConfig), field helpers, and
                     ShapeCheckedConfig (settings checked against the captured shapes)
    source.py        Source, SourceContext (the runtime's services for a source), TableBook
    sink.py          Sink, SelfDrivenSink
    context.py       SinkContext (the runtime's services for a sink), its standalone form
    capabilities.py  what a plugin may do beyond the base contract, asked for by type
    digest.py        chunk digests computed in the databases, for ``cdc verify`` (its own import)
    stats.py         ConnectorStats, the counters a plugin reports through
    renames.py       renames chained across a table's shapes

Re-exported from the leaves: the framework's own topics and the rule that tells them from a
table's (cdc/topics.py), and ``VERSION_HEADER``, the record header that carries each record's
version, a tombstone's too (cdc/headers.py), for a sink that reads Kafka itself.

Errors (``cdc.errors``): ``err.retriable`` tells the runtime whether to back off and try again or
to stop the connector with the message. ``servers`` (cdc/servers) classifies a driver error by its
code (SQLSTATE, errno) into that tree, with a message naming the setting or grant to change:
``servers.postgres.wrap(err, what, setting=servers.setting_of("sink", name, "url"))``.
"""

from __future__ import annotations

import cdc.servers.mysql  # noqa: F401 - servers.mysql and servers.postgres, for plugins
import cdc.servers.postgres  # noqa: F401
from cdc import servers
from cdc.api.capabilities import (
                                  BulkLoadableSink,
                                  DescribedSink,
                                  IncrementalSnapshotSource,
                                  MaintainedSink,
                                  PipelinedSink,
                                  ReadableSink,
                                  RebuildableSink,
                                  SelfRebuildingSink,
                                  SharedSink,
                                  SlotDrop,
                                  SlotListing,
                                  SlotOwningSource,
                                  SourceRead,
                                  StoredRow,
                                  TableReader,
                                  VerifiableSource,
                                  WriteCompletion,
                                  captured_table,
                                  in_range,
                                  key_order,
                                  page,
)
from cdc.api.config import (
                                  CapturedShape,
                                  CapturedShapes,
                                  ConfigPath,
                                  FieldPath,
                                  PluginConfig,
                                  RetryFailed,
                                  ShapeCheckedConfig,
                                  SinkConfig,
                                  SnapshotMode,
                                  SourceConfig,
                                  resolve_config_path,
                                  template_fields,
)
from cdc.api.context import (
                                  CheckpointFeed,
                                  ConnectorLogger,
                                  DeadLetterWriter,
                                  LogClient,
                                  NativeCodecs,
                                  SchemaLookup,
                                  SinkContext,
                                  StandaloneSinkContext,
                                  standalone_sink_context,
)
from cdc.api.renames import earlier_names, renames_to_follow
from cdc.api.sink import SelfDrivenSink, Sink
from cdc.api.source import Source, SourceContext, StandaloneSourceContext, TableBook
from cdc.api.stats import ConnectorStats
from cdc.errors import (
                                  CdcError,
                                  ConfigError,
                                  PermanentError,
                                  RebuildRequired,
                                  RetriableError,
                                  SchemaChangeError,
                                  ShapeMissingError,
                                  ShapeNotYetPublished,
)
from cdc.events import Batch, Op
from cdc.headers import VERSION as VERSION_HEADER
from cdc.positions import Position
from cdc.sink_event import SinkEvent, WindowPart
from cdc.topics import INTERNAL_TOPICS_LOOKAHEAD, dead_letter_topic, internal_topic, schema_changes_topic, table_topics
from cdc.units import human_bytes

__all__ = [
    # config
    "ConfigPath", "PluginConfig", "RetryFailed", "SinkConfig", "SnapshotMode", "SourceConfig",
    "resolve_config_path", "template_fields", "ShapeCheckedConfig", "CapturedShapes", "CapturedShape", "FieldPath",
    # sources
    "Source", "SourceContext", "StandaloneSourceContext", "TableBook", "Batch", "Position",
    "IncrementalSnapshotSource", "SlotOwningSource", "SlotListing", "SlotDrop",
    "VerifiableSource", "TableReader", "SourceRead", "captured_table",
    # sinks
    "Sink", "SelfDrivenSink", "SinkContext", "StandaloneSinkContext", "standalone_sink_context", "SinkEvent", "Op",
    "WindowPart", "RebuildableSink", "BulkLoadableSink", "PipelinedSink", "WriteCompletion", "MaintainedSink",
    "DescribedSink", "ReadableSink", "SelfRebuildingSink", "SharedSink", "StoredRow", "key_order", "page", "in_range",
    # services and their types
    "CheckpointFeed", "ConnectorLogger", "ConnectorStats", "DeadLetterWriter", "LogClient", "NativeCodecs",
    "SchemaLookup",
    # topics, headers, renames, sizes
    "INTERNAL_TOPICS_LOOKAHEAD", "dead_letter_topic", "internal_topic", "schema_changes_topic", "table_topics",
    "VERSION_HEADER",
    "earlier_names", "renames_to_follow", "human_bytes",
    # errors
    "CdcError", "ConfigError", "PermanentError", "RebuildRequired", "RetriableError", "SchemaChangeError",
    "ShapeMissingError", "ShapeNotYetPublished", "servers",
]
