"""A topic's reduced actions -> bulk items with their NDJSON lines, made in one pass.

The hottest loop of a write: per document, the action line (``index`` with the external version)
and the document (the row, after the table's layout, plus ``__cdc_version``). The document's
JSON is the row's JSON with the version field spliced in before its closing brace: the same
bytes as ``orjson.dumps({**row, VERSION_FIELD: version})`` without copying the row into a new
dict (a row that already has a field of that name is copied, so the version replaces it).

Where setup.py built it, ``_lines.c`` runs this same loop in C (the per-document work around
``orjson.dumps``); this Python loop is the reference, and tests/unit/test_opensearch_lines.py
checks that both make the same items and the same bytes. A row the runtime hands over as its JSON
bytes (``raw_rows``) never becomes a dict in C: its document is the row's bytes with the version
spliced in (or its members picked and renamed by the table layout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from cdc import native
from sinks.opensearch.bulk import Item
from sinks.opensearch.documents import Delete, Upsert
from sinks.opensearch.mapping import VERSION_FIELD
from sinks.opensearch.tombstones import tombstone_body

_OPTION = orjson.OPT_NON_STR_KEYS
_VERSION_KEY = orjson.dumps(VERSION_FIELD)


def _dumps(value: Any) -> bytes:
    """orjson.dumps, with OPT_NON_STR_KEYS only where plain fails (keys that are not strings:
    rare, and the option costs about as much as the rest of the call)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return orjson.dumps(value, option=_OPTION)


def document_json(body: Any, version: int) -> bytes:
    if type(body) is dict and VERSION_FIELD not in body:
        json = _dumps(body)
        return b"%b%b%b:%d}" % (json[:-1], b"," if len(json) > 2 else b"", _VERSION_KEY, version)
    return _dumps({**body, VERSION_FIELD: version})


def _encode(actions: Iterable, index: str, index_json: bytes, floor: int | None,
            body_of: Callable | None, items: list, lines: list, rest: list) -> None:
    new = tuple.__new__
    loads = orjson.loads
    for action in actions:
        kind = type(action)
        if kind is Upsert:
            doc_id, version, row, event = action
            if floor is not None and version < floor:
                continue
            if type(row) is bytes:  # the row's JSON (raw_rows): here, as a dict (C takes the bytes)
                row = loads(row)
            body = row if body_of is None else body_of(row)
            document = document_json(body, version)
        elif kind is Delete:
            doc_id, version, event = action
            if floor is not None and version < floor:
                continue
            body = tombstone_body(version)
            document = _dumps(body)
        else:
            rest.append(action)
            continue
        line = b'{"index":{"_index":%b,"_id":%b,"version":%d,"version_type":"external"}}\n%b\n' % (
            index_json, orjson.dumps(doc_id), version, document)
        items.append(new(Item, (index, doc_id, version, body, event, "external", line)))
        lines.append(line)


def encode(actions: Iterable, index: str, floor: int | None, body_of: Callable | None,
           items: list[Item], lines: list[bytes], fields: tuple | None = None) -> list:
    """Append the items of the upserts and deletes in ``actions`` not older than ``floor`` to
    ``items``, their NDJSON (action line and document) to ``lines``; returns the other actions
    (tombstones, which need a lookup in the index first). ``body_of`` None: the row is the
    document. An item's ``body`` is the document without the version field (it is in ``line``).

    A row may be the JSON bytes of its object (the runtime's ``raw_rows``): the C loop makes its
    document from the bytes (``fields``: the same layout as ``body_of``, ``TableLayout.raw_fields``;
    None with ``body_of`` None), and the item's ``body`` is then the document's JSON bytes; this
    Python loop decodes the row and goes the dict way. Both make documents with the same fields
    and values in the same order (tests/unit/test_opensearch_lines.py)."""
    rest: list = []
    index_json = orjson.dumps(index)
    if _lines is not None and native.enabled():
        _lines.encode(actions if type(actions) is list else list(actions), index, index_json, floor, body_of,
                      items, lines, rest, fields)
    else:
        _encode(actions, index, index_json, floor, body_of, items, lines, rest)
    return rest


_lines = native.load("sinks.opensearch._lines")  # the same loop in C
if _lines is not None:
    _lines.setup(orjson.dumps, _OPTION, Upsert, Delete, Item, tombstone_body, VERSION_FIELD, "external", orjson.loads)

# Whether this sink takes rows as JSON bytes (OpenSearchSink.raw_rows): only where the C loop makes
# their documents; the Python loop would decode each row anyway, as the runtime does.
RAW = _lines is not None
