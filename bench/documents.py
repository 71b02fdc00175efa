"""Joined documents: what the document sink costs beside the one-table sink, same node, same run.

    .venv/bin/cdc dev up --only opensearch
    .venv/bin/python -m bench.documents [--orders 50000] [--items 5] [--updates 20000] [--rounds 2]

A shop of ``--orders`` orders with ``--items`` items each, 1,000 customers, 2,000 products in 50
categories, as change events (what the runtime hands a sink), written in batches of 5,000 events
(the runtime's default), per round:

  plain     the orders table alone through the OpenSearch table sink (an index of orders): the
            documents/s of a one-table sink on the same node.
  streamed  every table's events through the document sink from an empty state, change by change
            (reach, registers, the documents written after each batch): documents/s.
  build     the same events as `cdc bootstrap` and `cdc rebuild` write them (and a new sink's first
            build): a new generation opened, its state loaded without reach, then at the switch
            every document assembled once and written. Documents/s (the load's and the assembly's
            seconds beside it), state rows/s, and the state's bytes per million rows.
  raw       the documents the build made, read back and indexed again into a new index by the
            same bulk writer, already JSON: what the node alone takes, the build's ceiling here.
  updates   ``--updates`` item updates (a quantity each) in batches of 1,000: the time until each
            change's document is written (the sink's write returns once OpenSearch acknowledged);
            half of them one write at a time, half with two writes in flight as the runtime
            submits them (writes_in_flight 2: the next batch stored while the node indexes one).

Prints each figure with the load average, the ratio build/plain (issue 29's target: at least
0.5), and the CPU seconds of this process per document. The comparison with pgsync (issue 29's
other target), end to end from PostgreSQL: bench/pgsync_documents.py.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cdc.api import Op, SinkEvent
from cdc.api.context import StandaloneSinkContext

CUSTOMERS, PRODUCTS, CATEGORIES, BATCH = 1000, 2000, 50, 5000

SHAPES = {
    "public.customers": [("id", "integer", True), ("name", "text", False), ("email", "text", False)],
    "public.categories": [("id", "integer", True), ("name", "text", False)],
    "public.products": [("id", "integer", True), ("sku", "text", False), ("name", "text", False),
                        ("category_id", "integer", False)],
    "public.orders": [("id", "integer", True), ("customer_id", "integer", False), ("status", "text", False),
                      ("note", "text", False)],
    "public.order_items": [("order_id", "integer", True), ("line_no", "integer", True),
                           ("product_id", "integer", False), ("qty", "integer", False)],
}

DOCUMENTS = [{"name": "orders", "table": "public.orders",
              "lookups": [{"table": "public.customers", "as": "customer", "foreign_key": ["customer_id"]}],
              "children": [{"table": "public.order_items", "as": "items", "foreign_key": ["order_id"],
                            "order_by": ["line_no"], "exclude": ["order_id"],
                            "lookups": [{"table": "public.products", "as": "product",
                                         "foreign_key": ["product_id"],
                                         "lookups": [{"table": "public.categories", "as": "category",
                                                      "foreign_key": ["category_id"]}]}]}]}]


class ShopContext(StandaloneSinkContext):
    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        table = topic.split(".", 1)[1]
        schema, name = table.split(".")
        return {"source": "shop", "db": "shop", "schema": schema, "table": name, "version": 1,
                "columns": [{"name": n, "type": t, "key": k} for n, t, k in SHAPES[table]]}

    def dead_letter(self, topic: str, partition: int, offset: int, reason: str,
                    key: bytes | None = None, value: bytes | None = None) -> None:
        raise AssertionError(reason)


def events(prefix: str, orders: int, items: int) -> dict[str, list[SinkEvent]]:
    rng = random.Random(29)
    version = 0
    offsets: dict[str, int] = {}
    out: dict[str, list[SinkEvent]] = {}

    def event(table: str, row: dict[str, Any], op: Op = Op.READ) -> None:
        nonlocal version
        version += 1
        topic = f"{prefix}.{table}"
        offset = offsets.get(topic, 0)
        offsets[topic] = offset + 1
        key = {n: row[n] for n, _, k in SHAPES[table] if k}
        out.setdefault(table, []).append(SinkEvent(topic, 0, offset, key, op, None, row, version,
                                                   {"table": table.split(".")[1], "schema": "public"}))

    for i in range(1, CATEGORIES + 1):
        event("public.categories", {"id": i, "name": f"category {i}"})
    for i in range(1, PRODUCTS + 1):
        event("public.products", {"id": i, "sku": f"SKU-{i:06d}", "name": f"product {i}",
                                  "category_id": rng.randint(1, CATEGORIES)})
    for i in range(1, CUSTOMERS + 1):
        event("public.customers", {"id": i, "name": f"customer {i}", "email": f"c{i}@example.com"})
    for i in range(1, orders + 1):
        event("public.orders", {"id": i, "customer_id": rng.randint(1, CUSTOMERS), "status": "new",
                                "note": f"order {i}"})
        for line in range(1, items + 1):
            event("public.order_items", {"order_id": i, "line_no": line, "product_id": rng.randint(1, PRODUCTS),
                                         "qty": rng.randint(1, 9)})
    return out


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_round(url: str, orders: int, items: int, updates: int, streamed: bool) -> dict[str, float]:
    from opensearchpy import OpenSearch

    from sinks.opensearch.config import OpenSearchSinkConfig
    from sinks.opensearch.doc_sink import OpenSearchDocumentSink
    from sinks.opensearch.sink import OpenSearchSink

    run = uuid.uuid4().hex[:6]
    prefix = f"bench{run}"
    by_table = events(prefix, orders, items)
    folder = Path(tempfile.mkdtemp(prefix="cdc-bench-docs-"))
    client = OpenSearch(url, timeout=120)
    figures: dict[str, float] = {}
    try:
        plain_config = OpenSearchSinkConfig(name=f"{prefix}-plain", type="opensearch", hosts=[url],
                                            topics=[f"{prefix}.public.orders"])
        plain = OpenSearchSink(plain_config)
        plain.attach(ShopContext(plain_config.name, prefix))
        plain.start()
        rows = by_table["public.orders"]
        began, cpu0 = time.perf_counter(), cpu()
        for start in range(0, len(rows), BATCH):
            plain.write(rows[start:start + BATCH])
        figures["plain_docs_s"] = len(rows) / (time.perf_counter() - began)
        figures["plain_cpu_us"] = (cpu() - cpu0) / len(rows) * 1e6
        plain.stop()

        config = OpenSearchSinkConfig.model_validate(
            {"name": f"{prefix}-docs", "type": "opensearch", "hosts": [url], "topics": [f"{prefix}.public.*"],
             "state_dir": str(folder / "state"), "documents": [{**DOCUMENTS[0], "name": f"{prefix}-orders"}]})
        # The lookups' topics first, then orders and items interleaved as one transaction each would be.
        stream = [*by_table["public.categories"], *by_table["public.products"], *by_table["public.customers"]]
        items_of = iter(by_table["public.order_items"])
        for order in by_table["public.orders"]:
            stream.append(order)
            stream.extend(next(items_of) for _ in range(items))
        if streamed:  # the documents kept change by change from an empty state, into the current generation
            sink = OpenSearchDocumentSink(config.model_copy(update={"name": f"{prefix}-streamed"}))
            sink.attach(ShopContext(sink.config.name, prefix))
            sink.start()
            began, cpu0 = time.perf_counter(), cpu()
            for start in range(0, len(stream), BATCH):
                sink.write(stream[start:start + BATCH])
            figures["stream_docs_s"] = orders / (time.perf_counter() - began)
            figures["stream_cpu_us"] = (cpu() - cpu0) / orders * 1e6
            sink.stop()
            client.indices.delete(index=f"{prefix}-orders*", params={"ignore_unavailable": "true"})
        sink = OpenSearchDocumentSink(config)
        sink.attach(ShopContext(config.name, prefix))
        sink.start()
        # What `cdc bootstrap` and `cdc rebuild` run: a new generation loaded, then switched to.
        began, cpu0 = time.perf_counter(), cpu()
        generation = sink.current_generation() + 1
        sink.open_generation(generation)
        for start in range(0, len(stream), BATCH):
            sink.write(stream[start:start + BATCH])
        loaded = time.perf_counter()
        sink.switch_generation(generation)
        seconds = time.perf_counter() - began
        figures["build_docs_s"] = orders / seconds
        figures["build_rows_s"] = len(stream) / seconds
        figures["build_load_s"] = loaded - began
        figures["build_assemble_s"] = seconds - (loaded - began)
        figures["build_cpu_us"] = (cpu() - cpu0) / orders * 1e6
        state = folder / "state" / f"{config.name}.g{generation}.db"
        size = sum(p.stat().st_size for p in state.parent.glob(state.name + "*"))
        figures["state_mib_per_m_rows"] = size / len(stream) * 1e6 / 2**20

        figures["raw_docs_s"] = raw_bulk(client, f"{prefix}-orders", f"{prefix}-raw")

        rng = random.Random(33)
        version = stream[-1].version or 0
        changes = []
        for n in range(updates):
            order, line = rng.randint(1, orders), rng.randint(1, items)
            version += 1
            row = {"order_id": order, "line_no": line, "product_id": rng.randint(1, PRODUCTS), "qty": 100 + n}
            changes.append(SinkEvent(f"{prefix}.public.order_items", 0, len(by_table["public.order_items"]) + n,
                                     {"order_id": order, "line_no": line}, Op.UPDATE, None, row, version,
                                     {"table": "order_items", "schema": "public"}))
        for in_flight in (1, 2):  # one write at a time, then as the runtime runs it (writes_in_flight 2)
            part = changes[:len(changes) // 2] if in_flight == 1 else changes[len(changes) // 2:]
            began = time.perf_counter()
            submitted: list[Any] = []
            for start in range(0, len(part), 1000):
                batch = part[start:start + 1000]
                done = sink.submit(batch) if in_flight > 1 else None
                if done is None:
                    sink.write(batch)
                    continue
                submitted.append(done)
                if len(submitted) >= in_flight:
                    submitted.pop(0).wait()
            for done in submitted:
                done.wait()
            figures[f"updates_per_s_{in_flight}"] = len(part) / (time.perf_counter() - began)
        client.indices.refresh(index=f"{prefix}-orders")
        counted = client.count(index=f"{prefix}-orders")["count"]
        assert counted == orders, f"{counted} documents, expected {orders}"
        sink.stop()
    finally:
        client.indices.delete(index=f"{prefix}*", params={"ignore_unavailable": "true"})
        shutil.rmtree(folder, ignore_errors=True)
    return figures


def raw_bulk(client: Any, alias: str, index: str) -> float:
    """The ceiling of the build on this node: the documents it built, read back, indexed into a
    new index of the same mapping by the same bulk writer (chunks of 2,000, as the switch writes
    them), already JSON, without periodic refreshes (as a generation is filled). Documents/s."""
    from opensearchpy.helpers import scan

    from sinks.opensearch.bulk import BulkWriter, Item

    docs = [(hit["_id"], hit["_version"], hit["_source"]) for hit in scan(client, index=alias, size=5000, version=True)]
    mapping = next(iter(client.indices.get_mapping(index=alias).values()))["mappings"]
    client.indices.create(index=index, body={"mappings": mapping, "settings": {"index": {"refresh_interval": "-1"}}})
    lines = [Item(index, doc_id, version, body).encode() for doc_id, version, body in docs]
    writer = BulkWriter(client, max_docs=2000, max_bytes=5_000_000, concurrency=2, what="raw")
    try:
        began = time.perf_counter()
        for start in range(0, len(docs), 2000):
            part = range(start, min(start + 2000, len(docs)))
            outcome = writer.send([Item(index, docs[i][0], docs[i][1], {}) for i in part], [lines[i] for i in part])
            assert not outcome.refused, outcome.refused[:3]
        return len(docs) / (time.perf_counter() - began)
    finally:
        writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=50_000)
    parser.add_argument("--items", type=int, default=5)
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-stream", action="store_true", help="leave out the change-by-change build")
    args = parser.parse_args()
    from cdc.dev.stack import read_env

    url = read_env()["OPENSEARCH_URL"]
    print(f"{args.orders} orders x {args.items} items, {args.updates} item updates; batches of {BATCH}")
    for round_ in range(1, args.rounds + 1):
        load = os.getloadavg()[0]
        f = run_round(url, args.orders, args.items, args.updates, not args.no_stream)
        streamed = "" if args.no_stream else (
            f"; streamed {f['stream_docs_s']:,.0f} docs/s ({f['stream_cpu_us']:.0f} us CPU/doc), ratio "
            f"{f['stream_docs_s'] / f['plain_docs_s']:.2f}")
        print(f"round {round_} (load {load:.1f}): plain {f['plain_docs_s']:,.0f} docs/s "
              f"({f['plain_cpu_us']:.0f} us CPU/doc); build {f['build_docs_s']:,.0f} docs/s, "
              f"{f['build_rows_s']:,.0f} rows/s ({f['build_cpu_us']:.0f} us CPU/doc; load "
              f"{f['build_load_s']:.1f}s, assembly {f['build_assemble_s']:.1f}s), "
              f"ratio {f['build_docs_s'] / f['plain_docs_s']:.2f}; raw bulk of the built documents "
              f"{f['raw_docs_s']:,.0f} docs/s (build/raw {f['build_docs_s'] / f['raw_docs_s']:.2f}){streamed}; state {f['state_mib_per_m_rows']:.0f} MiB "
              f"per million rows; {args.updates} item updates: {f['updates_per_s_1']:,.0f}/s one write at a time, "
              f"{f['updates_per_s_2']:,.0f}/s with two in flight", flush=True)


if __name__ == "__main__":
    main()
