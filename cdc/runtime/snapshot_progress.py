"""Progress of a snapshot for status and metrics: rows published, chunks done of all, an ETA.

The source tells its chunks (``Source.snapshot_chunks``); the runner counts the snapshot rows it
publishes. The ETA assumes the chunks left take as long, on average, as the ones done since the
meter first looked (chunks are about the same size: ``snapshot_chunk_rows``); it is None until
one more chunk is done.
"""

from __future__ import annotations

import time


class SnapshotProgressMeter:
    def __init__(self) -> None:
        self.rows = 0
        self._began: tuple[float, int] | None = None  # (when, chunks done then) at the first look

    def figures(self, chunks: tuple[int, int] | None) -> dict | None:
        """{rows, chunks_done, chunks_total, eta_seconds} while a snapshot is under way, else None."""
        if chunks is None:
            self._began = None
            return None
        now = time.monotonic()
        done, total = chunks
        if self._began is None:
            self._began = (now, done)
        began, done_then = self._began
        eta = None
        if done > done_then:
            eta = round((now - began) * (total - done) / (done - done_then), 1)
        return {"rows": self.rows, "chunks_done": done, "chunks_total": total, "eta_seconds": eta}
