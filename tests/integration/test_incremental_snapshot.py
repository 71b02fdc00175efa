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
import time
from dataclasses import dataclass, field

import orjson
import pytest

from cdc.offsets import OffsetStore
from cdc.positions import IncrementalProgress
from tests.integration.pg_capture import (
    capturing,
    embedded_log,  # noqa: F401 - the fixture ``log``
    topic_state,
    wait_until,
)

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


def writer(run, stop: threading.Event, seed: int, rows: int = ROWS, touched: set | None = None) -> threading.Thread:
    """Updates, deletes, primary-key changes and inserts on table t (keys 1..``rows``) until
    ``stop``; the keys it changed, deleted or moved go into ``touched``."""
    rng = random.Random(seed)
    touched = set() if touched is None else touched

    def loop() -> None:
        next_id = 1_000_000
        while not stop.is_set():
            action, row = rng.random(), rng.randrange(1, rows)
            next_id += 1
            touched.add(row)
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


KILL_ROWS = 10_000
KILL_CYCLES = 10


@dataclass
class Cycle:
    """One run of the daemon between two strikes: the chunk cursor it resumed from (None: the
    run that was asked for the snapshot) and what it read."""

    resumed_after: int | None
    began: dict = field(default_factory=dict)         # the topic's end offsets when it started
    ended: dict = field(default_factory=dict)         # ... when it was struck (or stopped)
    read: list[int] = field(default_factory=list)     # keys of its snapshot reads, in log order
    reread: int = 0                                   # of them, keys an earlier run had read
    read_after_cursor_before: int = 0                 # keys above the cursor the earlier runs had read


def check_kill_and_resume(tmp_path, source_yaml: str, table: str, run, rows_of, kafka_bootstrap: str,
                          prefix: str) -> None:
    """``cdc snapshot`` asks the running daemon for an incremental snapshot while a writer
    updates, deletes and moves keys of the table; then KILL_CYCLES times a kill -9 of the
    daemon's process group at a random moment after the stored chunk cursor moved since its
    start, and a start again. Each run reads on after the cursor it resumed from (no key up to
    it read again); what it reads again is at most what the runs before had read above that
    cursor; and the topic ends equal to the table. Kafka's topic keeps every record (its active
    segment is never compacted), so every read is counted."""
    from cdc.dev.services import free_port
    from tests.daemon import cdc_process, kill_daemon, run_daemon, stop_daemon
    from tests.integration.test_daemon import _open_log
    from tests.integration.test_daemon_control import _rows

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    port = free_port()
    config = tmp_path / "cdc.yaml"

    def configure(chunk_rows: int, pause_ms: int) -> None:
        config.write_text(f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {prefix}}}\n"
                          f"sources:\n  - {{name: src, snapshot: never, incremental_chunk_rows: {chunk_rows}, "
                          f"incremental_chunk_pause_ms: {pause_ms}, {source_yaml}}}\n"
                          f"http: \"127.0.0.1:{port}\"\n")

    # Small chunks with pauses give each strike a window (a quiet machine read 6,000 rows in 0.2 s
    # with none); the last run, with nothing to strike, reads on at full speed.
    configure(50, 200)
    log_, prefix = _open_log(config)
    topic = f"{prefix}.{table}"

    def cursor() -> int | None:
        stored = OffsetStore(log_, prefix).load("src")
        return stored.last_key[0] if isinstance(stored, IncrementalProgress) and stored.last_key else None

    def wait(what, check, process, limit=120):
        deadline = time.monotonic() + limit
        while not (value := check()):
            assert process.poll() is None, f"the daemon exited before {what}: {(tmp_path / 'daemon.log').read_text()}"
            assert time.monotonic() < deadline, f"not within {limit}s: {what}: {(tmp_path / 'daemon.log').read_text()}"
            time.sleep(0.1)
        return value

    cycles: list[Cycle] = []
    read_so_far: set[int] = set()

    def account() -> None:
        """Each run's snapshot reads: the records below its end offsets (taken when it was
        struck) and at or above the previous run's."""
        records = log_.read_all(topic)
        for cycle in cycles:
            for record in records:
                tp = (record.topic, record.partition)
                if record.value is not None and cycle.began.get(tp, 0) <= record.offset < cycle.ended[tp]:
                    value = orjson.loads(record.value)
                    if value["op"] == "r":
                        cycle.read.append(value["after"]["id"])
            if cycle.resumed_after is not None:
                cycle.read_after_cursor_before = sum(1 for key in read_so_far if key > cycle.resumed_after)
            cycle.reread = sum(1 for key in cycle.read if key in read_so_far)
            read_so_far.update(cycle.read)

    stop = threading.Event()
    touched: set[int] = set()
    thread = writer(run, stop, seed, rows=KILL_ROWS, touched=touched)
    try:
        for number in range(KILL_CYCLES + 1):
            last = number == KILL_CYCLES
            resumed_after = cursor() if number else None
            assert number == 0 or resumed_after is not None, f"no chunk cursor stored before start {number}"
            if last:
                configure(1000, 0)
            cycle = Cycle(resumed_after, began=cycles[-1].ended if cycles else {})
            process = run_daemon(config, "src", log="daemon.log")
            try:
                if number == 0:
                    wait("the source to stream", lambda: _rows(port).get("src", {}).get("phase") == "streaming", process)
                    asked = cdc_process(config, "snapshot", "src", table, log="snapshot.log")
                    assert asked.wait(60) == 0, (tmp_path / "snapshot.log").read_text()
                if last:
                    wait("the snapshot to end", lambda: not isinstance(OffsetStore(log_, prefix).load("src"),
                                                                       IncrementalProgress), process)
                    stop.set()
                    thread.join()
                    wanted = rows_of()
                    wait("the topic to equal the table", lambda: topic_state(log_, topic) == wanted, process)
                    continue
                moved = wait("the stored chunk cursor to move", lambda: (c := cursor()) is not None and
                             (resumed_after is None or c > resumed_after) and c, process)
                time.sleep(rng.uniform(0, 0.6))  # a random moment of the chunk, its pause, the next store
                assert cursor() is not None, f"the snapshot ended before strike {number + 1} (cursor {moved}): " \
                                             "make the table larger"
            finally:
                if last:
                    stop_daemon(process)
                else:
                    kill_daemon(process)
                if topic in log_.topics():  # else the run failed before its first read: that error stands
                    cycle.ended = log_.end_offsets(topic)
                    cycles.append(cycle)
    finally:
        stop.set()
        thread.join()
    account()
    figures = ", ".join(f"after {c.resumed_after}: read {len(c.read)}, again {c.reread} (<= {c.read_after_cursor_before})"
                        for c in cycles)
    print(f"seed {seed}; {figures}")
    for number, cycle in enumerate(cycles):
        assert len(cycle.read) == len(set(cycle.read)), f"run {number} read a key twice (seed {seed}): {figures}"
        if cycle.resumed_after is not None:
            assert all(key > cycle.resumed_after for key in cycle.read), \
                f"run {number} read again at or before its cursor {cycle.resumed_after} (seed {seed}): {figures}"
            assert cycle.reread <= cycle.read_after_cursor_before, f"seed {seed}: {figures}"
    assert len(cycles) == KILL_CYCLES + 1 and all(c.read for c in cycles[:-1]), f"seed {seed}: {figures}"
    untouched = set(range(1, KILL_ROWS + 1)) - touched
    assert untouched <= read_so_far, f"rows the writer left alone were not read: {sorted(untouched - read_so_far)[:10]}"
    assert not isinstance(OffsetStore(log_, prefix).load("src"), IncrementalProgress)
    log_.close()


