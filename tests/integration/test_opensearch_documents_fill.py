"""A joined documents' generation filled by a rebuild (sinks/opensearch/doc_sink.py): written
without periodic refreshes while nobody reads it, and given the document's refresh_interval (or
OpenSearch's default) back before the alias moves to it. The same as the table sink does
(tests/integration/test_opensearch_sink.py): a refresh a second cost the node a fifth to a
quarter of its CPU per document in a bulk fill."""

from __future__ import annotations

import uuid

import pytest
from opensearchpy import OpenSearch

from cdc.api import Op, SinkEvent
from cdc.api.context import StandaloneSinkContext
from sinks.opensearch.config import OpenSearchSinkConfig
from sinks.opensearch.doc_sink import OpenSearchDocumentSink

pytestmark = pytest.mark.opensearch

SHAPES = {"public.customers": [("id", "integer", True), ("name", "text", False)],
          "public.orders": [("id", "integer", True), ("customer_id", "integer", False)]}


class Shop(StandaloneSinkContext):
    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        schema, table = topic.split(".", 1)[1].split(".")
        return {"source": "shop", "db": "shop", "schema": schema, "table": table, "version": 1,
                "columns": [{"name": n, "type": t, "key": k} for n, t, k in SHAPES[f"{schema}.{table}"]]}


def _refresh_interval(client: OpenSearch, index: str):
    return client.indices.get_settings(index=index)[index]["settings"]["index"].get("refresh_interval")


@pytest.mark.parametrize("configured", [None, "7s"])
def test_a_filled_generation_has_no_periodic_refresh_until_the_switch(opensearch_url, tmp_path, configured):
    prefix = f"fill{uuid.uuid4().hex[:6]}"
    alias = f"{prefix}-orders"
    config = OpenSearchSinkConfig.model_validate(
        {"name": prefix, "type": "opensearch", "hosts": [opensearch_url], "topics": [f"{prefix}.public.*"],
         "state_dir": str(tmp_path), "documents": [{
             "name": alias, "table": "public.orders",
             **({"settings": {"index": {"refresh_interval": configured}}} if configured else {}),
             "lookups": [{"table": "public.customers", "as": "customer", "foreign_key": ["customer_id"]}]}]})
    events = [SinkEvent(f"{prefix}.public.customers", 0, 0, {"id": 1}, Op.READ, None, {"id": 1, "name": "ann"}, 1,
                        {"table": "customers", "schema": "public"}),
              SinkEvent(f"{prefix}.public.orders", 0, 0, {"id": 7}, Op.READ, None, {"id": 7, "customer_id": 1}, 2,
                        {"table": "orders", "schema": "public"})]
    client = OpenSearch(opensearch_url)
    sink = OpenSearchDocumentSink(config)
    sink.attach(Shop(prefix, prefix))
    sink.start()
    try:
        generation = sink.current_generation() + 1
        sink.open_generation(generation)
        sink.write(events)
        send, while_written = sink._send, []

        def observed(docs, generation):  # the switch writes every document, then moves the alias
            while_written.append(_refresh_interval(client, f"{alias}__g{generation}"))
            return send(docs, generation)
        sink._send = observed  # type: ignore[method-assign]
        sink.switch_generation(generation)
        assert while_written == ["-1"]
        (live,) = client.indices.get_alias(name=alias)
        assert live == f"{alias}__g{generation}"
        assert _refresh_interval(client, live) == configured
        found = client.get(index=alias, id="7")["_source"]
        assert found["customer"] == {"id": 1, "name": "ann"} and found["customer_id"] == 1
    finally:
        sink.stop()
        client.indices.delete(index=f"{alias}*", params={"ignore_unavailable": "true"})


def test_tombstone_documents_of_deleted_documents_are_purged_after_their_retention(opensearch_url, tmp_path):
    """A deleted order leaves a tombstone document (hidden by the alias); while the sink is caught
    up, ``maintain`` deletes those older than the retention, and the order inserted again later
    comes back at its version. Live documents stay."""
    prefix = f"purge{uuid.uuid4().hex[:6]}"
    alias = f"{prefix}-orders"
    config = OpenSearchSinkConfig.model_validate(
        {"name": prefix, "type": "opensearch", "hosts": [opensearch_url], "topics": [f"{prefix}.public.*"],
         "state_dir": str(tmp_path), "tombstone_retention_hours": 1e-9,  # every tombstone is older than that
         "documents": [{"name": alias, "table": "public.orders"}]})

    def order(offset: int, order_id: int, version: int, op: Op = Op.CREATE) -> SinkEvent:
        after = None if op is Op.DELETE else {"id": order_id, "customer_id": version}
        return SinkEvent(f"{prefix}.public.orders", 0, offset, {"id": order_id}, op, None, after, version,
                         {"table": "orders", "schema": "public"})

    client = OpenSearch(opensearch_url)
    sink = OpenSearchDocumentSink(config)
    sink.attach(Shop(prefix, prefix))
    sink.start()
    tombstones = {"query": {"term": {"__cdc_deleted": True}}}
    try:
        sink.write([order(0, 7, 10), order(1, 8, 11)])
        sink.write([order(2, 7, 12, Op.DELETE)])
        index = f"{alias}__g{sink.current_generation()}"
        client.indices.refresh(index=index)
        assert client.count(index=index, body=tombstones)["count"] == 1
        sink.maintain()
        assert client.count(index=index, body=tombstones)["count"] == 0
        assert client.count(index=index)["count"] == 1  # order 8 stays
        # Versions are log positions: the next change of a key is many past its delete (the purge's
        # own delete holds the tombstone's version + 1 for index.gc_deletes).
        sink.write([order(3, 7, 40)])
        client.indices.refresh(index=index)
        found = client.get(index=alias, id="7")
        assert found["_source"]["customer_id"] == 40 and found["_version"] == 40
        assert sink.counters["conflicts"] == 0
    finally:
        sink.stop()
        client.indices.delete(index=f"{alias}*", params={"ignore_unavailable": "true"})
