"""The MySQL source under kill -9: `cdc run` processes killed at random during a workload.

The writer records each transaction it commits (its MariaDB GTID, from ``@@last_gtid``, and the
number of ledger rows it inserted), so the test knows what the log must hold. It checks:

* after every kill, the stored position is a transaction boundary (the binlog event at it begins
  a transaction, and its GTID set is the server's ``BINLOG_GTID_POS`` there), and it is never
  ahead of the log: every transaction up to it has all its ledger rows in Kafka;
* at the end, nothing is lost: the topics equal the tables, and every transaction after the first
  snapshot attempt has all its rows in the log.

Completeness is checked on ``ledger`` (insert-only, a new key per row): the topics are compacted,
so copies of a key may be merged, but a key itself never disappears.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import orjson
import pytest

from cdc.log.kafka import KafkaLog
from cdc.offsets import OffsetStore
from cdc.positions import MySqlPosition
from tests.conftest import mysql_connect
from tests.integration.pg_capture import topic_state, wait_until
from tests.integration.test_mysql_source import execute, table_rows

pytestmark = [pytest.mark.mysql, pytest.mark.kafka, pytest.mark.slow]


class Writer(threading.Thread):
    """Small transactions (ledger inserts, an account update, now and then a delete) and, one in
    fifteen, a large one that spans several batches; each committed one is recorded."""

    def __init__(self, url: str, db: str) -> None:
        super().__init__(daemon=True)
        self.url, self.db = url, db
        self.stop = threading.Event()
        self.committed: dict[str, int] = {}   # gtid -> ledger rows it inserted
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err

    def _run(self) -> None:
        rng = random.Random(3)
        conn = mysql_connect(self.url, self.db)
        conn.autocommit(False)
        with conn.cursor() as cur:
            while not self.stop.is_set():
                rows = 300 if rng.random() < 1 / 15 else rng.randrange(1, 6)
                cur.execute("INSERT INTO ledger (account, amount) SELECT %s, seq FROM seq_1_to_" + str(rows),
                            (rng.randrange(1, 501),))
                cur.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (rng.randrange(1, 501),))
                if rng.random() < 0.05:
                    cur.execute("DELETE FROM accounts WHERE id = %s", (rng.randrange(1, 501),))
                conn.commit()
                cur.execute("SELECT @@last_gtid")
                self.committed[cur.fetchone()[0]] = rows
                time.sleep(0.002)
        conn.close()


def seq(gtid: str) -> int:
    return int(gtid.rsplit("-", 1)[1])


def ledger_by_transaction(log: KafkaLog, topic: str) -> tuple[dict[str, set], int]:
    """Ledger keys per transaction id, and the GTID sequence number of the first snapshot attempt
    (a later attempt streams from where the first was consistent)."""
    keys: dict[str, set] = {}
    first_snapshot = None
    for record in log.read_all(topic) if topic in log.topics() else []:
        if record.value is None:
            continue
        value = orjson.loads(record.value)
        if value["op"] == "r":
            gtid = seq(value["source"]["gtid"])
            first_snapshot = gtid if first_snapshot is None else min(first_snapshot, gtid)
        elif value["transaction"] is not None:
            keys.setdefault(value["transaction"]["id"], set()).add(record.key)
    return keys, first_snapshot if first_snapshot is not None else 0


def incomplete(committed: dict[str, int], keys: dict[str, set], after: int, upto: int | None) -> list[str]:
    return [g for g, rows in list(committed.items())
            if seq(g) > after and (upto is None or seq(g) <= upto) and len(keys.get(g, ())) != rows]


def assert_transaction_boundary(url: str, position: MySqlPosition) -> None:
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SHOW BINLOG EVENTS IN '{position.file}' FROM {position.pos} LIMIT 1")
            event = cur.fetchone()
            assert event is None or event[2] in ("Gtid", "Rotate", "Stop"), f"{position} is inside {event}"
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (position.file, position.pos))
            assert cur.fetchone()[0] == position.gtid_set, position
    finally:
        conn.close()


def test_kill_9_cycles_lose_nothing_and_resume_at_transaction_boundaries(mysql_url, mysql_db, kafka_bootstrap,
                                                                         tmp_path):
    execute(mysql_url, mysql_db, "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, account INT NOT NULL, "
                                 "amount INT NOT NULL)",
            "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)",
            "INSERT INTO accounts SELECT seq, 0 FROM seq_1_to_500")
    prefix = f"t_{uuid.uuid4().hex[:8]}"
    ledger_topic = f"{prefix}.{mysql_db}.ledger"
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: my, type: mysql, url: '{mysql_url}', server_id: {random.randrange(10_000, 2**31)}, "
        f"tables: ['{mysql_db}.*'], max_batch_events: 100, heartbeat_interval: 0.2}}\nhttp: null\n")

    def run() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)

    log = KafkaLog(kafka_bootstrap)
    writer = Writer(mysql_url, mysql_db)
    writer.start()
    rng = random.Random(11)
    checked = 0
    try:
        for _ in range(int(os.environ.get("KILL_CYCLES", 15))):
            before = OffsetStore(log, prefix).load("my")
            process = run()
            # Strike only once this run has stored a streaming position of its own (a blind sleep
            # lands in start-up on a busy machine), then at a random moment of the stream.
            try:
                wait_until(lambda: (lambda p: isinstance(p, MySqlPosition) and p != before)(
                    OffsetStore(log, prefix).load("my")), timeout=120, what="this run to store a position")
                time.sleep(rng.uniform(0.0, 1.5))
            finally:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            stored = OffsetStore(log, prefix).load("my")
            assert_transaction_boundary(mysql_url, stored)
            keys, since = ledger_by_transaction(log, ledger_topic)
            missing = incomplete(writer.committed, keys, since, seq(stored.gtid_set))
            assert not missing, f"stored {stored}, but {len(missing)} transactions before it are not whole in Kafka"
            checked += 1
    finally:
        writer.stop.set()
        writer.join()
    assert writer.error is None, writer.error
    final = run()
    try:
        ledger = table_rows(mysql_url, mysql_db, "ledger")
        accounts = table_rows(mysql_url, mysql_db, "accounts")
        assert len(writer.committed) > 300, "the writer made too few transactions to test anything"
        wait_until(lambda: topic_state(log, ledger_topic) == ledger, timeout=180, what="every ledger row in Kafka")
        wait_until(lambda: topic_state(log, f"{prefix}.{mysql_db}.accounts") == accounts, timeout=60,
                   what="the accounts table in Kafka")
        keys, since = ledger_by_transaction(log, ledger_topic)
        assert incomplete(writer.committed, keys, since, None) == []
        print(f"{len(writer.committed)} transactions, {len(ledger)} ledger rows, {checked} stored positions checked")
    finally:
        final.send_signal(signal.SIGTERM)
        assert final.wait(60) == 0
        log.close()
