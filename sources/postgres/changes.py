"""Decoded pgoutput messages -> change events: relations, complete rows, keys, transactions.

``ChangeBuilder`` keeps the relation cache (Relation messages, with the key and the column
converters of each captured table) and the state of the open transaction, and turns each data
message into events:

* Insert -> ``c``; Update -> ``u`` (or, when the key changed, ``d`` of the old key then ``c`` of
  the new one); Delete -> ``d``; Truncate -> ``t`` per captured table.
* ``version`` is the LSN of the change record (the message's data_start). Snapshot rows carry an
  LSN taken before the slot existed, which is lower than any change the slot can send (see
  ``snapshot.py``), so a sink never lets a snapshot row overwrite a streamed change.
* Unchanged TOAST values are filled from the old tuple (REPLICA IDENTITY FULL) or the TOAST store.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from cdc.events import ChangeEvent, Column, Op, SchemaChange, SnapshotMarker, TableId, TransactionInfo
from sources.postgres import pgoutput as pg
from sources.postgres.catalog import TableGone, TableMeta
from sources.postgres.fastpath import RowPath, compile_row_paths
from sources.postgres.toast import FIXED_WIDTH_TYPES, MIN_TOASTABLE_CHARS, ToastStore

log = logging.getLogger(__name__)

UNCHANGED = pg.UNCHANGED_TOAST
# Events are made with tuple.__new__ and module globals (an enum class attribute and the
# NamedTuple's keyword constructor run Python code, once per change).
_new = tuple.__new__
_CREATE, _UPDATE, _DELETE, _STREAMED = Op.CREATE, Op.UPDATE, Op.DELETE, SnapshotMarker.FALSE


@dataclass(slots=True)
class Relation:
    oid: int
    table: TableId
    qualified: str
    names: tuple[str, ...]
    converters: tuple[Callable[[str], Any], ...]
    key_index: tuple[int, ...]
    key_names: tuple[str, ...]
    type_names: tuple[str, ...]
    toastable: tuple[int, ...]     # indexes of the columns whose values may be stored out of line


def _refuse_gone(message: pg.Relation) -> TableMeta | None:
    raise TableGone(f"table {message.namespace}.{message.name} (oid {message.oid}) does not exist any more")


class ChangeBuilder:
    """Used from the source's thread only."""

    def __init__(self, database: str, lookup_table: Callable[[int], TableMeta | None],
                 converters_for: Callable[[list[int]], list[Callable[[str], Any]]], toast: ToastStore,
                 type_name: Callable[[int, int], str],
                 filled: Callable[[int, list[str]], dict[str, Any]] = lambda oid, names: {},
                 attnums: Callable[[int], dict[str, int]] = lambda oid: {}) -> None:
        self.database = database
        self.filled = filled                  # (oid, new column names) -> the values existing rows got
        self.attnums = attnums                # oid -> {column name: attnum}, from the catalog as it is now
        # Per relation OID, the attnums of the columns of its last published shape (at start: of
        # the last shape the stored position covers, kept in relations.py; else of the catalog
        # then): a column whose attnum comes back under another name was renamed (attnums are
        # never reused in a table), while the source ran or while it was down.
        self.column_ids: dict[int, dict[str, int]] = {}
        # (table, oid, column name -> attnum, lsn): told each shape's columns from the LSN it governs.
        self.on_columns: Callable[[TableId, int, dict[str, int], int], None] = lambda table, oid, ids, lsn: None
        self._fresh_columns: list[tuple[TableId, int, dict[str, int]]] = []   # waiting for their LSN
        self.type_name = type_name            # (type oid, modifier) -> "numeric(10,2)"
        self.lookup_table = lookup_table      # oid -> TableMeta, or None when not captured
        self.converters_for = converters_for  # type oids -> converters
        self.toast = toast
        self.relations: dict[int, Relation | None] = {}
        # The compiled paths of the captured relations' plain row messages (see fastpath.py), by
        # the message's first five bytes (type byte and relation OID).
        self.row_paths: dict[bytes, RowPath] = {}
        self.schema_changes: list[SchemaChange] = []
        # Shapes whose version is not known yet: the server sends a Relation message with no LSN
        # (walsender writes dataStart 0 for every message but the last of a change), so a shape
        # takes the LSN of the next message that has one, which is the first change it governs.
        self.unstamped: list[SchemaChange] = []
        # A table dropped and created again comes back under a new OID: its old rows are gone,
        # which the log never says (DROP TABLE writes no row changes). A truncate says it, before
        # the new table's first row (``stamp``). Known within one streaming session only.
        # Seeded from the relations.py memory, so a drop and re-create while the source was down
        # is noticed too; ``on_oid(table, oid, lsn)`` is told each table's OID from the LSN its
        # first shape governs.
        self.oids: dict[TableId, int] = {}
        self.gone_table: Callable[[pg.Relation], TableMeta | None] = _refuse_gone
        self.on_oid: Callable[[TableId, int, int], None] = lambda table, oid, lsn: None
        self._fresh: list[Relation] = []   # relations whose shape waits for its LSN
        self.recreated: list[Relation] = []
        # the open transaction
        self.xid: int | None = None
        self.commit_ms = 0
        self.order = 0
        self.table_order: dict[int, int] = {}  # relation oid -> events of it in this transaction

    # -- relations -----------------------------------------------------------------------------
    def on_relation(self, message: pg.Relation, lsn: int) -> None:
        try:
            meta = self.lookup_table(message.oid)
        except TableGone:  # dropped since these changes were written: the message has its shape
            meta = self.gone_table(message)
        oid_bytes = struct.pack("!I", message.oid)
        for code in (b"I", b"U", b"D"):
            self.row_paths.pop(code + oid_bytes, None)
        if meta is None:
            self.relations[message.oid] = None
            return
        names = tuple(c.name for c in message.columns)
        missing = [k for k in meta.key if k not in names]
        if missing:
            raise ValueError(f"table {meta.id}: key columns {missing} are not in the replicated columns")
        relation = Relation(
            message.oid, meta.id, f"{meta.id.schema}.{meta.id.table}", names,
            tuple(self.converters_for([c.type_oid for c in message.columns])),
            tuple(names.index(k) for k in meta.key), meta.key,
            tuple(self.type_name(c.type_oid, c.type_modifier) for c in message.columns),
            tuple(i for i, c in enumerate(message.columns) if c.type_oid not in FIXED_WIDTH_TYPES))
        previous = self.relations.get(message.oid)
        if previous is None or previous.names != relation.names or previous.type_names != relation.type_names:
            # Every column's, not only those new since the previous Relation message: after a
            # snapshot or a restart there is none, and a sink fills only columns its table lacks.
            filled = self.filled(message.oid, list(names))
            renamed = self._renamed(message.oid, names)
            change = SchemaChange(meta.id, tuple(Column(n, t, n in meta.key, default=filled.get(n),
                                                        renamed_from=renamed.get(n))
                                                 for n, t in zip(names, relation.type_names)),
                                  lsn, self.commit_ms or 0)
            (self.schema_changes if lsn else self.unstamped).append(change)
            if lsn:
                self.on_oid(meta.id, message.oid, lsn)
                self.on_columns(meta.id, message.oid, self.column_ids[message.oid], lsn)
            else:
                self._fresh.append(relation)
                self._fresh_columns.append((meta.id, message.oid, self.column_ids[message.oid]))
        if self.oids.get(meta.id, message.oid) != message.oid:
            log.info("table %s was dropped and created again (OID %d -> %d): its old rows are truncated",
                     meta.id, self.oids[meta.id], message.oid)
            self.recreated.append(relation)  # a new OID is a new shape, so ``stamp`` comes
        self.oids[meta.id] = message.oid
        self.relations[message.oid] = relation
        self.row_paths.update(compile_row_paths(relation.oid, relation.table, relation.qualified, relation.names,
                                                relation.converters, relation.key_index, relation.toastable))

    def _renamed(self, oid: int, names: tuple[str, ...]) -> dict[str, str]:
        """New name -> old name of the columns of ``oid`` renamed since its last shape. The
        catalog is read as it is now (like ``filled``); a name it no longer has (the stream is
        behind a rename or a drop) keeps the attnum its last shape had, so the rename is still
        recognised when the stream reaches it. A name neither knows (renamed again since, before
        the stream reached it) is placed by its position (``_placed``) where that is certain;
        else it counts as dropped and added, as does a column dropped and added."""
        now = self.attnums(oid)
        previous = self.column_ids.get(oid, {})
        ids = {name: now[name] if name in now else previous[name] for name in names
               if name in now or name in previous}
        ids.update(_placed(names, ids, set(previous.values())))
        before = {attnum: name for name, attnum in previous.items()}
        self.column_ids[oid] = ids
        return {name: before[attnum] for name, attnum in ids.items()
                if before.get(attnum, name) != name and before[attnum] not in names}

    def row_message(self, payload: bytes, lsn: int) -> list[ChangeEvent] | None:
        """The events of a plain Insert/Update/Delete outside a stream block, through its
        relation's compiled path; ``None`` when that path does not take it (then decode the
        message and use ``insert``/``update``/``delete``, which handle every case)."""
        path = self.row_paths.get(payload[:5])
        if path is None:
            return None
        try:
            return path(payload, lsn, self)
        except Exception:  # noqa: BLE001 - anything unusual is the generic path's to judge
            return None

    def stamp(self, lsn: int) -> list[ChangeEvent]:
        """Give the shapes waiting for a version ``lsn``: the LSN of the first message after
        their Relation messages that has one (a change of the relation, so its rows' versions are
        at least this). Called only while ``unstamped`` is not empty. Returns the truncates of
        tables created again, at that version: before their new rows, which are not under it."""
        self.schema_changes += [replace(change, version=lsn) for change in self.unstamped]
        self.unstamped = []
        for rel in self._fresh:
            self.on_oid(rel.table, rel.oid, lsn)
        self._fresh = []
        for table, oid, ids in self._fresh_columns:
            self.on_columns(table, oid, ids, lsn)
        self._fresh_columns = []
        for rel in self.recreated:
            self.toast.forget_table(rel.qualified)
        truncates = [ChangeEvent(Op.TRUNCATE, rel.table, None, None, None, lsn, self.commit_ms,
                                 source_fields=self._source(lsn), transaction=self._tx(rel))
                     for rel in self.recreated]
        self.recreated = []
        return truncates

    def take_schema_changes(self) -> tuple[SchemaChange, ...]:
        """The shapes whose version is known (an unstamped one waits for the next batch)."""
        changes, self.schema_changes = tuple(self.schema_changes), []
        return changes

    # -- transactions ----------------------------------------------------------------------------
    def begin(self, xid: int, commit_time_us: int) -> None:
        self.xid = xid
        self.xid_text = str(xid)
        self.commit_ms = pg.pg_time_to_unix_ms(commit_time_us)
        self.order = 0
        self.table_order = {}

    def end(self) -> None:
        self.xid = None

    def _tx(self, rel: Relation) -> TransactionInfo | None:
        if self.xid is None:
            return None
        self.order += 1
        n = self.table_order[rel.oid] = self.table_order.get(rel.oid, 0) + 1
        return tuple.__new__(TransactionInfo, (self.xid_text, self.order, n))

    # -- rows ------------------------------------------------------------------------------------
    def _row(self, rel: Relation, values: tuple, old: dict[str, Any] | None,
             key_jsons: tuple[bytes, ...], unavailable: list[str]) -> dict[str, Any]:
        """The row of ``values`` converted; each unchanged TOAST value is taken from ``old`` (a
        full old tuple, REPLICA IDENTITY FULL) or else from the TOAST store under the first of
        ``key_jsons`` that has it. A value found nowhere is left out and named in ``unavailable``."""
        if UNCHANGED not in values:  # the common case, in one comprehension
            return {name: None if value is None else convert(value)
                    for name, convert, value in zip(rel.names, rel.converters, values)}
        row: dict[str, Any] = {}
        for name, convert, value in zip(rel.names, rel.converters, self._unchanged_filled(rel, values, old, key_jsons)):
            if value is None:
                row[name] = None
            elif value is pg.UNCHANGED_TOAST:
                unavailable.append(name)
            else:
                row[name] = convert(value)
        return row

    def _unchanged_filled(self, rel: Relation, values: tuple, old: dict[str, Any] | None,
                          key_jsons: tuple[bytes, ...]) -> tuple:
        """``values`` with each unchanged TOAST value replaced by its text where ``old`` or the
        store has it (see ``_row``); the ones found nowhere stay ``UNCHANGED``."""
        if UNCHANGED not in values:
            return values
        filled = list(values)
        for i, value in enumerate(values):
            if value is not pg.UNCHANGED_TOAST:
                continue
            name = rel.names[i]
            text = old.get(name) if old is not None else None
            if text is None or text is pg.UNCHANGED_TOAST:
                text = None
                for key_json in key_jsons:
                    text = self.toast.recall(rel.qualified, key_json, name)
                    if text is not None:
                        break
            if text is not None:
                filled[i] = text
        return tuple(filled)

    def _remember_toastable(self, rel: Relation, key_json: bytes | None, values: tuple) -> None:
        for i in rel.toastable:
            value = values[i]
            if type(value) is str and len(value) >= MIN_TOASTABLE_CHARS:
                if key_json is None:
                    key_json = orjson.dumps(self._key(rel, values))
                self.toast.remember(rel.qualified, key_json, rel.names[i], value)

    def _key(self, rel: Relation, values: tuple) -> dict[str, Any]:
        return {name: rel.converters[i](values[i]) if values[i] is not None else None
                for name, i in zip(rel.key_names, rel.key_index)}

    def _source(self, lsn: int, unavailable: list[str] | None = None) -> dict[str, Any]:
        fields: dict[str, Any] = {"txId": self.xid, "lsn": lsn}
        if unavailable:
            fields["unchanged_toast"] = unavailable
        return fields

    def insert(self, message: pg.Insert, lsn: int) -> list[ChangeEvent]:
        rel = self.relations.get(message.relation_oid)
        if rel is None:
            return []
        new = message.new
        key = self._key(rel, new)
        self._remember_toastable(rel, None, new)
        unavailable: list[str] = []  # an insert sends every value: nothing is left unchanged
        after = self._row(rel, new, None, (), unavailable)
        return [_new(ChangeEvent, (_CREATE, rel.table, key, None, after, lsn, self.commit_ms, _STREAMED,
                                   self._source(lsn, unavailable), self._tx(rel)))]

    def update(self, message: pg.Update, lsn: int) -> list[ChangeEvent]:
        rel = self.relations.get(message.relation_oid)
        if rel is None:
            return []
        new = message.new
        key = self._key(rel, new)
        old_values = message.old
        # Only a full old tuple (REPLICA IDENTITY FULL, kind 'O') has the other columns' values; a
        # key tuple (kind 'K', sent when the key changed) has NULL for every non-key column, which
        # says nothing about an unchanged TOAST value.
        old_full: dict[str, Any] | None = None
        before = None
        old_key = key
        if old_values is not None:
            old_key = self._key(rel, old_values)
            if message.old_kind == "O":
                old_full = dict(zip(rel.names, old_values))
                before = self._row(rel, old_values, None, (), [])
            else:
                before = dict(old_key)
        key_json = orjson.dumps(key)
        unavailable: list[str] = []
        if old_key != key:
            old_json = orjson.dumps(old_key)
            # The row moved to a new key: its unchanged TOAST values are the old key's. When a
            # replay after a crash meets the move again, the old key's entries are already gone
            # and the new key's hold them (see toast.py on replays).
            filled = self._unchanged_filled(rel, new, old_full, (old_json, key_json))
            after = self._row(rel, filled, None, (), unavailable)
            self.toast.forget_key(rel.qualified, old_json, list(rel.names))
            self._remember_toastable(rel, key_json, filled)
            return [
                ChangeEvent(Op.DELETE, rel.table, old_key, before or dict(old_key), None, lsn, self.commit_ms,
                            source_fields=self._source(lsn), transaction=self._tx(rel)),
                ChangeEvent(Op.CREATE, rel.table, key, None, after, lsn, self.commit_ms,
                            source_fields=self._source(lsn, unavailable), transaction=self._tx(rel)),
            ]
        after = self._row(rel, new, old_full, (key_json,), unavailable)
        self._remember_toastable(rel, key_json, new)
        return [_new(ChangeEvent, (_UPDATE, rel.table, key, before, after, lsn, self.commit_ms, _STREAMED,
                                   self._source(lsn, unavailable), self._tx(rel)))]

    def delete(self, message: pg.Delete, lsn: int) -> list[ChangeEvent]:
        rel = self.relations.get(message.relation_oid)
        if rel is None:
            return []
        old = message.old
        key = self._key(rel, old)
        if message.old_kind == "O":
            before = self._row(rel, old, None, (), [])
        else:
            before = dict(key)
        self.toast.forget_key(rel.qualified, orjson.dumps(key), list(rel.names))
        return [_new(ChangeEvent, (_DELETE, rel.table, key, before, None, lsn, self.commit_ms, _STREAMED,
                                   self._source(lsn), self._tx(rel)))]

    def truncate(self, message: pg.Truncate, lsn: int) -> list[ChangeEvent]:
        events = []
        for oid in message.relation_oids:
            rel = self.relations.get(oid)
            if rel is None:
                continue
            self.toast.forget_table(rel.qualified)
            events.append(ChangeEvent(Op.TRUNCATE, rel.table, None, None, None, lsn, self.commit_ms,
                                      source_fields=self._source(lsn), transaction=self._tx(rel)))
        return events


def _placed(names: tuple[str, ...], ids: dict[str, int], previous: set[int]) -> dict[str, int]:
    """Attnums of the columns in ``names`` that ``ids`` lacks, where their place makes them
    certain. A Relation message lists the table's live columns in attnum order, and attnums only
    grow. Take a run of unknown names between two known columns with attnums ``low`` < ``high``,
    where ``high`` was a column of the last shape (``previous``, its attnums). Every column of
    the run is older than ``high``, so it was live at the last shape too: it is one of the last
    shape's attnums between ``low`` and ``high`` that no known name took. When there are as many
    of those as names in the run, they match in order (a column of them dropped since would
    leave fewer names than attnums). A run at the end has no such bound (a column added since
    sits there too) and stays unknown."""
    placed: dict[str, int] = {}
    taken = set(ids.values())
    low, run = 0, []
    for name in names:
        if name not in ids:
            run.append(name)
            continue
        high = ids[name]
        if run and low < high and high in previous:
            candidates = sorted(a for a in previous if low < a < high and a not in taken)
            if len(candidates) == len(run):
                placed.update(zip(run, candidates))
        low, run = high, []
    return placed
