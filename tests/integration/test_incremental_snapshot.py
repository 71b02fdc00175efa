"""Incremental snapshots while streaming (snapshot/incremental.py), against real servers.

A source that never snapshotted (``snapshot: never``) streams a table's changes only; an
incremental snapshot asked for while a writer updates, deletes and changes primary keys of that
table re-reads it in chunks between watermarks. Afterwards the topic equals the table both as a
sink sees it (newest version per key) and as compaction keeps it (last record per key), and no
chunk row ever went out with a version above a streamed change it does not show.
"""

from __future__ import annotations

import random
import threading

import orjson
import pytest

from cdc.offsets import OffsetStore
from cdc.positions import IncrementalProgress
from tests.integration.pg_capture import capturing, topic_state, wait_until
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``

ROWS = 4000


def records(log, topic: str) -> list:
    return sorted(log.read_all(topic), key=lambda r: (r.partition, r.offset)) if topic in log.topics() else []


def compacted(log, topic: str) -> dict:
    """What compaction keeps: the last record per key, deletes and tombstones removing it."""
    rows: dict = {}
    for record in records(log, topic):
        value = orjson.loads(record.value) if record.value is not None else None
        if value is None or value["op"] == "d":
            rows.pop(record.key.decode(), None)
        else:
            rows[record.key.decode()] = value["after"]
    return rows


def reads(log, topic: str) -> list[dict]:
    return [v for v in (orjson.loads(r.value) for r in records(log, topic) if r.value is not None) if v["op"] == "r"]


def assert_no_chunk_row_outranks_a_later_change(log, topic: str) -> None:
    """Every change after a chunk row of its key (log order: per key, as a sink reads) carries a
    higher version, so no sink that keeps the newest version ignores it in favour of the chunk."""
    last_read: dict = {}
    for record in records(log, topic):
        if record.value is None:
            continue
        value = orjson.loads(record.value)
        version = value["source"]["version"]
        if value["op"] == "r":
            last_read[record.key] = version
        elif record.key in last_read:
            assert version > last_read[record.key], f"{value} after a chunk row of version {last_read[record.key]}"


def writer(run, stop: threading.Event, seed: int) -> threading.Thread:
    """Updates, deletes, primary-key changes and inserts on table t until ``stop``."""
    rng = random.Random(seed)

    def loop() -> None:
        next_id = 1_000_000
        while not stop.is_set():
            action, row = rng.random(), rng.randrange(1, ROWS)
            next_id += 1
            if action < 0.55:
                run(f"UPDATE t SET v = v + 1 WHERE id = {row}")
            elif action < 0.7:
                run(f"DELETE FROM t WHERE id = {row}")
            elif action < 0.85:
                run(f"UPDATE t SET id = {next_id} WHERE id = {row}")
            else:
                run(f"INSERT INTO t (id, v) VALUES ({next_id}, 7)")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def check_under_writer(log, config, topic: str, run, rows_of, trigger) -> None:
    with capturing(config, log, "inc") as capture:
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        run("UPDATE t SET v = -1 WHERE id = 1")
        wait_until(lambda: len(records(log, topic)) == 1, capture=capture, what="the stream to work")
        stop = threading.Event()
        thread = writer(run, stop, seed=16)
        try:
            trigger(capture)
            wait_until(lambda: reads(log, topic), capture=capture, what="the first chunk")
            wait_until(lambda: capture.source.incremental_snapshot() is None, timeout=120, capture=capture,
                       what="the incremental snapshot to end")
        finally:
            stop.set()
            thread.join()
        table = rows_of("t")
        wait_until(lambda: topic_state(log, topic) == table, capture=capture, what="the topic to equal the table")
        assert compacted(log, topic) == table
        assert_no_chunk_row_outranks_a_later_change(log, topic)
        assert {r["source"]["snapshot"] for r in reads(log, topic)} == {"incremental"}
        keys = [orjson.dumps(r["after"]["id"]) for r in reads(log, topic)]
        assert len(keys) == len(set(keys)) > ROWS // 2  # each row read once at most (not: changed in a window)
    assert not isinstance(OffsetStore(log, "inc").load(config.name), IncrementalProgress)


