"""What ``cdc verify`` reads of an OpenSearch sink's store (cdc.api.ReadableSink), through the
alias readers query, and a source row as the document it becomes.

Cost: where the table's key is one integer column kept in the document (``stored_forms`` learns
its field from the rows it is given, before the ranges are asked for), a chunk is one ``range``
query on that field, sorted by it and paged with ``search_after`` (5,000 documents a page), so a
pass reads each document once; a second look is one ``ids`` query. Any other key has no order
OpenSearch can sort by that is ``key_order``: each range then scrolls the whole alias and filters
here (verify such tables with a large ``--chunk``).

``stored_forms`` applies the table's ``include``/``exclude``/``rename`` (documents.TableLayout);
the document is then the row as the event carries it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from cdc.api import StoredRow, in_range, key_order, page
from sinks.opensearch.config import OpenSearchSinkConfig
from sinks.opensearch.documents import TableLayout
from sinks.opensearch.generations import Generations
from sinks.opensearch.mapping import DELETED_AT_FIELD, DELETED_FIELD, VERSION_FIELD
from sinks.opensearch.naming import document_id

PAGE = 5000
OWN_FIELDS = "__cdc_"  # the prefix of the sink's own fields in a document (mapping.py)
OWN_FIELD_NAMES = (VERSION_FIELD, DELETED_FIELD, DELETED_AT_FIELD)
PAGE_FIELDS = "hits.hits._id,hits.hits._source,hits.hits.sort"


class OpenSearchSink(Protocol):
    """What these reads use of the sink (sink.py)."""

    config: OpenSearchSinkConfig
    client: Any
    generations: Generations
    key_fields: dict[str, str]  # topic -> the document field of its one integer key column

    def read_rows(self, topic: str, after: tuple | None = None, limit: int | None = None) -> list[StoredRow]: ...


def stored_forms(sink: OpenSearchSink, topic: str,
                 rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
    layout = _layout(sink, topic)
    out = []
    for key, row in rows:
        if len(key) == 1 and topic not in sink.key_fields:
            [(column, value)] = key.items()
            if type(value) is int and layout.keeps(column):
                sink.key_fields[topic] = layout.options.rename.get(column, column)
        out.append(StoredRow(key_of(document_id(key)), layout.body(dict(row))))
    return out


def read_range(sink: OpenSearchSink, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
    field = sink.key_fields.get(topic)
    alias = _alias(sink, topic)
    if field is None or alias is None or not all(_integer(b) for b in (after, upto) if b is not None):
        return in_range(sink.read_rows(topic), after, upto)
    bounds: dict[str, int] = {}
    if after is not None:
        bounds["gt"] = int(after[0])
    if upto is not None:
        bounds["lte"] = int(upto[0])
    sink.client.indices.refresh(index=alias)  # everything written so far, not only what a refresh showed
    query: dict[str, Any] = {"range": {field: bounds}} if bounds else {"match_all": {}}
    out: list[StoredRow] = []
    last: list | None = None
    while True:
        # Of each hit only what is read here: less to send and to parse. The sink's own fields are
        # dropped here, not by the node: source filtering costs the node a parse and a write of
        # every document (16.5 against 26 us of its CPU a document, bench/results/verify_scale.md).
        body: dict[str, Any] = {"size": PAGE, "query": query, "sort": [{field: "asc"}]}
        if last is not None:
            body["search_after"] = last
        answer = sink.client.search(index=alias, body=body, filter_path=PAGE_FIELDS)
        hits = answer.get("hits", {}).get("hits", [])
        out.extend([StoredRow(key_of(hit["_id"]), _without_own_fields(hit.get("_source", {}))) for hit in hits])
        if len(hits) < PAGE:
            return out  # sorted by the integer field: key_order
        last = hits[-1]["sort"]


def read_keys(sink: OpenSearchSink, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
    alias = _alias(sink, topic)
    if alias is None or not keys:
        return []
    ids = [document_id({str(i): v for i, v in enumerate(key)}) for key in keys]
    sink.client.indices.refresh(index=alias)
    answer = sink.client.search(index=alias, body={"size": len(ids), "query": {"ids": {"values": ids}}})
    wanted = {key_order(key) for key in keys}
    rows = [StoredRow(key_of(hit["_id"]), _fields(hit)) for hit in answer["hits"]["hits"]]
    return page([r for r in rows if key_order(r.key) in wanted], None, None)


def key_of(doc_id: str) -> tuple:
    """The key values a document id spells (naming.document_id)."""
    if doc_id.startswith("["):
        try:
            return tuple(orjson.loads(doc_id))
        except orjson.JSONDecodeError:
            pass
    return (doc_id,)


def _without_own_fields(source: dict) -> dict:
    for name in OWN_FIELD_NAMES:
        source.pop(name, None)
    return source


def _fields(hit: dict) -> dict:
    return {k: v for k, v in hit["_source"].items() if not k.startswith(OWN_FIELDS)}


def _alias(sink: OpenSearchSink, topic: str) -> str | None:
    alias = next((a for a, t in sink.generations.stored_aliases().items() if t == topic), None)
    if alias is None or not sink.client.indices.exists_alias(name=alias):
        return None
    return alias


def _layout(sink: OpenSearchSink, topic: str) -> TableLayout:
    parts = topic.split(".")
    qualified = ".".join(parts[-2:]) if len(parts) > 2 else parts[-1]
    return TableLayout.for_table(sink.config.tables, qualified)


def _integer(bound: tuple) -> bool:
    if len(bound) != 1:
        return False
    try:
        int(bound[0])
    except (TypeError, ValueError):
        return False
    return True
