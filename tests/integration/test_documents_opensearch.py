"""Joined documents in OpenSearch under a live writer (sinks/documents, sinks/opensearch/doc_sink.py).

A shop on real PostgreSQL (customers, orders, order_items keyed by (order_id, line_no), products,
categories), captured into the embedded log (two partitions per topic) and kept by ``cdc run`` as
one ``orders`` document per order: its customer, its items in line order, each with its product
and the product's category. A writer inserts, updates and deletes rows of every table, moves
items between orders and orders between customers, changes primary keys and deletes lookups.
The daemon is killed (SIGKILL to its process group) after each sign of progress, and started
again; once its state directory is deleted, so it must rebuild the documents from the topics.
A reader polls documents through the alias throughout and fails on any version going back or
any version seen with two contents. At the end every document read through the alias equals the
one PostgreSQL builds with JSON aggregation from the same rows, and no other is there.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg2
import pytest
from opensearchpy import OpenSearch

from tests.conftest import _fresh_database
from tests.daemon import cdc_process, kill_daemon, stop_daemon, wait_beside
from tests.integration.pg_capture import execute

pytestmark = [pytest.mark.postgres, pytest.mark.opensearch]

ORDERS, CUSTOMERS, PRODUCTS, CATEGORIES, LINES = 40, 8, 12, 4, 4

SCHEMA = [
    "CREATE TABLE categories (id int PRIMARY KEY, name text)",
    "CREATE TABLE customers (id int PRIMARY KEY, name text)",
    "CREATE TABLE products (id int PRIMARY KEY, name text, category_id int)",
    "CREATE TABLE orders (id int PRIMARY KEY, customer_id int, note text)",
    "CREATE TABLE order_items (order_id int, line_no int, product_id int, qty int, PRIMARY KEY (order_id, line_no))",
    f"INSERT INTO categories SELECT g, 'category ' || g FROM generate_series(1, {CATEGORIES}) g",
    f"INSERT INTO customers SELECT g, 'customer ' || g FROM generate_series(1, {CUSTOMERS}) g",
    f"INSERT INTO products SELECT g, 'product ' || g, 1 + g % {CATEGORIES} FROM generate_series(1, {PRODUCTS}) g",
    f"INSERT INTO orders SELECT g, 1 + g % {CUSTOMERS}, 'order ' || g FROM generate_series(1, {ORDERS}) g",
    f"INSERT INTO order_items SELECT o, l, 1 + (o * l) % {PRODUCTS}, l FROM generate_series(1, {ORDERS}) o, "
    f"generate_series(1, {LINES - 1}) l",
]

# The document PostgreSQL builds from the same rows: what the alias must hold for each order.
EXPECTED = """
SELECT o.id, jsonb_build_object(
  'id', o.id, 'customer_id', o.customer_id, 'note', o.note,
  'customer', (SELECT to_jsonb(c) FROM customers c WHERE c.id = o.customer_id),
  'items', coalesce((SELECT jsonb_agg(jsonb_build_object(
      'line_no', i.line_no, 'product_id', i.product_id, 'qty', i.qty,
      'product', (SELECT to_jsonb(p) || jsonb_build_object(
          'category', (SELECT to_jsonb(k) FROM categories k WHERE k.id = p.category_id))
        FROM products p WHERE p.id = i.product_id)) ORDER BY i.line_no)
    FROM order_items i WHERE i.order_id = o.id), '[]'::jsonb))
FROM orders o
"""

DOCUMENTS = """
    documents:
      - name: {alias}
        table: public.orders
        lookups:
          - {{table: public.customers, as: customer, foreign_key: [customer_id]}}
        children:
          - table: public.order_items
            as: items
            foreign_key: [order_id]
            order_by: [line_no]
            exclude: [order_id]
            nested: true
            lookups:
              - table: public.products
                as: product
                foreign_key: [product_id]
                lookups: [{{table: public.categories, as: category, foreign_key: [category_id]}}]
