"""The coordinator's lifecycle (snapshot/coordinator.py) against a real PostgreSQL server."""

from __future__ import annotations

import pytest

from cdc.offsets import OffsetStore
from cdc.positions import PgLsn, SnapshotProgress
from tests.integration.pg_capture import (
    Capture,
    capturing,
    crash_mid_snapshot,
    drop_released_slot,
    embedded_log,  # noqa: F401 - the fixture ``log``
    execute,
    pg_config,
    slot_name,
    table_rows,
    topic_state,
    wait_until,
)

pytestmark = pytest.mark.postgres


def test_a_snapshot_cut_short_after_a_lost_slot_is_taken_again(pg_dsn, tmp_path, log, monkeypatch):
    """when_needed re-snapshots after the slot is lost. If that snapshot dies half way, the stored
    position must say so: the old LSN would resume on the new slot, at the new snapshot's point,
    and the rows the cut-short snapshot did not reach would never come."""
    from sources.postgres.source import PostgresSource

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
            "INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g")
    config = pg_config(pg_dsn, tmp_path, snapshot="when_needed", snapshot_workers=1, max_batch_events=100,
                       snapshot_chunk_pages=4)
    with capturing(config, log, "cut") as capture:
        wait_until(lambda: len(topic_state(log, "cut.public.t")) == 100, capture=capture)
        wait_until(lambda: isinstance(capture.runner.stored, PgLsn), capture=capture)
    drop_released_slot(pg_dsn, slot_name(config, pg_dsn))
    execute(pg_dsn, "INSERT INTO t SELECT g, 1 FROM generate_series(101, 20000) g")

    crash_mid_snapshot(PostgresSource, monkeypatch)
    crashing = Capture(config, log, "cut").start()
    crashing.thread.join(60)
    assert isinstance(crashing.error, RuntimeError)
    monkeypatch.undo()
    assert isinstance(OffsetStore(log, "cut").load("pg"), SnapshotProgress)  # stored before the first row
    assert len(topic_state(log, "cut.public.t")) < 20000

    with capturing(config, log, "cut") as capture:
        expected = table_rows(pg_dsn, "t")
        wait_until(lambda: topic_state(log, "cut.public.t") == expected, capture=capture,
                   what="the topic to equal the table")
        wait_until(lambda: isinstance(capture.runner.stored, PgLsn), capture=capture)
