"""The PostgreSQL source's memory of each table's relation OID (sources/postgres/relations.py):
stored only for OIDs the committed position covers, so a crash never leaves it ahead of the log."""

from __future__ import annotations

from cdc.events import TableId
from sources.postgres.relations import RelationMemory

ITEMS = TableId("shop", "public", "items")


def test_an_oid_is_stored_once_the_position_covers_its_first_change(tmp_path):
    path = tmp_path / "state" / "relations.json"
    memory = RelationMemory(path)
    memory.seen(ITEMS, 100, lsn=500)
    memory.committed(499)                       # not yet covered: a restart must see the old OID
    assert not path.exists() and RelationMemory(path).known("shop") == {}
    memory.committed(500)
    assert RelationMemory(path).known("shop") == {ITEMS: 100}
    memory.seen(ITEMS, 200, lsn=900)            # dropped and created again
    memory.committed(800)
    assert RelationMemory(path).known("shop") == {ITEMS: 100}
    memory.committed(950)
    assert RelationMemory(path).known("shop") == {ITEMS: 200}


def test_an_unreadable_file_forgets_rather_than_stops(tmp_path):
    path = tmp_path / "relations.json"
    path.write_text("not json")
    assert RelationMemory(path).known("shop") == {}
