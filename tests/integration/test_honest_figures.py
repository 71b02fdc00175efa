"""What the daemon reports is true: a caught-up source shows lag 0 (measured against the server's
own position, not only commit times); a sink that falls behind shows it per topic in records and
seconds; sinks count their bytes; `cdc status` takes its figures from the daemon."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import psycopg2
import pytest

from cdc.dev.services import free_port
from tests.conftest import mysql_connect
from tests.integration.test_daemon import _get, _start
from tests.integration.test_daemon_control import _cdc, _rows, _stop, _wait


def _metric(port: int, name: str, **labels: str) -> float | None:
    _, text = _get(f"http://127.0.0.1:{port}/metrics")
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def _idle_source_shows_lag_zero(tmp_path: Path, source_yaml: str, write, what: str) -> None:
    port = free_port()
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  embedded: {{path: ./data, topic_prefix: t_{uuid.uuid4().hex[:8]}}}\n"
                      f"sources:\n  - {source_yaml}\nhttp: \"127.0.0.1:{port}\"\n")
    process = _start(config)
    try:
        _wait(f"{what} streams", lambda: (_rows(port).get("src") or {}).get("phase") == "streaming", process)
        write()  # changes, then nothing: the source catches up and stays idle
        _wait(f"{what} publishes the changes", lambda: (_rows(port).get("src") or {}).get("events", 0) >= 3, process)
        row = _wait(f"{what} reports lag 0 once caught up",
                    lambda: (row := _rows(port).get("src")) and row.get("lag_seconds") == 0 and row, process)
        assert row["phase"] == "streaming"
        assert _metric(port, "cdc_lag_seconds", connector="src") == 0
    finally:
        _stop(process)


@pytest.mark.postgres
def test_an_idle_caught_up_postgres_source_has_lag_zero(tmp_path, pg_dsn):
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")

    def write() -> None:
        with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 3) g")

    _idle_source_shows_lag_zero(tmp_path, f"{{name: src, type: postgres, dsn: '{pg_dsn}', tables: [public.items], "
                                f"state_dir: ./state}}", write, "the PostgreSQL source")


@pytest.mark.mysql
def test_an_idle_caught_up_mysql_source_has_lag_zero(tmp_path, mysql_url, mysql_db):
    conn = mysql_connect(mysql_url, mysql_db)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")

    def write() -> None:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO items VALUES (1, 'x'), (2, 'y'), (3, 'z')")

    try:
        _idle_source_shows_lag_zero(tmp_path, f"{{name: src, type: mysql, url: '{mysql_url}', "
                                    f"server_id: {random.randrange(10_000, 2**31)}, tables: ['{mysql_db}.*']}}",
                                    write, "the MySQL source")
    finally:
        conn.close()


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def log_yaml(request):
    """The log section for a fresh topic prefix: (yaml, prefix)."""
    prefix = f"t_{uuid.uuid4().hex[:8]}"
    if request.param == "kafka":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        return f"log:\n  kafka: {{bootstrap_servers: '{bootstrap}', topic_prefix: {prefix}, partitions: 2}}\n", prefix
    return f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}}}\n", prefix


def test_a_paused_sink_shows_its_lag_per_topic_and_status_comes_from_the_daemon(tmp_path, monkeypatch, capsys,
                                                                                 log_yaml):
    import json
    import subprocess
    import sys

    port = free_port()
    log_section, prefix = log_yaml
    topic = f"{prefix}.public.items"
    config = tmp_path / "cdc.yaml"
    # `other` needs a variable nobody set: the daemon runs the rest (--only), and `cdc status` of
    # the connectors it shows never reads other's settings.
    config.write_text(log_section +
                      "sources:\n  - {name: gen, type: generator, keys: 50, events: 1500, rate: 150}\n"
                      "sinks:\n"
                      f"  - {{name: warehouse, type: sql, url: 'sqlite:///target.db', topics: ['{prefix}.*']}}\n"
                      "  - {name: other, type: sql, url: '${CDC_TEST_NEVER_SET}', topics: ['x']}\n"
                      f"http: \"127.0.0.1:{port}\"\n")
    process = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config), "--only", "gen", "warehouse"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait("the sink writes", lambda: (_rows(port).get("warehouse") or {}).get("events", 0) > 0, process)
        assert _metric(port, "cdc_bytes_total", connector="warehouse") > 0
        assert _cdc("pause", str(config), "warehouse", cwd=tmp_path).returncode == 0
        _wait("the sink paused", lambda: (_rows(port).get("warehouse") or {}).get("phase") == "paused", process)
        _wait("the paused sink's lag shows in records and seconds",
              lambda: (_metric(port, "cdc_sink_lag_records", connector="warehouse", topic=topic) or 0) > 0
              and (_metric(port, "cdc_sink_lag_seconds", connector="warehouse", topic=topic) or 0) > 0, process)

        # `cdc status` answers from the daemon: it does not even open the log.
        import cdc.log.open
        from cdc.cli import main

        def no_log(*_):
            raise AssertionError("cdc status opened the log although the daemon answered")

        monkeypatch.setattr(cdc.log.open, "open_log", no_log)
        capsys.readouterr()
        assert main(["status", str(config), "gen", "warehouse", "--json"]) == 0
        rows = {row["name"]: row for row in json.loads(capsys.readouterr().out) if "name" in row}
        assert set(rows) == {"gen", "warehouse"}
        assert rows["warehouse"]["phase"] == "paused" and rows["warehouse"]["consumer_lag"] > 0
        assert rows["warehouse"]["topics"][topic]["seconds"] > 0
        monkeypatch.undo()

        assert _cdc("resume", str(config), "warehouse", cwd=tmp_path).returncode == 0
        _wait("the sink catches up once the source is done: lag 0 in records and seconds",
              lambda: (_rows(port).get("gen") or {}).get("phase") == "finished"
              and _metric(port, "cdc_sink_lag_records", connector="warehouse", topic=topic) == 0
              and _metric(port, "cdc_sink_lag_seconds", connector="warehouse", topic=topic) == 0, process)
    finally:
        _stop(process)


@pytest.mark.mysql
def test_a_snapshot_shows_rows_chunks_and_an_eta(tmp_path, mysql_url, mysql_db):
    conn = mysql_connect(mysql_url, mysql_db)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name varchar(40))")
        cur.execute("INSERT INTO items SELECT seq, concat('item ', seq) FROM seq_1_to_300000")
    conn.close()
    port = free_port()
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  embedded: {{path: ./data, topic_prefix: t_{uuid.uuid4().hex[:8]}, fsync: false}}\n"
                      f"sources:\n  - {{name: src, type: mysql, url: '{mysql_url}', server_id: "
                      f"{random.randrange(10_000, 2**31)}, tables: ['{mysql_db}.*'], snapshot_chunk_rows: 2000}}\n"
                      f"http: \"127.0.0.1:{port}\"\n")
    process = _start(config)
    try:
        row = _wait("the snapshot reports its progress midway",
                    lambda: (row := _rows(port).get("src")) and (s := row.get("snapshot_progress"))
                    and 0 < s["chunks_done"] < s["chunks_total"] and row, process)
        snapshot = row["snapshot_progress"]
        total = snapshot["chunks_total"]
        assert total >= 300_000 // 2000 and 0 < snapshot["rows"] <= 300_000  # chunks of 2000 rows at most
        assert _metric(port, "cdc_snapshot_chunks_total", connector="src") == total
        row = _wait("an ETA", lambda: (row := _rows(port).get("src")) and (s := row.get("snapshot_progress"))
                    and s["eta_seconds"] is not None and row, process)
        assert row["snapshot_progress"]["eta_seconds"] >= 0
        status = _cdc("status", str(config), cwd=tmp_path)
        assert "snapshot rows=" in status.stdout and f"/{total} eta=" in status.stdout, status.stdout
        _wait("the snapshot ends and its progress goes away",
              lambda: (row := _rows(port).get("src")) and row["phase"] == "streaming" and row["snapshot_progress"] is None,
              process, limit=300)
    finally:
        _stop(process)
