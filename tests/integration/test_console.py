"""The console in a real headless Chromium, against a running pipeline: PostgreSQL -> embedded
log -> SQL sink (SQLite), with a schema change and a row the target refuses (a dead letter)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import psycopg2
import pytest

from cdc.dev.services import free_port
from cdc.log.embedded import EmbeddedLog
from tests.browser import dump_dom, parse

pytestmark = pytest.mark.postgres

ROWS = 25
REFUSED = "qty must not be negative"


def _wait(what: str, check, daemon: subprocess.Popen, log_file: Path, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached; daemon log:\n{log_file.read_text()[-3000:]}")
        time.sleep(0.2)


def _get(http: str, path: str):
    try:
        with urllib.request.urlopen(f"http://{http}{path}", timeout=5) as response:
            return json.loads(response.read())
    except OSError:
        return None


def _target_count(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        try:
            return conn.execute("SELECT count(*) FROM items").fetchone()[0]
        except sqlite3.OperationalError:  # the sink has not created the table yet
            return 0


def test_the_console_shows_connectors_dead_letters_and_schema_history(pg_dsn, tmp_path):
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL)")
        cur.execute("INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, %s) g", (ROWS,))
    http = f"127.0.0.1:{free_port()}"
    target = tmp_path / "warehouse.db"
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  embedded: {{path: '{tmp_path / 'log'}', topic_prefix: shop, fsync: false}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{pg_dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"sinks:\n  - {{name: wh, type: sql, url: 'sqlite:///{target}', topics: ['shop.public.*'], "
        f"batch_wait_ms: 50}}\n"
        f"http: '{http}'\n")
    log_file = tmp_path / "daemon.log"
    daemon = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=tmp_path,
                              stdout=open(log_file, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait("the snapshot in the warehouse", lambda: _target_count(target) == ROWS, daemon, log_file)
        # The warehouse refuses negative quantities from now on: such a row becomes a dead letter.
        with sqlite3.connect(target, timeout=30) as conn:  # items is a view of generation 1's table
            conn.execute(f"CREATE TRIGGER no_negative BEFORE INSERT ON items__g1 WHEN NEW.qty < 0 "
                         f"BEGIN SELECT RAISE(ABORT, '{REFUSED}'); END")
        with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
            cur.execute("ALTER TABLE items ADD COLUMN note text")  # the table's second shape
            cur.execute("INSERT INTO items VALUES (1000, 'refused', -1, 'x'), (1001, 'kept', 1, 'y')")

        def settled():
            rows = {r["name"]: r for r in _get(http, "/status") or []}
            done = (rows.get("src", {}).get("events") == ROWS + 2 and _target_count(target) == ROWS + 1
                    and all(r["phase"] == "streaming" for r in rows.values()))
            letters = _get(http, "/api/dead-letters")
            return done and letters and letters[0]["count"] == 1
        _wait("the live rows, the dead letter and both phases", settled, daemon, log_file)

        page = parse(dump_dom(f"http://{http}/"))
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(60)

    assert page.find_all("load-error") == [], [e.text for e in page.find_all("load-error")]
    rows = {r.attrs["data-name"]: r for r in page.find_all("connector", tag="tr")}
    assert set(rows) == {"src", "wh"}
    assert {name: r.attrs["data-phase"] for name, r in rows.items()} == {"src": "streaming", "wh": "streaming"}
    assert rows["src"].find("events").text == str(ROWS + 2)  # 25 snapshot rows and 2 live inserts
    assert rows["src"].find("snapshot").text not in ("", "–")  # "done", or the figures the source reports
    for row in rows.values():  # the phase strip and both charts are drawn
        assert len(row.find_all("chart", tag="svg")) == 3

    [sink] = page.find_all("dead-letter-sink")
    assert sink.attrs["data-sink"] == "wh" and sink.find("dead-letter-count").text == "1"
    [letter] = page.find_all("dead-letter", tag="tr")
    assert REFUSED in letter.find("reason").text and '"id":1000' in letter.text.replace(" ", "")

    # Each shape of the table, as the schema topic holds them, with its columns.
    log = EmbeddedLog(tmp_path / "log")
    shapes = sorted(orjson.loads(r.value)["version"] for r in log.read_all("shop.schema-changes") if r.value)
    log.close()
    assert len(shapes) == 2
    versions = [r for r in page.find_all("schema-version", tag="tr") if r.attrs["data-table"] == "public.items"]
    assert [int(r.attrs["data-version"]) for r in versions] == shapes
    assert "note text" in versions[1].text
    assert "note" not in versions[0].text
