"""`cdc rebuild` of every rebuildable sink the daemon drives, while it runs, under a live writer.

Before the fix, a sink rebuilt through the running daemon on Kafka never read again: the rebuild
left its read positions set, so the streaming that followed never assigned its fresh bulk reader,
which then polled nothing for ever while the health stayed green (each empty poll counted as
"caught up"). The old generations were never dropped either, since the OpenSearch sink dropped
them only between writes.

Here three sinks (PostgreSQL warehouse, OpenSearch, Redis) each rebuild three times in a row while
a writer changes the source; after each rebuild a marker row is updated and must reach every
store, and at the end every store equals the source and holds one generation only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest
import redis as redis_client
from opensearchpy import NotFoundError, OpenSearch

from cdc.dev.services import free_port
from tests.background import ItemsWriter
from tests.daemon import cdc_process, kill_daemon, wait_beside
from tests.integration.pg_capture import execute
from tests.integration.test_daemon_control import _rows

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.kafka, pytest.mark.opensearch,
              pytest.mark.redis]

ROWS = 1000


def _config(tmp_path: Path, dsn: str, target: str, kafka: str, opensearch: str, redis_url: str,
            prefix: str, port: int) -> Path:
    path = tmp_path / "cdc.yaml"
    topics = f"['{prefix}.public.*']"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"sinks:\n"
        f"  - {{name: warehouse, type: sql, url: '{target}', topics: {topics}, batch_wait_ms: 50}}\n"
        f"  - {{name: search_{prefix}, type: opensearch, hosts: ['{opensearch}'], topics: {topics}, batch_wait_ms: 50, "
        f"drop_old_generation_after_s: 0}}\n"
        f"  - {{name: cache, type: redis, url: '{redis_url}', key_prefix: '{prefix}', topics: {topics}, "
        f"batch_wait_ms: 50}}\n"
        f"http: '127.0.0.1:{port}'\n")
    return path


def _source(dsn: str) -> dict[int, tuple]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, qty, note FROM items")
        return {r[0]: (r[1], r[2]) for r in cur.fetchall()}


def _warehouse(target: str) -> dict[int, tuple]:
    with psycopg2.connect(target) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass('items')")
        if cur.fetchone()[0] is None:
            return {}
        cur.execute("SELECT id, qty, note FROM items")
        return {r[0]: (r[1], r[2]) for r in cur.fetchall()}


def _search(client: OpenSearch, alias: str) -> dict[int, tuple]:
    if not client.indices.exists_alias(name=alias):
        return {}
    try:
        client.indices.refresh(index=alias)
        out, answer = {}, client.search(index=alias, body={"size": 5000, "sort": ["_doc"]}, params={"scroll": "1m"})
        while answer["hits"]["hits"]:
            for hit in answer["hits"]["hits"]:
                doc = hit["_source"]
                out[doc["id"]] = (doc["qty"], doc["note"])
            answer = client.scroll(body={"scroll_id": answer["_scroll_id"], "scroll": "1m"})
    except NotFoundError:  # a rebuild dropped the generation under the scroll: read again
        return {}
    return out


def _cache(client, prefix: str) -> dict[int, tuple]:
    from sinks.redis import current_namespace

    namespace = current_namespace(client, prefix)
    out = {}
    for key in client.scan_iter(match=f"{namespace}:public.items:*", count=1000):
        fields = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
        if fields:
            out[int(fields["id"])] = (int(fields["qty"]), fields.get("note"))
    return out


def test_rebuild_three_times_under_a_writer_and_every_later_change_arrives(
        pg_dsn, target_dsn, kafka_bootstrap, opensearch_url, opensearch_index, redis_url, tmp_path):
    prefix = opensearch_index
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note text)",
            f"INSERT INTO items SELECT g, 0, 'seed' FROM generate_series(1, {ROWS}) g")
    port = free_port()
    config = _config(tmp_path, pg_dsn, target_dsn, kafka_bootstrap, opensearch_url, redis_url, prefix, port)
    search, cache = OpenSearch(opensearch_url), redis_client.Redis.from_url(redis_url)
    alias = f"{prefix}.public.items"
    # The index's sink keeps its generations under its name in the node's state index: unique here.
    stores = {"warehouse": lambda: _warehouse(target_dsn), f"search_{prefix}": lambda: _search(search, alias),
              "cache": lambda: _cache(cache, prefix)}
    daemon = cdc_process(config, "run", log="daemon.log")
    try:
        wait_beside("every store holds the snapshot",
                    lambda: all(len(read()) >= ROWS for read in stores.values()), daemon)
        with ItemsWriter(pg_dsn, seed=7):
            for round_ in range(1, 4):
                for sink in stores:
                    result = subprocess.run([sys.executable, "-m", "cdc.cli", "rebuild", str(config), sink],
                                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
                    assert result.returncode == 0, f"rebuild {sink} #{round_}: {result.stderr[-2000:]}"
                    marker = f"after-{sink}-{round_}"
                    execute(pg_dsn, f"UPDATE items SET note = '{marker}' WHERE id = 1")
                    for name, read in stores.items():
                        wait_beside(f"round {round_}: the change made after rebuilding {sink} reaches {name}",
                                    lambda read=read: (read().get(1) or (None, None))[1] == marker, daemon, 90)
        expected = _source(pg_dsn)
        for name, read in stores.items():
            wait_beside(f"{name} equals the source", lambda read=read: read() == expected, daemon)
        status = _rows(port)
        for sink in stores:
            assert status[sink]["healthy"], status[sink]
        # Only the current generation is left in each store (the index's old ones are dropped at
        # once: drop_old_generation_after_s: 0).
        wait_beside("the old index generations are dropped",
                    lambda: sorted(search.indices.get(index=f"{alias}__g*")) == [f"{alias}__g4"], daemon, 60)
        with psycopg2.connect(target_dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT generation, state FROM cdc_sink_generations")
            assert dict(cur.fetchall()) == {4: "current"}
        def namespaces() -> set[str]:
            return {k.decode().split(":")[0] for k in cache.scan_iter(match=f"{prefix}*:public.items:*", count=1000)}
        wait_beside("the old cache generations are dropped", lambda: namespaces() == {f"{prefix}.g4"}, daemon, 60)
    finally:
        kill_daemon(daemon)
        search.close()
        cache.close()
    log = (tmp_path / "daemon.log").read_text(errors="replace")
    assert log.count("rebuilt into generation") == 9, log[-3000:]
