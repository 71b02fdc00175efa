"""Joined documents in OpenSearch, Redis and Redis Cluster under a live writer (sinks/documents,
sinks/opensearch/doc_sink.py, sinks/redis/doc_sink.py).

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
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg2
import pytest
import redis
from opensearchpy import OpenSearch
from redis.cluster import RedisCluster

from cdc.dev.services import free_port
from tests.conftest import _fresh_database
from tests.daemon import cdc_process, kill_daemon, stop_daemon, wait_beside
from tests.integration.pg_capture import execute

pytestmark = [pytest.mark.postgres, pytest.mark.opensearch, pytest.mark.redis]

ORDERS, CUSTOMERS, PRODUCTS, CATEGORIES, LINES = 40, 8, 12, 4, 4
KILLS = {"opensearch": 20, "redis": 8, "redis-cluster": 6}

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
            exclude: [order_id]{nested}
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
    """Polls documents: a version never goes back, one version has one content."""

    def __init__(self, target: Target) -> None:
        super().__init__(daemon=True)
        self.target, self.stopping = target, threading.Event()
        self.seen: dict[str, tuple[int, dict | None]] = {}
        self.problems: list[str] = []
        self.reads = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                found = self.target.versions([str(i) for i in range(1, ORDERS + 1)])
            except Exception:  # noqa: BLE001 - not there yet, the server busy
                time.sleep(0.2)
                continue
            for doc_id, (version, body) in found.items():
                was = self.seen.get(doc_id)
                if was is not None and (version < was[0] or (version == was[0] and body != was[1])):
                    self.problems.append(f"{doc_id}: {was[0]} {was[1]} then {version} {body}")
                self.seen[doc_id] = (version, body)
            self.reads += 1
            time.sleep(0.1)


class Target:
    """Where the documents are read back: ``documents()`` what readers see (id -> document),
    ``versions(ids)`` each id's version and body (None: deleted), read together."""

    def documents(self) -> dict[str, dict]: ...

    def versions(self, ids: list[str]) -> dict[str, tuple[int, dict | None]]: ...

    def top_version(self) -> int:
        try:
            found = self.versions([str(i) for i in range(1, ORDERS + 1)])
        except Exception:  # noqa: BLE001 - not created yet
            return 0
        return max((version for version, _ in found.values()), default=0)


class SearchTarget(Target):
    def __init__(self, url: str, alias: str) -> None:
        self.client, self.alias = OpenSearch([url], timeout=60), alias

    def documents(self) -> dict[str, dict]:
        if not self.client.indices.exists_alias(name=self.alias):
            return {}
        self.client.indices.refresh(index=self.alias)
        hits = self.client.search(index=self.alias, body={"size": 10_000, "query": {"match_all": {}}})["hits"]["hits"]
        return {hit["_id"]: {k: v for k, v in hit["_source"].items() if not k.startswith("__cdc_")} for hit in hits}

    def versions(self, ids: list[str]) -> dict[str, tuple[int, dict | None]]:
        # A GET through the alias sees tombstone documents (__cdc_deleted) too.
        out: dict[str, tuple[int, dict | None]] = {}
        for doc in self.client.mget(index=self.alias, body={"ids": ids})["docs"]:
            if doc.get("found"):
                body = doc["_source"]
                live = None if body.get("__cdc_deleted") else {k: v for k, v in body.items()
                                                                 if not k.startswith("__cdc_")}
                out[doc["_id"]] = (body["__cdc_version"], live)
        return out