@pytest.mark.postgres
@pytest.mark.kafka
def test_postgres_incremental_snapshot_resumes_from_the_last_chunk_after_kill_9_cycles(pg_dsn, tmp_path,
                                                                                      kafka_bootstrap, kafka_topic):
    from tests.integration.pg_capture import execute, table_rows

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
            f"INSERT INTO t SELECT g, 0 FROM generate_series(1, {KILL_ROWS}) g")
    check_kill_and_resume(tmp_path, f"type: postgres, dsn: '{pg_dsn}', tables: [public.t], signal_table: "
                          "public.cdc_signal, state_dir: ./state, heartbeat_interval: 1", "public.t",
                          lambda sql: execute(pg_dsn, sql), lambda: table_rows(pg_dsn, "t"), kafka_bootstrap,
                          kafka_topic)


@pytest.mark.mysql
@pytest.mark.kafka
def test_mariadb_incremental_snapshot_resumes_from_the_last_chunk_after_kill_9_cycles(mysql_url, mysql_db, tmp_path,
                                                                                     kafka_bootstrap, kafka_topic):
    from tests.integration.test_mysql_source import execute, table_rows

    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            f"INSERT INTO t SELECT seq, 0 FROM seq_1_to_{KILL_ROWS}")
    check_kill_and_resume(tmp_path, f"type: mysql, url: '{mysql_url}', tables: ['{mysql_db}.t'], signal_table: "
                          f"{mysql_db}.cdc_signal, server_id: {random.randrange(10_000, 2**31)}, "
                          "heartbeat_interval: 0.5", f"{mysql_db}.t", lambda sql: execute(mysql_url, mysql_db, sql),
                          lambda: table_rows(mysql_url, mysql_db, "t"), kafka_bootstrap, kafka_topic)


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
