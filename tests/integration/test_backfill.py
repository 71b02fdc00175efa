"""A table added to a source's ``tables:`` is backfilled at the next start, alone.

Against real servers: capture table ``a``, stop, add table ``b`` (which has rows) to the config,
restart while a writer changes both tables: ``b``'s topic ends equal to ``b``, ``a``'s rows were
not read again (its topic holds the first snapshot's reads only), and changes to both tables
after the restart stream as before. The writer runs through the backfill, so backfill rows and
streamed changes of the same keys meet; the topics are compared by version, as sinks apply them.
"""

from __future__ import annotations

import random
import threading

import pytest

from cdc.offsets import OffsetStore
from tests.integration.pg_capture import (
    capturing,
    embedded_log,  # noqa: F401 - the fixture ``log``
    topic_state,
    wait_until,
)


def _writer(run, stop: threading.Event, seed: int) -> threading.Thread:
    """Updates, deletes and inserts on tables a and b until ``stop``; ``run(sql)`` commits each."""
    rng = random.Random(seed)

    def loop() -> None:
        next_id = 100_000
        while not stop.is_set():
            table = rng.choice("ab")
            action = rng.random()
            if action < 0.6:
                run(f"UPDATE {table} SET v = v + 1 WHERE id = {rng.randrange(1, 3000)}")
            elif action < 0.8:
                run(f"DELETE FROM {table} WHERE id = {rng.randrange(1, 3000)}")
            else:
                next_id += 1
                run(f"INSERT INTO {table} (id, v) VALUES ({next_id}, 7)")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _check_backfill(log, prefix, namespace, source, config_a, config_ab, run, rows_of, snapshot_reads):
    a, b = f"{prefix}.{namespace}.a", f"{prefix}.{namespace}.b"
    with capturing(config_a, log, prefix) as capture:
        wait_until(lambda: topic_state(log, a) == rows_of("a"), capture=capture)
        wait_until(lambda: OffsetStore(log, prefix).load_tables(source) == {f"{namespace}.a"}, capture=capture,
                   what="the captured tables to be recorded")
    assert snapshot_reads(a) == len(rows_of("a")) and b not in log.topics()
    a_ended = log.end_offsets(a)
    run("UPDATE a SET v = 100 WHERE id <= 10")
    run("UPDATE b SET v = 100 WHERE id <= 10")

    stop = threading.Event()
    writer = _writer(run, stop, seed=16)
    try:
        with capturing(config_ab, log, prefix) as capture:
            wait_until(lambda: capture.source.phase == "streaming" and snapshot_reads(b) > 0, capture=capture,
                       what="the backfill to end")
            stop.set()
            writer.join()
            wait_until(lambda: topic_state(log, b) == rows_of("b"), capture=capture, what="b's topic to equal b")
            wait_until(lambda: topic_state(log, a) == rows_of("a"), capture=capture, what="a's topic to equal a")
            run("UPDATE a SET v = -1 WHERE id = 11")
            run("DELETE FROM b WHERE id = 12")
            run("INSERT INTO b (id, v) VALUES (200000, 2)")
            wait_until(lambda: topic_state(log, a) == rows_of("a") and topic_state(log, b) == rows_of("b"),
                       capture=capture, what="changes after the backfill")
    finally:
        stop.set()
        writer.join()
    read_again = _reads_after(log, a, a_ended)
    assert not read_again, f"table a was read again ({len(read_again)} rows)"
    # Rows streamed after the backfill name their shape, for the old table as for the new one.
    last_of_a = [r for r in _records(log, a) if r["after"] and r["after"]["id"] == 11][-1]
    last_of_b = [r for r in _records(log, b) if r["after"] and r["after"]["id"] == 200000][-1]
    assert "schema_version" in last_of_a["source"] and "schema_version" in last_of_b["source"]
    assert OffsetStore(log, prefix).load_tables(source) == {f"{namespace}.a", f"{namespace}.b"}


@pytest.mark.postgres
def test_postgres_backfills_a_table_added_to_the_config(pg_dsn, tmp_path, log):
    _postgres_backfill(pg_dsn, tmp_path, log)


