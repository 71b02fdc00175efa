"""Deletes that OpenSearch remembers as long as the topics can replay older writes.

OpenSearch forgets a deleted document's version after ``index.gc_deletes`` (60 s), and sooner
across a node restart (delete tombstones live in memory): a replayed older write would then
create the document again. So a delete is not an OpenSearch delete here. It is an ``index`` of a
*tombstone document* with the delete's version (external, like every write)::

    {"__cdc_deleted": true, "__cdc_version": <version>, "__cdc_deleted_at": <epoch ms>}

It is an ordinary document: its version survives restarts and ``gc_deletes``, so any older write
is refused (409) like a replay. Readers never see it: the alias they query has the filter
``ALIAS_FILTER`` (not deleted), which applies to search, count and scroll. A GET by ``_id``
through the alias does not apply alias filters: such a reader sees the tombstone with
``__cdc_deleted: true`` and must treat it as absent.

A record with a null value (the log's tombstone after a delete) carries its delete's version in
its ``cdc.version`` header (cdc.api.SinkEvent): ``documents.reduce`` makes it that delete, a
tombstone document at that version, refused by anything newer. What follows is for a tombstone
without a version (written before records had headers). When the batch holds the delete itself
it is dropped. Alone, it is dropped too when the runtime read its delete
(``SinkContext.delete_read``: in an earlier batch, or in the run whose commit this one resumed
from): that delete is written with its own version, and a live document for the key can only
come from a later record. Resolving the tombstone against it would be a loss: a run killed after
writing a row inserted again after the delete, replayed with the tombstone alone in its batch,
would write a tombstone document at that row's version, and the replayed row (equal version,
``external``) would be refused. Only when the delete was never read (compacted away while the
sink lagged) is the document's current version read (``mget``) and, if it is a live document, a
tombstone document written with that same version (``external_gte``): only something newer than
the row that was there can replace it.

What this does not cover, for such a tombstone: the delete compacted away AND a run killed after
writing a row inserted again after the tombstone (the row's later record in the same, uncommitted
write), replayed with the tombstone alone. Without a version nothing tells that row from an older
one, so it is resolved against it. A tombstone with its version header is never resolved
(tests/integration/test_opensearch_replayed_tombstone.py, ``..._whose_delete_was_compacted_away_...``).

Purge: tombstone documents older than ``tombstone_retention_hours`` are deleted (delete by query,
at most every tenth of the retention, and at most hourly). By then the topic's compaction has
dropped the older records of the key (``delete.retention.ms`` must not be longer), so no replay
can carry an older write of it.
"""

from __future__ import annotations

import time
from typing import Any

from sinks.opensearch.mapping import DELETED_AT_FIELD, DELETED_FIELD, VERSION_FIELD

ALIAS_FILTER: dict[str, Any] = {"bool": {"must_not": [{"term": {DELETED_FIELD: True}}]}}


def tombstone_body(version: int) -> dict[str, Any]:
    return {DELETED_FIELD: True, VERSION_FIELD: version, DELETED_AT_FIELD: int(time.time() * 1000)}


def live_versions(client, index: str, doc_ids: list[str]) -> dict[str, int]:
    """_id -> version of the documents that exist and are not tombstones."""
    if not doc_ids:
        return {}
    answer = client.mget(index=index, body={"ids": doc_ids},
                         params={"_source_includes": DELETED_FIELD, "realtime": "true"})
    found = {}
    for doc in answer["docs"]:
        if doc.get("found") and not (doc.get("_source") or {}).get(DELETED_FIELD):
            found[doc["_id"]] = doc["_version"]
    return found


def purge_query(retention_hours: float) -> dict[str, Any]:
    cutoff = int((time.time() - retention_hours * 3600) * 1000)
    return {"query": {"bool": {"filter": [{"term": {DELETED_FIELD: True}},
                                          {"range": {DELETED_AT_FIELD: {"lt": cutoff}}}]}}}


def retention_hours(configured: float | None, delete_retention_ms: int | None) -> float:
    """How long deletes are remembered: the configured hours, else the topic's
    delete.retention.ms (what the log can replay), else 24 h (Kafka's default)."""
    if configured is not None:
        return configured
    return delete_retention_ms / 3_600_000 if delete_retention_ms is not None else 24.0


def purge(client, index: str, retention_hours: float) -> int:
    """Delete tombstone documents older than the retention; returns how many went."""
    # An index deleted by hand (or never made: a table with no rows yet) has nothing to purge.
    answer = client.delete_by_query(index=index, body=purge_query(retention_hours),
                                    params={"conflicts": "proceed", "refresh": "true", "ignore_unavailable": "true"})
    return int(answer.get("deleted", 0))
