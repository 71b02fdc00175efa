"""The PostgreSQL snapshot's readers as processes (``snapshot/processes.py``).

Each child opens a connection, imports the exported snapshot (``SET TRANSACTION SNAPSHOT``, as
the reader threads do, so every process reads the same consistent state) and runs each chunk's
COPY, handing back blocks of whole COPY lines: one bytes object per block, the cheapest thing to
pickle. Where the chunk's statement is the plain COPY of the table (``copy_json.py``), the child
also makes each block's row JSON, so the lines it hands back are those the server would have
printed for the row-JSON statement. The source's process turns a block into events with the chunk's plan
(``SnapshotRows.plan``): for the common table that is a few C-level steps per row (split, int,
a Fragment of the row JSON the server printed). The child reads COPY in blocks (``copy_out.py``:
a C loop over libpq, the row JSON made in it), so no Python code runs per row in either process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg2

from sources.postgres.copy_json import CopyJson
from sources.postgres.copy_out import copy_blocks
from sources.postgres.errors import wrap
from sources.postgres.snapshot import SnapshotReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenReader:
    """Picklable: opens a reader inside the exported snapshot, in the child."""

    dsn: str
    options: str
    snapshot_name: str
    application_name: str
    setting: str

    def __call__(self) -> SnapshotReader:
        return SnapshotReader(self.dsn, self.options, self.snapshot_name, self.application_name, self.setting)


def copy_lines(reader: SnapshotReader, task: tuple[int, str, str, int, CopyJson | None], emit: Callable) -> None:
    """Runs in a child: ``task`` is (chunk index, table name, COPY statement, lines per block,
    what makes a block's row JSON or None)."""
    index, table, sql, lines, rewrite = task
    began = time.monotonic()
    try:
        rows = copy_blocks(reader.conn, sql, lines, lambda block: emit((index, block)), rewrite)
    except psycopg2.Error as err:
        raise wrap(err, f"reading {table} for the snapshot") from err
    log.debug("snapshot chunk %d of %s: %d rows in %.1fs", index, table, rows, time.monotonic() - began)
