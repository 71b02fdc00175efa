"""PostgreSQL's upserts staged as typed rows: COPY text lines made from events, one table per shape.

Why: staged as one jsonb document per row, PostgreSQL parsed each document on COPY and then
extracted and cast every column with ``->>`` in the upsert; that was most of a write's time
(bench/sql_upsert.py). Typed, COPY parses each value once, straight into its column type, and the
upsert only moves rows. The Python side stays one pass over the rows with no per-value call in
the common case (a string with no character COPY must escape, an integer, a NULL).

Rows the runtime left as JSON bytes (``SqlSink.raw_rows``, cdc/sink_events.py) never become
dicts: the runtime's compiled ``copy_rows`` (``SinkContext.native``) writes their lines straight
from the bytes, the same lines this module's generated loop writes for the decoded rows
(tests/unit/test_raw_rows.py compares the two), in about a tenth of the time of decoding and
formatting them.

A row's line is ``key JSON, version, column values...`` in COPY's text format: tab-separated,
``\\N`` for NULL, backslash, tab, newline and carriage return escaped. Values are the contract's
JSON forms and the server's input functions read them as they are (ISO timestamps with ``Z``,
exact numerics as strings, ``NaN``/``Infinity``), as the jsonb path's casts did; json/jsonb values
are written as JSON text, binary stays base64 text (decoded by the upsert), and a column that no
longer fits (``schema_policy: ignore``) is NULL. A value that does not fit fails the COPY, which
the sink reports like any data error of the table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable
from typing import Any

import orjson

from cdc.api import SinkEvent
from sinks.sql.plan import ColumnPlan
from sinks.sql.types import Family

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _text(value: Any) -> str:
    """Any non-NULL JSON value as COPY text (the slow path: escapes, non-strings)."""
    kind = value.__class__
    if kind is str:
        return value.translate(_ESCAPES)
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is float:
        return repr(value)
    return orjson.dumps(value).decode().translate(_ESCAPES)


def _json_text(value: Any) -> str:
    return orjson.dumps(value).decode().translate(_ESCAPES)


def stage_type(column: ColumnPlan) -> str:
    """The staging column's type: the target's, except binary (base64 text, decoded later)."""
    return "text" if column.family is Family.BINARY or column.skipped else column.sql_type


def stage_name(index: int, columns: list[ColumnPlan]) -> str:
    """A temporary table per plan position and shape: a session keeps one per shape it met."""
    shape = repr([stage_type(c) for c in columns]).encode()
    return f"cdc_up_{index}_{hashlib.blake2b(shape, digest_size=6).hexdigest()}"


def formatter(columns: list[ColumnPlan], copy_rows: Callable[..., bytes] | None = None
              ) -> Callable[[Iterable[tuple[bytes, SinkEvent]]], bytes]:
    """A function from (key JSON, event) pairs to the COPY text of their rows: rows left as JSON
    bytes through ``copy_rows`` (the C loop, ``NativeCodecs.copy_rows``), decoded ones through
    ``python_formatter``'s. Without ``copy_rows`` the runtime leaves no row as bytes."""
    python = python_formatter(columns)
    if copy_rows is None:
        return python
    names = tuple(c.name for c in columns)
    kinds = b"".join(b"x" if c.skipped else b"j" if c.family is Family.JSON else b"v" for c in columns)

    def format_rows(pairs: Iterable[tuple[bytes, SinkEvent]]) -> bytes:
        decoded: list = []  # the pairs whose row is a dict, left by the C loop for this one
        try:
            text = copy_rows(pairs, names, kinds, _nested_text, decoded)
        except ValueError:  # a member name with an escaped backslash: only the exact name will do
            text = python([(key, event._replace(after=orjson.loads(event.after))) for key, event in pairs
                           if event.after.__class__ is bytes])
            decoded = [(key, event) for key, event in pairs if event.after.__class__ is not bytes]
        return text + python(decoded) if decoded else text

    return format_rows


def _nested_text(span: bytes) -> str:
    """An object, array or json column's value, given as its JSON bytes, as the loop writes it."""
    return _json_text(orjson.loads(span))


def names_outside(rows: list, known: Collection[str],
                  unknown_names: Callable[..., set] | None = None) -> set[str]:
    """The column names the rows (dicts or JSON bytes) carry that are not in ``known``; rows as
    JSON bytes through ``unknown_names`` (``NativeCodecs.unknown_names``) where there is one."""
    raw = [row for row in rows if row.__class__ is bytes]
    missing = set().union(*(row for row in rows if row.__class__ is not bytes)).difference(known) \
        if len(raw) < len(rows) else set()
    if raw:
        if unknown_names is not None:
            missing |= unknown_names(raw, tuple(known), orjson.loads)
        else:
            missing |= set().union(*(orjson.loads(row) for row in raw)).difference(known)
    return missing


def python_formatter(columns: list[ColumnPlan]) -> Callable[[Iterable[tuple[bytes, SinkEvent]]], bytes]:
    """A function from (key JSON, event) pairs with decoded rows to the COPY text of their rows.

    The loop is generated for the columns (as ``collections.namedtuple`` generates its class):
    one dictionary lookup and a test or two per value, no call for a string that needs no
    escaping. Column names enter the code only as ``repr`` literals."""
    values = ["key.decode()", "str(event.version)"]
    for column in columns:
        get = f"(v := row.get({column.name!r}))"
        if column.skipped:
            values.append("'\\\\N'")
        elif column.family is Family.JSON:
            values.append(f"('\\\\N' if {get} is None else json_text(v))")
        elif column.family is Family.INTEGER:
            values.append(f"('\\\\N' if {get} is None else str(v) if v.__class__ is int else text(v))")
        elif column.family in (Family.FLOAT, Family.BOOLEAN):
            values.append(f"('\\\\N' if {get} is None else text(v))")
        else:  # strings in the contract: text, numerics, dates and times, uuids, base64
            values.append(f"('\\\\N' if {get} is None else v if v.__class__ is str and "
                          f"v.isprintable() and '\\\\' not in v else text(v))")
    lines = ["def format_rows(pairs):",
             "    out = []",
             "    append = out.append",
             "    for key, event in pairs:",
             "        row = event.after",
             "        if b'\\\\' in key:",
             "            key = key.replace(b'\\\\', b'\\\\\\\\')",
             f"        append('\\t'.join(({', '.join(values)},)))",
             "    append('')",
             "    return '\\n'.join(out).encode()"]
    namespace: dict[str, Any] = {"text": _text, "json_text": _json_text}
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from names via repr only
    return namespace["format_rows"]
