"""The ``avro`` format: Confluent's wire format (byte 0, the schema's 4-byte registry id, Avro
binary) for keys and values, with the schemas in a schema registry that speaks Confluent's API.

The records are those of the ``debezium-json`` format in another encoding: the same Connect
schema per (table, shape), built by ``debezium_json.TableFormat``, converted to Avro as Debezium's
``AvroConverter`` converts it (``avro_schema``), and the same converted row values. Key and value
schemas are registered under ``<topic>-key`` and ``<topic>-value`` (Confluent's TopicNameStrategy)
when a shape is first used: a table's new shape registers a new version of its subjects, which the
registry accepts or refuses by its compatibility setting (``SchemaRegistryError`` names the
subject and the registry's reason; the source then stops before the rows are written).

The registry is asked once per (subject, schema) and once per schema id read back: both ways are
cached for the life of the process, so the hot path never calls it.

Reading (``AvroReader``): the writer's schema by its id, then each field back to the ``json``
format's forms (through ``connect_decode``, as ``debezium-json`` is read), so a sink sees the same
envelope whatever the format.
"""

from __future__ import annotations

import base64
import logging
import struct
import threading
from collections.abc import Callable, Iterable
from io import BytesIO
from typing import Any, cast

import orjson

import cdc.formats.avro_schema as avro_schema
import cdc.formats.connect_decode as connect_decode
from cdc.errors import FormatError, SchemaRegistryError
from cdc.events import ChangeEvent, Column
from cdc.formats.avro_write import compile_encoder
from cdc.formats.connect_decode import apply_converters
from cdc.formats.connect_types import DebeziumOptions
from cdc.formats.debezium_json import DebeziumJsonEncoder, TableFormat

log = logging.getLogger(__name__)

MAGIC = b"\x00"


def _fastavro():
    try:
        import fastavro
    except ImportError as err:  # the [avro] extra
        raise FormatError("the avro format needs fastavro and confluent-kafka's schema registry client: "
                          "pip install 'cdc-framework[avro]'") from err
    return fastavro


class Registry:
    """A Confluent-API schema registry, with both lookups cached. Thread-safe."""

    def __init__(self, url: str) -> None:
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as err:
            raise FormatError("the avro format needs confluent-kafka's schema registry client: "
                              "pip install 'cdc-framework[avro]'") from err
        self.url = url
        self._client = SchemaRegistryClient({"url": url})
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

        try:
            return call()
        except ClientError as err:
            # 409: incompatible, 422: invalid, 404: unknown id/subject: the same call fails again
            raise SchemaRegistryError(f"schema registry {self.url}: {what}: {err}",
                                      retriable=err.http_status_code >= 500 or err.http_status_code < 0) from err
        except Exception as err:  # noqa: BLE001 - the client's transport errors have no common base
            raise SchemaRegistryError(f"schema registry {self.url} unreachable ({what}): {err}",
                                      retriable=True) from err

    def register(self, subject: str, schema: str) -> int:
        """The id of ``schema`` (Avro JSON) under ``subject``, registering it if it is new there."""
        key = (subject, schema)
        found = self._ids.get(key)
        if found is not None:
            return found
        from confluent_kafka.schema_registry import Schema

        schema_id = self._call(f"registering a schema under {subject}",
                               lambda: self._client.register_schema(subject, Schema(schema, "AVRO")))
        with self._lock:
            self._ids[key] = schema_id
        log.info("schema registry: %s has schema id %d", subject, schema_id)
        return schema_id

    def schema(self, schema_id: int) -> Any:
        """The Avro schema (parsed JSON) with registry id ``schema_id``."""
        found = self._schemas.get(schema_id)
        if found is None:
            text = self._call(f"reading schema id {schema_id}", lambda: self._client.get_schema(schema_id)).schema_str
            found = orjson.loads(text)
            with self._lock:
                self._schemas[schema_id] = found
        return found


