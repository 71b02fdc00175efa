"""Key families: which source column types encode their values alike in the change events.

A foreign key finds the row it references by comparing encoded values: the state keeps each row
under the canonical bytes of its key, and looks a reference up by the bytes of its foreign key
columns. So a foreign key column must be of the same family as the key column it references, or
the two would never meet (an integer ``42`` is not the text ``"42"``). The families follow the
event contract's encodings (docs/wire-formats.md):

============  =============================================================  ====================
family        source types                                                   encoded as
============  =============================================================  ====================
integer       smallint, integer, bigint, serial..., MySQL tinyint..bigint    JSON number
numeric(s)    numeric/decimal of scale s (``numeric``: no scale given)       text, s decimals
text          text, varchar, char, bpchar, name, citext, MySQL *text, enum   text
uuid          uuid                                                           text
date          date                                                           ``YYYY-MM-DD``
timestamp     timestamp without time zone, MySQL datetime                    ISO-8601, no offset
timestamptz   timestamp with time zone, MySQL timestamp (an instant)         ISO-8601 UTC
binary        bytea, blob, binary, varbinary                                 base64
============  =============================================================  ====================

Any other type is a family of its own name (``boolean``, ``inet``, ``time``...): it matches only
itself.
"""

from __future__ import annotations

import re

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
    args = [a.strip() for a in (match.group(2) or "").split(",") if a.strip()]
    if name in _INTEGERS:
        return "integer"
    if name in _NUMERICS:
        if not args:
            # MySQL prints decimal(10,0) for a bare DECIMAL; PostgreSQL's bare numeric has no scale.
            return "numeric"
        return f"numeric({args[1] if len(args) > 1 else 0})"
    if name in _TEXTS:
        return "text"
    return _FAMILIES.get(name, name)
