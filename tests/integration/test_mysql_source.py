"""The MySQL source against the real MariaDB: snapshot, streaming, handover, resume, prerequisites.

The helpers at the top (``mysql_config``, ``Capture``, ``capturing``, ``execute``, ``table_rows``)
are shared by the other ``test_mysql_*`` modules; ``topic_state`` and ``wait_until`` come from the
PostgreSQL helpers, which are source-neutral.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from decimal import Decimal

import orjson
import pytest

from cdc.errors import PositionLostError, PrerequisiteError
from cdc.events import Op
from cdc.log.base import Log
from cdc.offsets import OffsetStore
from cdc.positions import MySqlPosition
from sources.mysql.config import MySqlConfig
from sources.mysql.source import MySqlSource
from tests.conftest import mysql_connect
from tests.integration.pg_capture import (
    Capture,
    capturing,
    crash_mid_snapshot,
    embedded_log,  # noqa: F401 - the fixture ``log``
    execute_then_close,
    topic_state,
    wait_until,
    write_accounts,
)

pytestmark = pytest.mark.mysql


# --- helpers ----------------------------------------------------------------------------------------

def mysql_config(url: str, db: str, **overrides) -> MySqlConfig:
    settings = dict(name="my", type="mysql", url=url, server_id=random.randrange(10_000, 2**31),
                    tables=[f"{db}.*"], heartbeat_interval=0.2)
    settings.update(overrides)
    return MySqlConfig.model_validate(settings)


def execute(url: str, db: str | None, *statements: str) -> None:
    execute_then_close(mysql_connect(url, db), statements)


def table_rows(url: str, db: str, table: str, key: str = "id") -> dict[str, dict]:
    """The table's rows keyed like the topic; DECIMAL as text (simple column types only)."""
    conn = mysql_connect(url, db)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}`")
            names = [d[0] for d in cur.description]
            rows = [{n: str(v) if isinstance(v, Decimal) else v for n, v in zip(names, r)} for r in cur.fetchall()]
    finally:
        conn.close()
    return {orjson.dumps({key: r[key]}).decode(): r for r in rows}


def records(log: Log, topic: str) -> list[dict]:
    return [orjson.loads(r.value) for r in sorted(log.read_all(topic), key=lambda r: (r.partition, r.offset))
            if r.value is not None]


def purge_all_but_the_current_binlog(url: str) -> None:
    """PURGE BINARY LOGS up to the current file; retried while a replica that just disconnected
    (a stopped capture's dump thread) still holds an old file."""
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            current = cur.fetchone()[0]
            deadline = time.monotonic() + 20
            while True:
                cur.execute(f"PURGE BINARY LOGS TO '{current}'")
                cur.execute("SHOW BINARY LOGS")
                if [row[0] for row in cur.fetchall()] == [current]:
                    return
                assert time.monotonic() < deadline, "older binlogs stay in use"
                time.sleep(0.2)
    finally:
        conn.close()


# --- tests ------------------------------------------------------------------------------------------

def test_snapshot_then_stream_gives_the_table(mysql_url, mysql_db, log):
    execute(mysql_url, mysql_db, "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2))",
            "INSERT INTO items SELECT seq, CONCAT('item ', seq), seq * 1.5 FROM seq_1_to_500")
    with capturing(mysql_config(mysql_url, mysql_db), log, "t") as capture:
        wait_until(lambda: len(topic_state(log, f"t.{mysql_db}.items")) == 500, what="the snapshot", capture=capture)
        execute(mysql_url, mysql_db, "UPDATE items SET name = 'renamed' WHERE id <= 10",
                "DELETE FROM items WHERE id > 490", "INSERT INTO items VALUES (1000, 'new', 9.99)",
                "UPDATE items SET id = 2000 WHERE id = 20")  # a key change: delete + create
        expected = table_rows(mysql_url, mysql_db, "items")
        wait_until(lambda: topic_state(log, f"t.{mysql_db}.items") == expected, what="the stream", capture=capture)
    values = records(log, f"t.{mysql_db}.items")
    snapshot = [r for r in values if r["op"] == "r"]
    assert len(snapshot) == 500 and sum(r["source"]["snapshot"] == "last" for r in snapshot) == 1
    streamed = [r for r in values if r["op"] != "r"]
    assert min(r["source"]["version"] for r in streamed) > max(r["source"]["version"] for r in snapshot)
    assert all(r["transaction"] is not None and r["source"]["gtid"] == r["transaction"]["id"] for r in streamed)
    assert {r["source"]["file"] for r in values} and all(r["source"]["connector"] == "mysql" for r in values)
    moved = [r for r in streamed if r["source"]["gtid"] == max(x["source"]["gtid"] for x in streamed)]
    assert [(r["op"], (r["before"] or r["after"])["id"]) for r in moved] == [("d", 20), ("c", 2000)]
    shapes = [orjson.loads(r.value) for r in log.read_all("t.schema-changes")]
    assert [(c["name"], c["type"], c["key"]) for c in shapes[0]["columns"]] == [
        ("id", "int", True), ("name", "varchar(40)", False), ("price", "decimal(10,2)", False)]


def _writer(url: str, db: str, stop: threading.Event, seed: int) -> None:
    write_accounts(lambda: mysql_connect(url, db, autocommit=False), stop, seed, 100_000,
                   move="UPDATE IGNORE accounts SET id = %s WHERE id = %s")


@pytest.mark.parametrize("workers", [3, 1])
def test_handover_under_concurrent_writes(mysql_url, mysql_db, log, workers):
    execute(mysql_url, mysql_db, "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL, note TEXT)",
            "INSERT INTO accounts SELECT seq, 100, 'n' FROM seq_1_to_20000")
    stop = threading.Event()
    thread = threading.Thread(target=_writer, args=(mysql_url, mysql_db, stop, workers))
    thread.start()
    try:
        time.sleep(0.3)
        config = mysql_config(mysql_url, mysql_db, snapshot_workers=workers, snapshot_chunk_rows=1500)
        with capturing(config, log, "h") as capture:
            time.sleep(3)
            stop.set()
            thread.join()
            expected = table_rows(mysql_url, mysql_db, "accounts")
            wait_until(lambda: topic_state(log, f"h.{mysql_db}.accounts") == expected, what="equality",
                       capture=capture)
    finally:
        stop.set()
        thread.join()


def test_parallel_readers_fall_back_to_one_without_the_lock_privilege(mysql_url, mysql_db, log, caplog):
    """A user without RELOAD cannot FLUSH TABLES WITH READ LOCK: under writes the readers' views
    differ, so one lock-free reader takes the snapshot, and the topic still equals the table."""
    user = f"u{uuid.uuid4().hex[:8]}"
    execute(mysql_url, mysql_db, f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'",
            f"GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'%'",
            "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL, note TEXT)",
            "INSERT INTO accounts SELECT seq, 100, 'n' FROM seq_1_to_20000")
    stop = threading.Event()
    thread = threading.Thread(target=_writer, args=(mysql_url, mysql_db, stop, 7))
    thread.start()
    url = mysql_url.replace("root@", f"{user}:pw@")
    try:
        time.sleep(0.3)
        caplog.set_level("INFO", logger="sources.mysql")
        with capturing(mysql_config(url, mysql_db, snapshot_workers=3, snapshot_chunk_rows=1500), log,
                       "f") as capture:
            time.sleep(2)
            stop.set()
            thread.join()
            expected = table_rows(mysql_url, mysql_db, "accounts")
            wait_until(lambda: topic_state(log, f"f.{mysql_db}.accounts") == expected, capture=capture)
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "1 readers (single reader)" in messages or "3 readers (lock-free)" in messages, messages
    finally:
        stop.set()
        thread.join()
        execute(mysql_url, None, f"DROP USER '{user}'@'%'")


@pytest.mark.parametrize("gtid", [True, False])
def test_a_restart_resumes_right_after_the_stored_position(mysql_url, mysql_db, log, gtid):
    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1)")
    config = mysql_config(mysql_url, mysql_db, gtid=gtid)
    with capturing(config, log, "r") as capture:
        wait_until(lambda: topic_state(log, f"r.{mysql_db}.t"), capture=capture)
        execute(mysql_url, mysql_db, "INSERT INTO t VALUES (2, 2)", "UPDATE t SET v = 10 WHERE id = 1")
        wait_until(lambda: len(records(log, f"r.{mysql_db}.t")) == 3, capture=capture)
    stored = OffsetStore(log, "r").load("my")
    assert isinstance(stored, MySqlPosition) and (stored.gtid_set is not None)
    execute(mysql_url, mysql_db, "INSERT INTO t VALUES (3, 3)", "DELETE FROM t WHERE id = 2")
    with capturing(config, log, "r") as capture:
        wait_until(lambda: topic_state(log, f"r.{mysql_db}.t") == {'{"id":1}': {"id": 1, "v": 10},
                                                                  '{"id":3}': {"id": 3, "v": 3}}, capture=capture)
        assert capture.source.coordinator.stream.connection.by_gtid is gtid
    ops = [r["op"] for r in records(log, f"r.{mysql_db}.t")]
    assert sorted(ops) == sorted(["r", "c", "u", "c", "d"])  # nothing twice after a clean stop


def test_checkpoints_only_at_transaction_ends_even_when_batches_split_one(mysql_url, mysql_db):
    execute(mysql_url, mysql_db, "CREATE TABLE big (id INT PRIMARY KEY, pad VARCHAR(200))")
    source = MySqlSource(mysql_config(mysql_url, mysql_db, snapshot="never", max_batch_events=100), None)
    source.start()
    try:
        # ~160 bytes a row: about 50 rows per 8 kB row event
        execute(mysql_url, mysql_db, "INSERT INTO big SELECT seq, REPEAT('x', 150) FROM seq_1_to_1000",
                "UPDATE big SET pad = 'y' WHERE id <= 250")
        batches = []
        deadline = time.monotonic() + 30
        while sum(len(b.events) for b in batches) < 1250 and time.monotonic() < deadline:
            batch = source.poll(0.5)
            if batch is not None:
                batches.append(batch)
        events = [e for b in batches for e in b.events]
        assert len(events) == 1250 and all(e.check() for e in events)
        assert max(len(b.events) for b in batches) <= 100 + 60  # a batch ends after the event passing 100
        # A batch's checkpoint never passes a transaction still open at its end (other sessions'
        # transactions may commit in between: the binlog keeps each transaction in one piece).
        totals = Counter(e.transaction.id for e in events)
        first_pos = {}
        for e in events:
            first_pos.setdefault(e.transaction.id, e.version & 0xFFFFFFFF)
        seen: Counter = Counter()
        split = False
        for batch in batches:
            seen.update(e.transaction.id for e in batch.events)
            open_now = [tx for tx, n in seen.items() if n < totals[tx]]
            split = split or bool(open_now)
            if batch.checkpoint is not None:
                assert all(batch.checkpoint.pos <= first_pos[tx] for tx in open_now)
        assert split and batches[-1].checkpoint is not None
        orders = [e.transaction.total_order for e in events if e.op is Op.CREATE]
        assert orders == list(range(1, 1001))
        versions = [e.version for e in events]
        assert versions == sorted(versions) and len(set(versions)) == len(versions)
    finally:
        source.stop()


def test_prerequisites_name_the_missing_privilege(mysql_url, mysql_db):
    user = f"u{uuid.uuid4().hex[:8]}"
    execute(mysql_url, None, f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'", f"GRANT SELECT ON *.* TO '{user}'@'%'")
    try:
        source = MySqlSource(mysql_config(mysql_url.replace("root@", f"{user}:pw@"), mysql_db), None)
        with pytest.raises(PrerequisiteError, match=r"lacks REPLICATION SLAVE and REPLICATION CLIENT: GRANT"):
            source.start()
        source.stop()
    finally:
        execute(mysql_url, None, f"DROP USER '{user}'@'%'")


def test_a_table_without_a_key_is_refused_unless_given_one(mysql_url, mysql_db, log):
    execute(mysql_url, mysql_db, "CREATE TABLE loose (code VARCHAR(10) NOT NULL, v INT)",
            "INSERT INTO loose VALUES ('a', 1)")
    source = MySqlSource(mysql_config(mysql_url, mysql_db), None)
    with pytest.raises(PrerequisiteError, match=rf"{mysql_db}.loose has no primary key.*key_columns"):
        source.start()
    source.stop()
    config = mysql_config(mysql_url, mysql_db, key_columns={f"{mysql_db}.loose": ["code"]})
    with capturing(config, log, "k") as capture:
        wait_until(lambda: topic_state(log, f"k.{mysql_db}.loose"), capture=capture)
        execute(mysql_url, mysql_db, "UPDATE loose SET v = 2", "INSERT INTO loose VALUES ('b', 3)")
        wait_until(lambda: topic_state(log, f"k.{mysql_db}.loose") == {
            '{"code":"a"}': {"code": "a", "v": 2}, '{"code":"b"}': {"code": "b", "v": 3}}, capture=capture)


def test_snapshot_modes(mysql_url, mysql_db, log):
    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    with capturing(mysql_config(mysql_url, mysql_db, snapshot="never"), log, "never") as capture:
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        execute(mysql_url, mysql_db, "INSERT INTO t VALUES (3)")
        wait_until(lambda: topic_state(log, f"never.{mysql_db}.t") == {'{"id":3}': {"id": 3}}, capture=capture)
    only = Capture(mysql_config(mysql_url, mysql_db, snapshot="initial_only"), log, "only").start()
    only.thread.join(60)
    assert not only.thread.is_alive() and only.error is None and only.source.finished
    assert len(topic_state(log, f"only.{mysql_db}.t")) == 3
    execute(mysql_url, mysql_db, "DELETE FROM t WHERE id = 1")
    with capturing(mysql_config(mysql_url, mysql_db, snapshot="always"), log, "never") as capture:
        wait_until(lambda: sum(r["op"] == "r" for r in records(log, f"never.{mysql_db}.t")) == 2, capture=capture)


def test_truncate_is_an_event(mysql_url, mysql_db, log):
    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    with capturing(mysql_config(mysql_url, mysql_db), log, "tr") as capture:
        wait_until(lambda: len(topic_state(log, f"tr.{mysql_db}.t")) == 2, capture=capture)
        execute(mysql_url, mysql_db, "TRUNCATE t", "INSERT INTO t VALUES (3)")
        wait_until(lambda: topic_state(log, f"tr.{mysql_db}.t") == {'{"id":3}': {"id": 3}}, capture=capture)
    assert [r["op"] for r in records(log, f"tr.{mysql_db}.t")].count("t") == 2  # one per partition


def test_the_position_advances_while_only_other_tables_change(mysql_url, mysql_db, log):
    execute(mysql_url, mysql_db, "CREATE TABLE captured (id INT PRIMARY KEY)")
    other = f"{mysql_db}_other"
    execute(mysql_url, None, f"CREATE DATABASE `{other}`", f"CREATE TABLE `{other}`.busy (id INT PRIMARY KEY)")
    try:
        with capturing(mysql_config(mysql_url, mysql_db), log, "hb") as capture:
            wait_until(lambda: isinstance(capture.runner.stored, MySqlPosition), capture=capture)
            first = capture.runner.stored
            execute(mysql_url, other, "INSERT INTO busy SELECT seq FROM seq_1_to_100")
            wait_until(lambda: capture.runner.stored.pos > first.pos, what="the stored position to move",
                       capture=capture)
            assert log.topics() and f"hb.{other}.busy" not in log.topics()
    finally:
        execute(mysql_url, None, f"DROP DATABASE `{other}`")


def test_a_snapshot_cut_short_is_taken_again_and_streams_from_the_first_attempt(mysql_url, mysql_db, log,
                                                                               monkeypatch):
    """Rows the first attempt published and that are deleted before the second attempt must go:
    the second attempt streams from where the first was consistent, so the deletes come through."""
    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            "INSERT INTO t SELECT seq, 0 FROM seq_1_to_3000")
    config = mysql_config(mysql_url, mysql_db, snapshot_workers=1, max_batch_events=100)
    crash_mid_snapshot(MySqlSource, monkeypatch)
    capture = Capture(config, log, "again").start()
    capture.thread.join(60)
    assert isinstance(capture.error, RuntimeError)
    monkeypatch.undo()
    from cdc.positions import SnapshotProgress

    stored = OffsetStore(log, "again").load("my")
    assert isinstance(stored, SnapshotProgress)  # the marker, stored before the first row went out
    published = topic_state(log, f"again.{mysql_db}.t")
    assert 0 < len(published) < 3000 and '{"id":1}' in published
    execute(mysql_url, mysql_db, "DELETE FROM t WHERE id <= 50", "UPDATE t SET v = 1 WHERE id = 60",
            "INSERT INTO t VALUES (5000, 5)")
    with capturing(config, log, "again") as capture:
        expected = table_rows(mysql_url, mysql_db, "t")
        wait_until(lambda: topic_state(log, f"again.{mysql_db}.t") == expected, capture=capture)
    assert isinstance(OffsetStore(log, "again").load("my"), MySqlPosition)


def test_a_snapshot_taken_again_empties_a_table_emptied_in_between(mysql_url, mysql_db, log):
    """The second snapshot reads no row of a table emptied in between, so there is no key to
    compare with: its end names the tables it read, and every row left in their topics goes."""
    execute(mysql_url, mysql_db, "CREATE TABLE kept (id INT PRIMARY KEY)", "INSERT INTO kept VALUES (1), (2)",
            "CREATE TABLE emptied (id INT PRIMARY KEY)", "INSERT INTO emptied VALUES (1), (2), (3)")
    config = mysql_config(mysql_url, mysql_db)
    with capturing(config, log, "empt") as capture:
        wait_until(lambda: len(topic_state(log, f"empt.{mysql_db}.emptied")) == 3, capture=capture)
        wait_until(lambda: capture.runner.stored is not None, capture=capture)
    OffsetStore(log, "empt").reset("my")  # as if the first run died before its snapshot's end was stored
    execute(mysql_url, mysql_db, "DELETE FROM emptied")
    with capturing(config, log, "empt") as capture:
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        wait_until(lambda: topic_state(log, f"empt.{mysql_db}.emptied") == {}, capture=capture)
        assert set(topic_state(log, f"empt.{mysql_db}.kept")) == {'{"id":1}', '{"id":2}'}


@pytest.mark.serial
@pytest.mark.parametrize("gtid", [True, False])
def test_a_purged_binlog_stops_the_source_or_resnapshots_when_needed(mysql_url, mysql_db, log, gtid):
    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    config = mysql_config(mysql_url, mysql_db, gtid=gtid)
    with capturing(config, log, "lost") as capture:
        wait_until(lambda: topic_state(log, f"lost.{mysql_db}.t"), capture=capture)
        wait_until(lambda: capture.runner.stored is not None, capture=capture)
    # Changes after the stored position, then the file holding them is purged.
    execute(mysql_url, mysql_db, "INSERT INTO t VALUES (2)", "FLUSH BINARY LOGS")
    purge_all_but_the_current_binlog(mysql_url)
    failing = Capture(config, log, "lost").start()
    failing.thread.join(30)
    assert isinstance(failing.error, PositionLostError), f"expected PositionLostError, got {failing.error!r}"
    assert "has been purged" in str(failing.error) and "new snapshot" in str(failing.error)
    assert not failing.error.retriable
    healing = mysql_config(mysql_url, mysql_db, gtid=gtid, snapshot="when_needed")
    with capturing(healing, log, "lost") as capture:
        wait_until(lambda: topic_state(log, f"lost.{mysql_db}.t") == {'{"id":1}': {"id": 1}, '{"id":2}': {"id": 2}},
                   capture=capture)