@pytest.mark.postgres
@pytest.mark.parametrize("trigger", ["signal", "api"])
def test_postgres_incremental_snapshot_under_a_writer(pg_dsn, tmp_path, log, trigger):
    from tests.integration.pg_capture import execute, pg_config, table_rows

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
            f"INSERT INTO t SELECT g, 0 FROM generate_series(1, {ROWS}) g")
    config = pg_config(pg_dsn, tmp_path, tables=["public.t"], snapshot="never", signal_table="public.cdc_signal",
                       incremental_chunk_rows=300)

    def ask(capture) -> None:
        if trigger == "api":
            capture.source.request_snapshot(["public.t"])
        else:
            execute(pg_dsn, "INSERT INTO cdc_signal VALUES ('ad-hoc-1', 'execute-snapshot', "
                            "'{\"data-collections\": [\"public.t\"], \"type\": \"incremental\"}')")

    check_under_writer(log, config, "inc.public.t", lambda sql: execute(pg_dsn, sql),
                       lambda table: table_rows(pg_dsn, table), ask)
    assert "inc.public.cdc_signal" not in log.topics()


@pytest.mark.postgres
def test_postgres_chunk_row_never_beats_a_transaction_open_across_its_window(pg_dsn, tmp_path, log):
    """A transaction that changed a row before the low watermark and commits after the high one:
    its change is numbered below the watermark, so the chunk must wait for it (else the chunk's
    older row would carry the higher version and a sink would keep it); streaming goes on."""
    import psycopg2

    from tests.integration.pg_capture import execute, pg_config, table_rows

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
            "INSERT INTO t SELECT g, 0 FROM generate_series(1, 50) g")
    config = pg_config(pg_dsn, tmp_path, tables=["public.t"], snapshot="never", signal_table="public.cdc_signal",
                       incremental_chunk_rows=1000)
    open_tx = psycopg2.connect(pg_dsn)
    try:
        with capturing(config, log, "inc") as capture:
            wait_until(lambda: capture.source.phase == "streaming", capture=capture)
            with open_tx.cursor() as cur:
                cur.execute("UPDATE t SET v = 99 WHERE id = 7")  # open, not committed
            capture.source.request_snapshot(["public.t"])

            def low_watermark_written() -> bool:
                conn = psycopg2.connect(pg_dsn)
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT count(*) FROM cdc_signal WHERE type = 'snapshot-window-open'")
                        return cur.fetchone()[0] > 0
                finally:
                    conn.close()

            wait_until(low_watermark_written, capture=capture, what="the low watermark")
            # The chunk waits for the open transaction; the stream does not.
            execute(pg_dsn, "UPDATE t SET v = 5 WHERE id = 30")
            wait_until(lambda: topic_state(log, "inc.public.t").get('{"id":30}', {}).get("v") == 5, capture=capture,
                       what="a change streamed while the chunk waits")
            assert reads(log, "inc.public.t") == []
            open_tx.commit()
            wait_until(lambda: capture.source.incremental_snapshot() is None, capture=capture,
                       what="the incremental snapshot to end")
            # Rows 7 and 30 changed inside the window: the stream has them, the chunk drops them.
            wait_until(lambda: len(reads(log, "inc.public.t")) == 48, capture=capture, what="the chunk's rows")
            assert {r["after"]["id"] for r in reads(log, "inc.public.t")} == set(range(1, 51)) - {7, 30}
            assert topic_state(log, "inc.public.t") == table_rows(pg_dsn, "t")
            assert topic_state(log, "inc.public.t")['{"id":7}']["v"] == 99
            assert_no_chunk_row_outranks_a_later_change(log, "inc.public.t")
    finally:
        open_tx.close()


@pytest.mark.mysql
@pytest.mark.parametrize("trigger", ["signal", "api"])
def test_mariadb_incremental_snapshot_under_a_writer(mysql_url, mysql_db, log, trigger):
    from tests.integration.test_mysql_source import execute, mysql_config, table_rows

    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            f"INSERT INTO t SELECT seq, 0 FROM seq_1_to_{ROWS}")
    config = mysql_config(mysql_url, mysql_db, tables=[f"{mysql_db}.t"], snapshot="never",
                          signal_table=f"{mysql_db}.cdc_signal", incremental_chunk_rows=300)

    def ask(capture) -> None:
        if trigger == "api":
            capture.source.request_snapshot([f"{mysql_db}.t"])
        else:
            execute(mysql_url, mysql_db, "INSERT INTO cdc_signal VALUES ('ad-hoc-1', 'execute-snapshot', "
                                         f"'{{\"data-collections\": [\"{mysql_db}.t\"]}}')")

    check_under_writer(log, config, f"inc.{mysql_db}.t", lambda sql: execute(mysql_url, mysql_db, sql),
                       lambda table: table_rows(mysql_url, mysql_db, table), ask)
    assert f"inc.{mysql_db}.cdc_signal" not in log.topics()


