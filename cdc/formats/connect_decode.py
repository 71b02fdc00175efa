"""Kafka Connect JSON (``{"schema", "payload"}``) back to the ``json`` format's values.

The sink runtime decodes every record here or as plain ``json`` (``cdc.sink_events``), so a sink
sees the same envelope, in the same value forms, whichever format the topics hold: a Decimal's
base64 bytes become ``"12.50"``, an ``io.debezium.time.Date`` ``"2024-02-29"``, a
``MicroTimestamp`` ``"2024-01-02T03:04:05.5"``, ``io.debezium.data.Json`` text nested JSON, and so on.
The record's own schema says how each field was encoded, so no outside state is needed.

Forms that the ``json`` format prints with a fixed number of digits come back without trailing
zeros in fractions of seconds (MySQL ``DATETIME(3)``'s ``.120`` as ``.12``): the same instant.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from decimal import Context, Decimal
from typing import Any, TypeVar

import orjson

import cdc.formats.connect_types as t

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)
_EXACT = Context(prec=100_000)  # the default context's 28 digits would round wider numerics


def is_connect_json(value: Any) -> bool:
    """A decoded record part with Connect JSON's wrapper (and not a row that happens to have such
    columns: the schema is a Connect schema object)."""
    return (type(value) is dict and len(value) == 2 and "payload" in value
            and type(value.get("schema")) is dict and "type" in value["schema"])


def _decimal_text(unscaled: int, scale: int) -> str:
    return format(Decimal(unscaled).scaleb(-scale, _EXACT), "f")


def _bytes_int(text: str) -> int:
    return int.from_bytes(base64.b64decode(text), "big", signed=True)


def _clock(micros: int) -> str:
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    text = f"{sign}{hours:02d}:{minute:02d}:{second:02d}"
    return text + f".{fraction:06d}".rstrip("0") if fraction else text


def _timestamp(micros: int) -> str:
    moment = _EPOCH + dt.timedelta(microseconds=micros)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return text + f".{moment.microsecond:06d}".rstrip("0") if moment.microsecond else text


def _duration(micros: int) -> str:
    """MicroDuration -> ISO-8601 seconds (``PT93600S``): Debezium's months of 30.4375 days make the
    json format's ``P1DT2H`` unrecoverable, but the length is the same."""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    text = f"PT{seconds}" + (f".{fraction:06d}".rstrip("0") if fraction else "") + "S"
    return "-" + text if micros < 0 else text


def _converter(schema: dict) -> Callable[[Any], Any] | None:
    """How to turn a value of this field schema back into the json format's form (None: as is)."""
    name = schema.get("name")
    kind = schema.get("type")
    if name == t.DECIMAL:
        scale = int((schema.get("parameters") or {}).get("scale", 0))
        return lambda v: _decimal_text(_bytes_int(v), scale)
    if name == t.VARIABLE_SCALE_DECIMAL:
        return lambda v: _decimal_text(_bytes_int(v["value"]), v["scale"])
    if name in (t.DATE, t.CONNECT_DATE):
        return lambda v: (_EPOCH_DATE + dt.timedelta(days=v)).isoformat()
    if name in (t.TIME_MS, t.CONNECT_TIME):
        return lambda v: _clock(v * 1000)
    if name == t.MICRO_TIME:
        return _clock
    if name in (t.TIMESTAMP_MS, t.CONNECT_TIMESTAMP):
        return lambda v: _timestamp(v * 1000)
    if name == t.MICRO_TIMESTAMP:
        return _timestamp
    if name == t.MICRO_DURATION:
        return _duration
    if name == t.JSON:
        return orjson.loads
    if name == t.ENUM_SET:
        return lambda v: v.split(",") if v else []
    if name == t.BITS:
        return lambda v: int.from_bytes(base64.b64decode(v), "little")
    if kind == "array":
        inner = _converter(schema.get("items") or {})
        return None if inner is None else (lambda values: [None if x is None else inner(x) for x in values])
    return None


def row_converters(row_schema: dict | None) -> list[tuple[str, Callable[[Any], Any]]]:
    fields = (row_schema or {}).get("fields") or []
    out = []
    for field in fields:
        convert = _converter(field)
        if convert is not None:
            out.append((field["field"], convert))
    return out


_CACHE: dict[bytes, tuple] = {}


def _converters_for(schema: dict) -> tuple[list, list]:
    """(before's, after's) converters of an envelope schema, cached by the schema's JSON."""
    signature = orjson.dumps(schema)
    cached = _CACHE.get(signature)
    if cached is None:
        fields = {f.get("field"): f for f in schema.get("fields") or []}
        cached = (row_converters(fields.get("before")), row_converters(fields.get("after")))
        if len(_CACHE) > 1000:
            _CACHE.clear()
        _CACHE[signature] = cached
    return cached


_Row = TypeVar("_Row", dict, None)


def apply_converters(row: _Row, converters: list) -> _Row:
    """``row`` with each (column, convert) of ``converters`` applied in place to its non-null
    value; also the Avro format's mappers (cdc/formats/avro.py)."""
    if row is None or not converters:
        return row
    for name, convert in converters:
        value = row.get(name)
        if value is not None:
            row[name] = convert(value)
    return row


def key_payload(key: dict) -> dict:
    """A Connect JSON key's payload in the json format's forms."""
    payload = key.get("payload")
    if not isinstance(payload, dict):
        raise TypeError(f"a Connect JSON key's payload is {type(payload).__name__}, not an object")
    return apply_converters(payload, row_converters(key["schema"]))


def envelope(value: dict) -> dict:
    """A Connect JSON value's payload as the json format's envelope: rows in its forms, and
    ``source.version``/``schema_version`` from our fields (``cdc_version``/``cdc_schema_version``)."""
    payload = value.get("payload")
    if not isinstance(payload, dict):
        raise TypeError(f"a Connect JSON value's payload is {type(payload).__name__}, not an object")
    before_conv, after_conv = _converters_for(value["schema"])
    return as_envelope(payload, before_conv, after_conv)


def as_envelope(payload: dict, before_conv: list, after_conv: list) -> dict:
    """A Debezium envelope (decoded from Connect JSON or Avro) in the json format's forms: rows
    through their converters, and ``source.version``/``schema_version`` from our fields."""
    payload["before"] = apply_converters(payload.get("before"), before_conv)
    payload["after"] = apply_converters(payload.get("after"), after_conv)
    source = payload.get("source") or {}
    source["connector_version"] = source.get("version")
    source["version"] = source.pop("cdc_version", None)
    schema_version = source.pop("cdc_schema_version", None)
    if schema_version is not None:
        source["schema_version"] = schema_version
    payload["source"] = source
    return payload