_REGISTRIES: dict[str, Registry] = {}
_REGISTRIES_LOCK = threading.Lock()


def registry_for(url: str) -> Registry:
    """One client (and cache) per registry URL in the process."""
    with _REGISTRIES_LOCK:
        registry = _REGISTRIES.get(url)
        if registry is None:
            registry = _REGISTRIES[url] = Registry(url)
        return registry


# --- values between the debezium-json forms and Avro's ------------------------------------------

def _b64decode(text: Any) -> Any:
    return base64.b64decode(text) if isinstance(text, str) else text


def _b64encode(data: Any) -> Any:
    return base64.b64encode(data).decode("ascii") if isinstance(data, (bytes, bytearray)) else data


def _bytes_mapper(connect: dict, to_bytes: bool) -> Callable[[Any], Any] | None:
    """Connect JSON carries bytes as base64 text, Avro as bytes: the function that turns one
    field's value from one into the other (``to_bytes``: toward Avro), or None if it has no bytes."""
    kind = connect.get("type")
    if kind == "bytes":
        return _b64decode if to_bytes else _b64encode
    if kind == "array":
        inner = _bytes_mapper(connect.get("items") or {}, to_bytes)
        return None if inner is None else (lambda values: [None if v is None else inner(v) for v in values])
    if kind == "struct":
        mappers = _field_mappers(connect, to_bytes)
        if not mappers:
            return None

        def struct(value: dict) -> dict:
            for name, mapper in mappers:
                item = value.get(name)
                if item is not None:
                    value[name] = mapper(item)
            return value

        return struct
    return None


def _field_mappers(struct: dict, to_bytes: bool) -> list[tuple[str, Callable[[Any], Any]]]:
    out = []
    for field in struct.get("fields") or []:
        mapper = _bytes_mapper(field, to_bytes)
        if mapper is not None:
            out.append((field["field"], mapper))
    return out


# --- writing ------------------------------------------------------------------------------------

class AvroTableFormat(TableFormat):
    """A ``TableFormat`` with its Avro schemas, registered, and their writers."""

    __slots__ = ("key_header", "value_header", "encode_key", "encode_value", "row_mappers", "key_mappers",
                 "truncate_key")

    def __init__(self, topic: str, connector: str, columns: Iterable[Column], key_names: list[str],
                 options: DebeziumOptions, registry: Registry) -> None:
        columns = list(columns)
        super().__init__(topic, connector, columns, key_names, options)
        fastavro = _fastavro()
        key_connect = orjson.loads(self.key_schema)
        value_connect = orjson.loads(self.value_schema)
        key_avro = avro_schema.to_avro(key_connect)
        value_avro = avro_schema.to_avro(value_connect)
        self._column_defaults(value_avro, value_connect, columns)
        fastavro.parse_schema(key_avro)  # a schema fastavro refuses is ours to fix, not the registry's
        fastavro.parse_schema(value_avro)
        key_id = registry.register(f"{topic}-key", orjson.dumps(key_avro).decode())
        value_id = registry.register(f"{topic}-value", orjson.dumps(value_avro).decode())
        self.key_header = MAGIC + key_id.to_bytes(4, "big")
        self.value_header = MAGIC + value_id.to_bytes(4, "big")
        # A truncate's key: Avro null, written with a schema of its own (``"null"``, registered
        # under <topic>-truncate-key: the key subject's record schema cannot take it). A Confluent
        # reader finds the schema by its id and reads a null key, as Debezium's truncate has; a
        # compacted topic takes the record, which it refuses without a key.
        null_id = registry.register(f"{topic}-truncate-key", '"null"')
        self.truncate_key = MAGIC + null_id.to_bytes(4, "big")
        self.encode_key = compile_encoder(key_avro)
        self.encode_value = compile_encoder(value_avro)
        row = next(f for f in value_connect["fields"] if f["field"] == "after")
        self.row_mappers = _field_mappers(row, to_bytes=True)
        self.key_mappers = _field_mappers(key_connect, to_bytes=True)


    def _column_defaults(self, value_avro: dict, value_connect: dict, columns: list[Column]) -> None:
        """A NOT NULL column added with a default (``Column.default``) gets it as its Avro default,
        as Debezium puts a column's default into its schema: without one, a reader of the new
        schema could not read the old records, and a BACKWARD registry refuses the new version."""
        defaults = {c.name: c.default for c in columns if c.default is not None and not c.nullable and not c.key}
        if not defaults:
            return
        before = next(f for f in value_avro["fields"] if f["name"] == "before")
        record = before["type"][1]
        connect_fields = {f["field"]: f for f in next(f for f in value_connect["fields"]
                                                      if f["field"] == "before")["fields"]}
        converters = dict(self.converters)
        for field in record["fields"]:
            name = field["name"]
            if name not in defaults or isinstance(field["type"], list):
                continue
            value = defaults[name]
            try:
                if name in converters:
                    value = converters[name](value)
                if connect_fields[name].get("type") == "bytes" and isinstance(value, str):
                    value = base64.b64decode(value).decode("latin-1")  # Avro JSON: bytes as code points 0-255
            except (TypeError, ValueError) as err:  # the registry decides without it
                log.warning("column %s: default %r has no Avro form (%s); the schema carries none", name, value, err)
                continue
            if value is not None:
                field["default"] = value


