"""Table maintenance the sink schedules itself: small files compacted, old snapshots or versions
expired, files no version references removed.

A streaming MERGE every few seconds leaves a table with many small files (and, merge-on-read,
many delete files), and one snapshot or version per batch, until reads slow down and storage
grows. Per table, every ``maintenance.interval_minutes``:

=========== ===================================== ===============================================
step        Delta                                 Iceberg
=========== ===================================== ===============================================
compact     ``OPTIMIZE`` (bin-packing)            ``rewrite_data_files`` (files with deletes
                                                  too, dangling deletes dropped), then
                                                  ``rewrite_position_delete_files``
expire      ``delta.logRetentionDuration`` and    ``expire_snapshots`` older than
            ``deletedFileRetentionDuration``:     ``retain_hours`` (the newest always kept)
            Delta drops older log entries at
            its next checkpoint
orphans     ``VACUUM`` (files older than          ``remove_orphan_files`` older than
            ``retain_hours`` no version needs)    ``retain_hours``
=========== ===================================== ===============================================

The delete memory's table is compacted and expired the same way (it gets one small file per
batch with deletes).

It runs on the batch's own thread, after the batch's writes and before the batch is marked done,
at most one table per batch: nothing else writes the table meanwhile (the sink is its one
writer), so it cannot conflict with a MERGE. What it costs is that batch's latency. A step that
fails is logged, counted (``cdc status``: the sink's ``maintenance_*`` details) and tried again at
the next interval; it never fails the batch. A kill in the middle leaves what each format's
commit left: a compaction or expiry is one commit, or none.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pyspark.sql import SparkSession

from spark_sinks.tables import TableTarget

log = logging.getLogger(__name__)


class Maintenance:
    def __init__(self, settings: Any, stats: Any) -> None:
        """``settings``: the sink's ``maintenance`` section; ``stats``: its ConnectorStats."""
        self.settings = settings
        self.stats = stats
        # What `cdc status` shows (one line per sink: details as name=value), and the last run's
        # steps in full (``last``, for tests and benchmarks).
        self.details = stats.details
        self.details.update({"maintenance_runs": 0, "maintenance_failed": 0})
        self.last: dict[str, Any] | None = None

    def due(self, target: TableTarget, now: float) -> bool:
        interval = self.settings.interval_minutes * 60
        return interval > 0 and now - target.maintained_at >= interval

    def after_batch(self, session: SparkSession, targets: list[TableTarget]) -> TableTarget | None:
        """Maintain the first of ``targets`` that is due, if any; returns it."""
        now = time.monotonic()
        for target in targets:
            if self.due(target, now) and target.exists(session):
                self.run(session, target)
                target.maintained_at = time.monotonic()
                return target
        return None

    def run(self, session: SparkSession, target: TableTarget) -> dict[str, Any]:
        """Every step on ``target`` (and its delete memory); a failing step is logged and skipped."""
        settings = self.settings
        older_than_ms = int((time.time() - settings.retain_hours * 3600) * 1000)
        began, done, failed = time.monotonic(), {}, []
        steps = [("compact", settings.compact, lambda deletes: target.compact(session, deletes)),
                 ("expire", True, lambda deletes: target.expire(session, older_than_ms, settings.retain_hours,
                                                                deletes)),
                 ("orphans", settings.orphan_files,
                  lambda deletes: target.remove_orphans(session, older_than_ms, settings.retain_hours, deletes))]
        for name, wanted, step in steps:
            if not wanted:
                continue
            for deletes in (False, True):
                if deletes and not target.deletes_exist(session):
                    continue
                try:
                    done[f"{name}{' (deletes)' if deletes else ''}"] = step(deletes)
                except Exception as err:  # noqa: BLE001 - skipped, tried at the next interval
                    failed.append(name)
                    self.details["maintenance_failed"] += 1
                    self.details["maintenance_error"] = f"{target.name} {name}: {_first_line(err)}"
                    log.warning("table %s: maintenance step %s failed, tried again in %g min: %s", target.name,
                                name, settings.interval_minutes, _first_line(err))
        seconds = round(time.monotonic() - began, 2)
        self.details["maintenance_runs"] += 1
        self.details["maintenance_last"] = f"{target.name} in {seconds:g}s" + (f", {','.join(dict.fromkeys(failed))} failed"
                                                                              if failed else "")
        self.last = {"table": target.name, "at": time.time(), "seconds": seconds, **done,
                     **({"failed": failed} if failed else {})}
        log.info("table %s maintained in %.1fs: %s", target.name, seconds,
                 ", ".join(f"{k}: {v}" for k, v in done.items()) or "nothing done")
        return done


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