"""


class Writer(threading.Thread):
    """Random changes to every table, one transaction each, until stopped."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stopping, self.changes, self.error = dsn, threading.Event(), 0, None
        self.random = random.Random(29)

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                while not self.stopping.is_set():
                    cur.execute(*self._change())
                    self.changes += 1
                    time.sleep(0.002)
        except Exception as err:  # noqa: BLE001 - reported by the test
            self.error = err
        finally:
            conn.close()

    def _change(self) -> tuple:
        r = self.random
        order, line, n = r.randint(1, ORDERS), r.randint(1, LINES), r.randint(1, 10**6)
        kind = r.randrange(12)
        if kind == 0:  # an item moves to another order (both documents change)
            other = r.randint(1, ORDERS)
            return ("UPDATE order_items SET order_id = %s WHERE order_id = %s AND line_no = %s AND NOT EXISTS "
                    "(SELECT 1 FROM order_items WHERE order_id = %s AND line_no = %s)",
                    (other, order, line, other, line))
        if kind == 1:  # a primary-key change of an item
            return ("UPDATE order_items SET line_no = %s WHERE order_id = %s AND line_no = %s AND NOT EXISTS "
                    "(SELECT 1 FROM order_items WHERE order_id = %s AND line_no = %s)",
                    (line % LINES + 1, order, line, order, line % LINES + 1))
        if kind == 2:
            return ("INSERT INTO order_items VALUES (%s, %s, %s, 1) ON CONFLICT (order_id, line_no) DO UPDATE "
                    "SET qty = order_items.qty + 1", (order, line, r.randint(1, PRODUCTS + 2)))
        if kind == 3:
            return "DELETE FROM order_items WHERE order_id = %s AND line_no = %s", (order, line)
        if kind == 4:  # an order moves to another customer, or to one that does not exist
            return "UPDATE orders SET customer_id = %s WHERE id = %s", (r.randint(1, CUSTOMERS + 2), order)
        if kind == 5:  # a root deleted and inserted again
            return ("DELETE FROM orders WHERE id = %s" if n % 2 else
                    "INSERT INTO orders VALUES (%s, 1, 'again') ON CONFLICT (id) DO UPDATE SET note = 'again'",
                    (order,))
        if kind == 6:  # a primary-key change of an order: its items stay with the old id
            return ("UPDATE orders SET id = %s WHERE id = %s AND NOT EXISTS (SELECT 1 FROM orders WHERE id = %s)",
                    (order % ORDERS + 1, order, order % ORDERS + 1))
        if kind == 7:
            return "UPDATE customers SET name = %s WHERE id = %s", (f"customer {n}", r.randint(1, CUSTOMERS))
        if kind == 8:  # a lookup deleted and inserted again
            customer = r.randint(1, CUSTOMERS)
            return ("DELETE FROM customers WHERE id = %s" if n % 2 else
                    "INSERT INTO customers VALUES (%s, 'back') ON CONFLICT (id) DO NOTHING", (customer,))
        if kind == 9:
            return "UPDATE products SET name = %s, category_id = %s WHERE id = %s", (
                f"product {n}", r.randint(1, CATEGORIES + 1), r.randint(1, PRODUCTS))
        if kind == 10:
            return "UPDATE categories SET name = %s WHERE id = %s", (f"category {n}", r.randint(1, CATEGORIES))
        return "UPDATE orders SET note = %s WHERE id = %s", (f"note {n}", order)


class Reader(threading.Thread):
    """Polls documents through the alias: a version never goes back, one version has one content."""

    def __init__(self, client: OpenSearch, alias: str) -> None:
        super().__init__(daemon=True)
        self.client, self.alias, self.stopping = client, alias, threading.Event()
        self.seen: dict[str, tuple[int, dict]] = {}
        self.problems: list[str] = []
        self.reads = 0

    def run(self) -> None:
        ids = [str(i) for i in range(1, ORDERS + 1)]
        while not self.stopping.is_set():
            try:
                answer = self.client.mget(index=self.alias, body={"ids": ids})
            except Exception:  # noqa: BLE001 - the alias not there yet, OpenSearch busy
                time.sleep(0.2)
                continue
            for doc in answer["docs"]:
                if not doc.get("found"):
                    continue
                body = {k: v for k, v in doc["_source"].items() if k != "__cdc_deleted_at"}  # when, not what
                version = body["__cdc_version"]
                was = self.seen.get(doc["_id"])
                if was is not None and (version < was[0] or (version == was[0] and body != was[1])):
                    self.problems.append(f"{doc['_id']}: {was[0]} {was[1]} then {version} {body}")
                self.seen[doc["_id"]] = (version, body)
            self.reads += 1
            time.sleep(0.1)


