"""The source's own copy of the captured tables' definitions, kept in step with the binlog.

Loaded from the catalog at start, then changed by each DDL statement as the stream reaches it
(``ddl.py``), so a definition is right *at its point in the stream* even when the stream is behind
the server. Each change becomes a ``SchemaChange`` for ``<prefix>.schema-changes``.

The table maps are the final word on a table's columns: when a table map's column names differ
from the copy (a statement ``ddl.py`` did not understand, a table renamed into the captured set),
the copy is rebuilt from the table map, and the change is published then (``from_table_map``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from cdc.events import Column, SchemaChange, TableId
from sources.mysql import ddl
from sources.mysql.columns import ColumnSpec
from sources.mysql.ddl import ColumnDef
from sources.mysql.types import BINARY_TYPES, ColumnType

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TableSchema:
    id: TableId
    columns: list[ColumnDef]
    key: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def json_columns(self) -> set[str]:
        return {c.name for c in self.columns if c.type.json}

    def change(self, version: int, ts_ms: int, ddl_text: str | None,
               renamed: dict[str, str] | None = None) -> SchemaChange:
        """The shape as of ``version``; ``renamed``: new name -> name before the statement."""
        renamed = renamed or {}
        return SchemaChange(self.id, tuple(Column(c.name, c.type_name, c.name in self.key, c.nullable,
                                                  renamed_from=renamed.get(c.name))
                                           for c in self.columns), version, ts_ms, ddl_text)


def _dropped(table: TableId, version: int, ts_ms: int, ddl_text: str | None) -> SchemaChange:
    return SchemaChange(table, (), version, ts_ms, ddl_text)


class SchemaTracker:
    """Used from the source's thread only. ``captured(db, table)`` says which tables to keep."""

    def __init__(self, captured: Callable[[str, str], bool], tables: dict[tuple[str, str], TableSchema]) -> None:
        self.captured = captured
        self.tables = dict(tables)
        self.stale: dict[tuple[str, str], str | None] = {}  # shape unknown until the next table map; its DDL
        # Tables whose copy came from the catalog at a resume, which may be ahead of the binlog
        # there (DDL while the source was down): their shape is published at their first table
        # map or DDL, not at the resume point (``defer``).
        self.unconfirmed: set[tuple[str, str]] = set()
        # Per table, renames (new name -> name in the last shape rows were written under) since
        # its last table map: several DDL statements with no row between publish several shapes,
        # and a sink meets only the one its next rows name, so each carries the renames before it.
        self.carried: dict[tuple[str, str], dict[str, str]] = {}
        # Per table, renames the stream met whose old and new names the copy both lacks: the copy
        # came from the catalog at a resume, after the column was renamed again (new name -> the
        # name before the first of them). The next rename of the column, or a table map showing
        # it, then still names the column's name from before (see ``_alter``, ``from_table_map``).
        self.ahead: dict[tuple[str, str], dict[str, str]] = {}

    def defer(self) -> None:
        """The copy is the catalog's as of now and the stream resumes behind it: publish no
        shape from it until the binlog confirms or changes it (a table map, a DDL statement).
        A sink that saw the catalog's names at the resume point would take a column renamed
        while the source was down for a new one, and keep the values under the old name."""
        self.unconfirmed = set(self.tables)

    def get(self, db: str, table: str) -> TableSchema | None:
        return self.tables.get((db, table))

    def apply(self, statement: object, ddl_text: str, version: int,
              ts_ms: int) -> tuple[list[SchemaChange], list[TableId]]:
        """Apply one parsed DDL statement; returns (schema changes, tables truncated or dropped)."""
        changes: list[SchemaChange] = []
        if isinstance(statement, ddl.Truncate):
            if self.captured(statement.db, statement.table):
                return [], [TableId(statement.db, None, statement.table)]
            return [], []
        if isinstance(statement, ddl.CreateTable):
            name = (statement.db, statement.table)
            if self.captured(*name):
                schema = TableSchema(TableId(statement.db, None, statement.table), list(statement.columns),
                                     statement.key)
                self._put(name, schema)
                self.ahead.pop(name, None)
                changes.append(schema.change(version, ts_ms, ddl_text))
        elif isinstance(statement, ddl.CreateTableLike):
            name = (statement.db, statement.table)
            if self.captured(*name):
                source = self.tables.get(statement.source)
                if source is None:
                    self.stale[name] = ddl_text
                else:
                    schema = TableSchema(TableId(statement.db, None, statement.table), list(source.columns),
                                         source.key)
                    self._put(name, schema)
                    changes.append(schema.change(version, ts_ms, ddl_text))
        elif isinstance(statement, ddl.AlterTable):
            name = (statement.db, statement.table)
            altered = self.tables.get(name)
            renamed: dict[str, str] = {}
            if altered is not None:
                altered, renamed = self._alter(altered, statement.ops, self.ahead.setdefault(name, {}))
                renamed = self._carry(name, altered, renamed)
            elif self.captured(*name):
                self.stale[name] = ddl_text
            if statement.rename_to is not None:
                changes += self._rename(name, statement.rename_to, altered, version, ts_ms, ddl_text)
            elif altered is not None:
                self._put(name, altered)
                changes.append(altered.change(version, ts_ms, ddl_text, renamed))
        elif isinstance(statement, ddl.RenameTables):
            for old, new in statement.pairs:
                changes += self._rename(old, new, self.tables.get(old), version, ts_ms, ddl_text)
        elif isinstance(statement, ddl.DropTables):
            # Its rows are gone: a truncate says so on the table's topic (a re-created table starts empty).
            dropped = []
            for name in statement.tables:
                self.stale.pop(name, None)
                self.unconfirmed.discard(name)
                self.carried.pop(name, None)
                self.ahead.pop(name, None)
                if self.tables.pop(name, None) is not None:
                    changes.append(_dropped(TableId(name[0], None, name[1]), version, ts_ms, ddl_text))
                    dropped.append(TableId(name[0], None, name[1]))
            return changes, dropped
        elif isinstance(statement, ddl.Unparsed):
            name = (statement.db, statement.table)
            if self.captured(*name):
                self.stale[name] = ddl_text
        return changes, []

    def _carry(self, name: tuple[str, str], schema: TableSchema, renamed: dict[str, str]) -> dict[str, str]:
        """``renamed`` composed with the table's renames since its last table map."""
        carried = self.carried.get(name, {})
        names = set(schema.names)
        composed = {new: carried.get(old, old) for new, old in renamed.items()}
        consumed = set(renamed.values())
        composed.update({new: old for new, old in carried.items() if new in names and new not in consumed})
        composed = {new: old for new, old in composed.items() if old not in names and new != old}
        self.carried[name] = composed
        return composed

    def _put(self, name: tuple[str, str], schema: TableSchema) -> None:
        self.tables[name] = schema
        self.stale.pop(name, None)
        self.unconfirmed.discard(name)

    def _rename(self, old: tuple[str, str], new: tuple[str, str], schema: TableSchema | None, version: int,
                ts_ms: int, ddl_text: str) -> list[SchemaChange]:
        changes = []
        if self.tables.pop(old, None) is not None:
            changes.append(_dropped(TableId(old[0], None, old[1]), version, ts_ms, ddl_text))
        self.stale.pop(old, None)
        self.unconfirmed.discard(old)  # a table made again under the old name is a new one
        if self.captured(*new):
            if schema is None:
                self.stale[new] = ddl_text
            else:
                moved = TableSchema(TableId(new[0], None, new[1]), schema.columns, schema.key)
                self._put(new, moved)
                changes.append(moved.change(version, ts_ms, ddl_text))
        return changes

    @staticmethod
    def _alter(schema: TableSchema, ops: tuple, ahead: dict[str, str] | None = None) -> tuple[TableSchema,
                                                                                             dict[str, str]]:
        """The table after ``ops``, and its renamed columns (new name -> name before the statement):
        a sink renames those in place, keeping their values, instead of adding a new empty column.
        ``ahead``: the table's renames of names the copy lacks (``SchemaTracker.ahead``), updated."""
        ahead = {} if ahead is None else ahead
        columns = list(schema.columns)
        key = schema.key
        renamed: dict[str, str] = {}  # new name -> the name before the statement
        # Renames the copy already shows (a catalog read at a resume, after the statement ran
        # while the source was down): still renames for a sink that holds the old name.
        past: dict[str, str] = {}

        def rename(old: str, new: str) -> None:
            if old != new:
                renamed[new] = renamed.pop(old, old)

        def place(column: ColumnDef, after: str | None, index: int | None) -> None:
            if after == "":
                columns.insert(0, column)
            elif after is not None:
                names = [c.name for c in columns]
                columns.insert(names.index(after) + 1 if after in names else len(columns), column)
            elif index is not None:
                columns.insert(index, column)
            else:
                columns.append(column)

        for op in ops:
            names = [c.name for c in columns]
            if isinstance(op, ddl.AddColumn):
                if op.column.name in names:  # replayed over a catalog that already has it
                    columns.pop(names.index(op.column.name))
                place(op.column, op.after, None)
                if op.column.primary:
                    key = (op.column.name,)
            elif isinstance(op, ddl.DropColumn):
                if op.name in names:
                    renamed.pop(op.name, None)
                    columns.pop(names.index(op.name))
                    key = tuple(k for k in key if k != op.name)
            elif isinstance(op, ddl.ChangeColumn):
                if op.old not in names:
                    if op.old != op.column.name:
                        if op.column.name in names:
                            past[op.column.name] = ahead.pop(op.old, op.old)
                        else:
                            ahead[op.column.name] = ahead.pop(op.old, op.old)
                    continue
                index = names.index(op.old)
                columns.pop(index)
                place(op.column, op.after if op.move else None, None if op.move else index)
                rename(op.old, op.column.name)
                key = tuple(op.column.name if k == op.old else k for k in key)
                if op.column.primary:
                    key = (op.column.name,)
            elif isinstance(op, ddl.RenameColumn):
                if op.old in names:
                    index = names.index(op.old)
                    columns[index] = replace(columns[index], name=op.new)
                    rename(op.old, op.new)
                    key = tuple(op.new if k == op.old else k for k in key)
                elif op.new in names:
                    past[op.new] = ahead.pop(op.old, op.old)
                elif op.old != op.new:   # renamed again later: the copy has a newer name
                    ahead[op.new] = ahead.pop(op.old, op.old)
            elif isinstance(op, ddl.SetPrimaryKey):
                key = op.columns
                columns = [replace(c, nullable=False) if c.name in key else c for c in columns]
        before = set(schema.names)
        after = {c.name for c in columns}
        return TableSchema(schema.id, columns, key), {
            **{new: old for new, old in past.items() if new in after and old not in after},
            **{new: old for new, old in renamed.items() if old in before and new not in before}}

    def from_table_map(self, db: str, table: str, specs: list[ColumnSpec], key: tuple[str, ...],
                       load_json: Callable[[], set[str]], version: int, ts_ms: int) -> SchemaChange | None:
        """Reconcile the copy with a table map; a SchemaChange when the copy had to change."""
        name = (db, table)
        schema = self.tables.get(name)
        stale = name in self.stale
        carried = self.carried.pop(name, {})  # rows follow: a sink has met the shape that carried them
        spec_names = [s.name for s in specs]
        if schema is not None and not stale and schema.names == spec_names:
            if name in self.unconfirmed:  # the binlog agrees with the catalog read at the resume
                self.unconfirmed.discard(name)
                return schema.change(version, ts_ms, None, _renames(carried, spec_names))
            return None
        known = {c.name: c for c in schema.columns} if schema is not None else {}
        json_columns = load_json() if stale or schema is None or any(s.name not in known for s in specs) else set()
        columns = []
        for spec in specs:
            previous = known.get(spec.name)
            if previous is not None and not stale:
                columns.append(previous)
                continue
            is_json = spec.name in json_columns
            type_name = "json" if is_json else spec.type_name
            data_type = type_name.split("(")[0].split()[0]
            columns.append(ColumnDef(spec.name, ColumnType(data_type, type_name, spec.fsp, is_json,
                                                           data_type in BINARY_TYPES or spec.charset == "binary"),
                                     spec.nullable, spec.name in key))
        ddl_text = self.stale.pop(name, None)
        if schema is not None and name in self.unconfirmed:
            log.info("table %s.%s: at the resume point its columns were %s (the catalog has %s since): following "
                     "the binlog", db, table, [s.name for s in specs], schema.names)
        elif schema is not None and not stale:
            log.warning("table %s.%s: the binlog's columns %s differ from the tracked definition %s; following "
                        "the binlog", db, table, [s.name for s in specs], schema.names)
        # A column the copy lacks under a name the stream renamed it to (the copy is ahead): the
        # rows' shape names the column it was, for a sink that holds it.
        ahead = self.ahead.pop(name, {})
        renames = {**{new: old for new, old in ahead.items() if new not in known}, **carried}
        schema = TableSchema(TableId(db, None, table), columns, key)
        self.tables[name] = schema
        self.unconfirmed.discard(name)
        return schema.change(version, ts_ms, ddl_text, _renames(renames, spec_names))


def _renames(renames: dict[str, str], names: list[str]) -> dict[str, str]:
    """The renames (new name -> old) that ``names`` shows: the new name there, the old one gone."""
    return {new: old for new, old in renames.items() if new in names and old not in names}
