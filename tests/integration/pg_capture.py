"""Helpers for source tests: run a capture in a thread, compare topics with tables.

``Capture`` runs any source plugin (chosen by its config's ``type``); the PostgreSQL helpers
(``pg_config``, ``table_rows``, ``execute``) are here too, the MySQL ones in test_mysql_source.py."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any

import orjson
import psycopg2
import pytest

from cdc.errors import CdcError
from cdc.log.base import Log, TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.offsets import OffsetStore
from cdc.runtime.runner import SourceRunner
from sources.postgres.config import PostgresConfig


@pytest.fixture(name="log")
def kafka_log(kafka_bootstrap):
    """A KafkaLog on the stack's broker; import it into a test module to use it as ``log``."""
    from cdc.log.kafka import KafkaLog
    instance = KafkaLog(kafka_bootstrap)
    yield instance
    instance.close()


@pytest.fixture(name="log")
def embedded_log(tmp_path):
    """An embedded log in the test's directory; import it into a test module to use it as ``log``."""
    instance = EmbeddedLog(tmp_path / "log", fsync=False)
    yield instance
    instance.close()


def pg_config(dsn: str, tmp_path, **overrides) -> PostgresConfig:
    settings = dict(name="pg", type="postgres", dsn=dsn, tables=["public.*"], state_dir=str(tmp_path / "state"),
                    heartbeat_interval=1.0, status_interval=1.0)
    settings.update(overrides)
    return PostgresConfig.model_validate(settings)


def slot_name(config: PostgresConfig, dsn: str) -> str:
    """The slot the source of ``config`` uses in the (fresh) database of ``dsn``."""
    return config.slot_in(dsn.rsplit("/", 1)[1])


class Capture:
    """A SourceRunner on a thread, against ``log``; ``stop()`` drains it like SIGTERM does.
    ``restarts``: a retriable error starts the source again from its stored position, as the
    daemon's supervisor does (``restarted`` counts them); else it is the capture's error."""

    def __init__(self, config, log: Log, prefix: str, restarts: bool = False) -> None:
        self.log, self.prefix, self.config, self.restarts = log, prefix, config, restarts
        self.offsets = OffsetStore(log, prefix)
        self._make()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.restarted = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _make(self) -> None:
        from cdc.plugins import source_plugin

        self.source = source_plugin(self.config.type)(self.config, self.offsets.load(self.config.name))
        self.runner = SourceRunner(self.source, self.log, self.offsets, self.prefix, TopicSettings(partitions=2),
                                   offset_interval=0.2)

    def _run(self) -> None:
        while True:
            try:
                self.runner.run(self.stop_event)
                return
            except CdcError as err:
                if not (self.restarts and err.retriable) or self.stop_event.is_set():
                    self.error = err
                    return
                self.restarted += 1
                if self.stop_event.wait(1.0):
                    return
                self._make()
            except BaseException as err:  # noqa: BLE001 - reported by stop()
                self.error = err
                return

    def start(self) -> Capture:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the capture did not stop within 60s"
        if self.error is not None:
            raise self.error


@contextmanager
def capturing(config, log: Log, prefix: str, restarts: bool = False):
    capture = Capture(config, log, prefix, restarts).start()
    try:
        yield capture
    finally:
        capture.stop()


def crash_mid_snapshot(source_class, monkeypatch, after_batches: int = 3) -> None:
    """Make ``source_class`` raise once more than ``after_batches`` snapshot batches went out (a
    crash in the middle of a snapshot, evidence first); ``monkeypatch.undo()`` ends it."""
    from snapshot.coordinator import SnapshotCoordinator

    real_poll = SnapshotCoordinator._poll_snapshot
    batches = []

    def crashing_poll(self, timeout):
        batch = real_poll(self, timeout)
        if isinstance(self.halves, source_class) and batch is not None and batch.events:
            batches.append(batch)
            if len(batches) > after_batches:
                raise RuntimeError("crash in the middle of the snapshot")
        return batch

    monkeypatch.setattr(SnapshotCoordinator, "_poll_snapshot", crashing_poll)


