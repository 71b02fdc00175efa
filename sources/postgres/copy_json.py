"""The snapshot's row JSON made in the reader from plain COPY text, instead of by the server.

The snapshot reads a table whose every column has a server-side JSON expression
(``types/server_json.py``) as ``COPY (SELECT <keys>, row_to_json(...), <TOAST checks>) TO STDOUT``
(``snapshot.py``). Measured on bench/pg_snapshot.py's table, that statement costs the server
about 3.2 us of CPU per row against 0.55 us for a plain ``COPY (SELECT <columns>)``: the JSON
functions, not the reading, were the server's share of the snapshot. So where ``_copyjson.c``
was built, the reader runs the plain COPY and ``CopyJson`` turns each block of its lines into the
lines the server would have printed for the statement, byte for byte: the key fields as they
were, the row JSON as ``row_to_json`` writes it (``escape_json``'s escapes, numbers bare when they
are valid JSON numbers, ``true``/``false``), COPY-escaped, and per column that may be TOASTed its
text when it has ``MIN_TOASTABLE_CHARS`` characters or more. Everything after (making events,
the TOAST store, the fallbacks for escapes and long values) is unchanged.

``rewrite_lines`` is the Python twin of the C function, the reference the tests compare it with
(tests/unit/test_pg_copy_json.py) and what raises the typed error for a line the C path refuses.
Without the C build the snapshot keeps the server's statement: the Python twin is slower per row
than the server is.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from cdc import native
from cdc.errors import DecodeError
from sources.postgres.types.catalog import TypeInfo
from sources.postgres.types.server_json import BOOL, BYTEA, FLOAT, RAW, STRING, TIMESTAMP, TIMESTAMPTZ, json_kind

_copyjson = native.load("sources.postgres._copyjson")


def compiled() -> Any:
    """``_copyjson`` where it was built and ``cdc.native`` is on, else None."""
    return _copyjson if native.enabled() else None

_JSON_ESCAPES = {0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x22: '\\"', 0x5C: "\\\\"}
_COPY_UNESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def escape_json(text: str) -> str:
    """``text`` as PostgreSQL's ``escape_json`` writes it (without the quotes)."""
    out = []
    for char in text:
        code = ord(char)
        escaped = _JSON_ESCAPES.get(code)
        if escaped is not None:
            out.append(escaped)
        elif code < 0x20:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def copy_escape(text: str) -> str:
    """``text`` as COPY TO escapes a value (backslash and the control characters it names)."""
    return (text.replace("\\", "\\\\").replace("\b", "\\b").replace("\f", "\\f").replace("\n", "\\n")
            .replace("\r", "\\r").replace("\t", "\\t").replace("\v", "\\v"))


def json_number(text: str) -> bool:
    """PostgreSQL's ``IsValidJsonNumber``: JSON's number grammar over the whole text."""
    i, n = 0, len(text)
    digits = lambda j: j < n and "0" <= text[j] <= "9"  # noqa: E731
    if i < n and text[i] == "-":
        i += 1
    if i < n and text[i] == "0":
        i += 1
    elif i < n and "1" <= text[i] <= "9":
        while digits(i):
            i += 1
    else:
        return False
    if i < n and text[i] == ".":
        i += 1
        if not digits(i):
            return False
        while digits(i):
            i += 1
    if i < n and text[i] in "eE":
        i += 1
        if i < n and text[i] in "+-":
            i += 1
        if not digits(i):
            return False
        while digits(i):
            i += 1
    return i == n


def _unescape(field: str, where: str) -> str:
    out, i, n = [], 0, len(field)
    while i < n:
        char = field[i]
        if char == "\\":
            i += 1
            if i == n or field[i] not in _COPY_UNESCAPES:
                raise DecodeError(f"{where}: COPY escape {field[i - 1:i + 1]!r} is not one the server writes")
            char = _COPY_UNESCAPES[field[i]]
        out.append(char)
        i += 1
    return "".join(out)


