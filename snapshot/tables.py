"""Which tables a source's topics are complete for, stored with its offsets.

A table added to a source's ``tables:`` while the source was stopped has rows its topic never
got: the stream only brings changes from now on. To know such a table at the next start, the
coordinator records the tables its topics are complete for (after a snapshot or a backfill, once
the position that ends it is stored) in the offsets topic, next to the position
(``OffsetStore.save_tables``). A start that finds a stored position and a captured table outside
that record backfills the table (snapshot/coordinator.py).

No record (the offsets were written before this existed): every table captured now counts as
complete, and is recorded.
"""

from __future__ import annotations

from cdc.offsets import OffsetStore


class TableBook:
    """Threading: the runner's thread (the one that stores offsets)."""

    def __init__(self, offsets: OffsetStore, source: str) -> None:
        self.offsets, self.source = offsets, source

    def load(self) -> frozenset[str] | None:
        return self.offsets.load_tables(self.source)

    def save(self, tables: frozenset[str]) -> None:
        self.offsets.save_tables(self.source, tables)
