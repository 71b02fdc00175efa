"""The Spark sink's table maintenance over many micro-batches: how many files and snapshots (or
log versions) a table keeps, with maintenance beside the streaming MERGE and without.

    .venv/bin/cdc dev up --only spark
    .venv/bin/python -m bench.lake_maintenance [--batches 1000] [--batch 200] [--keys 5000]
                                              [--interval-seconds 20] [--retain-seconds 10]
                                              [--format delta,iceberg]

Per table format, in one local Spark session: ``--batches`` micro-batches of ``--batch`` changes
over ``--keys`` keys (bench.spark_merge's changes: inserts, then updates and 2% deletes) go
through the sink's own ``foreachBatch`` (``DeltaJob.apply``), with the sink's maintenance on
(``maintenance.interval_minutes`` = ``--interval-seconds``; ``retain_hours`` =
``--retain-seconds``). Every batch must succeed (maintenance runs on the batch's thread, between
MERGEs: it cannot conflict with one). At the end the table is checked to hold each live key at
its newest version, and the counts are printed: data files (and Iceberg's delete files) the
table's current version reads, snapshots (Iceberg) or log entries on disk (Delta), and the files
under the table's directory; ``--control`` runs the same batches with maintenance off, beside.
``tests/integration/test_spark_lake_maintenance.py`` runs 40 batches of this and asserts the
bounds below; this bench is the 1,000-batch run (bench/results/lake_maintenance.md).

Bounds, per table (with I batches per maintenance interval, each adding at most F files and S
snapshots): data files at most 1 + I x F after a compaction's bin-packing (one small table's
rows); data files on disk, referenced or not, at most that plus what the retention keeps;
Iceberg's snapshots at most (I + batches within retain_seconds) x S + 1. Delta drops log entries
past ``delta.logRetentionDuration`` at its checkpoints (every ten commits), but counts their age
from the start of the day they fall in (Delta's metadata clean-up truncates its cut-off to the
day), so within a day of writing none goes, whatever the retention: a Delta table keeps a log
entry per commit for up to a day plus the retention (a checkpoint every ten commits keeps its
reads short).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.spark_merge import batches, check, iceberg_catalog, make_changes, merge_job


@dataclass
class Counts:
    data_files: int      # the current version's data files
    delete_files: int    # Iceberg: the current version's delete files
    versions: int        # Iceberg: snapshots; Delta: log entries (json) on disk
    files_on_disk: int   # every file under the table's directory
    data_on_disk: int    # its data files there (outside _delta_log and metadata), referenced or not
    maintenance: dict    # runs, failed, the last run's steps (spark_sinks/maintenance.py)
    table_properties: dict
    seconds: float
    batches: int


def counts(spark, job, table: str, location: Path, table_format: str, seconds: float, done: int) -> Counts:
    if table_format == "iceberg":
        files = spark.sql(f"SELECT content FROM {table}.files").collect()
        data = sum(1 for f in files if f["content"] == 0)
        deletes = len(files) - data
        versions = spark.sql(f"SELECT count(*) AS n FROM {table}.snapshots").first()["n"]
    else:
        data = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").first()["numFiles"]
        deletes = 0
        versions = sum(1 for _ in (location / "_delta_log").glob("*.json"))
    files = [p for p in location.rglob("*") if p.is_file()]
    data_on_disk = sum(1 for p in files if p.suffix == ".parquet" and not {"_delta_log", "metadata"} & set(p.parts))
    ref = table if table_format == "iceberg" else f"delta.`{table}`"
    properties = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {ref}").collect()}
    maintenance = {"runs": job.stats.details.get("maintenance_runs", 0),
                   "failed": job.stats.details.get("maintenance_failed", 0), "last": job.maintenance.last}
    return Counts(data, deletes, versions, len(files), data_on_disk, maintenance, properties, seconds, done)


def run(spark, work: str, table_format: str, total: int, size: int, keys: int, interval_s: float,
        retain_s: float, maintain: bool = True, data: str | None = None) -> Counts:
    """``total`` batches of ``size`` changes through the sink's foreachBatch into a new table."""
    if data is None:
        data = f"{work}/changes.parquet"
        make_changes(spark, data, total * size, keys)
    label = f"{table_format}-{'on' if maintain else 'off'}"
    root = f"{work}/{label}"
    catalog = iceberg_catalog(spark, f"maint_{table_format}_{'on' if maintain else 'off'}", root) \
        if table_format == "iceberg" else ""
    job = merge_job(root, iceberg="merge-on-read" if table_format == "iceberg" else None, catalog=catalog,
                    maintenance={"interval_minutes": interval_s / 60 if maintain else 0,
                                 "retain_hours": retain_s / 3600})
    began = time.monotonic()
    done = 0
    for batch_id, batch in batches(spark, data, total * size, size):
        job.apply(batch, batch_id)
        done += 1
    seconds = time.monotonic() - began
    table = f"{catalog}.public.orders" if catalog else f"{root}/public/orders"
    check(spark, data, table)
    return counts(spark, job, table, Path(root) / "public" / "orders", table_format, seconds, done)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=200, help="changes per micro-batch")
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--interval-seconds", type=float, default=20.0)
    parser.add_argument("--retain-seconds", type=float, default=10.0)
    parser.add_argument("--format", default="delta,iceberg")
    parser.add_argument("--control", action="store_true", help="also run with maintenance off")
    args = parser.parse_args(argv)

    from cdc.dev.jars import spark_jars
    from cdc.dev.stack import read_env
    from spark_sinks.session import local_session

    jars = read_env().get("SPARK_JARS")
    spark = local_session("bench-lake-maintenance", jars=jars.split(",") if jars else spark_jars())
    work = tempfile.mkdtemp(prefix="bench-lake-maintenance-")
    data = f"{work}/changes.parquet"
    make_changes(spark, data, args.batches * args.batch, args.keys)
    for table_format in args.format.split(","):
        for maintain in (True, False) if args.control else (True,):
            load = os.getloadavg()[0]
            c = run(spark, work, table_format, args.batches, args.batch, args.keys, args.interval_seconds,
                    args.retain_seconds, maintain, data)
            print(f"{table_format:<8} maintenance {'on ' if maintain else 'off'} {c.batches} batches in "
                  f"{c.seconds:.0f}s: data files {c.data_files}, delete files {c.delete_files}, "
                  f"{'snapshots' if table_format == 'iceberg' else 'log entries'} {c.versions}, files on disk "
                  f"{c.files_on_disk} ({c.data_on_disk} data); maintenance runs {c.maintenance.get('runs', 0)}, failed "
                  f"{c.maintenance.get('failed', 0)} (load {load:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
