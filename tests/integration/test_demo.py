"""``cdc demo`` twice in a row: both runs end with every store (SQLite warehouse, OpenSearch,
Redis) equal to its source (PostgreSQL, MariaDB), and every joined document (an order with its
customer) equal to PostgreSQL's join, after live changes and a schema change that rebuilds the
search index. Then the demo's own check is shown to notice a store that differs."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys

import psycopg2
import pytest
import redis

from cdc.demo import CACHE_PREFIX, DOCUMENTS, Shop, _home, shop

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis, pytest.mark.opensearch]


def _demo() -> str:
    out = subprocess.run([sys.executable, "-m", "cdc.cli", "demo", "--changes", "60", "--then-stop",
                          "--timeout", "240"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    return out.stdout


def test_the_demo_twice_ends_with_every_store_equal_to_its_source(pg_admin_dsn, mysql_url, redis_url,
                                                                   opensearch_url):
    # A used stack: another OpenSearch sink ran before (its state is in the state index, the demo's
    # is not). The demo's reset crashed on that once.
    from opensearchpy import OpenSearch

    client = OpenSearch(hosts=[opensearch_url])
    client.index(index="cdc-sink-state", id="another-sink", body={"current": 1}, params={"refresh": "true"})
    client.delete(index="cdc-sink-state", id="search", params={"ignore": 404, "refresh": "true"})
    client.close()
    for _ in range(2):
        out = _demo()
        assert "5. every store equals its source:" in out
        assert re.search(r"orders joined with their customer: source +(\d+)  ==  documents +\1 ", out), out
        assert "now reads generation 2" in out  # the schema change rebuilt the index
        assert "console:  http://127.0.0.1:" in out

    # --then-stop dropped what the demo's PostgreSQL source made: no slot holds the server's WAL.
    admin = psycopg2.connect(pg_admin_dsn)
    with admin.cursor() as cur:
        cur.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (shop.PG_DATABASE,))
        assert cur.fetchall() == []
    admin.close()

    dsn = pg_admin_dsn.rsplit("/", 1)[0] + "/" + shop.PG_DATABASE
    checked = Shop(dsn, mysql_url, _home() / "cdc.yaml")  # the stores read through their sinks
    assert checked.check() == {}
    # The check notices a store that moved away from its source.
    cache = redis.Redis.from_url(redis_url)
    [key] = list(cache.scan_iter(match=f"{CACHE_PREFIX}*:public.customers:7"))
    cache.hset(key, "name", "someone else")
    with sqlite3.connect(_home() / "warehouse.db") as db:  # orders: a view of its generation's table
        [view] = db.execute("SELECT sql FROM sqlite_master WHERE type = 'view' AND name = 'orders'").fetchone()
        table = re.search(r'FROM\s+"?(\w+)"?', view).group(1)
        db.execute(f"DELETE FROM {table} WHERE id = (SELECT min(id) FROM {table})")
    search = OpenSearch(hosts=[opensearch_url])
    [hit] = search.search(index=DOCUMENTS, body={"size": 1, "query": {"exists": {"field": "customer.name"}}})[
        "hits"]["hits"]
    search.update(index=hit["_index"], id=hit["_id"], body={"doc": {"customer": {**hit["_source"]["customer"],
                                                                                 "name": "edited by hand"}}},
                  params={"refresh": "true"})
    search.close()
    found = checked.check()
    assert set(found) == {"cache", "warehouse", "documents"}
    assert set(found["cache"]) == {"customers"} and "someone else" in found["cache"]["customers"]
    assert set(found["warehouse"]) == {"orders"} and "missing 1" in found["warehouse"]["orders"]
    assert set(found["documents"]) == {"orders"} and "edited by hand" in found["documents"]["orders"]