class CacheTarget(Target):
    def __init__(self, url: str, prefix: str, name: str, cluster: bool = False) -> None:
        self.client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
        self.prefix, self.name, self.cluster = prefix, name, cluster

    def _keys(self) -> str:
        generation = int(self.client.get(f"{self.prefix}.generation") or 1)
        return self.prefix if generation == 1 else f"{self.prefix}.g{generation}"

    def documents(self) -> dict[str, dict]:
        ns = self._keys()
        head = f"{ns}:doc:{self.name}:"
        keys = [k.decode() for k in self.client.scan_iter(match=f"{head}*", count=1000)]
        values = self.client.mget_nonatomic(keys) if self.cluster else self.client.mget(keys)
        return {key[len(head):]: orjson.loads(value) for key, value in zip(keys, values) if value is not None}

    def versions(self, ids: list[str]) -> dict[str, tuple[int, dict | None]]:
        ns = self._keys()
        pairs = [(f"{ns}:doc:{self.name}:{doc_id}", f"{ns}:v:{{{ns}:doc:{self.name}:{doc_id}}}") for doc_id in ids]
        if self.cluster:  # a document and its version share a slot (the version's hash tag): one MGET each
            answers = [value for pair in pairs for value in self.client.mget(list(pair))]
        else:
            pipe = self.client.pipeline(transaction=True)  # each document with its version, at one moment
            for key, version_key in pairs:
                pipe.get(key)
                pipe.get(version_key)
            answers = pipe.execute()
        out: dict[str, tuple[int, dict | None]] = {}
        for doc_id, value, version in zip(ids, answers[::2], answers[1::2]):
            if version is not None:
                out[doc_id] = (int(version.decode().lstrip("D")), None if value is None else orjson.loads(value))
        return out


