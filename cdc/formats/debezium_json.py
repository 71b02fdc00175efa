"""The ``debezium-json`` format: Kafka Connect JSON (``schema`` + ``payload``) for keys and values,
with Debezium's envelope, source block and value encodings, so Debezium's own consumers (the JDBC
sink connector with ``JsonConverter`` and ``schemas.enable=true``) read our topics unchanged.

Key: ``{"schema": <struct of the primary-key columns, non-optional>, "payload": {"id": 42}}``.
Value: ``{"schema": <"<topic>.Envelope">, "payload": {"before", "after", "source", "transaction",
"op", "ts_ms", "ts_us", "ts_ns"}}``. Debezium's ``source.version`` is its connector's version;
ours (the int64 ordering version) is ``source.cdc_version``, and the schema record the row was
written under is ``source.cdc_schema_version``: fields of the source struct that Debezium's
consumers ignore. A delete's ``before`` holds every column of the shape, null where the source did
not send the value (Debezium's consumers expect the full struct).

The schemas come from the table's shape (the schema records, ``SchemaChange``): the runner hands
each shape to ``learn`` before the rows that name it. The Connect schema of a (table, shape) is
serialized once and cached; per event only the converted row and the source block are dumped.
Rows of a table with no shape (the generator source) get a schema inferred from their values.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from cdc import __version__
from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.formats.connect_types import DebeziumOptions, field_type
from cdc.headers import record_headers
from cdc.serde import EmitError, EnvelopeEncoder, put_record

log = logging.getLogger(__name__)

VERSION_TEXT = f"cdc-framework-{__version__}"

_SOURCE_FIELDS = {
    "postgresql": [("schema", "string", False), ("table", "string", False), ("txId", "int64", True),
                   ("lsn", "int64", True), ("xmin", "int64", True)],
    "mysql": [("table", "string", True), ("server_id", "int64", False), ("gtid", "string", True),
              ("file", "string", False), ("pos", "int64", False), ("row", "int32", False),
              ("thread", "int64", True), ("query", "string", True)],
}


def _source_schema(connector: str) -> dict:
    fields = [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
         "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,"
                                   "incremental"}, "default": "false", "field": "snapshot"},
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": True, "field": "sequence"},
        {"type": "int64", "optional": True, "field": "ts_us"},
        {"type": "int64", "optional": True, "field": "ts_ns"},
    ]
    # other connectors (the generator) write PostgreSQL's fields: see _source_head
    for name, kind, optional in _SOURCE_FIELDS.get(connector, _SOURCE_FIELDS["postgresql"]):
        fields.append({"type": kind, "optional": optional, "field": name})
    fields.append({"type": "int64", "optional": False, "field": "cdc_version"})
    fields.append({"type": "int64", "optional": True, "field": "cdc_schema_version"})
    return {"type": "struct", "fields": fields, "optional": False,
            "name": f"io.debezium.connector.{connector}.Source"}


_TRANSACTION = {"type": "struct", "fields": [
    {"type": "string", "optional": False, "field": "id"},
    {"type": "int64", "optional": False, "field": "total_order"},
    {"type": "int64", "optional": False, "field": "data_collection_order"}],
    "optional": True, "name": "event.block", "version": 1, "field": "transaction"}


class TableFormat:
    """One (table, shape): the cached key and value schemas and the row converter."""

    __slots__ = ("key_schema", "value_schema", "names", "converters", "key_names", "key_prefix", "value_prefix",
                 "key_as_is")

    def __init__(self, topic: str, connector: str, columns: Iterable[Column], key_names: list[str],
                 options: DebeziumOptions) -> None:
        fields, converters, names = [], [], []
        key_fields: dict[str, dict] = {}
        for column in columns:
            ftype = field_type(connector, column.type, options)
            optional = not column.key and column.nullable
            field = {**ftype.schema, "optional": optional, "field": column.name}
            fields.append(field)
            names.append(column.name)
            if ftype.convert is not None:
                converters.append((column.name, ftype.convert))
            if column.key:
                key_fields[column.name] = {**field, "optional": False}
        self.names = names
        self.converters = converters
        self.key_names = [k for k in key_names if k in key_fields] or list(key_fields)
        # keys whose columns need no conversion and come in key order are dumped as they are
        converted = {name for name, _ in converters}
        self.key_as_is = self.key_names == key_names and not converted.intersection(self.key_names)
        row = {"type": "struct", "fields": fields, "optional": True, "name": f"{topic}.Value"}
        self.key_schema = orjson.dumps({"type": "struct", "fields": [key_fields[k] for k in self.key_names],
                                        "optional": False, "name": f"{topic}.Key"})
        self.value_schema = orjson.dumps({
            "type": "struct", "optional": False, "name": f"{topic}.Envelope", "version": 2,
            "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                       {**_source_schema(connector), "field": "source"}, _TRANSACTION,
                       {"type": "string", "optional": False, "field": "op"},
                       {"type": "int64", "optional": True, "field": "ts_ms"},
                       {"type": "int64", "optional": True, "field": "ts_us"},
                       {"type": "int64", "optional": True, "field": "ts_ns"}]})
        self.key_prefix = b'{"schema":%b,"payload":' % self.key_schema
        self.value_prefix = b'{"schema":%b,"payload":' % self.value_schema

    def row(self, values: Any, fill: bool = False) -> dict | None:
        """A row in Debezium's encodings; ``fill``: every column, null where ``values`` has none."""
        if values is None:
            return None
        if type(values) is orjson.Fragment:  # a snapshot row the server printed as JSON
            values = orjson.loads(orjson.dumps(values))
        row = dict.fromkeys(self.names) | values if fill else dict(values)
        for name, convert in self.converters:
            value = row.get(name)
            if value is not None:
                row[name] = convert(value)
        return row