KILL_ROWS = 6000


def check_kill_and_resume(tmp_path, source_yaml: str, table: str, rows_of) -> None:
    """``cdc snapshot`` asks the running daemon; a kill -9 of its process group once a chunk
    cursor is stored: the next run reads on after that cursor (rows up to it are not read again)
    and the topic ends equal to the table."""
    import subprocess
    import sys
    import time

    from cdc.dev.services import free_port
    from tests.daemon import kill_daemon, run_daemon, stop_daemon
    from tests.integration.test_daemon import _open_log
    from tests.integration.test_daemon_control import _rows

    port = free_port()
    config = tmp_path / "cdc.yaml"
    # 60 chunks with a pause after each: a quiet machine read all 6,000 rows in 0.2 s, before
    # any cursor was stored to strike after.
    config.write_text("log:\n  embedded: {path: ./data, topic_prefix: kill}\n"
                      f"sources:\n  - {{name: src, snapshot: never, incremental_chunk_rows: 100, "
                      f"incremental_chunk_pause_ms: 100, {source_yaml}}}\n"
                      f"http: \"127.0.0.1:{port}\"\n")
    log_, prefix = _open_log(config)
    topic = f"{prefix}.{table}"

    def stored():
        return OffsetStore(log_, prefix).load("src")

    def wait(what, check, process, limit=120):
        deadline = time.monotonic() + limit
        while not (value := check()):
            assert process.poll() is None, f"the daemon exited before {what}: {(tmp_path / 'daemon.log').read_text()}"
            assert time.monotonic() < deadline, f"not within {limit}s: {what}: {(tmp_path / 'daemon.log').read_text()}"
            time.sleep(0.05)
        return value

    process = run_daemon(config, "src", log="daemon.log")
    try:
        wait("the source to stream", lambda: _rows(port).get("src", {}).get("phase") == "streaming", process)
        refused = subprocess.run([sys.executable, "-m", "cdc.cli", "snapshot", str(config), "src", "nope.nope"],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "does not capture nope.nope" in refused.stderr, refused.stderr
        asked = subprocess.run([sys.executable, "-m", "cdc.cli", "snapshot", str(config), "src", table],
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0 and "incremental snapshot of" in asked.stderr, asked.stderr
        cursor = wait("a chunk cursor stored", lambda: isinstance(p := stored(), IncrementalProgress)
                      and p.last_key is not None and p, process)
    finally:
        kill_daemon(process)
    last = cursor.last_key[0]
    assert last < KILL_ROWS
    process = run_daemon(config, "src", log="daemon.log")
    try:
        wanted = rows_of()
        wait("the topic to equal the table", lambda: not isinstance(stored(), IncrementalProgress)
             and topic_state(log_, topic) == wanted, process)
    finally:
        stop_daemon(process)
    read_ids = [r["after"]["id"] for r in reads(log_, topic)]
    assert sorted(set(read_ids)) == list(range(1, KILL_ROWS + 1))
    up_to_cursor = [i for i in read_ids if i <= last]
    assert len(up_to_cursor) == len(set(up_to_cursor)), "rows up to the stored chunk cursor were read again"
    reread = len(read_ids) - KILL_ROWS
    assert reread <= KILL_ROWS - last  # at most the rows after the cursor: out before the kill, read again
    log_.close()


@pytest.mark.postgres
def test_postgres_incremental_snapshot_resumes_from_the_last_chunk_after_kill_9(pg_dsn, tmp_path):
    from tests.integration.pg_capture import execute, table_rows

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
            f"INSERT INTO t SELECT g, 0 FROM generate_series(1, {KILL_ROWS}) g")
    check_kill_and_resume(tmp_path, f"type: postgres, dsn: '{pg_dsn}', tables: [public.t], signal_table: "
                          "public.cdc_signal, state_dir: ./state, heartbeat_interval: 1", "public.t",
                          lambda: table_rows(pg_dsn, "t"))


@pytest.mark.mysql
def test_mariadb_incremental_snapshot_resumes_from_the_last_chunk_after_kill_9(mysql_url, mysql_db, tmp_path):
    import random

    from tests.integration.test_mysql_source import execute, table_rows

    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            f"INSERT INTO t SELECT seq, 0 FROM seq_1_to_{KILL_ROWS}")
    check_kill_and_resume(tmp_path, f"type: mysql, url: '{mysql_url}', tables: ['{mysql_db}.t'], signal_table: "
                          f"{mysql_db}.cdc_signal, server_id: {random.randrange(10_000, 2**31)}, "
                          "heartbeat_interval: 0.5", f"{mysql_db}.t", lambda: table_rows(mysql_url, mysql_db, "t"))


