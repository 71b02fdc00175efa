"""Which relation (OID) each captured table was, remembered across restarts.

A table dropped and created again comes back under a new OID, and DROP TABLE writes no row
changes, so the topic would keep the old table's rows forever. Within one streaming session the
change builder sees the OID change and publishes a truncate before the new table's first row
(changes.py). Across a restart it needs to know the OID from before: this file in the source's
``state_dir`` keeps, per table, the OID whose changes (or snapshot rows) are covered by the stored
position. It is written at ``commit``, only with OIDs first seen at or before the committed LSN,
so a crash never leaves it ahead of the log: a restart that replays the old OID's changes still
sees the old OID first, then the new one.

Lost state (a new ``state_dir``) means a drop and re-create while the source was down is not
noticed (the new table's rows still come under its own new shape).
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
    """Used from the source's thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stored: dict[str, int] = {}
        if path.exists():
            try:
                self.stored = {k: int(v) for k, v in json.loads(path.read_text()).items()}
            except (ValueError, AttributeError) as err:
                log.warning("%s is unreadable (%s): a table re-created while the source was down will not "
                            "be noticed this time", path, err)
        self._seen: dict[str, tuple[int, int]] = {}   # table -> (oid, lsn first seen), not yet stored

    def known(self, database: str) -> dict[TableId, int]:
        """The OIDs covered by the stored position, to seed the change builder's."""
        out = {}
        for name, oid in self.stored.items():
            schema, _, table = name.partition(".")
            out[TableId(database, schema, table)] = oid
        return out

    def seen(self, table: TableId, oid: int, lsn: int) -> None:
        """``table`` is relation ``oid`` from ``lsn`` on (its first change or snapshot row)."""
        name = _name(table)
        if self.stored.get(name) != oid and self._seen.get(name, (None,))[0] != oid:
            self._seen[name] = (oid, lsn)

    def committed(self, lsn: int) -> None:
        """Everything up to ``lsn`` is stored: remember the OIDs first seen at or before it."""
        done = {name: oid for name, (oid, at) in self._seen.items() if at <= lsn}
        if not done:
            return
        for name in done:
            del self._seen[name]
        self.stored.update(done)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.stored, sort_keys=True))
        os.replace(temporary, self.path)