def _value(kind: int, field: str, where: str) -> str:
    """One column's JSON (not yet COPY-escaped) from its COPY field (not NULL)."""
    if kind == RAW:
        if not field or "\\" in field:
            raise DecodeError(f"{where}: {field[:100]!r} is not a number")
        return field
    if kind == FLOAT:
        return field if json_number(field) else '"' + escape_json(_unescape(field, where)) + '"'
    if kind == BOOL:
        if field not in ("t", "f"):
            raise DecodeError(f"{where}: {field[:100]!r} is not a bool")
        return "true" if field == "t" else "false"
    if kind == STRING:
        return '"' + escape_json(_unescape(field, where)) + '"'
    if kind in (TIMESTAMP, TIMESTAMPTZ):
        if "\\" in field:
            raise DecodeError(f"{where}: {field[:100]!r} is not a timestamp")
        if kind == TIMESTAMP:
            return '"' + (field if field.endswith("C") else field.replace(" ", "T")) + '"'
        return '"' + (field[:-3].replace(" ", "T") + "Z" if field.endswith("+00") else field) + '"'
    if kind == BYTEA:
        hexa = field[3:]
        if not field.startswith("\\\\x") or len(hexa) % 2:
            raise DecodeError(f"{where}: {field[:100]!r} is not bytea in hex")
        try:
            return '"' + base64.b64encode(bytes.fromhex(hexa)).decode() + '"'
        except ValueError as err:
            raise DecodeError(f"{where}: {field[:100]!r} is not bytea in hex") from err
    raise ValueError(f"unknown column kind {kind}")


@dataclass(frozen=True)
class CopyJson:
    """How one table's plain COPY lines become the snapshot statement's lines. Picklable (it goes
    to the reader processes with their tasks)."""

    table: str
    kinds: bytes               # one kind per column (types/server_json.py)
    heads: tuple[bytes, ...]   # before each value: '{"id":', ',"name":' (COPY-escaped)
    keys: tuple[int, ...]      # the key columns' indexes
    toast: tuple[int, ...]     # the indexes of the columns that may be TOASTed
    min_chars: int

    @classmethod
    def for_table(cls, table: str, columns: list[tuple[str, int]], catalog: Mapping[int, TypeInfo],
                  keys: list[int], toast: list[int], min_chars: int) -> CopyJson | None:
        """For ``columns`` (name, type oid); None where a column has no kind (the server's
        expressions do not serve the table either) or the C function was not built."""
        kinds = [json_kind(oid, catalog) for _, oid in columns]
        if compiled() is None or None in kinds:
            return None
        return cls.of(table, [name for name, _ in columns], cast(list[int], kinds), keys, toast, min_chars)

    @classmethod
    def of(cls, table: str, names: list[str], kinds: list[int], keys: list[int], toast: list[int],
           min_chars: int) -> CopyJson:
        heads = tuple(copy_escape(("{" if i == 0 else ",") + '"' + escape_json(name) + '":').encode()
                      for i, name in enumerate(names))
        return cls(table, bytes(kinds), heads, tuple(keys), tuple(toast), min_chars)

    def __call__(self, block: bytes) -> bytes:
        """The statement's lines for ``block`` (whole lines, each ending in a newline)."""
        if (c := compiled()) is not None:
            out = c.rewrite(block, self.kinds, self.heads, self.keys, self.toast, self.min_chars)
            if out is not None:
                return out
        return self.rewrite_lines(block)  # the reference, which names what is wrong

    def rewrite_lines(self, block: bytes) -> bytes:
        """The Python twin of ``_copyjson.rewrite``."""
        out = []
        for number, line in enumerate(block.split(b"\n")[:-1], 1):
            where = f"{self.table}: COPY line {number} of a block"
            try:
                fields = line.decode("utf-8").split("\t")
            except UnicodeDecodeError as err:
                raise DecodeError(f"{where} is not UTF-8: {err}") from err
            if len(fields) != len(self.kinds):
                raise DecodeError(f"{where} has {len(fields)} fields, not {len(self.kinds)}")
            parts = [fields[k] + "\t" for k in self.keys]
            row = []
            for kind, head, field in zip(self.kinds, self.heads, fields):
                row.append(head.decode())
                row.append("null" if field == "\\N" else copy_escape(_value(kind, field, where)))
            parts.append("".join(row) + "}")
            for index in self.toast:
                field = fields[index]
                long = field != "\\N" and len(_unescape(field, where)) >= self.min_chars
                parts.append("\t" + (field if long else ""))
            out.append("".join(parts) + "\n")
        return "".join(out).encode()