def wait_until(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition", capture=None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if capture is not None and capture.error is not None:
            raise capture.error
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def topic_state(log: Log, topic: str) -> dict[str, Any]:
    """Replay a table's topic: key JSON -> latest ``after`` (deleted keys absent), as a sink would,
    keeping the newest version per key and honouring truncates."""
    if topic not in log.topics():
        return {}
    rows: dict[str, tuple[int, Any]] = {}
    truncated_at = -1
    for record in sorted(log.read_all(topic), key=lambda r: (r.partition, r.offset)):
        if record.value is None:
            continue
        value = orjson.loads(record.value)
        version = value["source"]["version"]
        if value["op"] == "t":
            truncated_at = max(truncated_at, version)
            continue
        key = record.key.decode()
        if key in rows and rows[key][0] >= version:
            continue
        rows[key] = (version, None if value["op"] == "d" else value["after"])
    return {k: after for k, (version, after) in rows.items() if after is not None and version > truncated_at}


def table_rows(dsn: str, table: str, key: str = "id") -> dict[str, dict]:
    """The table's rows as JSON objects (row_to_json), keyed like the topic."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT row_to_json(t)::text FROM {table} t")
            rows = [orjson.loads(r[0]) for r in cur.fetchall()]
    finally:
        conn.close()
    return {orjson.dumps({key: r[key]}).decode(): r for r in rows}


def snapshot_row_as_streamed(log: Log, topic: str) -> dict:
    """The ``after`` of row 1 (read by the snapshot) without its key, once asserted equal byte for
    byte, key order included, to that of row 2 (the same values, streamed after it)."""
    values = {orjson.loads(r.key)["id"]: orjson.loads(r.value) for r in log.read_all(topic)}
    snap, streamed = values[1], values[2]
    assert snap["op"] == "r" and streamed["op"] == "c"
    assert streamed["source"]["version"] > snap["source"]["version"]
    a, b = dict(snap["after"]), dict(streamed["after"])
    a.pop("id"), b.pop("id")
    assert orjson.dumps(a) == orjson.dumps(b)
    return a


def execute(dsn: str, *statements: str) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    execute_then_close(conn, statements)


def drop_slot(conn, slot: str, timeout: float = 30) -> None:
    """Drop replication slot ``slot`` once the walsender that read it has let go of it (the server
    ends it a moment after its client went): a slot still active cannot be dropped."""
    deadline = time.monotonic() + timeout
    with conn.cursor() as cur:
        while True:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND NOT active", (slot,))
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            if cur.fetchone()[0] == 0:
                return
            assert time.monotonic() < deadline, f"slot {slot} still active after {timeout:.0f}s"
            time.sleep(0.1)


def drop_released_slot(dsn: str, slot: str) -> None:
    """``drop_slot`` on a connection of its own."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        drop_slot(conn, slot)
    finally:
        conn.close()


def execute_then_close(conn, statements: Iterable[str]) -> None:
    """Runs ``statements`` one by one on ``conn`` (any DB-API connection), then closes it."""
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def write_accounts(connect: Callable[[], Any], stop: threading.Event, seed: int, next_id: int,
                   move: str = "UPDATE accounts SET id = %s WHERE id = %s") -> None:
    """Random writes to ``accounts (id, balance, note)`` in transactions of 20 until ``stop``:
    updates, inserts of new ids above ``next_id``, deletes and key moves (``move``, the server's
    UPDATE of a row's id). ``connect`` opens the connection (any DB-API one); one thread runs it."""
    rng = random.Random(seed)
    conn = connect()
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                for _ in range(20):
                    choice = rng.random()
                    if choice < 0.4:
                        cur.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s",
                                    (rng.randrange(1, 3000),))
                    elif choice < 0.7:
                        next_id += 1
                        cur.execute("INSERT INTO accounts VALUES (%s, 1, 'w')", (next_id,))
                    elif choice < 0.85:
                        cur.execute("DELETE FROM accounts WHERE id = %s", (rng.randrange(1, next_id),))
                    else:  # move a row to a new key
                        next_id += 1
                        cur.execute(move, (next_id, rng.randrange(1, next_id)))
                conn.commit()
    finally:
        conn.close()
