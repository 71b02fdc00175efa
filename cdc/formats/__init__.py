"""Wire formats of the log: how change events become record keys and values, and back.

* ``json`` (the default): schemaless JSON envelopes with readable values (``cdc.serde``).
* ``debezium-json``: Kafka Connect JSON with ``schema`` and ``payload`` and Debezium's encodings,
  for Debezium's own consumers (``debezium_json``, types in ``connect_types``).
* ``avro``: the same Connect schemas and values in Avro, Confluent's wire format, schemas in a
  schema registry (``avro``, schemas converted by ``avro_schema``).

A source's runner encodes in the log's format (``make_encoder``); the sink runtime decodes any
format per record (``connect_decode``, called from ``cdc.sink_events``), so a sink reads topics
in any format, even a topic whose format changed midway.
"""

from __future__ import annotations

from collections.abc import Callable

from cdc.formats.connect_types import DebeziumOptions
from cdc.serde import EnvelopeEncoder

FORMATS = ("json", "debezium-json", "avro")


def make_encoder(fmt: str, connector: str, name: str, topic_prefix: str,
                 on_new_topic: Callable[[str], None] | None = None,
                 options: DebeziumOptions | None = None, registry_url: str | None = None) -> EnvelopeEncoder:
    """The encoder of ``fmt`` for one source (``registry_url``: the avro format's schema registry)."""
    if fmt == "json":
        return EnvelopeEncoder(connector, name, topic_prefix, on_new_topic)
    if fmt == "debezium-json":
        from cdc.formats.debezium_json import DebeziumJsonEncoder

        return DebeziumJsonEncoder(connector, name, topic_prefix, on_new_topic, options)
    if fmt == "avro":
        from cdc.formats.avro import AvroEncoder

        return AvroEncoder(connector, name, topic_prefix, on_new_topic, options, registry_url)
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
