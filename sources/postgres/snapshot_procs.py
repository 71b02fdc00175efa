"""The PostgreSQL snapshot's readers as processes (``snapshot/processes.py``).

Each child opens a connection, imports the exported snapshot (``SET TRANSACTION SNAPSHOT``, as
the reader threads do, so every process reads the same consistent state) and runs each chunk's
COPY, handing back blocks of whole COPY lines: one bytes object per block, the cheapest thing to
pickle. Where the chunk's statement is the plain COPY of the table (``copy_json.py``), the child
also makes each block's row JSON, so the lines it hands back are those the server would have
printed for the row-JSON statement. The source's process turns a block into events with the chunk's plan
(``SnapshotRows.plan``): for the common table that is a few C-level steps per row (split, int,
a Fragment of the row JSON the server printed), so the per-row Python work of driving COPY (a
``write`` call per row, cutting lines) runs in the children, beside the GIL, not under it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import psycopg2

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


class _LineBlocks:
    """A file for ``copy_expert`` that hands on blocks of whole lines (``lines`` writes each; libpq
    gives COPY data a row at a time)."""

    def __init__(self, index: int, emit: Callable, lines: int, rewrite: Callable[[bytes], bytes] | None) -> None:
        self.index, self.emit, self.lines, self.rewrite = index, emit, lines, rewrite
        self.chunks: list[bytes] = []
        self.rest = b""
        self.bytes = 0

    def write(self, data: bytes) -> None:
        chunks = self.chunks
        chunks.append(data)
        if len(chunks) >= self.lines:
            self._send()

    def _send(self) -> None:
        if self.rest:
            self.chunks.insert(0, self.rest)
        joined = b"".join(self.chunks)
        self.chunks = []
        cut = joined.rfind(b"\n") + 1
        self.rest = joined[cut:]
        if cut:
            self.bytes += cut
            block = joined[:cut] if cut < len(joined) else joined
            self.emit((self.index, block if self.rewrite is None else self.rewrite(block)))

    def close(self) -> None:
        if self.chunks:
            self._send()
        if self.rest:
            raise ValueError("COPY output ended in the middle of a row")


def copy_lines(reader: SnapshotReader, task: tuple[int, str, str, int, Callable | None], emit: Callable) -> None:
    """Runs in a child: ``task`` is (chunk index, table name, COPY statement, lines per block,
    what makes a block's row JSON or None)."""
    index, table, sql, lines, rewrite = task
    sink = _LineBlocks(index, emit, lines, rewrite)
    began = time.monotonic()
    try:
        with reader.conn.cursor() as cur:
            cur.copy_expert(sql, sink, size=1 << 20)
    except psycopg2.Error as err:
        raise wrap(err, f"reading {table} for the snapshot") from err
    sink.close()
    log.debug("snapshot chunk %d of %s: %d bytes in %.1fs", index, table, sink.bytes, time.monotonic() - began)