def _detail(port: int, connector: str, name: str) -> float:
    """A sink's figure as /metrics serves it (-1: not served)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return -1
    wanted = f'cdc_connector_detail{{connector="{connector}",name="{name}"}} '
    return next((float(line[len(wanted):]) for line in text.splitlines() if line.startswith(wanted)), -1)


def _expected(dsn: str) -> dict[str, dict]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(EXPECTED)
            return {str(order): document for order, document in cur.fetchall()}
    finally:
        conn.close()


def _moved(writer: Writer, target: Target, before: int) -> bool:
    assert writer.error is None, writer.error
    return target.top_version() > before


@pytest.fixture
def shop(pg_admin_dsn) -> Iterator[str]:
    databases = _fresh_database(pg_admin_dsn)
    dsn = next(databases)
    execute(dsn, *SCHEMA)
    yield dsn
    next(databases, None)


@pytest.mark.parametrize("store", ["opensearch", "redis", "redis-cluster"])
def test_documents_under_a_live_writer_and_kill_9_equal_the_sql_join(store, shop, opensearch_url, redis_url,
                                                                     redis_cluster_url, tmp_path):
    prefix = f"d{uuid.uuid4().hex[:6]}"
    name = f"{prefix}-orders"
    if store == "opensearch":
        sink = f"    type: opensearch\n    hosts: ['{opensearch_url}']\n"
        target: Target = SearchTarget(opensearch_url, name)
    else:
        cluster = store == "redis-cluster"
        url = redis_cluster_url if cluster else redis_url
        sink = f"    type: redis\n    url: '{url}'\n    key_prefix: {prefix}\n    format: json\n" + \
            ("    cluster: true\n" if cluster else "")
        target = CacheTarget(url, prefix, name, cluster)
    config = tmp_path / "cdc.yaml"
    port = free_port()
    config.write_text(
        f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: shop, type: postgres, dsn: '{shop}', tables: ['public.*'], state_dir: ./state, "
        f"heartbeat_interval: 1}}\n"
        f"sinks:\n  - name: {prefix}-docs\n{sink}"
        f"    topics: ['{prefix}.public.*']\n    batch_wait_ms: 50\n    state_dir: ./docstate\n"
        + DOCUMENTS.format(alias=name, nested="\n            nested: true" if store == "opensearch" else "")
        + f"http: '127.0.0.1:{port}'\n")
    writer, reader = Writer(shop), Reader(target)
    daemon = _run(config)
    try:
        wait_beside("the first documents", lambda: target.top_version() > 0, daemon)
        writer.start()
        reader.start()
        for kill in range(KILLS[store]):
            before = target.top_version()
            wait_beside(f"documents written after kill {kill}", lambda b=before: _moved(writer, target, b), daemon)
            time.sleep(random.uniform(0, 1.5))
            kill_daemon(daemon)
            if kill == KILLS[store] // 2:  # the state lost: the documents are rebuilt from the topics
                shutil.rmtree(tmp_path / "docstate")
            daemon = _run(config)
        wait_beside("writes under the last run", lambda: writer.changes > 1500, daemon, limit=300)
        writer.stopping.set()
        writer.join(30)
        assert writer.error is None, writer.error
        expected = _expected(shop)
        wait_beside("every document equal to the SQL join", lambda: target.documents() == expected, daemon,
                    limit=240, every=1.0)
        wait_beside("the sink's figures served", lambda: _detail(port, f"{prefix}-docs", "documents_written") > 0,
                    daemon, limit=60)
        status = subprocess.run([sys.executable, "-m", "cdc.cli", "status", "--json", str(config), f"{prefix}-docs"],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        writer.stopping.set()
        reader.stopping.set()
        stop_daemon(daemon)
    reader.join(10)
    assert not reader.problems, reader.problems[:5]
    assert reader.reads > 20 and len(reader.seen) > ORDERS // 2
    assert (tmp_path / "docstate").exists()
    [row] = [r for r in json.loads(status.stdout) if r["name"] == f"{prefix}-docs"]
    details = row["details"]  # the daemon's figures of its last run (cdc status, the console, /metrics)
    assert details["documents_written"] > 0 and details["rows_stored"] > 0, details
    assert details["state_rows"] >= len(expected) and details["state_bytes"] > 0, details
    if store == "opensearch":
        [described] = row["stores"]
        # Generation 2 is the first build (the snapshot's records were in the topics), 3 the lost state's.
        assert (described["alias"], described["generation"], described["documents"]) == (name, 3, len(expected))
        assert described["state_rows"] >= len(expected) and described["state_bytes"] > 0, described
    log_text = (tmp_path / "run.log").read_text(errors="replace")
    assert "holds nothing, and the offsets its group committed are past it" in log_text, "the lost state rebuilt"
    assert "a first build of its documents" in log_text, "the first start built the documents in a new generation"


def _run(config) -> subprocess.Popen:
    return cdc_process(config, "run", log="run.log")


@pytest.mark.mysql
def test_documents_of_a_mariadb_source_through_kills_equal_the_join(mysql_url, mysql_db, opensearch_url, tmp_path):
    """The same document from MariaDB (keys and foreign keys as the binlog carries them): the
    snapshot, then updates, a moved item, a deleted customer, a deleted item, an order's key
    changed and a new order, with the daemon killed twice after documents moved."""
    from tests.conftest import mysql_connect

    conn = mysql_connect(mysql_url, mysql_db)
    statements = [s.replace("public.", "") for s in SCHEMA]
    statements = [s.replace(f"generate_series(1, {ORDERS}) o, generate_series(1, {LINES - 1}) l", "") for s in
                  statements]
    with conn.cursor() as cur:
        for statement in statements[:5]:
            cur.execute(statement)
        cur.executemany("INSERT INTO categories VALUES (%s, %s)", [(i, f"category {i}") for i in range(1, 5)])
        cur.executemany("INSERT INTO customers VALUES (%s, %s)", [(i, f"customer {i}") for i in range(1, 9)])
        cur.executemany("INSERT INTO products VALUES (%s, %s, %s)", [(i, f"product {i}", 1 + i % 4)
                                                                    for i in range(1, 13)])
        cur.executemany("INSERT INTO orders VALUES (%s, %s, %s)", [(i, 1 + i % 8, f"order {i}") for i in range(1, 21)])
        cur.executemany("INSERT INTO order_items VALUES (%s, %s, %s, %s)",
                        [(o, line, 1 + (o * line) % 12, line) for o in range(1, 21) for line in range(1, 4)])
    prefix = f"m{uuid.uuid4().hex[:6]}"
    name = f"{prefix}-orders"
    config = tmp_path / "cdc.yaml"
    documents = DOCUMENTS.format(alias=name, nested="").replace("public.", f"{mysql_db}.")
    config.write_text(
        f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: shop, type: mysql, url: '{mysql_url}', server_id: {random.randrange(10_000, 2**31)}, "
        f"tables: ['{mysql_db}.*'], heartbeat_interval: 0.5}}\n"
        f"sinks:\n  - name: {prefix}-docs\n    type: opensearch\n    hosts: ['{opensearch_url}']\n"
        f"    topics: ['{prefix}.{mysql_db}.*']\n    batch_wait_ms: 50\n    state_dir: ./docstate\n"
        + documents + "http: null\n")
    target = SearchTarget(opensearch_url, name)
    changes = [
        "UPDATE customers SET name = 'renamed' WHERE id = 2",
        "UPDATE order_items SET order_id = 3, line_no = 9 WHERE order_id = 2 AND line_no = 1",  # a key change too
        "DELETE FROM customers WHERE id = 3",
        "DELETE FROM order_items WHERE order_id = 4 AND line_no = 2",
        "UPDATE orders SET id = 100 WHERE id = 5",
        "INSERT INTO orders VALUES (21, 1, 'new order')",
        "INSERT INTO order_items VALUES (21, 1, 7, 9)",
        "UPDATE products SET category_id = NULL WHERE id = 7",
        "UPDATE categories SET name = 'renamed category' WHERE id = 2",
    ]
    daemon = _run(config)
    try:
        wait_beside("the snapshot's documents", lambda: len(target.documents()) == 20, daemon)
        with conn.cursor() as cur:
            for number, change in enumerate(changes):
                cur.execute(change)
                if number in (2, 6):
                    before = target.top_version()
                    wait_beside("documents moved", lambda b=before: target.top_version() > b, daemon)
                    kill_daemon(daemon)
                    daemon = _run(config)
        expected = _mysql_join(conn)
        wait_beside("every document equal to the join", lambda: target.documents() == expected, daemon,
                    limit=240, every=1.0)
    finally:
        stop_daemon(daemon)
        conn.close()
    # What the changes made, in the documents compared: a key change leaves the items at the old key.
    assert len(expected) == 21 and "5" not in expected and expected["100"]["items"] == []
    assert expected["2"]["customer"] is None and expected["1"]["customer"]["name"] == "renamed"
    assert [i["line_no"] for i in expected["3"]["items"]] == [1, 2, 3, 9]


def _mysql_join(conn) -> dict[str, dict]:
    """The documents, joined in Python from MariaDB's rows as they are now."""
    with conn.cursor() as cur:
        tables = {}
        for table in ("customers", "orders", "products", "categories"):
            cur.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            tables[table] = {row[0]: dict(zip(names, row)) for row in cur.fetchall()}
        cur.execute("SELECT * FROM order_items ORDER BY order_id, line_no")
        names = [d[0] for d in cur.description]
        items = [dict(zip(names, row)) for row in cur.fetchall()]
    out = {}
    for order_id, order in tables["orders"].items():
        lines = []
        for item in (i for i in items if i["order_id"] == order_id):
            product = tables["products"].get(item["product_id"])
            if product is not None:
                product = {**product, "category": tables["categories"].get(product["category_id"])}
            lines.append({k: v for k, v in item.items() if k != "order_id"} | {"product": product})
        out[str(order_id)] = {**order, "customer": tables["customers"].get(order["customer_id"]), "items": lines}
    return out


