"""Which relation (OID) each captured table was, and its columns' attnums, remembered across restarts.

A table dropped and created again comes back under a new OID, and DROP TABLE writes no row
changes, so the topic would keep the old table's rows forever. Within one streaming session the
change builder sees the OID change and publishes a truncate before the new table's first row
(changes.py). Across a restart it needs to know the OID from before: this file in the source's
``state_dir`` keeps, per table, the OID whose changes (or snapshot rows) are covered by the stored
position. It is written at ``commit``, only with OIDs first seen at or before the committed LSN,
so a crash never leaves it ahead of the log: a restart that replays the old OID's changes still
sees the old OID first, then the new one.

The same file keeps, per table, the attnum of each column of the table's last shape covered by the
stored position (written by the same rule): a column renamed while the source was down comes back
in the first Relation message under its new name with its old attnum, which is how the change
builder tells a rename from a drop and an add (changes.py, ``_renamed``); without it the catalog
at start already has the new name, and sinks would add an empty column and keep the values under
the old name.

Lost state (a new ``state_dir``, or a file from before the columns were kept) means a drop and
re-create while the source was down is not noticed (the new table's rows still come under its
own new shape), and a rename while it was down counts as a drop and an add.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from cdc.events import TableId

log = logging.getLogger(__name__)


def _name(table: TableId) -> str:
    return f"{table.schema}.{table.table}"


class RelationMemory:
    """Used from the source's thread only. The file: ``{"schema.table": {"oid": N, "columns":
    {name: attnum}}}`` (an older file's ``{"schema.table": N}`` is read as OIDs alone)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stored: dict[str, int] = {}
        self.stored_columns: dict[str, dict[str, int]] = {}
        if path.exists():
            try:
                for name, entry in json.loads(path.read_text()).items():
                    if isinstance(entry, dict):
                        self.stored[name] = int(entry["oid"])
                        if entry.get("columns"):
                            self.stored_columns[name] = {c: int(n) for c, n in entry["columns"].items()}
                    else:
                        self.stored[name] = int(entry)
            except (ValueError, AttributeError, KeyError, TypeError) as err:
                log.warning("%s is unreadable (%s): a table re-created or a column renamed while the source was "
                            "down will not be noticed this time", path, err)
                self.stored, self.stored_columns = {}, {}
        self._seen: dict[str, tuple[int, int]] = {}   # table -> (oid, lsn first seen), not yet stored
        # table -> [(lsn from which they hold, oid, columns)], oldest first, not yet stored
        self._shaped: dict[str, list[tuple[int, int, dict[str, int]]]] = {}

    def known(self, database: str) -> dict[TableId, int]:
        """The OIDs covered by the stored position, to seed the change builder's."""
        out = {}
        for name, oid in self.stored.items():
            schema, _, table = name.partition(".")
            out[TableId(database, schema, table)] = oid
        return out

    def columns(self) -> dict[int, dict[str, int]]:
        """Relation OID -> column name -> attnum, of each table's last shape the stored position
        covers (to seed the change builder's ``column_ids``)."""
        return {self.stored[name]: dict(columns) for name, columns in self.stored_columns.items()
                if name in self.stored}

    def seen(self, table: TableId, oid: int, lsn: int) -> None:
        """``table`` is relation ``oid`` from ``lsn`` on (its first change or snapshot row)."""
        name = _name(table)
        if self.stored.get(name) != oid and self._seen.get(name, (None,))[0] != oid:
            self._seen[name] = (oid, lsn)

    def shaped(self, table: TableId, oid: int, columns: dict[str, int], lsn: int) -> None:
        """``table`` (relation ``oid``) has ``columns`` (name -> attnum) from ``lsn`` on."""
        self._shaped.setdefault(_name(table), []).append((lsn, oid, dict(columns)))

    def committed(self, lsn: int) -> None:
        """Everything up to ``lsn`` is stored: remember the OIDs first seen at or before it, and
        each table's newest columns from at or before it."""
        done = {name: oid for name, (oid, at) in self._seen.items() if at <= lsn}
        shapes = {}
        for name, pending in list(self._shaped.items()):
            covered = [entry for entry in pending if entry[0] <= lsn]
            if covered:
                shapes[name] = max(covered, key=lambda entry: entry[0])
                rest = [entry for entry in pending if entry[0] > lsn]
                if rest:
                    self._shaped[name] = rest
                else:
                    del self._shaped[name]
        if not done and not shapes:
            return
        for name in done:
            del self._seen[name]
        self.stored.update(done)
        for name, (_, oid, columns) in shapes.items():
            if self.stored.get(name, oid) == oid:
                self.stored_columns[name] = columns
        # A table whose OID changed has no columns of the new relation yet.
        for name in done:
            if name not in shapes:
                self.stored_columns.pop(name, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({name: {"oid": oid, **({"columns": self.stored_columns[name]}
                                                               if name in self.stored_columns else {})}
                                         for name, oid in self.stored.items()}, sort_keys=True))
        os.replace(temporary, self.path)
