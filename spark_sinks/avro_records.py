"""``avro`` records (Confluent's wire format) decoded with spark-avro, into the Connect JSON path.

A record of the ``avro`` format is byte 0, the writer schema's 4-byte id in the schema registry,
then Avro binary. The driver fetches each writer schema once by its id (``AvroSchemas``, through
``cdc.api.avro_writer_schema``) without Avro's logical types, so spark-avro's ``from_avro``
yields the values as encoded: a Decimal's unscaled bytes, a date's days, a MicroTimestamp's long.
Those are the forms a ``debezium-json`` payload carries (bytes as base64 there, which Spark's
``to_json`` writes for binary), so a decoded row is printed back as Connect JSON text and read by
the same readers as ``debezium-json`` rows (``connect_json.py``), with the Connect schema the Avro
schema stands for (``cdc.formats.avro_schema.to_connect``): the conversions live in one place.
The printing costs a second parse of the surviving rows; measured in docs/wire-formats.md.

A batch may hold records of several schema ids (a table's schema evolves with it; keys and
values have their own): each known id decodes with its own schema, chosen per record. An id
new to the job makes ``parse.envelopes`` mark its records ``unknown_avro``; the job fetches the
schemas and parses the batch again (once per new schema, as for a new Connect schema).

Schema ids double as the rows' ``codec`` (``ConnectCodecs``): a registry's ids are small
integers, the Connect codecs 64-bit hashes of a schema's text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc.api import ConfigError
from spark_sinks.connect_json import ConnectCodecs

log = logging.getLogger(__name__)

HEADER = 5  # byte 0 and the 4-byte big-endian schema id
# A record spark-avro cannot read with its schema comes out NULL (not a failed batch): poison.
PERMISSIVE = {"mode": "PERMISSIVE"}
# The row's null fields are printed too, so a column of all-null values is still named.
TO_JSON = {"ignoreNullFields": "false"}
ENVELOPE_FIELDS = ("before", "after", "op", "source")
SOURCE_FIELDS = ("cdc_version", "ts_ms")


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """One registry id: its Avro JSON (logical types stripped) and whether it is a change envelope
    (else a key's record, or a record of someone else's that is not ours to read)."""

    text: str
    envelope: bool
    shaped: bool   # an envelope whose source names the shape (cdc_schema_version)
    timed: bool    # an envelope with its own ts_ms


def framed(part: Column) -> Column:
    """True for a Confluent-framed record part (no JSON text begins with byte 0)."""
    return F.coalesce((F.length(part) >= HEADER) & (F.hex(F.substring(part, 1, 1)) == F.lit("00")), F.lit(False))


def schema_id(part: Column) -> Column:
    """The registry id of a framed part (NULL for any other)."""
    return F.when(framed(part), F.conv(F.hex(F.substring(part, 2, 4)), 16, 10).cast("long"))


def body(part: Column) -> Column:
    return F.substring(part, HEADER + 1, 1 << 30)


class AvroSchemas:
    """Registry id -> ``WriterSchema``, the Connect schema of each learnt into ``codecs``. Touched
    only from the job's ``foreachBatch`` thread."""

    def __init__(self, registry_url: str | None, codecs: ConnectCodecs,
                 fetch: Callable[[str, int], tuple[str, dict]]) -> None:
        self.registry_url = registry_url
        self.codecs = codecs
        self._fetch = fetch
        self._schemas: dict[int, WriterSchema] = {}

    def known(self) -> dict[int, WriterSchema]:
        # ConnectCodecs forgets all its schemas past its limit: such an id is learnt again.
        return {i: s for i, s in self._schemas.items() if i in self.codecs}

    def learn(self, sink: str, ids: set[int]) -> None:
        """Fetch the writer schemas of ``ids`` from the registry (``CdcError`` if it cannot)."""
        if not self.registry_url:
            raise ConfigError(f"sink {sink} (delta) read avro records (schema ids {sorted(ids)}) but no schema "
                              f"registry is configured: set log.schema_registry.url")
        fetch = self._fetch
        for found in sorted(ids):
            text, connect = fetch(self.registry_url, found)
            fields = {f.get("field"): f for f in connect.get("fields") or []}
            envelope = all(name in fields for name in ENVELOPE_FIELDS)
            source = {f.get("field") for f in (fields.get("source") or {}).get("fields") or []}
            envelope = envelope and all(name in source for name in SOURCE_FIELDS)
            if envelope:
                self.codecs.learn_value_schema(found, connect)
            else:
                self.codecs.learn_key_schema(found, connect)
            self._schemas[found] = WriterSchema(text, envelope, "cdc_schema_version" in source, "ts_ms" in fields)
        log.info("schema registry: %d avro writer schema(s) read (ids %s)", len(ids), sorted(ids))


def decoded(part: Column, ids: dict[int, WriterSchema], envelope: bool) -> list[tuple[int, Column]]:
    """(id, the part decoded with that id's schema, NULL for another id) per known id of the kind."""
    from pyspark.sql.avro.functions import from_avro

    sid = schema_id(part)
    return [(i, F.when(sid == F.lit(i), from_avro(body(part), s.text, PERMISSIVE)))
            for i, s in sorted(ids.items()) if s.envelope == envelope]


def payload(record: Column, schema: WriterSchema) -> Column:
    """A decoded envelope as ``connect_json.PAYLOAD``: rows as Connect JSON text."""
    source = record.getField("source")
    shape = source.getField("cdc_schema_version") if schema.shaped else F.lit(None).cast("long")
    return F.when(record.isNotNull(), F.struct(
        F.to_json(record.getField("before"), TO_JSON).alias("before"),
        F.to_json(record.getField("after"), TO_JSON).alias("after"),
        record.getField("op").alias("op"),
        (record.getField("ts_ms") if schema.timed else F.lit(None)).cast("long").alias("ts_ms"),
        F.struct(source.getField("cdc_version").cast("long").alias("cdc_version"),
                 source.getField("ts_ms").cast("long").alias("ts_ms"),
                 shape.cast("long").alias("cdc_schema_version")).alias("source")))


def key_text(record: Column) -> Column:
    """A decoded key as Connect JSON payload text."""
    return F.to_json(record, TO_JSON)


def require_spark_avro(session, sink: str) -> None:
    """``ConfigError`` naming the jar when spark-avro is not on the session's classpath."""
    jvm = session.sparkContext._jvm  # noqa: SLF001 - the JVM's class loader is reached through Py4J only
    try:
        jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(
            "org.apache.spark.sql.avro.AvroDataToCatalyst")
    except Exception as err:  # noqa: BLE001 - Py4J wraps ClassNotFoundException
        raise ConfigError(f"sink {sink} (delta) reads avro records with spark-avro, which this Spark session "
                          f"lacks: add org.apache.spark:spark-avro_2.13 of the session's Spark version to its "
                          f"jars (the jars `cdc dev up` resolves include it)") from err
