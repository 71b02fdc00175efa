"""Kafka Connect schemas -> Avro schemas, as Confluent's ``AvroData`` (the converter Debezium's
``AvroConverter`` uses) writes them, and the Connect schema back from such an Avro schema.

The ``avro`` format encodes the same Connect schema the ``debezium-json`` format writes
(``debezium_json.TableFormat``), so names and logical types are Debezium's:

* a struct is a record named by its Connect name, split at the last dot into namespace and name
  (``cdc.public.items.Value`` -> namespace ``cdc.public.items``, name ``Value``); characters Avro
  does not allow in a name become ``_`` (Debezium's ``schema.name.adjustment.mode=avro``);
* an optional field is a union with ``null`` first and default null; a field with a default puts
  the default's branch first;
* Connect's own logical types carry Avro's (``decimal``, ``date``, ``time-millis``,
  ``timestamp-millis``); every named type keeps its Connect name, version and parameters in
  ``connect.name``, ``connect.version`` and ``connect.parameters``, which is how a reader
  (Connect's Avro converters, ``to_connect`` here) knows an ``io.debezium.time.MicroTimestamp``
  from a plain long; ``int8``/``int16`` are Avro ints marked ``connect.type``.
"""

from __future__ import annotations

import re
from typing import Any

from cdc.errors import FormatError

_PRIMITIVE = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
              "float": "float", "float64": "double", "double": "double", "boolean": "boolean",
              "string": "string", "bytes": "bytes"}
_LOGICAL = {"org.apache.kafka.connect.data.Date": "date", "org.apache.kafka.connect.data.Time": "time-millis",
            "org.apache.kafka.connect.data.Timestamp": "timestamp-millis"}
DECIMAL = "org.apache.kafka.connect.data.Decimal"
DEFAULT_PRECISION = 64  # AvroData's precision for a Decimal whose schema gives none
_INVALID = re.compile(r"[^A-Za-z0-9_]")
_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def avro_name(part: str) -> str:
    """One part of a record name in Avro's alphabet (``_`` for anything else, ``_`` before a digit)."""
    cleaned = _INVALID.sub("_", part)
    return "_" + cleaned if not cleaned or cleaned[0].isdigit() else cleaned


def _full_name(connect_name: str) -> tuple[str, str | None]:
    namespace, _, name = connect_name.rpartition(".")
    return avro_name(name), ".".join(avro_name(p) for p in namespace.split(".")) if namespace else None


class _Converter:
    """One top-level conversion: a record defined once is referred to by its full name after."""

    def __init__(self) -> None:
        self.defined: set[str] = set()

    def schema(self, connect: dict) -> Any:
        kind = connect["type"]
        name = connect.get("name")
        if kind == "struct":
            return self._record(connect)
        if kind == "array":
            return {"type": "array", "items": self.optional(connect["items"])}
        if kind == "map":
            return {"type": "map", "values": self.optional(connect["values"])}
        base = _PRIMITIVE.get(kind)
        if base is None:
            raise FormatError(f"Connect type {kind!r} has no Avro form")
        out: dict[str, Any] = {"type": base}
        if kind in ("int8", "int16"):
            out["connect.type"] = kind
        if name is None and len(out) == 1:
            return base
        if name is not None:
            self._connect_attributes(connect, out)
            if name == DECIMAL:
                parameters = connect.get("parameters") or {}
                out["scale"] = int(parameters.get("scale", 0))
                out["precision"] = int(parameters.get("connect.decimal.precision", DEFAULT_PRECISION))
                out["logicalType"] = "decimal"
            elif name in _LOGICAL:
                out["logicalType"] = _LOGICAL[name]
        return out

    @staticmethod
    def _connect_attributes(connect: dict, out: dict) -> None:
        if connect.get("version") is not None:
            out["connect.version"] = connect["version"]
        if connect.get("doc") is not None:
            out["connect.doc"] = connect["doc"]
        if connect.get("parameters"):
            out["connect.parameters"] = dict(connect["parameters"])
        out["connect.name"] = connect["name"]

    def _record(self, connect: dict) -> Any:
        connect_name = connect.get("name") or "io.confluent.connect.avro.ConnectDefault"
        name, namespace = _full_name(connect_name)
        full = f"{namespace}.{name}" if namespace else name
        if full in self.defined:
            return full
        self.defined.add(full)
        fields = []
        for field in connect.get("fields") or []:
            if not _VALID_NAME.match(field["field"]):
                raise FormatError(f"column {field['field']!r} of {connect_name} is not a valid Avro field name "
                                  "(letters, digits and _, not starting with a digit): the avro format cannot "
                                  "carry it; use the json or debezium-json format for this table")
            fields.append({"name": field["field"], **self._field_type(field)})
        record: dict[str, Any] = {"type": "record", "name": name}
        if namespace:
            record["namespace"] = namespace
        record["fields"] = fields
        if connect.get("doc") is not None:
            record["doc"] = connect["doc"]
        if connect.get("version") is not None:
            record["connect.version"] = connect["version"]
        if connect.get("parameters"):
            record["connect.parameters"] = dict(connect["parameters"])
        record["connect.name"] = connect_name
        return record

    def optional(self, connect: dict) -> Any:
        inner = self.schema(connect)
        return ["null", inner] if connect.get("optional") else inner

    def _field_type(self, connect: dict) -> dict:
        inner = self.schema(connect)
        default = connect.get("default")
        if not connect.get("optional"):
            return {"type": inner} if default is None else {"type": inner, "default": default}
        if default is None:
            return {"type": ["null", inner], "default": None}
        return {"type": [inner, "null"], "default": default}


def to_avro(connect: dict) -> Any:
    """The Avro schema (a JSON-able value) of a Connect schema."""
    return _Converter().schema(connect)


# --- back: Avro -> the Connect schema a reader needs ------------------------------------------

_BACK = {"int": "int32", "long": "int64", "float": "float", "double": "double", "boolean": "boolean",
         "string": "string", "bytes": "bytes"}


def to_connect(avro: Any, named: dict[str, dict] | None = None) -> dict:
    """The Connect schema (``type``, ``name``, ``parameters``, ``fields``/``items``, ``optional``) an
    Avro schema written by ``to_avro`` (or by Confluent's or Apicurio's converters) stands for."""
    named = {} if named is None else named
    if isinstance(avro, str):
        if avro in named:
            return named[avro]
        return {"type": _BACK.get(avro, avro)}
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        inner = to_connect(branches[0], named) if len(branches) == 1 else {"type": "union"}
        return {**inner, "optional": "null" in avro}
    kind = avro["type"]
    if kind == "record":
        namespace = avro.get("namespace")
        full = avro["name"] if "." in avro["name"] or not namespace else f"{namespace}.{avro['name']}"
        out: dict[str, Any] = {"type": "struct", "name": avro.get("connect.name", full)}
        named[full] = out
        out["fields"] = [{**to_connect(f["type"], named), "field": f["name"]} for f in avro["fields"]]
        return out
    if kind == "array":
        return {"type": "array", "items": to_connect(avro["items"], named)}
    if kind == "map":
        return {"type": "map", "values": to_connect(avro["values"], named)}
    if isinstance(kind, (dict, list)):
        return to_connect(kind, named)
    out = {"type": avro.get("connect.type") or _BACK.get(kind, kind)}
    if "connect.name" in avro:
        out["name"] = avro["connect.name"]
    if "connect.parameters" in avro:
        out["parameters"] = avro["connect.parameters"]
    return out
