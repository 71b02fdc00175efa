"""Change events to topic records: Debezium-compatible key and value JSON, and tombstones.

Key: the primary-key columns as a JSON object (``{"id": 42}``), in key-column order.
Value: the envelope without the Connect ``schema`` wrapper::

    {"before", "after", "op", "ts_ms", "source": {connector, name, db, schema?, table, snapshot,
     ts_ms, <connector fields>, version}, "transaction"}

A delete is followed by a tombstone (same key, null value) so compaction can drop the key. A
truncate has no row key: it is keyed ``{}`` and written to every partition of the table's topic,
so each partition's consumer sees it in order with that partition's rows.

The hot path is one ``orjson.dumps`` per key and per value; topic names are cached per table.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, NamedTuple

import orjson

from cdc.events import ChangeEvent, Op, SchemaChange, SnapshotMarker, TableId

TRUNCATE_KEY = b"{}"


class Record(NamedTuple):
    """A record to publish. A tuple: millions are made per minute, and tuples are the cheapest."""

    topic: str
    key: bytes
    value: bytes | None
    to_all_partitions: bool = False


class EnvelopeEncoder:
    """Encodes one source's events. Not thread-safe (it caches per table); make one per thread.

    The envelope is assembled from byte pieces rather than dumped from a nested dict: the parts
    that are the same for every event of a table, snapshot flag and op (connector, name, db,
    schema, table ...) are serialized once and cached, so per event only the rows, the key and a
    few numbers go through ``orjson.dumps``. ``envelope`` gives the same JSON as a dict, for
    readers and tests.
    """

    __slots__ = ("connector", "name", "prefix", "on_new_topic", "value_bytes", "_topics", "_heads")

    def __init__(self, connector: str, name: str, topic_prefix: str,
                 on_new_topic: Callable[[str], None] | None = None) -> None:
        self.connector = connector
        self.name = name
        self.prefix = topic_prefix
        self.on_new_topic = on_new_topic  # called once per topic, before its first record is made
        self.value_bytes = 0              # bytes of values encoded so far (for metrics)
        self._topics: dict[TableId, str] = {}
        self._heads: dict[tuple, tuple] = {}

    def topic(self, table: TableId) -> str:
        topic = self._topics.get(table)
        if topic is None:
            topic = table.topic(self.prefix)
            if self.on_new_topic is not None:
                self.on_new_topic(topic)
            self._topics[table] = topic
        return topic

    def _source_head(self, table: TableId, snapshot: str) -> dict[str, Any]:
        source: dict[str, Any] = {"connector": self.connector, "name": self.name, "db": table.db}
        if table.schema is not None:
            source["schema"] = table.schema
        source["table"] = table.table
        source["snapshot"] = snapshot
        return source

    def envelope(self, event: ChangeEvent, now_ms: int) -> dict[str, Any]:
        """The value of ``event``'s record as a dict (what ``encode`` writes as bytes)."""
        source = self._source_head(event.table, event.snapshot.value)
        source["ts_ms"] = event.ts_ms
        if event.source_fields:
            source.update(event.source_fields)
        source["version"] = event.version
        tx = event.transaction
        return {
            "before": event.before, "after": event.after, "op": event.op.value, "ts_ms": now_ms,
            "source": source,
            "transaction": None if tx is None else {
                "id": tx.id, "total_order": tx.total_order,
                "data_collection_order": tx.data_collection_order},
        }

    def _parts(self, table: TableId, op: Op, snapshot: SnapshotMarker) -> tuple:
        """(table, topic, b'"<op>"', b'{"connector":...,"snapshot":..,"ts_ms":'), cached."""
        source = orjson.dumps(self._source_head(table, snapshot.value))
        parts = (table, self.topic(table), b'"' + op.value.encode() + b'"', source[:-1] + b',"ts_ms":')
        self._heads[(id(table), id(op), id(snapshot))] = parts  # parts[0] keeps the id in use
        return parts

    def encode(self, events: list[ChangeEvent], now_ms: int | None = None) -> list[Record]:
        """Records for ``events`` in order, a tombstone after each delete."""
        return list(self.iter_encode(events, now_ms))

    def iter_encode(self, events: list[ChangeEvent], now_ms: int | None = None) -> Iterator[Record]:
        """``encode``, one record at a time: a writer that produces each record as it comes lets
        its memory be reused at once (values are mostly over 512 bytes, past Python's small-object
        allocator, and a batch of thousands kept alive costs more than its encoding)."""
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        dumps = orjson.dumps
        heads = self._heads
        new = tuple.__new__  # a Record without the Python-level NamedTuple constructor
        for event in events:
            table, op, snapshot = event.table, event.op, event.snapshot
            # The constant parts per table, op and snapshot flag, looked up by identity: hashing
            # a TableId or an enum member runs Python code, hashing three ids does not.
            parts = heads.get((id(table), id(op), id(snapshot)))
            if parts is None or parts[0] is not table:
                parts = self._parts(table, op, snapshot)
            before, fields, tx = event.before, event.source_fields, event.transaction
            # One C-level format per value.
            common = (b"null" if before is None else dumps(before), dumps(event.after), parts[2],
                      now_ms, parts[3], event.ts_ms, event.version,
                      b"," + dumps(fields)[1:] if fields else b"}")
            if tx is None:
                value = _VALUE % common
            else:
                value = _VALUE_TX % (*common, dumps(tx.id), tx.total_order, tx.data_collection_order)
            self.value_bytes += len(value)
            if op is Op.TRUNCATE:
                yield new(Record, (parts[1], TRUNCATE_KEY, value, True))
                continue
            key = dumps(event.key)
            yield new(Record, (parts[1], key, value, False))
            if op is Op.DELETE:
                yield new(Record, (parts[1], key, None, False))


# The source object opens in parts[3]; the %b after the version holds the connector's fields and
# closes it (",<fields>}" or "}").
_HEAD = b'{"before":%b,"after":%b,"op":%b,"ts_ms":%d,"source":%b%d,"version":%d%b'
_VALUE = _HEAD + b',"transaction":null}'
_VALUE_TX = _HEAD + b',"transaction":{"id":%b,"total_order":%d,"data_collection_order":%d}}'


def schema_changes_topic(prefix: str) -> str:
    return f"{prefix}.schema-changes"


def encode_schema_change(change: SchemaChange, source_name: str, prefix: str) -> Record:
    """The record of a table's new shape: keyed by table, so compaction keeps the newest."""
    table = change.table
    key = orjson.dumps({"source": source_name, "db": table.db, "schema": table.schema, "table": table.table})
    value = orjson.dumps({
        "source": source_name, "db": table.db, "schema": table.schema, "table": table.table,
        "version": change.version, "ts_ms": change.ts_ms, "ddl": change.ddl,
        "columns": [{"name": c.name, "type": c.type, "key": c.key, "nullable": c.nullable}
                    for c in change.columns]})
    return Record(schema_changes_topic(prefix), key, value)


def decode(data: bytes | None) -> Any:
    """A key or value back to Python (``None`` for a tombstone)."""
    return None if data is None else orjson.loads(data)