class AvroEncoder(DebeziumJsonEncoder):
    """``EnvelopeEncoder`` with the avro format. Not thread-safe; one per source."""

    __slots__ = ("registry",)

    def __init__(self, connector: str, name: str, topic_prefix: str,
                 on_new_topic: Callable[[str], None] | None = None,
                 options: DebeziumOptions | None = None, registry_url: str | None = None) -> None:
        if not registry_url:
            raise FormatError("the avro format needs a schema registry: set log.schema_registry.url")
        super().__init__(connector, name, topic_prefix, on_new_topic, options)
        self.registry = registry_for(registry_url)

    def _make_format(self, topic: str, connector: str, columns: list[Column], key_names: list[str]) -> TableFormat:
        return AvroTableFormat(topic, connector, columns, key_names, self.options, self.registry)

    # The formats handed to these are this encoder's, all made by its _make_format.

    def _truncate_key(self, fmt: TableFormat) -> bytes:
        return cast(AvroTableFormat, fmt).truncate_key

    def _key(self, event: ChangeEvent, fmt: TableFormat) -> bytes:
        avro = cast(AvroTableFormat, fmt)
        key = event.key or {}
        payload = avro.row({k: key[k] for k in avro.key_names if k in key}) or {}
        return avro.encode_key(avro.key_header, apply_converters(payload, avro.key_mappers))

    def _value(self, event: ChangeEvent, fmt: TableFormat, head: dict[str, Any], now_ms: int) -> bytes:
        avro = cast(AvroTableFormat, fmt)
        payload = self._payload(event, avro, head, now_ms)
        mappers = avro.row_mappers
        if mappers:
            apply_converters(payload["before"], mappers)
            apply_converters(payload["after"], mappers)
        return avro.encode_value(avro.value_header, payload)

    def record_key(self, event: ChangeEvent) -> bytes:
        return self._key(event, self._format(event))


# --- reading ------------------------------------------------------------------------------------

def strip_logical_types(avro: Any) -> Any:
    """The schema without Avro logical types, so a reader (fastavro here, spark-avro in the delta
    sink) hands back the encoded ints and bytes, which the Connect JSON readers then convert by
    their Connect names (``connect_decode``, the delta sink's ``connect_json``)."""
    if isinstance(avro, list):
        return [strip_logical_types(a) for a in avro]
    if isinstance(avro, dict):
        return {k: strip_logical_types(v) for k, v in avro.items() if k != "logicalType"}
    return avro


