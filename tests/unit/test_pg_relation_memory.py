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


def test_columns_are_stored_once_the_position_covers_their_shape(tmp_path):
    path = tmp_path / "relations.json"
    memory = RelationMemory(path)
    memory.seen(ITEMS, 100, lsn=500)
    memory.shaped(ITEMS, 100, {"id": 1, "label": 2}, lsn=500)
    memory.shaped(ITEMS, 100, {"id": 1, "title": 2}, lsn=700)   # renamed at 700
    memory.committed(600)
    assert RelationMemory(path).columns() == {100: {"id": 1, "label": 2}}
    memory.committed(700)
    assert RelationMemory(path).columns() == {100: {"id": 1, "title": 2}}
    memory.seen(ITEMS, 200, lsn=900)                             # dropped and created again
    memory.committed(900)
    assert RelationMemory(path).columns() == {} and RelationMemory(path).known("shop") == {ITEMS: 200}


def test_a_file_of_oids_alone_is_still_read(tmp_path):
    path = tmp_path / "relations.json"
    path.write_text('{"public.items": 100}')
    memory = RelationMemory(path)
    assert memory.known("shop") == {ITEMS: 100} and memory.columns() == {}


def test_a_rename_the_stream_is_behind_is_still_told_from_a_drop():
    """The catalog already has ``title`` (attnum 2) when the stream still shows ``label``: the
    old name keeps the attnum of the last shape, so ``title`` is a rename when it comes."""
    from sources.postgres.changes import ChangeBuilder

    catalog = {"id": 1, "title": 2, "extra": 4}
    builder = ChangeBuilder("shop", lambda oid: None, lambda oids: [], None, lambda oid, mod: "",
                            attnums=lambda oid: dict(catalog))
    builder.column_ids[100] = {"id": 1, "label": 2, "qty": 3}        # relations.json, as stored
    assert builder._renamed(100, ("id", "label", "qty")) == {}       # rows of the old shape first
    assert builder._renamed(100, ("id", "title", "extra")) == {"title": "label"}


def test_a_middle_name_of_a_column_renamed_twice_is_placed_by_its_position():
    """``note`` (attnum 3) became ``memo``, rows were written, then ``remark``: the stream's
    ``memo`` is in neither the catalog nor the last shape, but it sits between ``title`` (2) and
    ``qty`` (4, of the last shape), where the last shape had only attnum 3 free. At the end of
    the columns nothing bounds it (a column added since could sit there): not placed."""
    from sources.postgres.changes import ChangeBuilder

    catalog = {"id": 1, "title": 2, "remark": 3, "extra": 5}
    builder = ChangeBuilder("shop", lambda oid: None, lambda oids: [], None, lambda oid, mod: "",
                            attnums=lambda oid: dict(catalog))
    builder.column_ids[100] = {"id": 1, "label": 2, "note": 3, "qty": 4}
    assert builder._renamed(100, ("id", "title", "memo", "qty")) == {"title": "label", "memo": "note"}
    assert builder._renamed(100, ("id", "title", "remark", "extra")) == {"remark": "memo"}
    builder.column_ids[100] = {"id": 1, "note": 3}
    assert builder._renamed(100, ("id", "memo")) == {}
    # Two names between the same bounds, one attnum free there (a column dropped since): unsure.
    builder.column_ids[100] = {"id": 1, "note": 3, "qty": 4}
    assert builder._renamed(100, ("id", "memo", "other", "qty")) == {}