def _search_documents(tmp_path: Path, dsn: str, opensearch_url: str, nested: bool) -> tuple[SearchTarget, Path]:
    """A config of the shop captured into the embedded log and kept as orders documents in
    OpenSearch (``cdc run`` of it), and the target reading them."""
    prefix = f"d{uuid.uuid4().hex[:6]}"
    name = f"{prefix}-orders"
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: shop, type: postgres, dsn: '{dsn}', tables: ['public.*'], state_dir: ./state, "
        f"heartbeat_interval: 1}}\n"
        f"sinks:\n  - name: {prefix}-docs\n    type: opensearch\n    hosts: ['{opensearch_url}']\n"
        f"    topics: ['{prefix}.public.*']\n    batch_wait_ms: 50\n    state_dir: ./docstate\n"
        + DOCUMENTS.format(alias=name, nested="\n            nested: true" if nested else "") + "http: null\n")
    return SearchTarget(opensearch_url, name), config


# After the schema changes of the test below: orders.note renamed to remark, order_items.qty dropped,
# customers.tier added (to_jsonb shows it).
EXPECTED_CHANGED = """
SELECT o.id, jsonb_build_object(
  'id', o.id, 'customer_id', o.customer_id, 'remark', o.remark,
  'customer', (SELECT to_jsonb(c) FROM customers c WHERE c.id = o.customer_id),
  'items', coalesce((SELECT jsonb_agg(jsonb_build_object(
      'line_no', i.line_no, 'product_id', i.product_id,
      'product', (SELECT to_jsonb(p) || jsonb_build_object(
          'category', (SELECT to_jsonb(k) FROM categories k WHERE k.id = p.category_id))
        FROM products p WHERE p.id = i.product_id)) ORDER BY i.line_no)
    FROM order_items i WHERE i.order_id = o.id), '[]'::jsonb))
FROM orders o
"""