@pytest.mark.postgres17
def test_postgres17_backfills_with_a_temporary_slot_beside_its_failover_slot(pg17_dsn, tmp_path, log):
    """On 17 the source's slot is a failover slot; the backfill's temporary slot cannot be one
    (the server refuses FAILOVER for a temporary slot), so it is made without."""
    import psycopg2

    _postgres_backfill(pg17_dsn, tmp_path, log)
    with psycopg2.connect(pg17_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT failover FROM pg_replication_slots WHERE database = current_database()")
        assert cur.fetchall() == [(True,)]
    conn.close()


def _postgres_backfill(pg_dsn, tmp_path, log) -> None:
    from tests.integration.pg_capture import execute, pg_config, table_rows

    execute(pg_dsn, "CREATE TABLE a (id int PRIMARY KEY, v int)", "CREATE TABLE b (id int PRIMARY KEY, v int)",
            "INSERT INTO a SELECT g, 0 FROM generate_series(1, 3000) g",
            "INSERT INTO b SELECT g, 0 FROM generate_series(1, 3000) g")
    settings = dict(snapshot_workers=2, snapshot_chunk_pages=4, max_batch_events=200)
    _check_backfill(log, "bf", "public", "pg", pg_config(pg_dsn, tmp_path, tables=["public.a"], **settings),
                    pg_config(pg_dsn, tmp_path, tables=["public.a", "public.b"], **settings),
                    lambda sql: execute(pg_dsn, sql), lambda table: table_rows(pg_dsn, table),
                    lambda topic: _reads(log, topic))


@pytest.mark.mysql
def test_mariadb_backfills_a_table_added_to_the_config(mysql_url, mysql_db, log):
    from tests.integration.test_mysql_source import execute, mysql_config, table_rows

    execute(mysql_url, mysql_db, "CREATE TABLE a (id INT PRIMARY KEY, v INT)",
            "CREATE TABLE b (id INT PRIMARY KEY, v INT)",
            "INSERT INTO a SELECT seq, 0 FROM seq_1_to_3000", "INSERT INTO b SELECT seq, 0 FROM seq_1_to_3000")
    settings = dict(snapshot_workers=2, snapshot_chunk_rows=500, max_batch_events=200)
    _check_backfill(log, "bf", mysql_db, "my", mysql_config(mysql_url, mysql_db, tables=[f"{mysql_db}.a"], **settings),
                    mysql_config(mysql_url, mysql_db, tables=[f"{mysql_db}.a", f"{mysql_db}.b"], **settings),
                    lambda sql: execute(mysql_url, mysql_db, sql), lambda table: table_rows(mysql_url, mysql_db, table),
                    lambda topic: _reads(log, topic))


def _records(log, topic: str) -> list[dict]:
    import orjson

    return [orjson.loads(r.value) for r in sorted(log.read_all(topic), key=lambda r: (r.partition, r.offset))
            if r.value is not None]


def _reads(log, topic: str) -> int:
    """How many snapshot reads (op ``r``) the topic holds."""
    import orjson

    if topic not in log.topics():
        return 0
    return sum(1 for r in log.read_all(topic) if r.value is not None and orjson.loads(r.value)["op"] == "r")


@pytest.mark.postgres
def test_a_backfill_cut_short_is_taken_again_and_only_it(pg_dsn, tmp_path, log, monkeypatch):
    from cdc.positions import PgLsn, SnapshotProgress
    from sources.postgres.source import PostgresSource
    from tests.integration.pg_capture import Capture, crash_mid_snapshot, execute, pg_config, table_rows

    execute(pg_dsn, "CREATE TABLE a (id int PRIMARY KEY, v int)", "CREATE TABLE b (id int PRIMARY KEY, v int)",
            "INSERT INTO a SELECT g, 0 FROM generate_series(1, 1000) g",
            "INSERT INTO b SELECT g, 0 FROM generate_series(1, 20000) g")
    settings = dict(snapshot_workers=1, snapshot_chunk_pages=4, max_batch_events=100)
    with capturing(pg_config(pg_dsn, tmp_path, tables=["public.a"], **settings), log, "cut") as capture:
        wait_until(lambda: OffsetStore(log, "cut").load_tables("pg") == {"public.a"}, capture=capture)
    both = pg_config(pg_dsn, tmp_path, tables=["public.a", "public.b"], **settings)
    crash_mid_snapshot(PostgresSource, monkeypatch)
    crashing = Capture(both, log, "cut").start()
    crashing.thread.join(60)
    assert isinstance(crashing.error, RuntimeError)
    monkeypatch.undo()
    stored = OffsetStore(log, "cut").load("pg")
    assert isinstance(stored, SnapshotProgress) and stored.extra == {"backfill": ["public.b"]}
    assert 0 < _reads(log, "cut.public.b") < 20000
    assert OffsetStore(log, "cut").load_tables("pg") == {"public.a"}

    execute(pg_dsn, "DELETE FROM b WHERE id <= 10", "UPDATE a SET v = 5 WHERE id = 1")
    a_ended = log.end_offsets("cut.public.a")
    with capturing(both, log, "cut") as capture:
        wait_until(lambda: topic_state(log, "cut.public.b") == table_rows(pg_dsn, "b"), capture=capture)
        wait_until(lambda: topic_state(log, "cut.public.a") == table_rows(pg_dsn, "a"), capture=capture)
        wait_until(lambda: isinstance(OffsetStore(log, "cut").load("pg"), PgLsn), capture=capture)
    read_again = _reads_after(log, "cut.public.a", a_ended)
    assert not read_again, f"table a was read again ({len(read_again)} rows)"
    assert OffsetStore(log, "cut").load_tables("pg") == {"public.a", "public.b"}


def _reads_after(log, topic: str, ended: dict) -> list:
    """The snapshot reads written at or after the end offsets ``ended``. Found by offset, not by
    counting reads: the embedded log compacts as it goes, so an earlier read of a row that was
    updated since may be gone."""
    import orjson

    return [r for r in log.read_all(topic) if r.value is not None and r.offset >= ended[(r.topic, r.partition)]
            and orjson.loads(r.value)["op"] == "r"]