def _inferred_columns(event: ChangeEvent) -> list[Column]:
    row = event.after or event.before or {}
    if type(row) is orjson.Fragment:
        row = orjson.loads(orjson.dumps(row))
    kinds = {bool: "boolean", int: "bigint", float: "double precision"}
    keys = set(event.key or ())
    return [Column(n, kinds.get(type(v), "jsonb" if isinstance(v, (dict, list)) else "text"), n in keys)
            for n, v in row.items()]


class DebeziumJsonEncoder(EnvelopeEncoder):
    """``EnvelopeEncoder`` with the debezium-json format. Not thread-safe; one per source."""

    __slots__ = ("options", "_shapes", "_formats", "_newest")

    def __init__(self, connector: str, name: str, topic_prefix: str,
                 on_new_topic: Callable[[str], None] | None = None,
                 options: DebeziumOptions | None = None) -> None:
        super().__init__(connector, name, topic_prefix, on_new_topic)
        self.options = options or DebeziumOptions()
        self._shapes: dict[tuple[TableId, int], SchemaChange] = {}
        self._newest: dict[TableId, SchemaChange] = {}
        self._formats: dict[tuple[TableId, int | None], TableFormat] = {}

    def learn(self, changes: Iterable[SchemaChange]) -> None:
        """Shapes that rows will name (``source.schema_version``), before those rows are encoded."""
        for change in changes:
            self._shapes[(change.table, change.version)] = change
            newest = self._newest.get(change.table)
            if newest is None or newest.version <= change.version:
                self._newest[change.table] = change
                self._formats.pop((change.table, None), None)  # rows naming no shape take the newest

    def _format(self, event: ChangeEvent) -> TableFormat:
        table = event.table
        version = self.schema_versions.get(table)
        cached = self._formats.get((table, version))
        if cached is not None:
            return cached
        shape = self._shapes.get((table, version)) if version is not None else None
        if shape is None:
            shape = self._newest.get(table)
        if shape is not None and shape.columns:
            columns = list(shape.columns)
            connector = self.connector
        else:
            log.warning("%s: no shape known; its Connect schema is inferred from a row's values", table)
            columns, connector = _inferred_columns(event), "postgresql"
        key_names = list(event.key or ())
        if not any(c.key for c in columns):
            columns = [Column(c.name, c.type, c.name in key_names, c.nullable) for c in columns]
        made = self._formats[(table, version)] = self._make_format(self.topic(table), connector, columns, key_names)
        return made

    def _make_format(self, topic: str, connector: str, columns: list[Column], key_names: list[str]) -> TableFormat:
        """The format of one (table, shape); the avro format's adds its registered Avro schemas."""
        return TableFormat(topic, connector, columns, key_names, self.options)

    def _source_head(self, table: TableId, snapshot: str) -> dict[str, Any]:
        """The source block's fields that are the same for every event of a table and snapshot
        flag, in Debezium's order; the per-event ones are filled in by ``_source``."""
        head: dict[str, Any] = {"version": VERSION_TEXT, "connector": self.connector, "name": self.name,
                                "ts_ms": 0, "snapshot": snapshot, "db": table.db, "sequence": None,
                                "ts_us": 0, "ts_ns": 0}
        if self.connector == "mysql":
            head.update({"table": table.table, "server_id": 0, "gtid": None, "file": "", "pos": 0, "row": 0,
                         "thread": None, "query": None})
        else:
            head.update({"schema": table.schema if table.schema is not None else table.db, "table": table.table,
                         "txId": None, "lsn": None, "xmin": None})
        head["cdc_version"] = 0
        head["cdc_schema_version"] = self.schema_versions.get(table)
        return head

    def _source(self, event: ChangeEvent, head: dict[str, Any]) -> dict[str, Any]:
        source = head.copy()
        ts_ms = event.ts_ms
        source["ts_ms"] = ts_ms
        source["ts_us"] = ts_ms * 1000
        source["ts_ns"] = ts_ms * 1_000_000
        fields = event.source_fields
        if fields:
            for name in _SOURCE_EVENT_FIELDS:
                if name in fields:
                    source[name] = fields[name]
        source["cdc_version"] = event.version
        return source

    def _payload(self, event: ChangeEvent, fmt: TableFormat, head: dict[str, Any], now_ms: int) -> dict[str, Any]:
        tx = event.transaction
        transaction = None
        if tx is not None:
            fields = event.source_fields or {}
            tx_number, lsn = fields.get("txId"), fields.get("lsn")
            tx_id = f"{tx_number}:{lsn}" if tx_number is not None and lsn is not None else tx.id
            transaction = {"id": tx_id, "total_order": tx.total_order,
                           "data_collection_order": tx.data_collection_order}
        return {"before": fmt.row(event.before, fill=event.op is Op.DELETE), "after": fmt.row(event.after),
                "source": self._source(event, head), "transaction": transaction, "op": event.op.value,
                "ts_ms": now_ms, "ts_us": now_ms * 1000, "ts_ns": now_ms * 1_000_000}

    def envelope(self, event: ChangeEvent, now_ms: int) -> dict[str, Any]:
        """The payload of ``event``'s value (what ``emit`` writes inside ``{"schema", "payload"}``)."""
        return self._payload(event, self._format(event), self._source_head(event.table, event.snapshot.value),
                             now_ms)

    def record_key(self, event: ChangeEvent) -> bytes:
        return self._key(event, self._format(event))

    def _key(self, event: ChangeEvent, fmt: TableFormat) -> bytes:
        key = event.key
        if fmt.key_as_is and key:
            return fmt.key_prefix + orjson.dumps(key) + b"}"
        payload = fmt.row({k: key[k] for k in fmt.key_names if k in key}) if key else {}
        return fmt.key_prefix + orjson.dumps(payload) + b"}"

    def _truncate_key(self, fmt: TableFormat) -> bytes:
        """The key of a truncate's records: null to a Connect reader (see ``TRUNCATE_KEY``)."""
        return TRUNCATE_KEY

    def _value(self, event: ChangeEvent, fmt: TableFormat, head: dict[str, Any], now_ms: int) -> bytes:
        """One record value: the Connect JSON ``schema`` + ``payload`` object."""
        return fmt.value_prefix + orjson.dumps(self._payload(event, fmt, head, now_ms)) + b"}"

    def emit(self, events: list[ChangeEvent], emit: Callable[..., Any], when_room: Callable[..., Any],
             everywhere: Callable[..., Any], now_ms: int | None = None) -> None:
        """As ``EnvelopeEncoder.emit`` (same order, tombstones, truncates, headers, errors), in this format.
        Python only: bench/publish.py measures what it costs beside the ``json`` format. The
        table's format, topic and source head are looked up once per table, op and snapshot
        flag within a call (``schema_versions`` changes only between calls)."""
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        value_of = self._value
        topic = None
        nbytes = 0
        per_table: dict[int, tuple[TableFormat, str, dict[Any, dict[str, Any]]]] = {}
        last_table: TableId | None = None
        source = self.source_header
        try:
            for event in events:
                table = event.table
                if table is not last_table:
                    found = per_table.get(id(table))
                    if found is None:
                        topic = self.topic(table)  # named in the error if making the table's format fails
                        found = per_table[id(table)] = (self._format(event), topic, {})
                    fmt, table_topic, heads = found
                    topic, last_table = table_topic, table
                head = heads.get(event.snapshot)
                if head is None:
                    head = heads[event.snapshot] = self._source_head(table, event.snapshot.value)
                value = value_of(event, fmt, head, now_ms)
                nbytes += len(value)
                headers = record_headers(event.version, source)
                if event.op is _TRUNCATE:
                    everywhere(table_topic, value, self._truncate_key(fmt), headers)
                    continue
                put_record(emit, when_room, table_topic, value, self._key(event, fmt), event.op is _DELETE, headers)
        except Exception as exc:
            raise EmitError(topic, exc) from exc
        finally:
            self.value_bytes += nbytes


_TRUNCATE, _DELETE = Op.TRUNCATE, Op.DELETE
# Debezium writes a truncate with no key, which a compacted topic (ours are) refuses with
# INVALID_RECORD: the whole capture stopped at a TRUNCATE. This key is Connect JSON that Kafka
# Connect's JsonConverter reads as a null key, so a Connect consumer sees what Debezium's truncate
# gives it, and the topic takes it (one key per table: compaction keeps the newest truncate).
TRUNCATE_KEY = b'{"schema":null,"payload":null}'
# The connector's fields of an event that go into Debezium's source block (the rest are ours).
_SOURCE_EVENT_FIELDS = ("txId", "lsn", "gtid", "file", "pos", "row")
