"""Key names: one key per row, its version companion, the generation namespaces, the meta keys.

A row's key is the config's template, by default ``<prefix>:<schema>.<table>:<primary key>``, in
the namespace of the generation being written (see generations.py): generation 1 is ``<prefix>``
itself, generation N > 1 is ``<prefix>.g<N>``, and ``<prefix>.generation`` (outside both) names
the one readers should use.

The primary key is encoded stably: its columns in the source's key order (the order of the
record key's JSON object), each value as text, joined by ``:``. Text: strings as they are, integers
and exact numerics in decimal, ``true``/``false``, floats as Python's shortest repr, JSON values as
compact JSON with sorted keys, and NULL as ``%N``. In every component ``%``, ``:``, ``{`` and ``}``
are percent-encoded (``%25 %3A %7B %7D``), so a composite key cannot be confused with a value that
contains the separator, and no key has a hash tag the user did not write. Examples: ``{"id": 42}``
-> ``42``; ``{"tenant": "a:b", "id": 7}`` -> ``a%3Ab:7``. Schema and table names are encoded the
same way.

The version of a row lives beside it, never in it, so readers of the value see only the row: the
companion ``<namespace>:v:{<row key>}`` holds ``<version>`` while the row is live and ``D<version>``
(with an expiry) after a delete. Its hash tag is the whole row key, so in a Redis Cluster both keys
hash to the same slot and one script call may touch both.
"""

from __future__ import annotations

from typing import Any

import orjson

_ESCAPES = str.maketrans({"%": "%25", ":": "%3A", "{": "%7B", "}": "%7D"})
NULL = "%N"


def encode_component(value: Any) -> str:
    if value is None:
        return NULL
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        text = value
    elif isinstance(value, int):
        return str(value)
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return text.translate(_ESCAPES)


def encode_key(key: dict[str, Any]) -> str:
    """The record key (primary-key columns in key order) as one stable string."""
    if len(key) == 1:
        for value in key.values():
            if type(value) is int:
                return str(value)
    return ":".join(encode_component(value) for value in key.values())


def decode_key(text: str) -> tuple:
    """An encoded primary key (``encode_key``) back to its components, as text (None for NULL)."""
    return tuple(None if part == NULL else part.replace("%3A", ":").replace("%7B", "{").replace("%7D", "}")
                 .replace("%25", "%") for part in text.split(":"))


def namespace(prefix: str, generation: int) -> str:
    return prefix if generation == 1 else f"{prefix}.g{generation}"


def generation_pointer(prefix: str) -> str:
    """The key naming the generation readers use (absent: generation 1)."""
    return f"{prefix}.generation"


def applied_key(ns: str, source: str) -> str:
    return f"{ns}:applied:{source}"


def stats_key(ns: str) -> str:
    return f"{ns}:stats"


def companion(row_key: str) -> str:
    """The version companion of ``row_key`` (same hash slot: the row key is its hash tag)."""
    ns_end = row_key.index(":")
    return f"{row_key[:ns_end]}:v:{{{row_key}}}"


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class KeySpace:
    """Row keys of one generation namespace, from the config's template."""

    def __init__(self, template: str, ns: str) -> None:
        self.template = template
        self.ns = ns
        self._tables: dict[tuple[str, str], tuple[str, str]] = {}

    def parts(self, schema: str, table: str) -> tuple[str, str]:
        """The template around ``{key}`` for one table, formatted once."""
        parts = self._tables.get((schema, table))
        if parts is None:
            head, tail = self.template.split("{key}", 1)
            names = {"prefix": self.ns, "schema": encode_component(schema), "table": encode_component(table)}
            parts = self._tables[(schema, table)] = (head.format(**names), tail.format(**names))
        return parts

    def table_prefix(self, schema: str, table: str) -> str:
        """Everything of a row key before the encoded primary key (the template up to ``{key}``)."""
        return self.parts(schema, table)[0]

    def row_key(self, schema: str, table: str, key: dict[str, Any]) -> str:
        head, tail = self.parts(schema, table)
        return head + encode_key(key) + tail

    def table_pattern(self, schema: str, table: str) -> str:
        """A SCAN pattern matching the row keys of one table (and nothing else of the template)."""
        head, tail = self.parts(schema, table)
        return _glob_escape(head) + "*" + _glob_escape(tail)

    def namespace_pattern(self) -> str:
        return _glob_escape(self.ns) + ":*"
