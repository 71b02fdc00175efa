"""``cdc verify`` with a MariaDB source (reads at a binlog position) into a SQLite target, a MariaDB
target and a Redis Cluster cache of JSON values, under a live writer: a clean store verifies equal,
hand edits are reported exactly, ``--repair`` heals what a snapshot can send and the next verify
is clean (cdc/runtime/verify.py)."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
import uuid

import pytest
from redis.cluster import RedisCluster

from tests.conftest import mysql_connect
from tests.daemon import cdc_process, stop_daemon
from tests.integration.pg_capture import wait_until
from tests.verifying import free_port, keys_of, verify

pytestmark = [pytest.mark.mysql, pytest.mark.redis]

ROWS = 800
RESERVED = 100  # keys below are never touched by the writer


def _mariadb_count(url: str, database: str) -> int:
    conn = mysql_connect(url, database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM items")
            return cur.fetchone()[0]
    except Exception:  # noqa: BLE001 - not made yet
        return 0
    finally:
        conn.close()


def _cached(cluster: RedisCluster, prefix: str) -> int:
    return sum(1 for k in cluster.scan_iter(match=f"{prefix}:*.items:*", count=1000) if b"{" not in k)


def _count(path) -> int:
    try:
        conn = sqlite3.connect(path)
        try:
            return conn.execute("SELECT count(*) FROM items").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:  # not made yet
        return 0


def test_a_mariadb_source_verified_under_a_writer_reports_hand_edits_and_repairs(mysql_url, mysql_db,
                                                                                redis_cluster_url, tmp_path):
    target_db = f"{mysql_db}_wh"
    admin = mysql_connect(mysql_url, mysql_db)
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE items (id INT PRIMARY KEY, qty INT NOT NULL, price DECIMAL(10,2), note TEXT)")
        cur.execute(f"INSERT INTO items SELECT seq, seq MOD 7, 9.90, 'seed' FROM seq_1_to_{ROWS}")
        cur.execute(f"CREATE DATABASE `{target_db}`")
    prefix, cache = f"m{uuid.uuid4().hex[:6]}", f"m{uuid.uuid4().hex[:6]}"
    target_url = mysql_url.replace("mysql://", "mysql+pymysql://", 1).rstrip("/") + f"/{target_db}"
    cluster = RedisCluster.from_url(redis_cluster_url)
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: my, type: mysql, url: '{mysql_url}', server_id: {random.randrange(10_000, 2**31)}, "
        f"tables: ['{mysql_db}.items'], heartbeat_interval: 0.5, signal_table: '{mysql_db}.cdc_signal'}}\n"
        f"sinks:\n  - {{name: lite, type: sql, url: 'sqlite:///lite.db', topics: ['{prefix}.*'], batch_wait_ms: 50}}\n"
        f"  - {{name: mdb, type: sql, url: '{target_url}', topics: ['{prefix}.*'], batch_wait_ms: 50}}\n"
        f"  - {{name: rc, type: redis, url: '{redis_cluster_url}', cluster: true, format: json, key_prefix: {cache}, "
        f"topics: ['{prefix}.*'], batch_wait_ms: 50}}\n"
        f"http: '127.0.0.1:{free_port()}'\n")
    daemon = cdc_process(config, "run", log="daemon.log")
    stop, changes = threading.Event(), [0]

    def writer() -> None:
        conn, rng, next_id = mysql_connect(mysql_url, mysql_db), random.Random(5), 100_000
        try:
            with conn.cursor() as cur:
                while not stop.is_set():
                    roll, key = rng.random(), rng.randrange(RESERVED, ROWS)
                    if roll < 0.6:
                        cur.execute("UPDATE items SET qty = qty + 1, note = %s WHERE id = %s", (f"n{changes[0]}", key))
                    elif roll < 0.8:
                        next_id += 1
                        cur.execute("INSERT INTO items VALUES (%s, 1, 2.50, 'new')", (next_id,))
                    else:
                        cur.execute("DELETE FROM items WHERE id = %s", (key,))
                    changes[0] += 1
                    time.sleep(0.01)
        finally:
            conn.close()

    thread = threading.Thread(target=writer, daemon=True)
    try:
        wait_until(lambda: _count(tmp_path / "lite.db") == ROWS, timeout=120, what="the SQLite target's first fill")
        wait_until(lambda: _mariadb_count(mysql_url, target_db) == ROWS, timeout=120,
                   what="the MariaDB target's first fill")
        wait_until(lambda: _cached(cluster, cache) == ROWS, timeout=120, what="the cluster cache's first fill")
        thread.start()
        wait_until(lambda: changes[0] > 100, timeout=60, what="the writer to write")
        for sink in ("lite", "mdb", "rc"):
            code, answer = verify(config, sink, "--chunk", "300")
            assert (code, answer["tables"][0]["counts"]) == (0, {"missing": 0, "extra": 0, "different": 0,
                                                                 "unsettled": 0}), (sink, answer)
            assert answer["tables"][0]["store_rows"] >= ROWS // 2, (sink, answer)
        target = sqlite3.connect(tmp_path / "lite.db", timeout=30)
        with target:
            target.execute("DELETE FROM items__g1 WHERE id = 3")
            target.execute("UPDATE items__g1 SET note = 'edited' WHERE id = 4")
        target.close()
        warehouse = mysql_connect(mysql_url, target_db)
        with warehouse.cursor() as cur:  # items is a view of generation 1's table
            cur.execute("DELETE FROM items__g1 WHERE id = 5")
            cur.execute("UPDATE items__g1 SET price = 0.01 WHERE id = 6")
            cur.execute("INSERT INTO items__g1 (id, qty, price, note, __cdc_version) VALUES (99999999, 1, 1, 'x', 1)")
        warehouse.close()
        [edited] = [k for k in cluster.scan_iter(match=f"{cache}:*.items:8") if b"{" not in k]
        cluster.set(edited, json.dumps({**json.loads(cluster.get(edited)), "note": "edited"}))
        [gone] = [k for k in cluster.scan_iter(match=f"{cache}:*.items:7") if b"{" not in k]
        cluster.delete(gone)
        for sink, expected in (("lite", (["3"], ["4"], [])), ("mdb", (["5"], ["6"], ["99999999"])),
                               ("rc", (["7"], ["8"], []))):
            code, answer = verify(config, sink, "--chunk", "300")
            assert code == 1, (sink, answer)
            assert (keys_of(answer, "missing"), keys_of(answer, "different"), keys_of(answer, "extra")) == \
                expected, sink
        for sink in ("lite", "rc"):
            code, answer = verify(config, sink, "--repair", "--repair-timeout", "120")
            assert code == 0 and all(r["equal"] for r in answer["repair"]), answer
            assert verify(config, sink)[0] == 0
        # The writer stopped and the MariaDB target caught up (verify names just the hand edits):
        # its rows are compared by the two databases' digests in canonical texts, 300 at a time
        # (10 chunks), but for the first 300 (keys 5 and 6) and the last (the stray row), whose
        # rows are compared in chunks and name the keys.
        stop.set()
        thread.join()
        found: list[dict] = []

        def hand_edits_only() -> bool:
            found[:] = [verify(config, "mdb", "--chunk", "30", "--looks", "1")[1]]
            return (keys_of(found[0], "missing"), keys_of(found[0], "different"), keys_of(found[0], "extra")) == \
                (["5"], ["6"], ["99999999"])
        wait_until(hand_edits_only, timeout=60, what="the MariaDB target to catch up with the stopped writer")
        table = found[0]["tables"][0]
        assert table["chunks_differing"] == 2 and table["chunks_digested"] >= 1, table
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        stop_daemon(daemon)
        names = list(cluster.scan_iter(match=f"{cache}*"))
        for name in names:
            cluster.delete(name)
        cluster.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{target_db}`")
        admin.close()


def test_the_verify_reader_reads_timestamps_in_utc_as_the_snapshot_does(mysql_url, mysql_db):
    """A TIMESTAMP's text follows the session's time zone; the snapshot and the binlog give UTC,
    so the verify reader's session is UTC whatever the server's default (else every TIMESTAMP of
    a server in another zone would differ from the store). Its digests read the same session."""
    from sources.mysql.config import MySqlConfig
    from sources.mysql.verify_reader import MySqlTableReader

    conn = mysql_connect(mysql_url, mysql_db)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE stamps (id INT PRIMARY KEY, at TIMESTAMP(6) NULL)")
        cur.execute("SET SESSION time_zone = '+05:00'")
        cur.execute("INSERT INTO stamps VALUES (1, '2026-01-01 05:00:00.000001')")  # 00:00 UTC
    conn.close()
    reader = MySqlTableReader(MySqlConfig(name="my", url=mysql_url, server_id=4242, tables=[f"{mysql_db}.*"]))
    try:
        [event] = reader.read(f"{mysql_db}.stamps", None, 10).events
        with reader.conn.cursor() as cur:
            cur.execute("SELECT @@session.time_zone")
            zone = cur.fetchone()[0]
    finally:
        reader.close()
    assert zone in ("+00:00", b"+00:00")
    assert str(event.after["at"]).startswith("2026-01-01T00:00:00.000001"), event.after
