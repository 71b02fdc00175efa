"""spark_sinks/maintenance.py's scheduling and failure handling (pure logic: a fake table that
records its steps; the real ones run in tests/integration/test_spark_lake_maintenance.py)."""

from __future__ import annotations

import time

from cdc.api import ConnectorStats
from spark_sinks.config import MaintenanceSettings
from spark_sinks.maintenance import Maintenance


class FakeTable:
    def __init__(self, name: str, fail: str | None = None, deletes: bool = True) -> None:
        self.name, self.fail, self.has_deletes = name, fail, deletes
        self.maintained_at = time.monotonic()
        self.steps: list[tuple[str, bool]] = []

    def exists(self, session) -> bool:
        return True

    def deletes_exist(self, session) -> bool:
        return self.has_deletes

    def _step(self, name: str, deletes: bool) -> str:
        if name == self.fail:
            raise RuntimeError(f"{name} refused\nJava stack trace ...")
        self.steps.append((name, deletes))
        return "done"

    def compact(self, session, deletes=False):
        return self._step("compact", deletes)

    def expire(self, session, older_than_ms, retain_hours, deletes=False):
        return self._step("expire", deletes)

    def remove_orphans(self, session, older_than_ms, retain_hours, deletes=False):
        return self._step("orphans", deletes)


def test_one_due_table_per_batch_every_step_on_its_rows_and_its_delete_memory():
    stats = ConnectorStats("lake", "sink")
    maintenance = Maintenance(MaintenanceSettings(interval_minutes=1), stats)
    a, b = FakeTable("public.a"), FakeTable("public.b", deletes=False)
    assert maintenance.after_batch(None, [a, b]) is None   # not due: one interval after the start
    a.maintained_at = b.maintained_at = time.monotonic() - 61
    assert maintenance.after_batch(None, [a, b]) is a
    assert a.steps == [("compact", False), ("compact", True), ("expire", False), ("expire", True),
                       ("orphans", False), ("orphans", True)]
    assert maintenance.after_batch(None, [a, b]) is b and b.steps == [("compact", False), ("expire", False),
                                                                      ("orphans", False)]
    assert maintenance.after_batch(None, [a, b]) is None
    assert stats.details["maintenance_runs"] == 2 and stats.details["maintenance_failed"] == 0


def test_a_failing_step_is_counted_and_skipped_never_raised():
    stats = ConnectorStats("lake", "sink")
    maintenance = Maintenance(MaintenanceSettings(interval_minutes=1, orphan_files=False), stats)
    table = FakeTable("public.a", fail="compact")
    table.maintained_at -= 61
    assert maintenance.after_batch(None, [table]) is table
    assert table.steps == [("expire", False), ("expire", True)]
    assert stats.details["maintenance_failed"] == 2
    assert stats.details["maintenance_error"] == "public.a compact: compact refused"
    assert stats.details["maintenance_last"].startswith("public.a in ") and "compact failed" in \
        stats.details["maintenance_last"]


def test_interval_zero_never_maintains():
    maintenance = Maintenance(MaintenanceSettings(interval_minutes=0), ConnectorStats("lake", "sink"))
    table = FakeTable("public.a")
    table.maintained_at -= 10**6
    assert maintenance.after_batch(None, [table]) is None and table.steps == []
