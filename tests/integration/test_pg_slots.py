"""Replication slots over their whole life, against a real server: names that do not collide
across databases, `cdc status` listing every slot (orphans flagged), `cdc drop`, and the
retained-WAL budget with its metric."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import orjson
import psycopg2
import pytest

from cdc.errors import PermanentError, PositionLostError
from cdc.log.embedded import EmbeddedLog
from cdc.runtime.http import render_metrics
from sources.postgres.config import default_slot_name
from tests.conftest import _fresh_database
from tests.integration.pg_capture import Capture, capturing, execute, pg_config, slot_name, wait_until

# serial: these tests list every slot of the server, make slots of fixed names (cdc_pg, taken,
# left_behind) and change max_slot_wal_keep_size for the whole server.
pytestmark = [pytest.mark.postgres, pytest.mark.serial]


@pytest.fixture
def second_db(pg_admin_dsn):
    """Another fresh database on the same server, dropped with its slots afterwards."""
    yield from _fresh_database(pg_admin_dsn)


def _slots(dsn: str) -> dict[str, str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT slot_name, database FROM pg_replication_slots")
            return dict(cur.fetchall())
    finally:
        conn.close()


def test_default_slot_names_are_valid_and_unique_when_cut():
    long_db = "d" * 60
    a, b = default_slot_name(long_db, "orders-A"), default_slot_name(long_db, "orders-B")
    assert len(a) == len(b) == 63 and a != b
    assert default_slot_name("Shop.Demo", "shop-pg") == "cdc_shop_demo_shop_pg"
    assert all(c.isdigit() or c.islower() or c == "_" for c in a)


def test_sources_of_the_same_name_in_two_databases_get_their_own_slots(pg_dsn, second_db, tmp_path):
    for dsn in (pg_dsn, second_db):
        execute(dsn, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    logs = [EmbeddedLog(tmp_path / f"log{i}", fsync=False) for i in range(2)]
    try:
        with capturing(pg_config(pg_dsn, tmp_path / "a", name="shop_pg"), logs[0], "a") as first, \
                capturing(pg_config(second_db, tmp_path / "b", name="shop_pg"), logs[1], "b") as second:
            for capture in (first, second):
                wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        slots = _slots(pg_dsn)
        config = pg_config(pg_dsn, tmp_path, name="shop_pg")
        assert slots[slot_name(config, pg_dsn)] == pg_dsn.rsplit("/", 1)[1]
        assert slots[slot_name(config, second_db)] == second_db.rsplit("/", 1)[1]
    finally:
        for log in logs:
            log.close()


def test_a_slot_of_the_old_default_name_in_the_sources_database_is_kept(pg_dsn, tmp_path):
    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)",
            "SELECT pg_create_logical_replication_slot('cdc_pg', 'pgoutput')")
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        with capturing(pg_config(pg_dsn, tmp_path), log, "old") as capture:
            wait_until(lambda: capture.source.phase == "streaming", capture=capture)
            assert capture.source.slot_name == "cdc_pg"
        assert "cdc_pg" in _slots(pg_dsn)
        assert slot_name(pg_config(pg_dsn, tmp_path), pg_dsn) not in _slots(pg_dsn)
    finally:
        log.close()


def test_a_slot_name_taken_in_another_database_names_the_slot_setting(pg_dsn, second_db, tmp_path):
    execute(second_db, "SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        failing = Capture(pg_config(pg_dsn, tmp_path, slot="taken"), log, "x").start()
        failing.thread.join(60)
        assert isinstance(failing.error, PermanentError)
        assert "`slot:`" in str(failing.error) and "taken" in str(failing.error)
    finally:
        log.close()


# --- cdc status / cdc drop -----------------------------------------------------------------------

def _config_file(tmp_path: Path, dsn: str, **settings) -> Path:
    source = {"name": "pg", "type": "postgres", "dsn": dsn, "tables": ["public.*"],
              "heartbeat_interval": 1.0, "status_interval": 1.0, **settings}
    path = tmp_path / "cdc.yaml"
    path.write_text("log:\n  embedded: {path: ./data, topic_prefix: lc}\n"
                    f"sources:\n  - {orjson.dumps(source).decode()}\nhttp: null\n")
    return path


def _capture_from_file(path: Path):
    from cdc.config import load_config
    from cdc.log.open import open_log

    config = load_config(str(path))
    log = open_log(config.log)
    return Capture(config.sources[0], log, config.log.topic_prefix), log


def test_status_lists_every_slot_with_retained_wal_and_flags_orphans(pg_dsn, tmp_path, capsys):
    from cdc.cli import main

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)",
            "SELECT pg_create_logical_replication_slot('left_behind', 'pgoutput')",
            "CREATE SCHEMA other", "CREATE TABLE other.pad (x text)",
            "INSERT INTO other.pad SELECT repeat('x', 1000) FROM generate_series(1, 2000)")
    path = _config_file(tmp_path, pg_dsn)
    capture, log = _capture_from_file(path)
    capture.start()
    wait_until(lambda: capture.source.phase == "streaming", capture=capture)
    capture.stop()
    log.close()
    capsys.readouterr()
    assert main(["status", str(path), "--json"]) == 0
    rows = {r["name"]: r for r in orjson.loads(capsys.readouterr().out) if r["kind"] == "slot"}
    database = pg_dsn.rsplit("/", 1)[1]
    orphan, owned = rows["left_behind"], rows[slot_name(capture.config, pg_dsn)]
    assert orphan["owner"] is None and orphan["database"] == database and orphan["active"] is False
    assert orphan["retained_wal_bytes"] > 2000 * 1000 and orphan["wal_status"] in ("reserved", "extended")
    assert owned["owner"] == "pg"
    assert main(["status", str(path)]) == 0
    text = capsys.readouterr().out
    assert "left_behind" in text and "ORPHAN" in text and " MiB" in text


def test_drop_removes_slot_publication_and_offset_then_a_restart_snapshots(pg_dsn, tmp_path, capsys):
    from cdc.cli import main

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    path = _config_file(tmp_path, pg_dsn)
    capture, log = _capture_from_file(path)
    capture.start()
    wait_until(lambda: capture.runner.stored is not None, capture=capture, what="a stored offset")
    capture.stop()
    slot = slot_name(capture.config, pg_dsn)
    assert slot in _slots(pg_dsn)
    log.close()

    # No terminal, no --yes: refused, nothing dropped.
    refused = subprocess.run([sys.executable, "-m", "cdc.cli", "drop", str(path), "pg"], cwd=tmp_path,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert slot in _slots(pg_dsn)

    assert main(["drop", str(path), "pg", "--yes"]) == 0
    assert slot not in _slots(pg_dsn)
    conn = psycopg2.connect(pg_dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_publication WHERE pubname = %s", (capture.config.publication_name,))
        assert cur.fetchone()[0] == 0
    conn.close()

    again, log = _capture_from_file(path)
    assert again.source.start_position is None  # the stored offset is gone
    try:
        again.start()
        wait_until(lambda: again.runner.stored is not None, capture=again, what="a stored offset")
        again.stop()
        snapshots = [orjson.loads(r.value)["op"] for r in log.read_all("lc.public.t")]
        assert snapshots.count("r") == 2  # once per run: the second run took the snapshot again
    finally:
        log.close()


def test_drop_keeps_a_publication_cdc_did_not_create(pg_dsn, tmp_path, capsys):
    from cdc.cli import main

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE PUBLICATION theirs FOR TABLE t")
    path = _config_file(tmp_path, pg_dsn, publication="theirs")
    capture, log = _capture_from_file(path)
    capture.start()
    wait_until(lambda: capture.source.phase == "streaming", capture=capture)
    capture.stop()
    log.close()
    assert main(["drop", str(path), "pg", "--yes"]) == 0
    conn = psycopg2.connect(pg_dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_publication WHERE pubname = 'theirs'")
        assert cur.fetchone()[0] == 1
    conn.close()
    assert slot_name(capture.config, pg_dsn) not in _slots(pg_dsn)


# --- the retained-WAL budget --------------------------------------------------------------------

def test_retained_wal_above_the_budget_is_warned_about_and_exported(pg_dsn, tmp_path, caplog):
    execute(pg_dsn, "CREATE TABLE captured (id int PRIMARY KEY)", "CREATE SCHEMA other",
            "CREATE TABLE other.busy (id serial PRIMARY KEY, pad text)")
    # No heartbeat during the test: nothing moves the slot while only uncaptured tables change.
    config = pg_config(pg_dsn, tmp_path, tables=["public.*"], heartbeat_interval=3600, max_retained_wal="1MB",
                       wal_check_interval=0.2)
    assert config.max_retained_wal == 1_000_000
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        with caplog.at_level(logging.WARNING, logger="sources.postgres.slots"), \
                capturing(config, log, "wal") as capture:
            wait_until(lambda: capture.source.phase == "streaming", capture=capture)
            # A transaction left open holds the slot's restart_lsn where it began (the source
            # confirms what keepalives report once it has nothing pending, so without it the slot
            # could move past the busy table's WAL before the check below looks).
            holder = psycopg2.connect(pg_dsn)
            try:
                with holder.cursor() as cur:
                    cur.execute("INSERT INTO captured VALUES (1)")
                execute(pg_dsn, "INSERT INTO other.busy (pad) SELECT repeat('x', 1000) FROM generate_series(1, 5000)")
                wait_until(lambda: (capture.runner.stats.retained_wal_bytes or 0) > 5000 * 1000, capture=capture,
                           what="the retained WAL in the connector's stats")
                wait_until(lambda: any("above max_retained_wal" in r.getMessage() for r in caplog.records),
                           capture=capture, what="the budget warning")
                metrics = render_metrics([{**capture.runner.stats.snapshot(), "healthy": True}])
            finally:
                holder.rollback()
                holder.close()
        line = next(l for l in metrics.splitlines() if l.startswith('cdc_retained_wal_bytes{connector="pg"}'))
        assert int(line.split()[-1]) > 5000 * 1000
    finally:
        log.close()


def test_the_budget_is_validated(tmp_path):
    from pydantic import ValidationError

    assert pg_config("postgresql://u@h/db", tmp_path, max_retained_wal="1GiB").max_retained_wal == 1 << 30
    with pytest.raises(ValidationError, match="max_retained_wal"):
        pg_config("postgresql://u@h/db", tmp_path, max_retained_wal="lots")


def test_drop_refuses_while_a_process_streams_from_the_slot(pg_dsn, tmp_path, capsys):
    from cdc.cli import main

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    path = _config_file(tmp_path, pg_dsn)
    capture, log = _capture_from_file(path)
    capture.start()
    try:
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        wait_until(lambda: _active(pg_dsn, slot_name(capture.config, pg_dsn)), capture=capture, what="an active slot")
        capsys.readouterr()
        assert main(["drop", str(path), "pg", "--yes"]) == 2
        assert "is active" in capsys.readouterr().err
        assert slot_name(capture.config, pg_dsn) in _slots(pg_dsn)
    finally:
        capture.stop()
        log.close()


def _active(dsn: str, slot: str) -> bool:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
            return bool(row and row[0])
    finally:
        conn.close()


# --- the slot over its life: idle tables, the drop policy, slots the server invalidates ---------

def _slot_row(dsn: str, slot: str) -> tuple | None:
    """(retained bytes, confirmed_flush_lsn as a number, wal_status) of ``slot``, or None."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT (pg_current_wal_lsn() - restart_lsn)::bigint, (confirmed_flush_lsn - '0/0')::bigint, "
                        "wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            return cur.fetchone()
    finally:
        conn.close()


