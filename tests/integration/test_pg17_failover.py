"""PostgreSQL 17 failover slots: the source makes its slot a failover slot where the server has
them (`failover_slot`, on by default), switches an existing slot to match the setting, and
`cdc status` says which slots fail over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from cdc.dev.services import free_port
from tests.integration.test_daemon import _start
from tests.integration.test_daemon_control import _cdc, _rows, _stop, _wait


def _failover_of_slots(dsn: str) -> dict[str, bool]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT slot_name, failover FROM pg_replication_slots WHERE database = current_database()")
        found = dict(cur.fetchall())
    conn.close()
    return found


def _config(tmp_path: Path, dsn: str, port: int, plain_failover: bool) -> Path:
    config = tmp_path / "cdc.yaml"
    config.write_text(
        "log:\n  embedded: {path: ./data, topic_prefix: failover}\n"
        "sources:\n"
        f"  - {{name: pg, type: postgres, dsn: '{dsn}', tables: [public.items], state_dir: ./state}}\n"
        f"  - {{name: plain, type: postgres, dsn: '{dsn}', tables: [public.items], state_dir: ./state,\n"
        f"     failover_slot: {str(plain_failover).lower()}}}\n"
        f"http: \"127.0.0.1:{port}\"\n")
    return config


@pytest.mark.postgres17
def test_a_slot_on_postgres_17_fails_over_by_default_and_status_says_so(tmp_path, pg17_dsn):
    with psycopg2.connect(pg17_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int")
        assert cur.fetchone()[0] >= 170000
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO items VALUES (1, 'x')")
    conn.close()
    port = free_port()
    config = _config(tmp_path, pg17_dsn, port, plain_failover=False)
    process = _start(config)
    try:
        _wait("both sources stream", lambda: (rows := _rows(port)) and all(
            rows.get(n, {}).get("phase") == "streaming" for n in ("pg", "plain")), process)
        slots = _failover_of_slots(pg17_dsn)
        [pg_slot] = [name for name in slots if name.endswith("_pg")]
        [plain_slot] = [name for name in slots if name.endswith("_plain")]
        assert slots == {pg_slot: True, plain_slot: False}
        status = subprocess.run([sys.executable, "-m", "cdc.cli", "status", str(config)], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        lines = {line.split()[1]: line for line in status.stdout.splitlines() if line.startswith("slot ")}
        assert "failover=true" in lines[pg_slot] and lines[pg_slot].endswith("source pg"), status.stdout
        assert "failover=false" in lines[plain_slot] and lines[plain_slot].endswith("source plain"), status.stdout
    finally:
        _stop(process)

    # The setting changed: the existing slot is switched (ALTER_REPLICATION_SLOT) when the source
    # resumes from it; no new slot, no new snapshot.
    config = _config(tmp_path, pg17_dsn, port, plain_failover=True)
    process = _start(config)
    try:
        _wait("both sources stream again", lambda: (rows := _rows(port)) and all(
            rows.get(n, {}).get("phase") == "streaming" for n in ("pg", "plain")), process)
        assert _failover_of_slots(pg17_dsn) == {pg_slot: True, plain_slot: True}
    finally:
        output = _stop(process)
    assert "snapshot done" not in output, output[-6000:]


def _log_records(config: Path, topic: str) -> list[dict]:
    """Every change event of ``topic`` in the embedded log, in log order."""
    import orjson

    from cdc.config import load_config
    from cdc.log.open import open_log

    log_ = open_log(load_config(str(config)).log)
    try:
        if topic not in log_.topics():
            return []
        ends = log_.end_offsets(topic)
        reader = log_.reader()
        reader.assign({tp: 0 for tp in ends})
        records: list[dict] = []
        while sum(1 for _ in records) < sum(ends.values()):
            batch = reader.poll(500, 0.5)
            if not batch:
                break
            records += [orjson.loads(r.value) for r in batch if r.value is not None]
        reader.close()
        return records
    finally:
        log_.close()


def _stored_lsn(config: Path, source: str) -> int:
    from cdc.config import load_config
    from cdc.log.open import open_log
    from cdc.offsets import OffsetStore

    loaded = load_config(str(config))
    log_ = open_log(loaded.log)
    try:
        store = OffsetStore(log_, loaded.log.topic_prefix)
        position = store.load_all()[source]
        store.close()
    finally:
        log_.close()
    return position.lsn


def _until(what: str, check, limit: float = 180):
    import time

    deadline = time.monotonic() + limit
    while not (value := check()):
        assert time.monotonic() < deadline, f"not within {limit:.0f}s: {what}"
        time.sleep(0.2)
    return value


@pytest.mark.postgres17
def test_capture_goes_on_from_the_promoted_standbys_synced_slot_with_nothing_lost(tmp_path, pg17_bindir):
    """A primary and a standby that synchronizes failover slots; the daemon captures from the
    primary until the standby's copy of its slot has caught up, more rows are written (and
    replayed on the standby), the primary dies, the standby is promoted, and the daemon, pointed
    at it, resumes from the synced slot: every row arrives, nothing at or before the stored
    position comes twice (at-least-once past it), no new snapshot."""
    from tests.integration.pg17_standby import STANDBY_SLOT, start_primary, start_standby

    primary = start_primary()
    standby = None
    process = None
    try:
        primary.sql("CREATE DATABASE shop")
        primary.sql("CREATE TABLE items (id int PRIMARY KEY, name text)", database="shop")
        standby = start_standby(primary)
        _until("the standby streams from the primary", lambda: primary.sql(
            "SELECT 1 FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming'",
            (STANDBY_SLOT,)))
        # Logical walsenders of failover slots send nothing the standby has not received.
        primary.sql("ALTER SYSTEM SET synchronized_standby_slots = %s", (STANDBY_SLOT,))
        primary.sql("SELECT pg_reload_conf()")

        port = free_port()
        config = tmp_path / "cdc.yaml"

        def text(dsn: str) -> str:
            return ("log:\n  embedded: {path: ./data, topic_prefix: fo}\n"
                    f"sources:\n  - {{name: pg, type: postgres, dsn: '{dsn}', tables: [public.items], "
                    f"state_dir: ./state, status_interval: 1}}\nhttp: \"127.0.0.1:{port}\"\n")

        config.write_text(text(primary.dsn("shop")))
        process = _start(config)
        _wait("the source streams from the primary", lambda: (_rows(port).get("pg") or {}).get("phase") == "streaming",
              process)
        [(slot, failover)] = primary.sql("SELECT slot_name, failover FROM pg_replication_slots "
                                         "WHERE slot_type = 'logical'")
        assert failover is True

        for i in range(1, 51):
            primary.sql("INSERT INTO items VALUES (%s, 'before')", (i,), database="shop")
        [(written,)] = primary.sql("SELECT pg_current_wal_lsn()::text")
        _wait("the daemon confirms the first rows to the primary", lambda: primary.sql(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND confirmed_flush_lsn >= %s",
            (slot, written)), process)
        _until("the standby's synced copy of the slot catches up", lambda: standby.sql(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND synced AND failover "
            "AND confirmed_flush_lsn >= %s", (slot, written)))

        # The source stops (drains, stores its position); the late rows then exist on the primary
        # and, replayed, on the standby, but only the standby's synced slot can deliver them.
        assert _cdc("pause", str(config), "pg", cwd=tmp_path).returncode == 0
        _wait("the source paused", lambda: (_rows(port).get("pg") or {}).get("phase") == "paused", process)
        for i in range(51, 81):
            primary.sql("INSERT INTO items VALUES (%s, 'late')", (i,), database="shop")
        [(written,)] = primary.sql("SELECT pg_current_wal_lsn()::text")
        _until("the standby replays the late rows", lambda: standby.sql(
            "SELECT 1 WHERE pg_last_wal_replay_lsn() >= %s", (written,)))

        primary.kill()
        _stop(process)
        process = None
        stored = _stored_lsn(config, "pg")
        topic = "fo.public.items"
        before = _log_records(config, topic)

        standby.sql("SELECT pg_promote(true, 60)")
        # The promoted server holds the primary's slot (synchronized): the source resumes from it.
        assert standby.sql("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == [(True,)]
        config.write_text(text(standby.dsn("shop")))
        process = _start(config)
        _wait("every row is in the log after the failover", lambda: {
            r["after"]["id"] for r in _log_records(config, topic) if r.get("after")} == set(range(1, 81)), process)
    finally:
        output = _stop(process) if process is not None else ""
        for server in (standby, primary):
            if server is not None:
                server.remove()

    after = _log_records(config, topic)[len(before):]
    assert {r["after"]["id"] for r in before} == set(range(1, 51))
    assert {r["after"]["id"] for r in after} >= set(range(51, 81))
    assert "snapshot done" not in output, output[-6000:]
    assert all(r["op"] == "c" for r in after), "the failover took a new snapshot"
    again = [r for r in after if r["after"]["id"] in {b["after"]["id"] for b in before}]
    assert all(r["source"]["version"] > stored for r in again), \
        f"changes at or before the stored position {stored} came again: {again[:3]}"