def test_a_column_added_renamed_and_dropped_reaches_every_document(shop, opensearch_url, tmp_path):
    """schema_policy rebuild (the default): a column a document shows added to a lookup's table,
    renamed in the root's and dropped from a child's. The sink rebuilds the documents in the new
    shapes, so every document equals the join on the new tables: the added column null where no
    row carried it, the renamed one with the values rows of the old shape carry under the old
    name, the dropped one gone, also from documents no later change touched."""
    target, config = _search_documents(tmp_path, shop, opensearch_url, nested=True)
    daemon = _run(config)
    try:
        expected = _expected(shop)
        wait_beside("every document equal to the SQL join", lambda: target.documents() == expected, daemon,
                    limit=240, every=1.0)
        execute(shop, "ALTER TABLE customers ADD COLUMN tier text",
                "UPDATE customers SET tier = 'gold' WHERE id = 1",
                "ALTER TABLE orders RENAME COLUMN note TO remark",
                "UPDATE orders SET remark = 'changed' WHERE id = 2",
                "ALTER TABLE order_items DROP COLUMN qty",
                "UPDATE order_items SET product_id = 1 WHERE order_id = 3 AND line_no = 1")
        conn = psycopg2.connect(shop)
        try:
            with conn.cursor() as cur:
                cur.execute(EXPECTED_CHANGED)
                changed = {str(order): document for order, document in cur.fetchall()}
        finally:
            conn.close()
        assert changed["5"]["remark"] == "order 5" and "tier" in changed["5"]["customer"], changed["5"]
        wait_beside("every document in the new shapes", lambda: target.documents() == changed, daemon,
                    limit=240, every=1.0)
    finally:
        stop_daemon(daemon)
    log_text = (tmp_path / "run.log").read_text(errors="replace")
    assert "which its documents show: the documents are rebuilt in the new shape" in log_text


def test_a_lookup_table_empty_at_the_start_joins_once_its_rows_come(pg_admin_dsn, opensearch_url, tmp_path):
    """A lookup's table with no rows when the sink starts: the documents hold null for it (no
    write fails, nothing goes to the dead letters), and its rows join the documents once they
    come. (A joined table whose topic is not made yet: tests/unit/test_documents_follow_shapes.py.)"""
    databases = _fresh_database(pg_admin_dsn)
    dsn = next(databases)
    try:
        execute(dsn, *[statement for statement in SCHEMA if not statement.startswith("INSERT INTO customers")])
        target, config = _search_documents(tmp_path, dsn, opensearch_url, nested=False)
        daemon = _run(config)
        try:
            expected = _expected(dsn)
            assert all(document["customer"] is None for document in expected.values())
            wait_beside("every document equal to the SQL join", lambda: target.documents() == expected, daemon,
                        limit=240, every=1.0)
            execute(dsn, f"INSERT INTO customers SELECT g, 'customer ' || g FROM generate_series(1, {CUSTOMERS}) g")
            expected = _expected(dsn)
            wait_beside("the customers in their documents", lambda: target.documents() == expected, daemon,
                        limit=240, every=1.0)
        finally:
            stop_daemon(daemon)
        log_text = (tmp_path / "run.log").read_text(errors="replace")
        assert "does not exist" not in log_text and "dead letter" not in log_text.lower(), log_text[-3000:]
    finally:
        next(databases, None)