def _current_lsn(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
            return cur.fetchone()[0]
    finally:
        conn.close()


BUSY_ROUND = "INSERT INTO other.busy (pad) SELECT repeat(md5(random()::text), 32) FROM generate_series(1, 5000)"


def test_an_idle_captured_table_does_not_make_the_slot_hold_wal(pg_dsn, tmp_path, caplog):
    """Only an uncaptured table is written (8 rounds of ~6 MB, three times the budget): the
    source's heartbeats move its slot, so the WAL it retains stays under max_retained_wal."""
    execute(pg_dsn, "CREATE TABLE captured (id int PRIMARY KEY)", "CREATE SCHEMA other",
            "CREATE TABLE other.busy (id serial PRIMARY KEY, pad text)")
    config = pg_config(pg_dsn, tmp_path, tables=["public.*"], heartbeat_interval=0.5, max_retained_wal="16MB",
                       wal_check_interval=0.2)
    slot = slot_name(config, pg_dsn)
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    retained = []
    try:
        with caplog.at_level(logging.WARNING, logger="sources.postgres.slots"), \
                capturing(config, log, "idle") as capture:
            wait_until(lambda: capture.source.phase == "streaming", capture=capture)
            for _ in range(8):
                execute(pg_dsn, BUSY_ROUND)
                written = _current_lsn(pg_dsn)
                # Evidence the slot moved past this round: the source confirmed a later position.
                wait_until(lambda: _slot_row(pg_dsn, slot)[1] >= written, capture=capture,
                           what="the slot confirmed past the round's WAL")
                # The slot's restart point moves at the server's next running-transactions record,
                # written every 15 s by the background writer; a checkpoint writes one now.
                execute(pg_dsn, "CHECKPOINT")
                retained.append(_slot_row(pg_dsn, slot)[0])
            wait_until(lambda: _slot_row(pg_dsn, slot)[0] < config.max_retained_wal, capture=capture,
                       what="the slot's restart point past the writes")
        assert sum(1 for _ in log.read_all("idle.public.captured")) == 0
    finally:
        log.close()
    assert len(retained) == 8 and max(retained) < config.max_retained_wal, retained
    assert not any("above max_retained_wal" in r.getMessage() for r in caplog.records)


def test_the_drop_policy_drops_the_slot_over_budget_and_snapshots_again(pg_dsn, tmp_path, caplog):
    execute(pg_dsn, "CREATE TABLE captured (id int PRIMARY KEY, v text)",
            "INSERT INTO captured SELECT g, 'v' FROM generate_series(1, 3) g", "CREATE SCHEMA other",
            "CREATE TABLE other.busy (id serial PRIMARY KEY, pad text)")
    # No heartbeats: nothing moves the slot while only the uncaptured table is written.
    config = pg_config(pg_dsn, tmp_path, snapshot="when_needed", heartbeat_interval=3600, max_retained_wal="2MB",
                       on_retained_wal="drop", wal_check_interval=0.2)
    slot = slot_name(config, pg_dsn)
    log = EmbeddedLog(tmp_path / "log", fsync=False)

    def ops():
        return [orjson.loads(r.value)["op"] for r in log.read_all("drop.public.captured") if r.value is not None]

    try:
        with caplog.at_level(logging.WARNING), capturing(config, log, "drop") as capture:
            wait_until(lambda: capture.source.phase == "streaming" and ops().count("r") == 3, capture=capture,
                       what="the first snapshot")
            first = _slot_row(pg_dsn, slot)
            execute(pg_dsn, BUSY_ROUND)  # ~6 MB of WAL the slot holds
            wait_until(lambda: ops().count("r") == 6, capture=capture, what="the second snapshot")
            wait_until(lambda: capture.source.phase == "streaming", capture=capture)
            execute(pg_dsn, "INSERT INTO captured VALUES (4, 'after')")
            wait_until(lambda: "c" in ops(), capture=capture, what="a change streamed by the new slot")
            again = _slot_row(pg_dsn, slot)
        assert first is not None and again is not None and again[0] < config.max_retained_wal
        assert any("dropping it (on_retained_wal: drop)" in r.getMessage() for r in caplog.records)
        assert any("was dropped (on_retained_wal: drop)" in r.getMessage() and "taking a new snapshot" in r.getMessage()
                   for r in caplog.records)
    finally:
        log.close()


def test_the_drop_policy_needs_a_budget_and_when_needed(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="needs snapshot: when_needed, not initial"):
        pg_config("postgresql://u@h/db", tmp_path, max_retained_wal="1GB", on_retained_wal="drop")
    with pytest.raises(ValidationError, match="needs max_retained_wal"):
        pg_config("postgresql://u@h/db", tmp_path, snapshot="when_needed", on_retained_wal="drop")
    assert pg_config("postgresql://u@h/db", tmp_path, snapshot="when_needed", max_retained_wal="1GB",
                     on_retained_wal="drop").on_retained_wal == "drop"


@pytest.fixture
def small_slot_wal_keep(pg_admin_dsn):
    """max_slot_wal_keep_size = 1MB on the test server for one test (ALTER SYSTEM + reload), then reset."""
    def alter(value: str) -> None:
        conn = psycopg2.connect(pg_admin_dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"ALTER SYSTEM {value}")
            cur.execute("SELECT pg_reload_conf()")
        conn.close()

    alter("SET max_slot_wal_keep_size = '1MB'")
    yield
    alter("RESET max_slot_wal_keep_size")


def _invalidate(dsn: str, slot: str) -> None:
    """Write WAL past max_slot_wal_keep_size and checkpoint until the server invalidates ``slot``."""
    for _ in range(12):
        execute(dsn, BUSY_ROUND, "SELECT pg_switch_wal()", "CHECKPOINT")
        if _slot_row(dsn, slot)[2] == "lost":
            return
    raise AssertionError(f"slot {slot} was not invalidated: {_slot_row(dsn, slot)}")


@pytest.mark.parametrize("mode", ["initial", "when_needed"])
def test_a_slot_invalidated_by_max_slot_wal_keep_size(pg_dsn, tmp_path, small_slot_wal_keep, mode):
    execute(pg_dsn, "CREATE TABLE captured (id int PRIMARY KEY)", "INSERT INTO captured VALUES (1), (2)",
            "CREATE SCHEMA other", "CREATE TABLE other.busy (id serial PRIMARY KEY, pad text)")
    config = pg_config(pg_dsn, tmp_path, snapshot=mode)
    slot = slot_name(config, pg_dsn)
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        with capturing(config, log, "lost") as capture:
            wait_until(lambda: capture.runner.stored is not None and capture.source.phase == "streaming",
                       capture=capture, what="a stored streaming position")
        _invalidate(pg_dsn, slot)  # while the source is stopped
        execute(pg_dsn, "INSERT INTO captured VALUES (3)")
        again = Capture(config, log, "lost").start()
        if mode == "initial":
            again.thread.join(60)
            assert isinstance(again.error, PositionLostError)
            assert slot in str(again.error) and "max_slot_wal_keep_size" in str(again.error)
            return
        try:
            def snapshot_ids():
                return sorted(orjson.loads(r.value)["after"]["id"] for r in log.read_all("lost.public.captured")
                              if r.value is not None and orjson.loads(r.value)["op"] == "r")

            # The phase turns to streaming before the snapshot's last batch is published: wait for the rows.
            wait_until(lambda: snapshot_ids() == [1, 1, 2, 2, 3], capture=again, what="the second snapshot")
            wait_until(lambda: again.source.phase == "streaming", capture=again)
            assert _slot_row(pg_dsn, slot)[2] != "lost"
        finally:
            again.stop()
    finally:
        log.close()
