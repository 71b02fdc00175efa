"""Values of TOASTed columns, kept so that an update that leaves them unchanged still gives a
complete row.

PostgreSQL stores a large value (over about 2 kB) out of line; an UPDATE that does not touch it
logs no new copy, and pgoutput sends "unchanged TOAST" instead of the value. Under REPLICA
IDENTITY FULL the old tuple has it; otherwise the source fills it from this store, which keeps
the newest large value per (table, key, column) as seen in the snapshot and the stream.

What happens when neither has it (capture started with ``snapshot: never`` before the row was
last written with that value): the column is left out of ``after`` and named in the event's
``source.unchanged_toast`` list, so a sink keeps its current value (a partial update) instead of
writing a placeholder. After a crash the stream replays from the stored position; an event
replayed before the next write of the column may then carry a newer value than it first had.
The final state is the same. An update that moves a row to a new key carries the value from the
old key's entry to the new key's (pgoutput's old key tuple has NULL for every other column, which
says nothing about the value); a replay of such a move, whose old entry is already forgotten, finds
it under the new key.

A SQLite file per source; writes are buffered and committed by ``flush`` (once per batch).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

# A value shorter than this is never stored out of line (TOAST_TUPLE_THRESHOLD is ~2 kB of bytes;
# counting characters, a quarter of it is a safe floor for multi-byte text).
MIN_TOASTABLE_CHARS = 500

# Types whose values have a fixed, small length: never stored out of line, never remembered.
FIXED_WIDTH_TYPES = frozenset({
    16, 18, 20, 21, 23, 26, 28, 29, 700, 701, 790, 829, 774, 1082, 1083, 1114, 1184, 1186, 1266, 2950, 3220,
})


class ToastStore:
    """Used from the source's thread only."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS toast (tbl TEXT, key BLOB, col TEXT, value TEXT, "
                         "PRIMARY KEY (tbl, key, col)) WITHOUT ROWID")
        self._pending: dict[tuple[str, bytes, str], str | None] = {}
        # Tables that have (or had) a value stored: for the others there is nothing to forget, so
        # deletes of rows without large values cost nothing.
        self._tables = {t for t, in self._db.execute("SELECT DISTINCT tbl FROM toast")}

    def remember(self, table: str, key: bytes, column: str, value: str) -> None:
        self._tables.add(table)
        self._pending[(table, key, column)] = value

    def forget_key(self, table: str, key: bytes, columns: list[str]) -> None:
        if table not in self._tables:
            return
        for column in columns:
            self._pending[(table, key, column)] = None

    def forget_table(self, table: str) -> None:
        if table not in self._tables:
            return
        self.flush()
        self._db.execute("DELETE FROM toast WHERE tbl = ?", (table,))

    def recall(self, table: str, key: bytes, column: str) -> str | None:
        if table not in self._tables:
            return None
        entry = (table, key, column)
        if entry in self._pending:
            return self._pending[entry]
        row = self._db.execute("SELECT value FROM toast WHERE tbl = ? AND key = ? AND col = ?", entry).fetchone()
        return row[0] if row else None

    def flush(self) -> None:
        if not self._pending:
            return
        upserts = [(t, k, c, v) for (t, k, c), v in self._pending.items() if v is not None]
        deletes = [(t, k, c) for (t, k, c), v in self._pending.items() if v is None]
        self._db.execute("BEGIN")
        self._db.executemany("INSERT OR REPLACE INTO toast VALUES (?, ?, ?, ?)", upserts)
        self._db.executemany("DELETE FROM toast WHERE tbl = ? AND key = ? AND col = ?", deletes)
        self._db.execute("COMMIT")
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self._db.close()
