"""Unchanged TOAST values when an update moves a row to a new primary key.

pgoutput sends such an update with the old key tuple (kind 'K': NULL for every non-key column)
and ``UNCHANGED_TOAST`` for the large value it did not rewrite. The value must come from the
TOAST store under the old key, not from the key tuple's NULL; and when a replay after a crash
meets the move again (the old key's entry already forgotten), from the new key's entry.
"""

from __future__ import annotations

from cdc.events import Op, TableId
from sources.postgres import pgoutput as pg
from sources.postgres.catalog import TableMeta
from sources.postgres.changes import ChangeBuilder
from sources.postgres.toast import ToastStore
from sources.postgres.types.converters import converter_for

INT4, TEXT = 23, 25
BIG = "x" * 3000
RELATION = pg.Relation(None, 100, "public", "docs", "d", (
    pg.Column(True, "id", INT4, -1), pg.Column(False, "title", TEXT, -1), pg.Column(False, "body", TEXT, -1)))


def builder(tmp_path) -> ChangeBuilder:
    made = ChangeBuilder("db", lambda oid: TableMeta(oid, TableId("db", "public", "docs"), (), ("id",), "d"),
                         lambda oids: [converter_for(o, {}) for o in oids], ToastStore(tmp_path / "toast.db"),
                         lambda oid, mod: {INT4: "integer", TEXT: "text"}[oid])
    made.on_relation(RELATION, 1)
    made.begin(7, 0)
    return made


def move(b: ChangeBuilder, old_id: int, new_id: int, lsn: int):
    return b.update(pg.Update(None, 100, "K", (str(old_id), None, None),
                              (str(new_id), "moved", pg.UNCHANGED_TOAST)), lsn)


def test_a_key_change_takes_the_unchanged_value_from_the_old_key(tmp_path):
    b = builder(tmp_path)
    b.insert(pg.Insert(None, 100, ("1", "t", BIG)), 10)
    delete, create = move(b, 1, 2, 20)
    assert (delete.op, create.op) == (Op.DELETE, Op.CREATE)
    assert create.after == {"id": 2, "title": "moved", "body": BIG}
    assert "unchanged_toast" not in create.source_fields
    # ...and the value now lives under the new key: a later update of another column has it too.
    b.toast.flush()
    (update,) = b.update(pg.Update(None, 100, None, None, ("2", "again", pg.UNCHANGED_TOAST)), 30)
    assert update.after["body"] == BIG
    # A second move carries it on.
    _, create = move(b, 2, 3, 40)
    assert create.after["body"] == BIG


def test_a_replayed_key_change_finds_the_value_under_the_new_key(tmp_path):
    b = builder(tmp_path)
    b.insert(pg.Insert(None, 100, ("1", "t", BIG)), 10)
    move(b, 1, 2, 20)
    b.toast.flush()
    # A crash, then the stream resent from before the move: the old key is already forgotten.
    _, create = move(b, 1, 2, 20)
    assert create.after["body"] == BIG


def test_a_value_known_nowhere_is_named_not_nulled(tmp_path):
    b = builder(tmp_path)  # capture began after the row was written (snapshot: never)
    _, create = move(b, 5, 6, 20)
    assert "body" not in create.after and create.after["title"] == "moved"
    assert create.source_fields["unchanged_toast"] == ["body"]


def test_a_full_old_row_still_supplies_the_value(tmp_path):
    b = builder(tmp_path)
    (update,) = b.update(pg.Update(None, 100, "O", ("1", "t", BIG), ("1", "u", pg.UNCHANGED_TOAST)), 10)
    assert update.after["body"] == BIG and update.before["body"] == BIG
