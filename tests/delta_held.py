"""The Delta sink of a config file, run as ``cdc run``'s worker runs it (``run_connector``), but
held for good at one point of a batch, once it wrote a file saying it got there: a test waits
for that file and kills the process there (``tests.daemon.kill_daemon``)::

    python -m tests.delta_held CONFIG SINK POINT MARKER [TABLE]

POINT is ``shape`` (a table followed a new shape of its source, no row of the batch written to it yet) or
``rebuild`` (a rebuild wrote its staging table from the topic, readers still see the old one).
TABLE (``namespace.table``): hold only there; other tables pass the point (a test with several
sources kills the sink at each one's table in turn).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path


def hold(point: str, marker: Path, only: str | None):
    def held(batch_id: int, table: str) -> None:
        if only is not None and table != only:
            return
        marker.write_text(f"{point}: table {table}, batch {batch_id}\n")
        threading.Event().wait()  # until killed
    return held


def main(config_path: str, name: str, point: str, marker: str, only: str | None = None) -> int:
    from cdc.runtime.worker import run_connector
    from spark_sinks import job

    held = hold(point, Path(marker).resolve(), only)
    init = job.DeltaJob.__init__

    def holding(self, config, **kwargs) -> None:
        init(self, config, **kwargs)
        if point == "shape":
            self.after_shape = held
        elif point == "rebuild":
            staging = Path(config.path) / "_cdc_rebuild"   # DeltaJob.rebuild's staging area

            def after_table(batch_id: int, table: str) -> None:
                if (staging / Path(*table.split("."))).is_dir():   # this table's staging table
                    held(batch_id, table)
            self.after_table = after_table
        else:
            raise SystemExit(f"unknown point {point}")

    job.DeltaJob.__init__ = holding
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_connector(config_path, name, threading.Event())


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main(*sys.argv[1:]))