@pytest.mark.mysql
def test_mariadb_incremental_snapshot_of_a_table_with_a_composite_key(mysql_url, mysql_db, log):
    """Chunks follow a two-column key (read with the key comparison spelled out, which MariaDB
    ranges over): every row is read once."""
    from tests.integration.test_mysql_source import execute, mysql_config, table_rows

    execute(mysql_url, mysql_db, "CREATE TABLE t (a INT, b VARCHAR(10), v INT, PRIMARY KEY (a, b))",
            "INSERT INTO t SELECT seq DIV 10, CONCAT('k', seq MOD 10), seq FROM seq_1_to_1000")
    config = mysql_config(mysql_url, mysql_db, tables=[f"{mysql_db}.t"], snapshot="never",
                          signal_table=f"{mysql_db}.cdc_signal", incremental_chunk_rows=64)
    topic = f"inc.{mysql_db}.t"
    with capturing(config, log, "inc") as capture:
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        capture.source.request_snapshot([f"{mysql_db}.t"])
        wait_until(lambda: len(reads(log, topic)) == 1000 and capture.source.incremental_snapshot() is None,
                   capture=capture, what="every row read")
    keys = [(r["after"]["a"], r["after"]["b"]) for r in reads(log, topic)]
    assert len(set(keys)) == 1000
    rows = table_rows(mysql_url, mysql_db, "t", key="v")
    assert {orjson.dumps({"v": r["v"]}).decode(): r for r in compacted(log, topic).values()} == rows


@pytest.mark.postgres
def test_postgres_incremental_snapshot_with_a_role_that_may_not_create_tables(pg_dsn, tmp_path, log):
    """A signal table made by the DBA is used as it is: the source's role (no CREATE on the
    schema, as PostgreSQL 15 gives public by default) only writes and reads it."""
    import uuid

    from tests.integration.pg_capture import execute, pg_config, table_rows

    role = f"inc_{uuid.uuid4().hex[:8]}"
    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t SELECT g, 0 FROM generate_series(1, 500) g",
            "CREATE TABLE cdc_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))",
            f"CREATE ROLE {role} LOGIN REPLICATION", f"GRANT SELECT ON t TO {role}",
            f"GRANT SELECT, INSERT, DELETE ON cdc_signal TO {role}",
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
            "CREATE PUBLICATION inc_pub FOR TABLE t, cdc_signal")
    dsn = pg_dsn.replace("://postgres@", f"://{role}@")
    config = pg_config(dsn, tmp_path, tables=["public.t"], snapshot="never", signal_table="public.cdc_signal",
                       publication="inc_pub", manage_publication=False, incremental_chunk_rows=100)
    try:
        with capturing(config, log, "inc") as capture:
            wait_until(lambda: capture.source.phase == "streaming", capture=capture)
            capture.source.request_snapshot(["public.t"])
            wait_until(lambda: capture.source.incremental_snapshot() is None and len(reads(log, "inc.public.t")) == 500,
                       capture=capture, what="the incremental snapshot to end")
        assert topic_state(log, "inc.public.t") == table_rows(pg_dsn, "t")
    finally:
        execute(pg_dsn, f"DROP OWNED BY {role}")
        execute(pg_dsn.rsplit("/", 1)[0] + "/postgres", f"DROP ROLE IF EXISTS {role}")