def _float32_shortest(value: float) -> float:
    """A 32-bit float (MySQL FLOAT, Connect float32) as the shortest decimal that is the same
    float32: what the json and debezium-json formats, and Java's Float.toString, print (3.14159,
    not the 3.141590118408203 its widening to a double gives)."""
    for digits in range(6, 10):
        candidate = float(f"{value:.{digits}g}")
        if _F32.unpack(_F32.pack(candidate))[0] == value:
            return candidate
    return value


_F32 = struct.Struct("<f")


class _Decoder:
    """One writer schema: fastavro's parsed form and the fixes back to the json format's forms."""

    __slots__ = ("parsed", "envelope", "before", "after", "key")

    def __init__(self, avro: Any) -> None:
        self.parsed = _fastavro().parse_schema(strip_logical_types(avro))
        connect = avro_schema.to_connect(avro)
        fields = {f["field"]: f for f in connect.get("fields") or []}
        self.envelope = "op" in fields and "after" in fields
        if self.envelope:
            self.before = self._row(fields["before"])
            self.after = self._row(fields["after"])
        else:
            self.key = self._row(connect)

    @staticmethod
    def _row(row_schema: dict) -> list[tuple[str, Callable[[Any], Any]]]:
        """(field, fix) per field: Avro bytes to base64 text, then the Connect JSON reader's
        conversion (``connect_decode``)."""
        out: list[tuple[str, Callable[[Any], Any]]] = []
        for field in row_schema.get("fields") or []:
            to_text = _bytes_mapper(field, to_bytes=False)
            convert = connect_decode._converter(field)
            if field.get("type") == "float" and convert is None:
                convert = _float32_shortest
            if to_text is not None and convert is not None:
                out.append((field["field"], _then(to_text, convert)))
            elif to_text is not None:
                out.append((field["field"], to_text))
            elif convert is not None:
                out.append((field["field"], convert))
        return out


def _then(first: Callable[[Any], Any], second: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: second(first(value))


class AvroReader:
    """Decodes Confluent-framed Avro records with the schemas of one registry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._decoders: dict[int, _Decoder] = {}
        self._read = _fastavro().schemaless_reader

    def _decode(self, data: bytes) -> tuple[_Decoder, Any]:
        if len(data) < 5 or data[0] != 0:
            raise ValueError("not a Confluent-framed Avro record (magic byte 0 and a 4-byte schema id)")
        schema_id = int.from_bytes(data[1:5], "big")
        decoder = self._decoders.get(schema_id)
        if decoder is None:
            decoder = self._decoders[schema_id] = _Decoder(self.registry.schema(schema_id))
        return decoder, self._read(BytesIO(data[5:]), decoder.parsed, None)

    def key(self, data: bytes) -> dict:
        decoder, value = self._decode(data)
        if value is None:  # a truncate's key (AvroTableFormat.truncate_key)
            return {}
        if decoder.envelope or not isinstance(value, dict):
            raise ValueError("an Avro key that is not a record of key columns")
        return apply_converters(value, decoder.key)

    def value(self, data: bytes) -> dict:
        """The json format's envelope (rows in its forms, ``source.version`` ours), as
        ``connect_decode.envelope`` gives it for Connect JSON."""
        decoder, value = self._decode(data)
        if not decoder.envelope:
            return value
        return connect_decode.as_envelope(value, decoder.before, decoder.after)


_READER: AvroReader | None = None


def use_registry(url: str | None) -> None:
    """Where this process's readers find the schemas of ``avro`` records (from the log config)."""
    global _READER
    _READER = AvroReader(registry_for(url)) if url else None


def reader() -> AvroReader:
    if _READER is None:
        raise FormatError("an avro record (Confluent wire format) was read, but no schema registry is "
                          "configured: set log.schema_registry.url")
    return _READER


def is_avro(data: bytes) -> bool:
    """Confluent's framing starts with byte 0, which no JSON text does."""
    return bool(data) and data[0] == 0