def _expected(dsn: str) -> dict[str, dict]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(EXPECTED)
            return {str(order): document for order, document in cur.fetchall()}
    finally:
        conn.close()


def _documents(client: OpenSearch, alias: str) -> dict[str, dict]:
    client.indices.refresh(index=alias)
    hits = client.search(index=alias, body={"size": 10_000, "query": {"match_all": {}}})["hits"]["hits"]
    return {hit["_id"]: {k: v for k, v in hit["_source"].items() if not k.startswith("__cdc_")} for hit in hits}


def _moved(writer: Writer, client: OpenSearch, alias: str, before: int) -> bool:
    assert writer.error is None, writer.error
    return _top_version(client, alias) > before


def _top_version(client: OpenSearch, alias: str) -> int:
    try:
        client.indices.refresh(index=alias)
        answer = client.search(index=alias, body={"size": 0, "aggs": {"v": {"max": {"field": "__cdc_version"}}}})
    except Exception:  # noqa: BLE001 - not created yet
        return 0
    return int(answer["aggregations"]["v"]["value"] or 0)


@pytest.fixture
def shop(pg_admin_dsn) -> Iterator[str]:
    databases = _fresh_database(pg_admin_dsn)
    dsn = next(databases)
    execute(dsn, *SCHEMA)
    yield dsn
    next(databases, None)


def test_documents_under_a_live_writer_and_kill_9_equal_the_sql_join(shop, opensearch_url, tmp_path):
    prefix = f"d{uuid.uuid4().hex[:6]}"
    alias = f"{prefix}-orders"
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: shop, type: postgres, dsn: '{shop}', tables: ['public.*'], state_dir: ./state, "
        f"heartbeat_interval: 1}}\n"
        f"sinks:\n  - name: {prefix}-search\n    type: opensearch\n    hosts: ['{opensearch_url}']\n"
        f"    topics: ['{prefix}.public.*']\n    batch_wait_ms: 50\n    state_dir: ./docstate\n"
        + DOCUMENTS.format(alias=alias) + "http: null\n")
    client = OpenSearch([opensearch_url], timeout=60)
    writer, reader = Writer(shop), Reader(client, alias)
    daemon = _run(config)
    try:
        wait_beside("the first documents", lambda: _top_version(client, alias) > 0, daemon)
        writer.start()
        reader.start()
        for kill in range(20):
            before = _top_version(client, alias)
            wait_beside(f"documents written after kill {kill}", lambda b=before: _moved(writer, client, alias, b),
                        daemon)
            time.sleep(random.uniform(0, 1.5))
            kill_daemon(daemon)
            if kill == 12:  # the state lost: the documents are rebuilt from the topics
                shutil.rmtree(tmp_path / "docstate")
            daemon = _run(config)
        wait_beside("writes under the last run", lambda: writer.changes > 1500, daemon, limit=300)
        writer.stopping.set()
        writer.join(30)
        assert writer.error is None, writer.error
        expected = _expected(shop)

        def caught_up() -> bool:
            return _documents(client, alias) == expected

        wait_beside("every document equal to the SQL join", caught_up, daemon, limit=240, every=1.0)
        status = subprocess.run([sys.executable, "-m", "cdc.cli", "status", "--json", str(config), f"{prefix}-search"],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        writer.stopping.set()
        reader.stopping.set()
        stop_daemon(daemon)
    reader.join(10)
    assert not reader.problems, reader.problems[:5]
    assert reader.reads > 20 and len(reader.seen) > ORDERS // 2
    assert (tmp_path / "docstate").exists()
    [row] = [r for r in json.loads(status.stdout) if r["name"] == f"{prefix}-search"]
    [store] = row["stores"]
    assert (store["alias"], store["generation"], store["documents"]) == (alias, 2, len(expected)), store
    assert store["state_rows"] >= len(expected) and store["state_bytes"] > 0, store
    log_text = (tmp_path / "run.log").read_text(errors="replace")
    assert "is behind the offsets its group committed" in log_text and "readers switched" in log_text, \
        "the lost state made the sink rebuild"


def _run(config) -> subprocess.Popen:
    return cdc_process(config, "run", log="run.log")
