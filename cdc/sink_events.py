"""Records of the log decoded into ``SinkEvent``s (cdc/sink_event.py, where their semantics are
written), once, by the sink runtime: every format (json, debezium-json, avro) reads back as the
json format's envelope here, so a sink sees one shape whatever the log holds."""

from __future__ import annotations

from typing import Any

import orjson

from cdc import native
from cdc.events import Op
from cdc.formats import avro, connect_decode
from cdc.headers import version_of
from cdc.sink_event import SinkEvent


class PoisonRecord(ValueError):
    """A record that cannot be decoded at all (not JSON, no envelope)."""


_OPS = {op.value: op for op in Op}
_new = tuple.__new__  # SinkEvent's fields in order, without NamedTuple's Python-level __new__


def decode_key(data: bytes | None) -> dict[str, Any]:
    """A record key in any format as the json format's key object."""
    if data is not None and avro.is_avro(data):
        return avro.reader().key(data)
    key = orjson.loads(data) if data is not None else {}
    if type(key) is dict and len(key) == 2 and key.get("payload", 0) is None and key.get("schema", 0) is None:
        return {}  # Connect JSON's null key: a truncate's in debezium-json (formats.debezium_json.TRUNCATE_KEY)
    return connect_decode.key_payload(key) if connect_decode.is_connect_json(key) else key


def decode_value(data: bytes) -> Any:
    """A record value in any format as the json format's envelope (the one place where the
    ``debezium-json`` and ``avro`` formats are read back; see cdc/formats/). An avro record's
    schema comes from the registry of the log config (``avro.use_registry``)."""
    if avro.is_avro(data):
        return avro.reader().value(data)
    value = orjson.loads(data)
    return connect_decode.envelope(value) if connect_decode.is_connect_json(value) else value


def decode_record(record) -> SinkEvent:
    """A LogRecord -> SinkEvent, whatever the format; ``PoisonRecord`` says what is wrong with it."""
    try:
        key = decode_key(record.key)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, EOFError) as err:
        raise PoisonRecord(f"the key is not a JSON, Connect JSON or Avro key: {err}") from err
    if record.value is None:
        try:
            version = version_of(record[6] if len(record) > 6 else None)
        except ValueError as err:
            raise PoisonRecord(f"a tombstone whose version is unreadable: {err}") from err
        return _new(SinkEvent, (record.topic, record.partition, record.offset, key, None, None, None, version, {},
                                None))
    try:
        value = decode_value(record.value)
        op = _OPS[value["op"]]
        source = value.get("source") or {}
        version = source["version"]
        if not isinstance(version, int):
            raise TypeError(f"source.version is {type(version).__name__}, not an integer")
        return _new(SinkEvent, (record.topic, record.partition, record.offset, key, op, value.get("before"),
                                value.get("after"), version, source, value.get("ts_ms")))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, EOFError) as err:
        raise PoisonRecord(f"not a change event envelope: {type(err).__name__}: {err}") from err


def decode_batch(records: list, ends: dict, raw_rows: bool = False
                 ) -> tuple[list[SinkEvent], list[tuple[Any, PoisonRecord]], int]:
    """A batch of LogRecords -> (their SinkEvents in order, the records that are poison with why,
    the bytes of their values); ``ends[(topic, partition)]`` is set to the offset after each
    partition's last record. Where setup.py built it, ``cdc/_decode.c`` runs this loop in C: its
    one envelope parser (``decode_one``) decodes the common record (a JSON key object and a plain
    JSON envelope, or a tombstone) and hands every other one to ``decode_record``, so both give the
    same events and the same poisons (tests/unit/test_sink_decode_batch.py compares them). This
    Python loop is the reference. ``raw_rows`` (a sink's ``raw_rows``): the C parser leaves an
    upsert's ``after`` as the JSON bytes of the row (see ``decode_records``); without the C
    module every row is a dict."""
    if _decode is not None and native.enabled():
        return _decode.decode_batch(records if type(records) is list else list(records), ends, raw_rows)
    events: list[SinkEvent] = []
    poisons: list[tuple[Any, PoisonRecord]] = []
    nbytes = 0
    append = events.append
    for record in records:
        ends[(record.topic, record.partition)] = record.offset + 1
        if record.value is not None:
            nbytes += len(record.value)
        try:
            append(decode_record(record))
        except PoisonRecord as err:
            poisons.append((record, err))
    return events, poisons, nbytes


def decode_packed(batch, ends: dict, raw_rows: bool = False
                  ) -> tuple[list[SinkEvent], list[tuple[Any, PoisonRecord]], int]:
    """``decode_batch`` of a batch of the bulk reader (cdc.log.kafka_bulk.PackedBatch): in C (where
    built) straight from the packed bytes, without a confluent-kafka Message per record, and a
    LogRecord made only for a record the C parser hands to ``decode_record``; else its records,
    decoded by ``decode_batch``. The same events and the same poisons either way
    (tests/unit/test_sink_decode_batch.py)."""
    if _decode is not None and native.enabled():
        from cdc.log.base import LogRecord
        return _decode.decode_packed(batch.data, batch.count, batch.topics, ends, raw_rows, LogRecord)
    return decode_batch(batch.records(), ends, raw_rows)


_decode = native.load("cdc._decode")  # the same loops and the envelope decoder in C
if _decode is not None:
    _decode.decode_setup(orjson.loads, decode_record, PoisonRecord, SinkEvent, _OPS)


def raw_rows_decoded() -> bool:
    """Whether ``decode_records`` can leave rows undecoded now (the C decoder built and on)."""
    return _decode is not None and native.enabled()


def decode_records(records: list, raw_rows: bool) -> list[SinkEvent | PoisonRecord]:
    """Per record its SinkEvent, or the PoisonRecord saying why it has none (returned, not raised).

    ``raw_rows`` (a sink's ``raw_rows``, and the C decoder built): an upsert whose value is a
    plain ``json`` envelope keeps its ``after`` as the bytes of the row object. The decoder checks
    each value as strictly as orjson does, builds the source block and the common key object (member
    names without escapes) itself (reusing the names and strings that repeat from record to record)
    and decodes only a delete's before, any other key and the values it does not make with orjson:
    building the row's dict was most of decoding a record (bench/bootstrap.py). Anything it
    does not take (Connect JSON, Avro, a malformed value) goes through ``decode_record`` as
    before, so the same records are poison either way and the events are equal once ``after`` is
    decoded (tests/unit/test_raw_rows.py). The parser is ``decode_batch``'s (one in C for both)."""
    out: list[SinkEvent | PoisonRecord] = []
    append = out.append
    fast = _decode.decode_envelopes(records, SinkEvent, _OPS, orjson.loads) \
        if raw_rows and raw_rows_decoded() else [None] * len(records)
    for record, event in zip(records, fast):
        if event is not None:
            append(event)
            continue
        try:
            append(decode_record(record))
        except PoisonRecord as err:
            append(err)
    return out
