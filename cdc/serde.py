"""Change events to topic records: Debezium-compatible key and value JSON, and tombstones.

Key: the primary-key columns as a JSON object (``{"id": 42}``), in key-column order.
Value: the envelope without the Connect ``schema`` wrapper::

    {"before", "after", "op", "ts_ms", "source": {connector, name, db, schema?, table, snapshot,
     schema_version?, ts_ms, <connector fields>, version}, "transaction"}

``source.schema_version`` names the schema record (``<prefix>.schema-changes``, keyed by table
and version) whose shape the row has; it is absent for a table whose source published no shape.

A delete is followed by a tombstone (same key, null value) so compaction can drop the key. A
truncate has no row key: it is keyed ``{}`` and written to every partition of the table's topic,
so each partition's consumer sees it in order with that partition's rows.

Every record carries the headers of cdc/headers.py: ``cdc.version`` (the event's version; a
tombstone its delete's) and ``cdc.source`` (the source's name), in every format.

The hot path is one ``orjson.dumps`` per row and key and one bytes format per value; topic names
and the constant parts of the envelope are cached per table; each record is handed to the log as
it is made (``EnvelopeEncoder.emit``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import orjson

from cdc import native
from cdc.events import ChangeEvent, Op, RowBlock, SchemaChange, SnapshotMarker, TableId
from cdc.headers import VERSION as VERSION_HEADER
from cdc.headers import Headers, record_headers, source_header
from cdc.topics import schema_changes_topic

TRUNCATE_KEY = b"{}"


class Record(NamedTuple):
    """A record to publish. A tuple: millions are made per minute, and tuples are the cheapest."""

    topic: str
    key: bytes
    value: bytes | None
    to_all_partitions: bool = False
    headers: Headers | None = None  # cdc/headers.py; a list shared by a delete and its tombstone


class EnvelopeEncoder:
    """Encodes one source's events. Not thread-safe (it caches per table); make one per thread.

    The envelope is assembled from byte pieces rather than dumped from a nested dict: the parts
    that are the same for every event of a table, snapshot flag and op (connector, name, db,
    schema, table ...) are serialized once and cached, so per event only the rows, the key and a
    few numbers go through ``orjson.dumps``. ``envelope`` gives the same JSON as a dict, for
    readers and tests.
    """

    __slots__ = ("connector", "name", "prefix", "on_new_topic", "value_bytes", "_topics",
                 "schema_versions", "source_header")

    def __init__(self, connector: str, name: str, topic_prefix: str,
                 on_new_topic: Callable[[str], None] | None = None) -> None:
        self.connector = connector
        self.name = name
        self.prefix = topic_prefix
        self.on_new_topic = on_new_topic  # called once per topic, before its first record is made
        self.value_bytes = 0              # bytes of values encoded so far (for metrics)
        self._topics: dict[TableId, str] = {}
        # table -> the version of the schema record its events are written under (``source.
        # schema_version``). Part of the per-table constant head of ``source``, so it costs
        # nothing per event; the runner sets it between ``emit`` calls (see cdc/schema_order.py).
        self.schema_versions: dict[TableId, int] = {}
        self.source_header = source_header(name)  # the cdc.source header of every record

    def topic(self, table: TableId) -> str:
        topic = self._topics.get(table)
        if topic is None:
            topic = table.topic(self.prefix)
            if self.on_new_topic is not None:
                self.on_new_topic(topic)
            self._topics[table] = topic
        return topic

    def record_key(self, event: ChangeEvent) -> bytes:
        """The key of ``event``'s record, as ``emit`` writes it."""
        return orjson.dumps(event.key)

    def _source_head(self, table: TableId, snapshot: str) -> dict[str, Any]:
        source: dict[str, Any] = {"connector": self.connector, "name": self.name, "db": table.db}
        if table.schema is not None:
            source["schema"] = table.schema
        source["table"] = table.table
        source["snapshot"] = snapshot
        schema_version = self.schema_versions.get(table)
        if schema_version is not None:
            source["schema_version"] = schema_version
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

    def _middle(self, table: TableId, op: Op, snapshot: SnapshotMarker, now_ms: int) -> tuple[str, bytes]:
        """(topic, b',"op":"u","ts_ms":<now>,"source":{"connector":...,"snapshot":..,"ts_ms":'): what
        is the same for every event of a table, op and snapshot flag within one call."""
        source = orjson.dumps(self._source_head(table, snapshot.value))
        return self.topic(table), _MIDDLE % (op.value.encode(), now_ms, source[:-1] + b',"ts_ms":')

    def encode(self, events: list[ChangeEvent], now_ms: int | None = None) -> list[Record]:
        """Records for ``events`` in order, a tombstone after each delete."""
        records: list[Record] = []
        append, new = records.append, tuple.__new__

        def emit(topic: str, value: bytes | None, key: bytes, headers: Headers | None = None) -> None:
            append(new(Record, (topic, key, value, False, headers)))

        def everywhere(topic: str, value: bytes, key: bytes, headers: Headers | None = None) -> None:
            append(new(Record, (topic, key, value, True, headers)))

        self.emit(events, emit, emit, everywhere, now_ms)
        return records

    def emit(self, events: list[ChangeEvent], emit: Callable[..., Any], when_room: Callable[..., Any],
             everywhere: Callable[..., Any], now_ms: int | None = None) -> None:
        """Encode ``events`` in order and hand each record over as it is made:
        ``emit(topic, value, key, headers)`` (a tombstone's value is ``None``; its headers are its
        delete's), or, for a truncate, ``everywhere(topic, value, key, headers)`` (one copy to
        every partition). ``headers`` is cdc/headers.py's list, the form confluent-kafka's
        ``produce`` takes (the Kafka writer passes its produce through
        ``cdc.log.kafka_writer.positional_produce``). ``emit`` may raise
        ``BufferError`` (no room just now); the record then goes to ``when_room``, which must wait
        for room and take it. Any other failure, of encoding or of ``emit``, is raised as an
        ``EmitError`` naming the topic, with the failure as its cause.

        The hottest loop of a capture (bench/publish.py measures it), so encoding and producing
        are one loop: a Kafka writer passes its producer's ``produce`` as ``emit``, and no record
        object, generator step or extra call stands between the two. Events are unpacked as
        tuples, the cached parts are found through the table's identity (a ``TableId`` hashes in
        Python code) and then ``(op, snapshot)`` (str-based enums hash in C), the table's lookup
        is skipped while the table repeats, and the byte count is summed locally. Each value is
        made and handed over before the next, so its memory is reused at once (values are mostly
        over 512 bytes, past Python's small-object allocator). Measured: about 1.3 µs per event
        of encoding for a 10-column row with its transaction.

        Where setup.py could build it, ``cdc/_encode.c`` runs this same loop in C (the rows,
        keys and fields still go through ``orjson.dumps``): about 0.6 µs per event, the same
        bytes (tests/unit/test_encode.py compares the two on generated events). This Python
        loop stays the reference and runs where there is no compiler.
        """
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        if type(events) is RowBlock:
            if _encode is not None and native.enabled():
                return self._emit_rows(events, emit, when_room, now_ms)
            events = events.events()
        if _encode is not None and native.enabled():
            where: list[Any] = [None, 0]  # the C loop leaves the failing topic and the bytes so far
            try:
                self.value_bytes += _encode.emit(self._middle, events, emit, when_room, everywhere, now_ms, where,
                                                   self.source_header)
            except Exception as exc:
                self.value_bytes += where[1]
                raise EmitError(where[0], exc) from exc
            return
        dumps = orjson.dumps
        if type(events) is not list:
            events = list(events)  # alive for the call: the caches below compare by identity
        # Per call, the part between the row and the event's own numbers, now_ms included:
        # id(table) -> {(op, snapshot): (topic, b',"op":"u","ts_ms":<now>,"source":{...,"ts_ms":')}.
        # The ids are safe as keys here: the events keep their tables alive for the call.
        middles: dict[int, dict] = {}
        last_table: TableId | None = None
        per_op: dict = {}
        last_tx_id, tx_id_json = None, b""
        last_fields, fields_json = None, b""
        source = self.source_header
        nbytes = 0
        topic = None
        try:
            for event in events:
                op, table, key, before, after, version, ts_ms, snapshot, fields, tx = event
                if table is not last_table:
                    found = middles.get(id(table))
                    if found is None:
                        found = middles[id(table)] = {}
                    per_op = found
                    last_table = table
                middle = per_op.get((op, snapshot))
                if middle is None:
                    middle = per_op[(op, snapshot)] = self._middle(table, op, snapshot, now_ms)
                topic = middle[0]
                # One C-level format per value; the connector's fields close the source object.
                if tx is None:
                    if fields:
                        if fields is not last_fields:  # a snapshot's events share one dict
                            last_fields, fields_json = fields, dumps(fields)[1:]
                        value = _VALUE_F % (b"null" if before is None else dumps(before), dumps(after),
                                            middle[1], ts_ms, version, fields_json)
                    else:
                        value = _VALUE % (b"null" if before is None else dumps(before), dumps(after),
                                          middle[1], ts_ms, version)
                else:
                    if tx[0] is not last_tx_id:  # a transaction's events share its id
                        last_tx_id, tx_id_json = tx[0], dumps(tx[0])
                    if fields:
                        if fields is not last_fields:
                            last_fields, fields_json = fields, dumps(fields)[1:]
                        value = _VALUE_F_TX % (b"null" if before is None else dumps(before), dumps(after),
                                               middle[1], ts_ms, version, fields_json,
                                               tx_id_json, tx[1], tx[2])
                    else:
                        value = _VALUE_TX % (b"null" if before is None else dumps(before), dumps(after),
                                             middle[1], ts_ms, version, tx_id_json, tx[1], tx[2])
                nbytes += len(value)
                headers = [(VERSION_HEADER, b"%d" % version), source]
                if op is _TRUNCATE:
                    everywhere(topic, value, TRUNCATE_KEY, headers)
                    continue
                put_record(emit, when_room, topic, value, dumps(key), op is _DELETE, headers)
        except Exception as exc:
            raise EmitError(topic, exc) from exc
        finally:
            self.value_bytes += nbytes

    @property
    def row_blocks_as_lines(self) -> bool:
        """Whether this encoder's records of a ``RowBlock`` are ``row_block_parts`` around its lines:
        the json format's are; a format that encodes events its own way (a subclass with its own
        ``emit``) makes them from the events instead."""
        return type(self).emit is EnvelopeEncoder.emit

    def row_block_parts(self, rows: RowBlock, now_ms: int) -> tuple[str, bytes, bytes, bytes, bytes]:
        """(topic, value head, value tail, key head, key tail) of a ``RowBlock``'s records: per line
        the value is head + row JSON + tail and the key head + the key's digits + tail, the bytes
        ``emit`` makes from the block's events (tests/unit/test_row_block.py compares the two)."""
        topic, middle = self._middle(rows.table, _READ, _SNAPSHOT_TRUE, now_ms)
        fields = rows.source_fields
        tail = (_VALUE_F % (b"null", b"", middle, rows.ts_ms, rows.version, orjson.dumps(fields)[1:]) if fields
                else _VALUE % (b"null", b"", middle, rows.ts_ms, rows.version))[len(_AFTER_AT):]
        return topic, _AFTER_AT, tail, orjson.dumps({rows.key_name: 0})[:-2], b"}"

    def emit_row_block(self, rows: RowBlock, produce_rows: Callable[..., int], now_ms: int | None = None) -> None:
        """Hand a whole ``RowBlock`` over at once: ``produce_rows(topic, block, value_head,
        value_tail, key_head, key_tail, headers)`` makes and produces its records (the Kafka
        writer's block producer, cdc/log/block_producer.py), every one with ``headers`` (the rows
        share one version), and returns the bytes of values made. Failures as ``emit``'s, an
        ``EmitError``."""
        topic = None
        try:
            topic, *parts = self.row_block_parts(rows, time.time_ns() // 1_000_000 if now_ms is None else now_ms)
            self.value_bytes += produce_rows(topic, rows.block, *parts,
                                             record_headers(rows.version, self.source_header))
        except Exception as exc:
            raise EmitError(topic, exc) from exc

    def _emit_rows(self, rows: RowBlock, emit, when_room, now_ms: int) -> None:
        """The records of a ``RowBlock`` straight from its lines (cdc/_encode.c ``emit_rows``),
        made from ``row_block_parts``."""
        topic = None
        try:
            topic, *parts = self.row_block_parts(rows, now_ms)
            self.value_bytes += _encode.emit_rows(rows.block, emit, when_room, topic, *parts,
                                                    record_headers(rows.version, self.source_header))
        except Exception as exc:
            raise EmitError(topic, exc) from exc


def put_record(emit, when_room, topic: str, value: bytes, key: bytes | None, tombstone: bool,
               headers: Sequence[tuple[str, bytes | None]]) -> None:
    """Hand one record to the producer (``emit``), and after a delete its tombstone, both with
    ``headers`` (the tombstone carries its delete's version); a full producer queue
    (``BufferError``) waits for room (``when_room``) instead of failing. Every format's encoder
    emits through this."""
    try:
        emit(topic, value, key, headers)
    except BufferError:
        when_room(topic, value, key, headers)
    if tombstone:
        try:
            emit(topic, None, key, headers)
        except BufferError:
            when_room(topic, None, key, headers)


class EmitError(Exception):
    """A record of ``topic`` (``None``: before the first topic was known) could not be made or
    handed over; the failure is the ``__cause__``."""

    def __init__(self, topic: str | None, cause: BaseException) -> None:
        super().__init__(f"a record for {topic or 'a topic'} failed: {type(cause).__name__}: {cause}")
        self.topic = topic
        self.cause = cause


_TRUNCATE, _DELETE = Op.TRUNCATE, Op.DELETE  # module globals: an enum class attribute costs more
_READ, _SNAPSHOT_TRUE = Op.READ, SnapshotMarker.TRUE
_AFTER_AT = b'{"before":null,"after":'  # what every snapshot row's value begins with

_encode = native.load("cdc._encode")  # the same loop in C
if _encode is not None:
    _encode.setup(orjson.dumps, _TRUNCATE, _DELETE, TRUNCATE_KEY)

# The value, in four shapes (with or without the connector's source fields, with or without a
# transaction). _MIDDLE holds what is constant per table, op, snapshot flag and call; it opens
# the source object, which the fields (their JSON without its "{") or a "}" close.
_MIDDLE = b',"op":"%b","ts_ms":%d,"source":%b'
_HEAD = b'{"before":%b,"after":%b%b%d,"version":%d'
_TX = b',"transaction":{"id":%b,"total_order":%d,"data_collection_order":%d}}'
_VALUE = _HEAD + b'},"transaction":null}'
_VALUE_F = _HEAD + b',%b,"transaction":null}'
_VALUE_TX = _HEAD + b'}' + _TX
_VALUE_F_TX = _HEAD + b',%b' + _TX


def encode_schema_change(change: SchemaChange, source_name: str, prefix: str) -> Record:
    """The record of a table's shape as of ``change.version``: keyed by table *and* version, so
    compaction keeps every shape an envelope may name in ``source.schema_version``."""
    table = change.table
    key = orjson.dumps({"source": source_name, "db": table.db, "schema": table.schema, "table": table.table,
                        "version": change.version})
    value = orjson.dumps({
        "source": source_name, "db": table.db, "schema": table.schema, "table": table.table,
        "version": change.version, "ts_ms": change.ts_ms, "ddl": change.ddl,
        "columns": [{"name": c.name, "type": c.type, "key": c.key, "nullable": c.nullable}
                    | ({} if c.default is None else {"default": c.default})
                    | ({} if c.renamed_from is None else {"renamed_from": c.renamed_from})
                    for c in change.columns]})
    return Record(schema_changes_topic(prefix), key, value, False,
                  record_headers(change.version, source_header(source_name)))


def decode(data: bytes | None) -> Any:
    """A key or value back to Python (``None`` for a tombstone)."""
    return None if data is None else orjson.loads(data)
