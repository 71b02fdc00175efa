"""``cdc snapshot --where``, ``--pause`` and ``--resume`` against the running daemon and real
servers: a condition reads only the rows it matches (and a condition the database refuses is
refused at the command, naming it); a paused snapshot opens no further chunk while the stream goes
on, and a resume reads on to the end.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc.offsets import OffsetStore
from cdc.positions import IncrementalProgress
from tests.daemon import run_daemon, stop_daemon
from tests.integration.test_daemon import _open_log
from tests.integration.test_daemon_control import _rows
from tests.integration.test_incremental_snapshot import reads

ROWS = 3000
CHUNK = 50


def snapshot_command(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc.cli", "snapshot", str(config), "src", *args],
                          cwd=config.parent, capture_output=True, text=True, timeout=60)


def wait(what: str, check, process: subprocess.Popen, config: Path, limit: float = 120):
    deadline = time.monotonic() + limit
    while not (value := check()):
        log = (config.parent / "daemon.log").read_text()
        assert process.poll() is None, f"the daemon exited before {what}: {log}"
        assert time.monotonic() < deadline, f"not within {limit}s: {what}: {log}"
        time.sleep(0.05)
    return value


def check_controls(tmp_path: Path, source_yaml: str, table: str, even: str, insert_row) -> None:
    """Asks for the even rows of ``table`` (condition ``even``) and pauses it at once; checks that
    no further chunk is opened while the stream carries a new row, resumes, and checks that
    exactly the even rows were read."""
    from cdc.dev.services import free_port

    port = free_port()
    config = tmp_path / "cdc.yaml"
    # 30 chunks of 50 rows with 0.6 s after each: the pause, asked right after the snapshot, finds
    # it under way even when starting the command takes seconds on a loaded machine.
    config.write_text("log:\n  embedded: {path: ./data, topic_prefix: ctl}\n"
                      f"sources:\n  - {{name: src, snapshot: never, incremental_chunk_rows: {CHUNK}, "
                      f"incremental_chunk_pause_ms: 600, {source_yaml}}}\n"
                      f"http: \"127.0.0.1:{port}\"\n")
    log_, prefix = _open_log(config)
    topic = f"{prefix}.{table}"

    def progress():
        stored = OffsetStore(log_, prefix).load("src")
        return stored if isinstance(stored, IncrementalProgress) else None

    def snapshot_status():
        return _rows(port).get("src", {}).get("incremental_snapshot") or {}

    process = run_daemon(config, "src", log="daemon.log")
    try:
        wait("the source to stream", lambda: _rows(port).get("src", {}).get("phase") == "streaming", process, config)
        refused = snapshot_command(config, table, "--where", "no_such_column = 1")
        assert refused.returncode != 0, refused.stderr
        assert "no_such_column" in refused.stderr and "refused" in refused.stderr, refused.stderr
        escaping = snapshot_command(config, table, "--where", "v = 0) OR (1 = 1")  # the server would take it
        assert escaping.returncode != 0 and "closes more than the condition opened" in escaping.stderr, escaping.stderr
        misplaced = snapshot_command(config, "--pause", "--where", even)
        assert misplaced.returncode != 0 and "--where goes with the tables" in misplaced.stderr, misplaced.stderr

        asked = snapshot_command(config, table, "--where", even)
        assert asked.returncode == 0 and f"rows where {even}" in asked.stderr, asked.stderr
        paused = snapshot_command(config, "--pause")
        assert paused.returncode == 0, paused.stderr
        wait("the pause stored with the progress", lambda: (p := progress()) and p.paused, process, config)
        status = wait("status to show the pause", lambda: (s := snapshot_status()).get("paused") and s, process, config)
        assert status["where"] == even and status["table"] == table
        reads_when_paused = len(reads(log_, topic))
        # Evidence that the stream goes on while paused: a new row reaches the topic. Meanwhile at
        # most the chunk open when the pause came went out; no further one was opened.
        new_id = insert_row()
        wait("a streamed row while paused", lambda: any(
            v["op"] == "c" and v["after"]["id"] == new_id for v in _values(log_, topic)), process, config)
        time.sleep(2.0)  # three chunk pauses: a snapshot that ignored the pause would read on
        assert progress().paused
        reads_while_paused = len(reads(log_, topic))
        assert reads_while_paused <= reads_when_paused + CHUNK < ROWS // 2, (reads_when_paused, reads_while_paused)

        resumed = snapshot_command(config, "--resume")
        assert resumed.returncode == 0, resumed.stderr
        wait("the snapshot to finish", lambda: progress() is None and not snapshot_status()
             and len(reads(log_, topic)) > reads_while_paused, process, config, limit=180)
    finally:
        stop_daemon(process)
    read_ids = [r["after"]["id"] for r in reads(log_, topic)]
    assert read_ids and all(i % 2 == 0 for i in read_ids), "a row outside the condition was read"
    assert set(read_ids) >= {i for i in range(2, ROWS + 1, 2)}, "an even row was not read"
    log_.close()


def _values(log_, topic: str) -> list[dict]:
    import orjson

    if topic not in log_.topics():
        return []
    return [orjson.loads(r.value) for r in log_.read_all(topic) if r.value is not None]


@pytest.mark.postgres
def test_postgres_snapshot_where_pause_and_resume_through_the_daemon(pg_dsn, tmp_path):
    from tests.integration.pg_capture import execute

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
            f"INSERT INTO t SELECT g, 0 FROM generate_series(1, {ROWS}) g")

    def insert_row() -> int:
        new_id = ROWS + 2 + random.randrange(1000) * 2  # even: matches the condition, read or not
        execute(pg_dsn, f"INSERT INTO t VALUES ({new_id}, 1)")
        return new_id

    check_controls(tmp_path, f"type: postgres, dsn: '{pg_dsn}', tables: [public.t], signal_table: "
                   "public.cdc_signal, state_dir: ./state, heartbeat_interval: 1", "public.t", "id % 2 = 0",
                   insert_row)


@pytest.mark.mysql
def test_mariadb_snapshot_where_pause_and_resume_through_the_daemon(mysql_url, mysql_db, tmp_path):
    from tests.integration.test_mysql_source import execute

    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            f"INSERT INTO t SELECT seq, 0 FROM seq_1_to_{ROWS}")

    def insert_row() -> int:
        new_id = ROWS + 2 + random.randrange(1000) * 2
        execute(mysql_url, mysql_db, f"INSERT INTO t VALUES ({new_id}, 1)")
        return new_id

    check_controls(tmp_path, f"type: mysql, url: '{mysql_url}', tables: ['{mysql_db}.t'], signal_table: "
                   f"{mysql_db}.cdc_signal, server_id: {random.randrange(10_000, 2**31)}, heartbeat_interval: 0.5",
                   f"{mysql_db}.t", "id % 2 = 0", insert_row)
