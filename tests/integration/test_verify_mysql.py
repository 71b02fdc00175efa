"""``cdc verify`` with a MariaDB source (reads at a binlog position) into a SQLite target, under a
live writer: a clean store verifies equal, hand edits are reported exactly, ``--repair`` heals
what a snapshot can send and the next verify is clean (cdc/runtime/verify.py)."""

from __future__ import annotations

import json
import random
import socket
import sqlite3
import threading
import time
import uuid
from contextlib import redirect_stdout
from io import StringIO

import pytest

from cdc.cli import main
from tests.conftest import mysql_connect
from tests.daemon import cdc_process, stop_daemon
from tests.integration.pg_capture import wait_until

pytestmark = [pytest.mark.mysql]

ROWS = 800
RESERVED = 100  # keys below are never touched by the writer


def verify(config, sink: str, *args: str) -> tuple[int, dict]:
    out = StringIO()
    with redirect_stdout(out):
        code = main(["verify", str(config), sink, "--json", "--settle-timeout", "30", *args])
    return code, json.loads(out.getvalue())


def keys_of(answer: dict, kind: str) -> list:
    return sorted(k for table in answer["tables"] for finding in table[kind] for k in finding["key"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _count(path) -> int:
    try:
        conn = sqlite3.connect(path)
        try:
            return conn.execute("SELECT count(*) FROM items").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:  # not made yet
        return 0


def test_a_mariadb_source_verified_under_a_writer_reports_hand_edits_and_repairs(mysql_url, mysql_db, tmp_path):
    admin = mysql_connect(mysql_url, mysql_db)
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE items (id INT PRIMARY KEY, qty INT NOT NULL, price DECIMAL(10,2), note TEXT)")
        cur.execute(f"INSERT INTO items SELECT seq, seq MOD 7, 9.90, 'seed' FROM seq_1_to_{ROWS}")
    admin.close()
    prefix = f"m{uuid.uuid4().hex[:6]}"
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: my, type: mysql, url: '{mysql_url}', server_id: {random.randrange(10_000, 2**31)}, "
        f"tables: ['{mysql_db}.items'], heartbeat_interval: 0.5, signal_table: '{mysql_db}.cdc_signal'}}\n"
        f"sinks:\n  - {{name: lite, type: sql, url: 'sqlite:///lite.db', topics: ['{prefix}.*'], batch_wait_ms: 50}}\n"
        f"http: '127.0.0.1:{_free_port()}'\n")
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
        thread.start()
        wait_until(lambda: changes[0] > 100, timeout=60, what="the writer to write")
        code, answer = verify(config, "lite", "--chunk", "300")
        assert (code, answer["tables"][0]["counts"]) == (0, {"missing": 0, "extra": 0, "different": 0,
                                                             "unsettled": 0}), answer
        target = sqlite3.connect(tmp_path / "lite.db", timeout=30)
        with target:
            target.execute("DELETE FROM items__g1 WHERE id = 3")
            target.execute("UPDATE items__g1 SET note = 'edited' WHERE id = 4")
        target.close()
        code, answer = verify(config, "lite", "--chunk", "300")
        assert code == 1
        assert (keys_of(answer, "missing"), keys_of(answer, "different"), keys_of(answer, "extra")) == \
            (["3"], ["4"], [])
        code, answer = verify(config, "lite", "--repair", "--repair-timeout", "120")
        assert code == 0 and all(r["equal"] for r in answer["repair"]), answer
        assert verify(config, "lite")[0] == 0
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        stop_daemon(daemon)
