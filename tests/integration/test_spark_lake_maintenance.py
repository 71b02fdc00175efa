"""The Spark sink's table maintenance (spark_sinks/maintenance.py) beside its MERGEs, for Delta
and Iceberg: 12 micro-batches through the sink's own foreachBatch, maintenance due every second (so
after about every batch, whatever the machine's load: a batch takes longer) with a retention of
1 s. Every batch succeeds, no maintenance step fails, the table holds each live key
at its newest version (bench.spark_merge.check), and its files and snapshots (Iceberg) stay
under the bounds bench/lake_maintenance.py states (its 1,000-batch Iceberg run
is in bench/results/lake_maintenance.md), where without maintenance a table keeps one version and a
file or more per batch."""

from __future__ import annotations

import pytest

from bench.lake_maintenance import run

pytestmark = [pytest.mark.spark]

BATCHES, SIZE, KEYS = 12, 100, 1000


@pytest.mark.parametrize("table_format", ["delta", pytest.param("iceberg", marks=pytest.mark.iceberg)])
def test_maintenance_keeps_files_and_versions_bounded_and_never_fails_a_batch(spark, tmp_path, table_format):
    on = run(spark, str(tmp_path), table_format, BATCHES, SIZE, KEYS, interval_s=1, retain_s=1)
    assert on.batches == BATCHES
    runs = on.maintenance["runs"]
    assert runs >= 3 and on.maintenance["failed"] == 0, on.maintenance
    per_run = BATCHES / runs   # batches between two maintenance runs, on average
    # Each batch adds a version or two and a few files; what a run leaves is what came since.
    # Without maintenance the table reads a data file or more per batch, and keeps a snapshot each.
    assert on.data_files + on.delete_files <= min(3 * per_run + 2, BATCHES / 2), (on, per_run)
    assert on.data_on_disk <= 6 * per_run + 4, (on, per_run)   # and those within the retention
    if table_format == "iceberg":
        assert on.versions <= min(2 * per_run + 3, BATCHES / 2), (on, per_run)
    else:   # Delta keeps its log entries for a day at least (bench/lake_maintenance.py): the retention is set
        assert on.versions >= BATCHES and on.table_properties["delta.logRetentionDuration"] == "interval 1 seconds"
