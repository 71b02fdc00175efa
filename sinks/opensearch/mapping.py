"""Source column types -> OpenSearch field mappings, and whether a new shape fits an index.

A schema record names each column's type as the source prints it: PostgreSQL's ``format_type``
(``integer``, ``numeric(10,2)``, ``timestamp(3) with time zone``, ``text[]``, ``jsonb``) or
MySQL's column type (``int unsigned``, ``decimal(10,2)``, ``datetime(6)``, ``enum('a','b')``).
The table in sinks/opensearch/README.md is the contract; ``field_mapping`` implements it.

Documents keep every value exactly as the event has it (``_source`` is the row): a mapping only
decides how a value is indexed. Hence decimals are ``scaled_float`` (scale <= 6 and precision
<= 15, exact in a double) or ``double``, with a ``keyword`` sub-field ``exact`` holding the exact
text; floats ignore malformed values, so ``"NaN"`` and ``"Infinity"`` stay in ``_source``
unindexed instead of refusing the row.

``compare`` says what a new set of generated properties means for an index's live mapping:
fields to add (a put-mapping call, live), and fields whose definition changed (the index cannot
follow: ``schema_policy`` decides).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

# The sink's own fields. Tombstones carry __cdc_deleted; every document carries __cdc_version
# (the range a truncate clears), so readers can also see which change they look at.
VERSION_FIELD = "__cdc_version"
DELETED_FIELD = "__cdc_deleted"
DELETED_AT_FIELD = "__cdc_deleted_at"
META_PROPERTIES: dict[str, dict] = {
    VERSION_FIELD: {"type": "long"},
    DELETED_FIELD: {"type": "boolean"},
    DELETED_AT_FIELD: {"type": "date", "format": "epoch_millis"},
}

TEXT = {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}
KEYWORD = {"type": "keyword"}
LONG = {"type": "long"}
DOUBLE = {"type": "double", "ignore_malformed": True}
BOOLEAN = {"type": "boolean"}
DATE = {"type": "date", "format": "strict_date"}
DATETIME = {"type": "date", "format": "strict_date_optional_time"}
BINARY = {"type": "binary"}
JSON = {"type": "object", "enabled": False}  # any JSON, kept in _source; `mappings:` may choose flat_object

_INTEGERS = set("smallint integer int bigint int2 int4 int8 tinyint mediumint serial bigserial smallserial "
                "serial2 serial4 serial8 oid year".split())
_FLOATS = set("real float4 float8 float double".split()) | {"double precision"}
_TEXTS = {"text", "character varying", "varchar", "character", "char", "bpchar", "name", "citext",
          "tinytext", "mediumtext", "longtext", "nvarchar", "nchar", "xml"}
_KEYWORDS = {"uuid", "time", "time without time zone", "time with time zone", "timetz", "interval",
             "inet", "cidr", "macaddr", "macaddr8", "money", "bit", "bit varying", "varbit", "set"}
_BINARIES = {"bytea", "blob", "tinyblob", "mediumblob", "longblob", "binary", "varbinary"}
_TYPE = re.compile(r"([a-z][a-z0-9_ ]*?)\s*(?:\(([^()]*)\))?((?:\s+[a-z]+)*)\s*")


def field_mapping(type_name: str) -> dict[str, Any]:
    """The mapping of one column, from its source type name."""
    text = type_name.strip().lower()
    if text.endswith("]"):                       # arrays: OpenSearch fields hold several values
        element = field_mapping(text[: text.index("[")])
        return JSON if element is JSON else element
    if text.startswith("_") or text.endswith("range") or text in ("json", "jsonb", "hstore"):
        return JSON
    if text.startswith("enum("):
        return KEYWORD
    match = _TYPE.fullmatch(text)
    if match is None:
        return TEXT
    words = " ".join(f"{match.group(1)} {match.group(3)}".split())
    unsigned = " unsigned" in words
    name = words.replace(" unsigned", "").replace(" zerofill", "")
    args = [int(a) for a in (match.group(2) or "").split(",") if a.strip().isdigit()]
    if name in _INTEGERS:
        return {"type": "unsigned_long"} if unsigned and name in ("bigint", "int8") else LONG
    if name in ("numeric", "decimal", "dec", "fixed"):
        return _decimal(args)
    if name in _FLOATS:
        return DOUBLE
    if name in ("boolean", "bool") or (name == "tinyint" and args == [1]):
        return BOOLEAN
    if name == "date":
        return DATE
    if name in ("timestamp", "timestamp without time zone", "timestamp with time zone", "timestamptz",
                "datetime"):
        return DATETIME
    if name in _BINARIES:
        return BINARY
    if name in _KEYWORDS:
        return KEYWORD
    return TEXT


def _decimal(args: list[int]) -> dict[str, Any]:
    exact = {"exact": {"type": "keyword"}}
    precision, scale = (args + [0, 0])[:2] if args else (None, None)
    if precision is not None and scale is not None and precision <= 15 and scale <= 6:
        return {"type": "scaled_float", "scaling_factor": 10 ** scale, "fields": exact}
    return {"type": "double", "fields": exact}


@dataclass(frozen=True, slots=True)
class Shape:
    """What an index of one table holds: the generated properties and the user's overrides."""

    properties: dict[str, dict]           # field name -> mapping, the sink's fields included
    dynamic: bool                         # no schema record: let OpenSearch map fields it sees

    @property
    def mappings(self) -> dict[str, Any]:
        return {"dynamic": self.dynamic, "properties": self.properties}


def shape_of(columns: list[dict] | None, fields: dict[str, str], overrides: dict[str, dict]) -> Shape:
    """``columns`` from the schema record (None: no record); ``fields``: column -> field name of
    the columns the document keeps; ``overrides``: field -> the user's mapping."""
    properties = dict(META_PROPERTIES)
    for column in columns or ():
        name = fields.get(column["name"])
        if name is not None:
            properties[name] = field_mapping(column["type"])
    properties.update(overrides)
    return Shape(properties, dynamic=columns is None)


@dataclass(slots=True)
class Difference:
    added: dict[str, dict] = field(default_factory=dict)
    changed: dict[str, tuple[dict, dict]] = field(default_factory=dict)  # field -> (live, wanted)


def compare(live: dict[str, dict], wanted: dict[str, dict]) -> Difference:
    """``live``: the index's properties as OpenSearch returns them; ``wanted``: a new shape's."""
    diff = Difference()
    for name, mapping in wanted.items():
        current = live.get(name)
        if current is None:
            diff.added[name] = mapping
        elif not _same(current, mapping):
            diff.changed[name] = (current, mapping)
    return diff


def _same(live: dict, wanted: dict) -> bool:
    # What decides how a value is indexed; OpenSearch echoes mappings back with defaults left
    # out, numbers as floats and "object" implicit, so the rest is not compared.
    def essence(m: dict) -> tuple:
        kind = m.get("type", "object")
        factor = float(m["scaling_factor"]) if "scaling_factor" in m else None
        return kind, factor, m.get("format"), m.get("enabled", True)
    return essence(live) == essence(wanted)


def fingerprint(*parts: Any) -> str:
    """A short stable digest of the user's mappings and settings (stored in the index's _meta)."""
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
