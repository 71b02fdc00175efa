"""Key families, and the canonical bytes of keys and foreign keys in the documents' state.

A foreign key finds the row it references by comparing encoded values: the state keeps each row
under the canonical bytes of its key, and looks a reference up by the bytes of its foreign key
columns. So a foreign key column must be of the same family as the key column it references, or
the two would never meet (an integer ``42`` is not the text ``"42"``). The families follow the
event contract's encodings (docs/wire-formats.md):

============  =============================================================  ====================
family        source types                                                   encoded as
============  =============================================================  ====================
integer       smallint, integer, bigint, serial..., MySQL tinyint..bigint    JSON number
numeric       numeric, decimal (any precision and scale)                     text (normalised)
text          text, varchar, char, bpchar, name, citext, MySQL *text, enum   text
uuid          uuid                                                           text
date          date                                                           ``YYYY-MM-DD``
timestamp     timestamp without time zone, MySQL datetime                    ISO-8601, no offset
timestamptz   timestamp with time zone, MySQL timestamp (an instant)         ISO-8601 UTC
binary        bytea, blob, binary, varbinary                                 base64
============  =============================================================  ====================

Any other type is a family of its own name (``boolean``, ``inet``, ``time``...): it matches only
itself.

``key_bytes(values, families)`` is what the state stores a row under and looks a reference up
by: the JSON array of the values, each in a canonical form of its family, so that values the
source holds equal encode alike. A foreign key is encoded with the families of the key it
references (``cdc validate`` made sure they are its own), so ``key_bytes`` of a child's foreign
key equals ``key_bytes`` of its parent's key exactly when the source would join them. A null
anywhere is no reference at all (None): a child with a null foreign key is in no document, a
lookup through one is null.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

_INTEGERS = set("smallint integer int bigint int2 int4 int8 tinyint mediumint serial bigserial smallserial "
                "serial2 serial4 serial8 oid year".split())
_NUMERICS = {"numeric", "decimal", "dec", "fixed"}
_TEXTS = {"text", "character varying", "varchar", "character", "char", "bpchar", "name", "citext",
          "tinytext", "mediumtext", "longtext", "nvarchar", "nchar"}
_FAMILIES = {"uuid": "uuid", "date": "date", "timestamp without time zone": "timestamp", "datetime": "timestamp",
             "timestamp with time zone": "timestamptz", "timestamptz": "timestamptz",
             # MySQL's bare timestamp is an instant, sent as UTC like PostgreSQL's timestamptz.
             "timestamp": "timestamptz",
             "bytea": "binary", "blob": "binary", "tinyblob": "binary", "mediumblob": "binary",
             "longblob": "binary", "binary": "binary", "varbinary": "binary",
             "bool": "boolean", "boolean": "boolean"}
# "name(args) suffix words": numeric(10,2), timestamp(3) with time zone, int(11) unsigned
_TYPE = re.compile(r"([a-z][a-z0-9_ ]*?)\s*(?:\(([^()]*)\))?((?:\s+[a-z]+)*)\s*")


def key_family(type_name: str) -> str:
    """The family of a source type name as a schema record prints it (see the table above)."""
    text = type_name.strip().lower()
    if text.startswith(("enum(", "set(")):
        return "text" if text.startswith("enum(") else "set"
    match = _TYPE.fullmatch(text)
    if match is None or text.endswith("]"):
        return text  # arrays and anything exotic: only the very same type
    words = f"{match.group(1)} {match.group(3)}".split()
    name = " ".join(w for w in words if w not in ("unsigned", "zerofill"))
    if name in _INTEGERS:
        return "integer"
    if name in _NUMERICS:
        # Of any scale: their keys are normalised (canonical), so 5.00 meets 5 as in the source.
        return "numeric"
    if name in _TEXTS:
        return "text"
    return _FAMILIES.get(name, name)


def canonical(value: Any, family: str) -> Any:
    """``value`` (as the change event carries it) in the one form equal source values share."""
    if family.startswith("numeric") and isinstance(value, (str, int)) and not isinstance(value, bool):
        # 1.50 = 1.5 in numeric without a scale (the source keeps the scale it was given); 1E+2 is 100.
        try:
            number = Decimal(value)
        except InvalidOperation:
            return value  # NaN spelled otherwise, or a value the contract does not know: as it came
        if not number.is_finite():
            return value
        text = format(number.normalize(), "f")
        return "0" if text == "-0" else text
    if family == "uuid" and isinstance(value, str):
        return value.lower()
    return value


def key_bytes(values: Sequence[Any], families: Sequence[str]) -> bytes | None:
    """The canonical bytes of a key (or of a foreign key, with its referenced key's ``families``),
    or None when a value is null: a null references nothing."""
    if None in values:
        return None
    if len(values) != len(families):
        raise ValueError(f"{len(values)} key values for {len(families)} key columns")
    if all(family in _AS_THEY_ARE for family in families):
        return orjson.dumps(values if isinstance(values, list) else list(values))
    return orjson.dumps([canonical(value, family) for value, family in zip(values, families, strict=True)])


# Families whose values the events carry in their one canonical form already (canonical() is
# the identity for them): the common integer and text keys skip it.
_AS_THEY_ARE = frozenset({"integer", "text", "date", "timestamp", "timestamptz", "binary", "boolean"})


def key_encoder(columns: Sequence[str], families: Sequence[str]) -> Callable[[Mapping[str, Any]], bytes | None]:
    """``key_bytes`` of ``columns`` of a row, as one function made once per key (the usual one
    column integer or text key costs a dict lookup and one ``orjson.dumps``)."""
    names, kinds = tuple(columns), tuple(families)
    if len(names) != len(kinds):
        raise ValueError(f"{len(names)} key columns for {len(kinds)} families")
    dumps = orjson.dumps
    if len(names) == 1 and kinds[0] in _AS_THEY_ARE:
        (name,) = names

        def one(row: Mapping[str, Any]) -> bytes | None:
            value = row.get(name)
            return None if value is None else dumps([value])
        return one
    if all(kind in _AS_THEY_ARE for kind in kinds):
        def many(row: Mapping[str, Any]) -> bytes | None:
            values = [row.get(name) for name in names]
            return None if None in values else dumps(values)
        return many
    return lambda row: key_bytes([row.get(c) for c in names], kinds)
