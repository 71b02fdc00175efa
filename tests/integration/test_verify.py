"""``cdc verify`` against real stores under a live writer (cdc/runtime/verify.py).

One pipeline for the module: a PostgreSQL source into the embedded log, daemons running the
source, a PostgreSQL warehouse sink, a Redis cache sink and an OpenSearch sink, and a writer
changing the source all along (never the keys below ``RESERVED``: those the tests corrupt by
hand). A clean store verifies equal; hand edits of each store are reported exactly, key by key;
a store that cannot catch up in time is unsettled, never different. A DuckDB target lets no
other process in while its sink runs: it is verified with its sink stopped, the writer held
meanwhile (else the stopped store falls behind, rightly reported).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import psycopg2
import pytest
import redis
from opensearchpy import OpenSearch

from cdc.cli import main
from tests.background import PgWriter
from tests.browser import dump_dom, parse
from tests.conftest import _fresh_database
from tests.daemon import cdc_process, run_daemon, stop_daemon
from tests.integration.pg_capture import execute, wait_until
from tests.verifying import free_port, keys_of, verify

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.opensearch]

ROWS = 1500
RESERVED = 100  # keys 1..RESERVED-1 are never touched by the writer


class Writer(PgWriter):
    """Updates, inserts and deletes on ``items`` above ``RESERVED``."""

    pause = 0.05

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(dsn, seed)
        self.hold = threading.Event()  # set: commit nothing new (a test reads a stopped store)
        self.held = threading.Event()  # set once held with every change before it committed

    def change(self, cur) -> None:
        if self.hold.is_set():
            if self.changes % self.per_commit == 0:  # the first change of a transaction: the last committed
                self.held.set()
            time.sleep(0.01)
            return
        self.held.clear()
        roll = self.rng.random()
        if roll < 0.6:
            cur.execute("UPDATE items SET qty = qty + 1, note = %s WHERE id = %s",
                        (f"n{self.changes}", self.rng.randrange(RESERVED, ROWS)))
        elif roll < 0.8:
            cur.execute("INSERT INTO items VALUES (%s, 1, 2.50, 'new', now())", (self.new_id(),))
        else:
            cur.execute("DELETE FROM items WHERE id = %s", (self.rng.randrange(RESERVED, self.next_id),))


@dataclass
class Pipeline:
    config: Path
    source_dsn: str
    target_dsn: str
    redis_url: str
    redis_prefix: str
    opensearch_url: str
    alias: str
    writer: Writer


def assert_repaired(pipeline: Pipeline, sink: str) -> None:
    """``--repair`` heals what a verify found (exit 0), and the next verify finds the store equal."""
    code, answer = verify(pipeline.config, sink, "--repair", "--repair-timeout", "120")
    assert code == 0, answer
    assert answer["repair"] and all(r["equal"] for r in answer["repair"])
    assert verify(pipeline.config, sink)[0] == 0


def _pair(generators: list) -> Iterator[str]:
    for generator in generators:
        yield next(generator)


@pytest.fixture(scope="module")
def pipeline(pg_admin_dsn, redis_url, opensearch_url, tmp_path_factory) -> Iterator[Pipeline]:
    databases = [_fresh_database(pg_admin_dsn), _fresh_database(pg_admin_dsn)]
    source_dsn, target_dsn = _pair(databases)
    tmp = tmp_path_factory.mktemp("verify")
    prefix, cache = f"v{uuid.uuid4().hex[:6]}", f"v{uuid.uuid4().hex[:6]}"
    execute(source_dsn, "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, price numeric(10,2), note text, "
                        "at timestamptz)",
            f"INSERT INTO items SELECT g, g % 7, 9.90, 'seed', '2026-01-01T00:00:00Z' "
            f"FROM generate_series(1, {ROWS}) g",
            # Values of many types, never written again: compared as each store keeps them.
            "CREATE TABLE kinds (id int PRIMARY KEY, u uuid, j jsonb, b bytea, f float8, r real, flag boolean, "
            "d date, ts timestamp, tstz timestamptz, arr int[], tx text, n numeric, big bigint, t time)",
            "INSERT INTO kinds SELECT g, md5(g::text)::uuid, jsonb_build_object('k', g, 'a', array[1, 2]), "
            "decode(md5(g::text), 'hex'), g / 3.0, g / 7.0, g % 2 = 0, date '2026-02-01' + g, "
            "timestamp '2026-02-01 10:00:00.123456' + g * interval '1 hour', "
            "timestamptz '2026-02-01 10:00:00+02' + g * interval '1 minute', array[g, g + 1], "
            "'007-' || g, 12345.678901234567 * g, 9007199254740993 + g, time '10:11:12.5' "
            "FROM generate_series(1, 30) g")
    url = target_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
    config = tmp / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{source_dsn}', tables: ['public.items', 'public.kinds'], "
        f"state_dir: ./state, heartbeat_interval: 1, status_interval: 1, signal_table: public.cdc_signal}}\n"
        f"sinks:\n"
        f"  - {{name: wh, type: sql, url: '{url}', topics: ['{prefix}.public.*'], batch_wait_ms: 50}}\n"
        f"  - {{name: cache, type: redis, url: '{redis_url}', key_prefix: {cache}, topics: ['{prefix}.public.*'], "
        f"exclude: [at], batch_wait_ms: 50}}\n"
        f"  - {{name: search, type: opensearch, hosts: ['{opensearch_url}'], topics: ['{prefix}.public.*'], "
        f"index_name: '{prefix}-{{table}}', batch_wait_ms: 50}}\n"
        f"  - {{name: duck, type: sql, url: 'duckdb:///duck.db', topics: ['{prefix}.public.*'], batch_wait_ms: 50}}\n"
        f"http: '127.0.0.1:{free_port()}'\n")
    # The DuckDB sink runs alone, from a copy of the file without the HTTP API (one daemon serves it).
    config.with_name("duck.yaml").write_text(config.read_text().rsplit("http:", 1)[0] + "http: null\n")
    # A second warehouse sink (schema bg) that the daemon verifies in the background every 2 s.
    config.with_name("background.yaml").write_text(
        config.read_text().rsplit("http:", 1)[0] +
        f"  - {{name: bg, type: sql, url: '{url}', schema: bg, topics: ['{prefix}.public.*'], batch_wait_ms: 50, "
        f"verify: {{every: 2s, rows_per_s: 100000}}}}\nhttp: '127.0.0.1:{free_port()}'\n")
    daemon = cdc_process(config, "run", "--only", "src", "wh", "cache", "search", log="daemon.log")
    try:
        # Both tables in all three stores before the writer starts: a test counts the store's rows.
        for table, rows in (("items", ROWS), ("kinds", 30)):
            wait_until(lambda: _count(target_dsn, table) == rows, timeout=120, what=f"the warehouse's {table}")
            wait_until(lambda: _cached(redis_url, cache, table) == rows, timeout=120, what=f"the cache's {table}")
            wait_until(lambda: _indexed(opensearch_url, prefix, table) == rows, timeout=120,
                       what=f"the index's {table}")
        with Writer(source_dsn, seed=30) as writer:
            wait_until(lambda: writer.changes > 200, timeout=60, what="the writer to write")
            yield Pipeline(config, source_dsn, target_dsn, redis_url, cache, opensearch_url, f"{prefix}-items", writer)
    finally:
        stop_daemon(daemon)
        client = redis.Redis.from_url(redis_url)
        names = list(client.scan_iter(match=f"{cache}*"))
        if names:
            client.delete(*names)
        client.close()
        search = OpenSearch(opensearch_url)
        search.indices.delete(index=f"{prefix}-*", ignore_unavailable=True)
        search.close()
        for generator in databases:
            next(generator, None)


def _indexed(url: str, prefix: str, table: str = "items") -> int:
    client = OpenSearch(url)
    try:
        if not client.indices.exists_alias(name=f"{prefix}-{table}"):
            return 0
        client.indices.refresh(index=f"{prefix}-{table}")
        return client.count(index=f"{prefix}-{table}")["count"]
    finally:
        client.close()


def _cached(url: str, prefix: str, table: str = "items") -> int:
    client = redis.Redis.from_url(url)
    try:
        return sum(1 for _ in client.scan_iter(match=f"{prefix}:public.{table}:*", count=1000))
    finally:
        client.close()


def _count(dsn: str, table: str = "items") -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table}")
            return cur.fetchone()[0]
    except psycopg2.errors.UndefinedTable:
        return 0
    finally:
        conn.close()


def test_a_clean_store_under_a_live_writer_verifies_equal(pipeline):
    before = pipeline.writer.changes
    for sink in ("wh", "cache", "search"):
        # 40 rows a chunk, 400 a digest (the warehouse): several either way.
        code, answer = verify(pipeline.config, sink, "--chunk", "40")
        assert [t["table"] for t in answer["tables"]] == ["public.items", "public.kinds"]
        for table in answer["tables"]:
            assert (code, table["counts"]) == (0, {"missing": 0, "extra": 0, "different": 0, "unsettled": 0}), \
                (sink, table)
        items, kinds = answer["tables"]
        assert items["rows"] >= ROWS // 2 and items["chunks"] >= 3 and kinds["rows"] == kinds["store_rows"] == 30
    assert pipeline.writer.changes > before  # the writer wrote while verify ran


def test_a_store_that_lags_behind_under_a_live_writer_is_no_false_alarm(pipeline, monkeypatch):
    """The cache paused while the writer writes, and resumed only once verify waits for it: its
    first chunks differ from the source (the store is behind), and the second looks wait for it
    instead of reporting."""
    from cdc.runtime.verify import LogSettle

    assert main(["pause", str(pipeline.config), "cache"]) == 0
    written = pipeline.writer.changes
    wait_until(lambda: pipeline.writer.changes > written + 100, timeout=60, what="writes the cache misses")
    waiting, settle = threading.Event(), LogSettle.wait

    def wait(self, position, topic):  # verify found a chunk differing and waits for the store
        waiting.set()
        return settle(self, position, topic)

    def resume() -> None:  # a process of its own: verify() holds this one's stdout
        waiting.wait(120)
        subprocess.run([sys.executable, "-m", "cdc.cli", "resume", str(pipeline.config), "cache"], check=True,
                       capture_output=True, timeout=60)

    monkeypatch.setattr(LogSettle, "wait", wait)
    resumer = threading.Thread(target=resume)
    resumer.start()
    try:
        code, answer = verify(pipeline.config, "cache", "--chunk", "400")
    finally:
        waiting.set()
        resumer.join()
    table = answer["tables"][0]
    assert (code, table["counts"]) == (0, {"missing": 0, "extra": 0, "different": 0, "unsettled": 0}), table
    assert table["chunks_differing"] >= 1 and table["settled"]


def test_a_store_that_does_not_settle_in_time_is_unsettled_not_different(pipeline):
    """The warehouse paused while the writer writes: its store is behind, and the second looks
    give up waiting for it (``--settle-timeout 2``). Nothing is known to differ: exit 3, the
    keys unsettled, the report saying the store did not settle."""
    assert main(["pause", str(pipeline.config), "wh"]) == 0
    try:
        written = pipeline.writer.changes
        wait_until(lambda: pipeline.writer.changes > written + 50, timeout=60, what="writes the warehouse misses")
        code, answer = verify(pipeline.config, "wh", "--settle-timeout", "2")
    finally:
        assert main(["resume", str(pipeline.config), "wh"]) == 0
    table = answer["tables"][0]
    assert (code, answer["equal"], table["settled"], table["equal"]) == (3, False, False, False), table
    assert table["counts"]["unsettled"] >= 1 and table["unsettled"], table
    assert sum(table["counts"][kind] for kind in ("missing", "extra", "different")) == 0, table


def test_hand_edits_of_the_warehouse_are_reported_exactly(pipeline):
    execute(pipeline.target_dsn, "DELETE FROM items WHERE id = 5", "UPDATE items SET qty = 999 WHERE id = 6",
            "INSERT INTO items (id, qty, price, note, __cdc_version) VALUES (99999999, 1, 1.00, 'stray', 1)")
    code, answer = verify(pipeline.config, "wh", "--chunk", "400")
    assert code == 1
    assert (keys_of(answer, "missing"), keys_of(answer, "different"), keys_of(answer, "extra")) == \
        (["5"], ["6"], ["99999999"])
    [different] = answer["tables"][0]["different"]
    assert (different["source"]["qty"], different["store"]["qty"]) == ("6", "999")
    # --repair re-sends 5 and 6 through the source; the stray row has no source row to send.
    code, answer = verify(pipeline.config, "wh", "--repair", "--repair-timeout", "120")
    assert code == 1 and keys_of(answer, "extra") == ["99999999"]
    assert [r["counts"] for r in answer["repair"]] == [{"missing": 0, "extra": 0, "different": 0, "unsettled": 0}]
    execute(pipeline.target_dsn, "DELETE FROM items WHERE id = 99999999")
    assert verify(pipeline.config, "wh")[0] == 0


def test_hand_edits_of_the_cache_are_reported_exactly(pipeline):
    client = redis.Redis.from_url(pipeline.redis_url)
    try:
        client.hset(f"{pipeline.redis_prefix}:public.items:7", "note", "edited")
        client.delete(f"{pipeline.redis_prefix}:public.items:8")
    finally:
        client.close()
    code, answer = verify(pipeline.config, "cache", "--chunk", "400")
    assert code == 1
    assert (keys_of(answer, "missing"), keys_of(answer, "different"), keys_of(answer, "extra")) == \
        (["8"], ["7"], [])
    [different] = answer["tables"][0]["different"]
    assert (different["source"]["note"], different["store"]["note"]) == ("seed", "edited")
    assert "at" not in different["source"]  # the sink's exclude applies to the source side too
    assert_repaired(pipeline, "cache")


def test_hand_edits_behind_the_search_alias_are_reported_exactly(pipeline):
    client = OpenSearch(pipeline.opensearch_url)
    try:
        # Edited as a careless user would: by id, through the alias, bookkeeping fields untouched.
        client.update(index=pipeline.alias, id="9", body={"doc": {"note": "edited"}}, params={"refresh": "true"})
        client.delete(index=pipeline.alias, id="10", params={"refresh": "true"})
    finally:
        client.close()
    code, answer = verify(pipeline.config, "search", "--chunk", "400")
    assert code == 1
    assert (keys_of(answer, "missing"), keys_of(answer, "different"), keys_of(answer, "extra")) == \
        (["10"], ["9"], [])
    [different] = answer["tables"][0]["different"]
    assert (different["source"]["note"], different["store"]["note"]) == ("seed", "edited")
    assert_repaired(pipeline, "search")


def _settle(pipeline: Pipeline, sink: str) -> None:
    """Wait until ``sink`` applied everything the source committed so far."""
    from cdc.config import load_config
    from cdc.log.open import open_log
    from cdc.positions import PgLsn
    from cdc.runtime.verify import LogSettle

    config = load_config(str(pipeline.config))
    conn = psycopg2.connect(pipeline.source_dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        now = PgLsn(int(cur.fetchone()[0]))
    conn.close()
    log_ = open_log(config.log)
    settle = LogSettle(log_, config.log.topic_prefix, "src", sink, timeout=120)
    try:
        assert settle.wait(now, f"{config.log.topic_prefix}.public.items"), f"sink {sink} to apply the source's writes"
    finally:
        settle.close()
        log_.close()


def test_equal_chunks_are_compared_by_the_databases_digests(pipeline):
    """The writer held and the warehouse caught up: each chunk is compared by the digests
    PostgreSQL computes on both sides (cdc/api/digest.py), no row read here, ``kinds`` with its
    15 types too (uuid, jsonb, bytea, floats, arrays, times...). ``--rows`` compares rows and
    agrees. A hand edit that keeps the row count makes its chunk's digests differ, and the rows
    then name the key."""
    pipeline.writer.hold.set()
    try:
        assert pipeline.writer.held.wait(30), "the writer to hold"
        _settle(pipeline, "wh")
        # A digest covers 10 chunks: 400 rows here.
        code, answer = verify(pipeline.config, "wh", "--chunk", "40")
        rows_code, by_rows = verify(pipeline.config, "wh", "--chunk", "40", "--rows")
        execute(pipeline.target_dsn, "UPDATE items SET note = note || ' edited' WHERE id = 7")
        try:
            edited_code, edited = verify(pipeline.config, "wh", "--chunk", "40", "--looks", "1")
        finally:
            execute(pipeline.target_dsn, "UPDATE items SET note = left(note, -7) WHERE id = 7")
    finally:
        pipeline.writer.hold.clear()
    items, kinds = answer["tables"]
    assert code == 0 and items["chunks"] >= 4, answer
    assert (items["chunks_digested"], items["chunks_differing"]) == (items["chunks"], 0)
    assert (kinds["chunks_digested"], kinds["rows"]) == (kinds["chunks"], 30)
    assert rows_code == 0 and by_rows["tables"][0]["chunks_digested"] == 0
    assert by_rows["tables"][0]["rows"] == items["rows"] == items["store_rows"]
    assert edited_code == 1 and keys_of(edited, "different") == ["7"], edited
    first = edited["tables"][0]  # the first 400 rows compared in 10 chunks, one differing; the rest by digest
    assert (first["chunks_differing"], first["chunks_digested"]) == (1, first["chunks"] - 10), first


def test_a_source_column_the_store_type_cannot_take_is_compared_by_rows_not_an_error(pipeline):
    """A store column whose type no longer matches the source's (``schema_policy: ignore`` after
    an ALTER TYPE): the source's digest declines it, by kind (text into a bigint) or when the
    cast refuses a value (text into a uuid), and verify falls back to rows instead of failing."""
    from cdc.api.digest import DigestColumn, DigestPlan, Kind
    from cdc.config import load_config
    from cdc.plugins import source_plugin

    [source] = load_config(str(pipeline.config)).sources
    reader = source_plugin(source.type).open_reader(source)
    key = DigestColumn("id", Kind.INTEGER, None, "integer")
    try:
        fits = reader.digest("public.items", DigestPlan("id", (key, DigestColumn("qty", Kind.INTEGER, None, "bigint")),
                                                        "postgresql"), None, 10)
        as_bigint = reader.digest("public.items", DigestPlan(
            "id", (key, DigestColumn("note", Kind.INTEGER, None, "bigint")), "postgresql"), None, 10)
        as_uuid = reader.digest("public.items", DigestPlan(
            "id", (key, DigestColumn("note", None, None, "uuid")), "postgresql"), None, 10)
        after = reader.digest("public.items", DigestPlan(
            "id", (key, DigestColumn("qty", Kind.INTEGER, None, "bigint")), "postgresql"), None, 10)
    finally:
        reader.close()
    assert fits is not None and fits.digest.rows == 10
    assert (as_bigint, as_uuid) == (None, None)
    assert after is not None and after.digest.rows == 10  # the connection still works after the refused cast


def test_hand_edits_of_a_duckdb_target_are_reported_exactly_and_repaired_once_its_sink_runs(pipeline):
    """DuckDB lets one process in: the target is verified with its sink stopped, the writer held.
    ``--repair --repair-timeout 0`` sends the keys through the daemon's source without waiting
    for a store it cannot read while the sink runs; the sink, started again, applies them, and
    the next verify (the stray row deleted by hand: no source row to send) is clean."""
    from cdc.config import load_config
    from cdc.log.open import open_log

    config = load_config(str(pipeline.config))
    topic = f"{config.log.topic_prefix}.public.items"
    duck_config = pipeline.config.with_name("duck.yaml")
    duck = run_daemon(duck_config, "duck", log="duck.log")
    log_ = open_log(config.log)
    pipeline.writer.hold.set()
    try:
        assert pipeline.writer.held.wait(30), "the writer to hold"
        _settle(pipeline, "duck")
        stop_daemon(duck)
        target = duckdb.connect(str(pipeline.config.parent / "duck.db"))
        try:
            target.execute("DELETE FROM items__g1 WHERE id = 11")  # DuckDB edits tables, not views
            target.execute("UPDATE items__g1 SET price = 0.01 WHERE id = 12")
            target.execute("INSERT INTO items__g1 (id, qty, note, __cdc_version) VALUES (77777777, 1, 'stray', 1)")
        finally:
            target.close()
        code, answer = verify(pipeline.config, "duck", "--chunk", "400")
        ends = sum(log_.end_offsets(topic).values())
        sent_code, sent = verify(pipeline.config, "duck", "--repair", "--repair-timeout", "0")
        wait_until(lambda: sum(log_.end_offsets(topic).values()) >= ends + 2, timeout=120,
                   what="the two keys sent again in the log")
        duck = run_daemon(duck_config, "duck", log="duck-again.log")
        _settle(pipeline, "duck")
        stop_daemon(duck)
        target = duckdb.connect(str(pipeline.config.parent / "duck.db"))
        try:
            target.execute("DELETE FROM items__g1 WHERE id = 77777777")
        finally:
            target.close()
        healed_code, healed = verify(pipeline.config, "duck", "--chunk", "400")
    finally:
        pipeline.writer.hold.clear()
        stop_daemon(duck)
        log_.close()
    assert code == 1
    assert (keys_of(answer, "missing"), keys_of(answer, "different"), keys_of(answer, "extra")) == \
        (["11"], ["12"], ["77777777"])
    [different] = answer["tables"][0]["different"]
    assert (different["source"]["price"], different["store"]["price"]) == ("9.9", "0.01")
    assert sent_code != 0 and sent["repair"], sent  # sent, not applied yet: the sink was stopped
    assert healed_code == 0, healed


def test_usage_errors_exit_2_and_a_repair_without_a_daemon_says_so(pipeline, capsys):
    config = str(pipeline.config)
    assert main(["verify", config, "nosuch"]) == 2
    assert "no sink named 'nosuch'" in capsys.readouterr().err
    assert main(["verify", config, "wh", "public.nosuch"]) == 2
    assert "reads no table public.nosuch" in capsys.readouterr().err
    assert main(["verify", config, "wh", "--chunk", "0"]) == 2
    assert main(["verify", str(pipeline.config.with_name("duck.yaml")), "duck", "--repair"]) == 75
    assert "--repair sends the keys through the running daemon's API" in capsys.readouterr().err


def test_the_daemon_verifies_a_sink_in_the_background_and_exports_what_differs(pipeline):
    config = pipeline.config.with_name("background.yaml")
    port = re.search(r"http: '127.0.0.1:(\d+)'", config.read_text())[1]

    def passes() -> dict[str, str]:
        """The bg sink's verify figures in /metrics: series -> value."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
        except OSError:
            return {}
        return dict(line.rsplit(" ", 1) for line in text.splitlines()
                    if line.startswith("cdc_verify_") and 'sink="bg"' in line)

    mismatched = 'cdc_verify_mismatched_rows{sink="bg",table="public.items"}'
    stamp = 'cdc_verify_last_pass_timestamp_seconds{sink="bg"}'
    daemon = cdc_process(config, "run", "--only", "bg", log="background.log")
    try:
        wait_until(lambda: passes().get(mismatched) == "0", timeout=120, what="a background pass finding bg equal")
        execute(pipeline.target_dsn, "UPDATE bg.items SET qty = -1 WHERE id = 14")
        edited = time.time()
        wait_until(lambda: (f := passes()) and float(f[stamp]) > edited and f[mismatched] == "1", timeout=60,
                   what="a background pass finding the edit")
        assert passes()['cdc_verify_failed{sink="bg"}'] == "0"
        # The console shows the last pass: the table and how many keys differ.
        page = parse(dump_dom(f"http://127.0.0.1:{port}/"))
        [bg] = [r for r in page.find_all("connector", tag="tr") if r.attrs["data-name"] == "bg"]
        cell = bg.find("verify")
        assert "verify-differs" in cell.classes and float(cell.attrs["data-at"]) > edited
        assert {t.attrs["data-table"]: t.attrs["data-keys"] for t in cell.find_all("verify-table")} == \
            {"public.items": "1", "public.kinds": "0"}
        assert daemon.poll() is None  # a mismatch never stops the pipeline
    finally:
        stop_daemon(daemon)
