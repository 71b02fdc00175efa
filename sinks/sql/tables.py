"""The target tables of one sink: naming, creation, schema evolution, and the plan of each write.

``TableCatalog.prepare`` runs before a write's transaction and does every DDL the write needs, each
in its own short transaction: MySQL commits implicitly at DDL, so DDL inside the data transaction
would break the one-transaction-per-write rule there, and all of it is idempotent (IF NOT EXISTS,
columns added only when missing), so a failed write that is retried repeats nothing harmful.

Names: the view readers use is ``table_name`` filled in from the source table; the physical
table of generation N is ``<view>__g<N>``. Creating a table in the generation readers currently
see also (re)creates its view; tables in an open (rebuilding) generation get views at the switch.

What the sink knows about a table lives in ``cdc_sink_tables`` (``bookkeeping.TableEntry``) and
is cached here; other sink processes may change it (a rebuild and a live sink write the same
generation after a switch), so every DDL step re-reads the stored entry and merges, and the first
use of a table in this process checks the physical table against it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence
from functools import lru_cache
from typing import Any, cast

import orjson
import sqlalchemy as sa

import sinks.sql.copy_rows as copy_rows
from cdc.api import PermanentError, RebuildRequired, SchemaChangeError, earlier_names
from sinks.sql.bookkeeping import Bookkeeping, SourceColumn, TableEntry, physical_name
from sinks.sql.config import SqlSinkConfig
from sinks.sql.evolve import KEY, diff, infer_columns, record_columns, renamed_columns, widens, with_key
from sinks.sql.plan import DELETED, VERSION, ColumnPlan, TablePlan, column_plans
from sinks.sql.reduce import TopicChanges
from sinks.sql.target import Target
from sinks.sql.types import grows, parse_type, signature, target_type
from sinks.sql.values import converter

log = logging.getLogger(__name__)


class TableCatalog:
    def __init__(self, target: Target, books: Bookkeeping, config: SqlSinkConfig,
                 schema_for: Callable[..., dict | None], current: Callable[[], int],
                 shape_of: Callable[[Any], dict | None] | None = None,
                 shapes_between: Callable[[str, int, int], list[dict]] | None = None,
                 unknown_names: Callable[..., set] | None = None) -> None:
        self.target = target
        self.books = books
        self.config = config
        self.schema_for = schema_for
        # The shape an event names, with the runtime's bound on waiting for it (cdc.api.Sink.shape_of).
        self.shape_of = shape_of or (lambda event: schema_for(
            event.topic, event.source.get("schema_version") if event.source else None))
        self.current = current            # the generation readers see, as last known
        self.shapes_between = shapes_between or (lambda topic, after, before: [])
        self.unknown_names = unknown_names  # in C where built (cdc.api.NativeCodecs)
        self._entries: dict[tuple[int, str], TableEntry] = {}
        self._plans: dict[tuple[int, str], list[ColumnPlan]] = {}
        self._skipped: dict[tuple[int, str], set[str]] = {}
        self._records: dict[tuple[int, str], bytes] = {}
        self._names: dict[str, str] = {}
        self.signature = lru_cache(maxsize=4096)(self._signature)

    def forget(self, generation: int | None = None) -> None:
        """Drop cached knowledge (of one generation, or all)."""
        for cache in (self._entries, self._plans, self._skipped, self._records):
            for key in [k for k in cache if generation is None or k[0] == generation]:
                del cache[key]

    # --- names ----------------------------------------------------------------------------------

    def table_name(self, changes: TopicChanges) -> str:
        topic = changes.topic
        name = self._names.get(topic)
        if name is not None:
            return name
        record = self.schema_for(topic)
        source = record or changes.first.source
        parts = topic.split(".")
        namespace = parts[-2] if len(parts) >= 3 else ""
        table = (source or {}).get("table") or parts[-1]
        db = (source or {}).get("db") or namespace
        schema = (source or {}).get("schema") or namespace or db
        name = self.config.table_name.format(schema=schema, db=db, table=table)
        if source:  # a tombstone alone cannot name {db} for PostgreSQL: do not remember its guess
            self._names[topic] = name
        return name

    def _check_name(self, physical: str) -> None:
        limit = self.target.max_identifier()
        if len(physical) > limit:
            raise PermanentError(f"table name {physical!r} is longer than {self.target.kind}'s limit of "
                                 f"{limit} characters; set a shorter table_name template")

    # --- the plan of a write ----------------------------------------------------------------------

    def prepare(self, changes: TopicChanges, generation: int) -> TablePlan:
        """The plan for ``changes`` in ``generation``, after creating or altering its table.

        ``changes`` has one shape (the runtime cuts batches where a topic's shape changes): the
        schema record its rows name. A new table is made in the topic's newest shape (a bootstrap
        or a rebuild writes older rows into it); an existing one follows a newer shape before its
        first row is written (``_follow``), and never goes back to an older one."""
        name = self.table_name(changes)
        physical = physical_name(name, generation)
        self._check_name(physical)
        cache_key = (generation, name)
        entry = self._entries.get(cache_key)
        if entry is None:
            entry = self._load(generation, name)
        record = self._shape_of(changes)
        if entry is None or (record is None and copy_rows.names_outside(
                [event.after for event in changes.upserts.values()], entry.columns, self.unknown_names)):
            changes.materialize()  # values decide the columns (or may): rows as dicts
        rows = _rows(changes)
        key_names = _key_names(changes)
        if entry is None:
            if not rows and record is None:
                return TablePlan(changes, physical, None)
            shape = self._newest(changes.topic, record)
            columns = with_key(record_columns(shape), key_names) if shape else []
            if shape is not None:
                columns = self._with_earlier_names(changes.topic, shape, columns)
            if shape is None:  # the source publishes no shapes: only then types come from values
                columns += infer_columns([r for r in rows if isinstance(r, dict)], set(), key_names)  # decoded above
            if not any(c.key for c in columns):
                if not rows:  # e.g. only a truncate so far: the table can wait for a keyed event
                    return TablePlan(changes, physical, None)
                raise PermanentError(f"{physical}: no key columns (the events of {changes.topic} have no key)")
            columns = self._former_names(name, generation, columns)
            entry = self.sync(TableEntry(name, generation, changes.topic, {c.name: c for c in columns},
                                         shape.get("version") if shape else None))
            if shape is not None:
                self._records[cache_key] = _fingerprint(shape)
            rows = _under_current_names(changes, entry)
            if record is not None and self.config.schema_policy != "rebuild":
                entry = self._older_columns(entry, rows, record, changes.topic)
        elif record is not None:
            if not _older(record, entry):
                fingerprint = _fingerprint(record)
                if self._records.get(cache_key) != fingerprint:
                    entry = self._follow(entry, record, key_names,
                                         self._skipped_shapes(changes.topic, entry, record))
                    self._records[cache_key] = fingerprint
            rows = _under_current_names(changes, entry)
            if self.config.schema_policy != "rebuild":  # rebuild: tables hold the newest shape only
                entry = self._older_columns(entry, rows, record, changes.topic)
        else:
            # Rows still as JSON bytes carry only the table's columns (else they were decoded above).
            unknown = infer_columns([r for r in rows if isinstance(r, dict)], set(entry.columns), ())
            if unknown:
                log.info("sql sink %s: %s: new column(s) %s inferred from values (the source publishes no "
                         "shape)", self.config.name, physical, ", ".join(f"{c.name} {c.type}" for c in unknown))
                entry = self.sync(TableEntry(name, generation, entry.topic, {**entry.columns,
                                             **{c.name: c for c in unknown}}, entry.schema_version))
        plans = self._plans.get(cache_key)
        if plans is None:
            plans = self._plans[cache_key] = column_plans(entry, self.target.dialect, self.target.kind,
                                                          self.target.mariadb, self._skipped.get(cache_key, set()))
        return TablePlan(changes, physical, entry, plans)

    def _with_earlier_names(self, topic: str, shape: dict[str, Any], columns: list[SourceColumn]
                            ) -> list[SourceColumn]:
        """``columns`` of a table made in ``shape``, each with every name it had in the shapes
        before (``renamed_from`` names only the one just before): rows of those shapes still in the
        topic (a bootstrap, a rebuild) land under the current name after two renames as after one."""
        version = shape.get("version")
        if not isinstance(version, int):
            return columns
        history = earlier_names((*self.shapes_between(topic, -1 << 63, version), shape))
        return [dataclasses.replace(c, was=tuple(dict.fromkeys((*c.was, *history[c.name]))))
                if history.get(c.name) else c for c in columns]  # ``was`` is newest first

    def _skipped_shapes(self, topic: str, entry: TableEntry, record: dict[str, Any]) -> list[dict[str, Any]]:
        """The shapes between the one ``entry`` follows and ``record``, whose renames count too: a
        column's ``renamed_from`` names its name in the shape just before, so a table that went
        from shape 1 to shape 3 directly (the rows of shape 2 all in another partition, read
        later) would take shape 2's renames for a dropped column and a new one, empty. Only their
        renames: a shape in between may list columns of a later one (a MySQL source resuming
        past DDL publishes the catalog's columns at the first), which the table must not take."""
        after, before = entry.schema_version, record.get("version")
        if not isinstance(after, int) or not isinstance(before, int):
            return []
        return self.shapes_between(topic, after, before)

    def _shape_of(self, changes: TopicChanges) -> dict[str, Any] | None:
        """The schema record the rows of ``changes`` name (the newest of the topic when they name none)."""
        return self.shape_of(changes.first)

    def _newest(self, topic: str, record: dict[str, Any] | None) -> dict[str, Any] | None:
        """The shape a new table is made in: the newest the topic has, or the rows' own when it
        is newer (a dropped table's shape, with no columns, does not count)."""
        shapes = [r for r in (record, self.schema_for(topic, None)) if r is not None and r.get("columns")]
        if not shapes:
            return None
        return max(shapes, key=lambda r: r["version"] if isinstance(r.get("version"), int) else -1)

    def _older_columns(self, entry: TableEntry, rows: list[dict[str, Any] | bytes], record: dict[str, Any],
                       topic: str) -> TableEntry:
        """Columns of rows written under an older shape that the (newer) table lacks, typed by
        that shape: a column dropped before the table was made in the newest shape. Kept (with
        the values those rows had) under every policy but ``rebuild``, whose tables hold the
        newest shape only, so a bootstrap ends like a live sink that saw the drop."""
        missing = copy_rows.names_outside(rows, entry.columns, self.unknown_names)  # in C: runs on every write
        if not missing:
            return entry
        typed = [SourceColumn(c.name, c.type, False) for c in record_columns(record) if c.name in missing]
        unnamed = missing - {c.name for c in typed}
        if unnamed:
            raise PermanentError(f"{entry.physical} (topic {topic}): rows carry column(s) {sorted(unnamed)} that "
                                 f"their schema record (version {record.get('version')}) does not name")
        log.info("sql sink %s: %s: adding column(s) %s of an older shape", self.config.name, entry.physical,
                 ", ".join(f"{c.name} {c.type}" for c in typed))
        return self.sync(TableEntry(entry.name, entry.generation, entry.topic,
                                    {**entry.columns, **{c.name: c for c in typed}}, entry.schema_version))

    def _former_names(self, name: str, generation: int, columns: list[SourceColumn]) -> list[SourceColumn]:
        """``columns`` of a table new in ``generation``, each with the earlier names that the
        current generation's table knows for it (a rebuild replays rows written before a rename
        that the live sink followed)."""
        current = self.current()
        if generation == current:
            return columns
        with self.target.engine.connect() as conn:
            live = self.books.entry(conn, current, name)
        if live is None:
            return columns
        return [SourceColumn(c.name, c.type, c.key, c.inferred, tuple(dict.fromkeys((*c.was, *live.columns[c.name].was))))
                if c.name in live.columns and live.columns[c.name].was else c for c in columns]

    def _load(self, generation: int, name: str) -> TableEntry | None:
        with self.target.engine.begin() as conn:
            entry = self.books.entry(conn, generation, name)
        if entry is None:
            return None
        return self.sync(entry)  # first use here: check the physical table against the entry

    def _follow(self, entry: TableEntry, record: dict[str, Any], key_names: list[str],
                between: Sequence[dict[str, Any]] = ()) -> TableEntry:
        """Evolve ``entry`` to the source columns of ``record`` (see evolve.py), or raise;
        ``between``: the shapes it skips (their renames count, see ``renamed_columns``)."""
        cache_key = (entry.generation, entry.name)
        policy = self.config.schema_policy
        renames, passed = renamed_columns(entry, record, between)
        if renames:
            described = "; ".join(f"column {old} renamed to {new}" for new, old in renames.items())
            if policy == "fail":
                raise SchemaChangeError(
                    f"sql sink {self.config.name}: table {entry.physical} (topic {entry.topic}): source schema change "
                    f"{described} (schema_policy is 'fail'); nothing of the new shape was written. Fix: set "
                    f"schema_policy: evolve (or rebuild), which renames the column in place and keeps its values "
                    f"(a cdc rebuild alone cannot: the topic holds the older rows under the old name)")
            log.info("sql sink %s: %s: %s (in place, values kept)", self.config.name, entry.physical, described)
            entry = self.sync(entry, renames=renames, passed=passed)
        columns = with_key(record_columns(record), key_names or entry.key)
        added, changed = diff(entry, columns, self.signature)
        dropped = sorted(set(entry.columns) - {c.name for c in columns})
        if dropped and policy == "rebuild":  # the new generation is made without them
            raise RebuildRequired(f"sql sink {self.config.name}: table {entry.physical} (topic {entry.topic}): "
                                  f"source schema change column(s) {', '.join(dropped)} dropped; schema_policy "
                                  f"is 'rebuild': rebuilding from the topic")
        # A string that only grew (a longer varchar, an enum with labels added) is no decision to
        # make: it changes in place under every policy, like a new column (types.grows).
        retyped = [c for c in changed if c.column != KEY and not entry.columns[c.column].key
                   and grows(c.old, c.new, self.target.kind)]
        changed = [c for c in changed if c not in retyped]
        if changed and policy == "evolve":
            widened = [c for c in changed if c.column != KEY and not entry.columns[c.column].key
                       and widens(c.old, c.new, self.target.kind, mariadb=self.target.mariadb)]
            retyped += widened
            changed = [c for c in changed if c not in widened]
        if changed:
            described = "; ".join(str(change) for change in changed)
            where = f"sql sink {self.config.name}: table {entry.physical} (topic {entry.topic})"
            if policy in ("fail", "evolve"):
                why = ("the target cannot change it in place without losing values" if policy == "evolve"
                       else "schema_policy is 'fail'")
                raise SchemaChangeError(
                    f"{where}: source schema change {described} ({why}); nothing of the new shape was written. "
                    f"Fix: cdc rebuild CONFIG {self.config.name} (a new generation in the new shape, readers "
                    f"keep the old one until it is complete), or set schema_policy: rebuild")
            if policy == "rebuild":
                raise RebuildRequired(f"{where}: source schema change {described}; schema_policy is 'rebuild': "
                                      f"rebuilding from the topic")
            skipped = {change.column for change in changed if change.column != KEY}
            if skipped != self._skipped.get(cache_key):
                log.warning("%s: %s; schema_policy 'ignore': writing NULL to %s from now on", where, described,
                            ", ".join(sorted(skipped)) or "no column")
            self._skipped[cache_key] = skipped
        else:
            self._skipped.pop(cache_key, None)
        self._plans.pop(cache_key, None)
        merged = dict(entry.columns)
        for column in columns:  # inferred columns whose type the record confirms are now declared
            old = merged.get(column.name)
            if old is not None and old.inferred and self.signature(old.type, old.key) == self.signature(column.type, old.key):
                merged[column.name] = SourceColumn(column.name, column.type, old.key)
        for change in retyped:
            merged[change.column] = SourceColumn(change.column, change.new, False, was=merged[change.column].was)
        merged.update({c.name: c for c in added})
        evolved = TableEntry(entry.name, entry.generation, entry.topic, merged, record.get("version"))
        if added:
            log.info("sql sink %s: %s: adding column(s) %s", self.config.name, entry.physical,
                     ", ".join(f"{c.name} {c.type}" for c in added))
        if retyped:
            log.info("sql sink %s: %s: changing in place (no value lost) %s", self.config.name, entry.physical,
                     "; ".join(str(c) for c in retyped))
        if merged != entry.columns or evolved.schema_version != entry.schema_version:
            # Rows the source had when it added a column got a value there without a logged
            # change (ADD COLUMN ... DEFAULT): the shape says which; rows written before the shape
            # (older versions) get it here too.
            defaults = {c["name"]: c["default"] for c in record.get("columns") or ()
                        if c.get("default") is not None and c["name"] in {a.name for a in added}}
            return self.sync(evolved, retype=[c.column for c in retyped], fill=defaults,
                             below=record.get("version"))
        return entry

    # --- DDL --------------------------------------------------------------------------------------

    def sync(self, entry: TableEntry, retype: Collection[str] = (), fill: dict[str, Any] | None = None,
             below: int | None = None, renames: dict[str, str] | None = None,
             passed: dict[str, tuple[str, ...]] | None = None) -> TableEntry:
        """Make the physical table hold every column of ``entry`` (creating the table if needed),
        renaming the columns of ``renames`` (new name -> old name; ``passed``: the names a renamed
        column had in between, see evolve.renamed_columns) and changing the types of the
        columns named in ``retype``, store the entry merged with what is stored, and refresh the
        view of the current generation."""
        target, physical = self.target, entry.physical
        if renames:
            entry = TableEntry(entry.name, entry.generation, entry.topic,
                               _renamed(entry.columns, renames, passed), entry.schema_version)

        def work(conn: sa.engine.Connection) -> TableEntry:
            if entry.generation == self.current():
                target.lock_view(conn, entry.name)  # before the table, as readers do
            merged = entry
            stored = self.books.entry(conn, entry.generation, entry.name)
            if stored is not None:
                merged = TableEntry(entry.name, entry.generation, entry.topic,
                                    {**_renamed(stored.columns, renames or {}, passed), **entry.columns},
                                    entry.schema_version)
            wanted = [(c.name, self._type(c)) for c in merged.columns.values()]
            extra = [(VERSION, sa.BigInteger())] + ([(DELETED, sa.Boolean())] if self.config.soft_delete else [])
            existing = target.columns_of(conn, physical)
            current = merged.generation == self.current()
            for new, old in (renames or {}).items():  # idempotent: a retry finds it done
                if existing is not None and old in existing and new not in existing:
                    target.rename_column(conn, physical, old, new, merged.name if current else None)
                    existing = [new if name == old else name for name in existing]
            if existing is None:
                target.create_table(conn, physical, wanted, merged.key, [
                    sa.Column(VERSION, sa.BigInteger, nullable=False, quote=True),
                    *([sa.Column(DELETED, sa.Boolean, nullable=False, server_default=sa.false(), quote=True)]
                      if self.config.soft_delete else [])])
            else:
                for column_name, type_ in wanted + extra:
                    if column_name not in existing:
                        target.add_column(conn, physical, column_name, type_)
                for column_name in retype:
                    target.change_column_type(conn, physical, column_name, self._type(merged.columns[column_name]),
                                              merged.name if current else None)
                if fill and isinstance(below, int):
                    for column_name, value in fill.items():
                        family = parse_type(merged.columns[column_name].type)[0]
                        conn.execute(sa.text(f"UPDATE {target.qualified(physical)} SET {target.quote(column_name)} = :v "
                                             f"WHERE {target.quote(VERSION)} < :below"),
                                     {"v": converter(family, target.kind)(value), "below": below})
            self.books.save_entry(conn, merged)
            if merged.generation == self.current():
                target.point_view(conn, merged.name, physical)
            return merged

        entry = target.run_ddl(work)
        cache_key = (entry.generation, entry.name)
        self._entries[cache_key] = entry
        self._plans.pop(cache_key, None)
        return entry

    def _type(self, column: SourceColumn) -> sa.types.TypeEngine:
        return target_type(column.type, self.target.kind, key=column.key, mariadb=self.target.mariadb)

    def _signature(self, type_name: str, key: bool) -> str:
        return signature(target_type(type_name, self.target.kind, key=key, mariadb=self.target.mariadb),
                         self.target.dialect)


def _renamed(columns: dict[str, SourceColumn], renames: dict[str, str],
             passed: dict[str, tuple[str, ...]] | None = None) -> dict[str, SourceColumn]:
    """``columns`` with each old name of ``renames`` (new -> old) replaced by the new one, in
    place, remembering the old name (and the names ``passed`` on the way, newer than it) for rows
    written before the rename."""
    old_to_new = {old: new for new, old in renames.items()}
    out = {}
    for name, column in columns.items():
        new = old_to_new.get(name)
        if new is None:
            out[name] = column
        else:
            out[new] = SourceColumn(new, column.type, column.key, column.inferred,
                                    (*(passed or {}).get(new, ()), name, *column.was))
    return out


def _under_current_names(changes: TopicChanges, entry: TableEntry) -> list[dict[str, Any] | bytes]:
    """The rows of ``changes`` (``_rows``), with values that rows of a shape before a rename carry under a
    column's earlier name moved to its current one (in ``changes`` too, for the write). Only
    names the table does not use now: a new column may take an old name again."""
    former = {old: column.name for column in entry.columns.values() for old in column.was
              if old not in entry.columns}
    if former:
        changes.materialize()
        for key, event in changes.upserts.items():
            after = event.after
            assert isinstance(after, dict), "materialized: an upsert's row, decoded"
            if not former.keys() & after.keys():
                continue
            moved = {}
            for column, value in after.items():
                current = former.get(column)
                if current is None:
                    moved[column] = value
                elif current not in after:
                    moved.setdefault(current, value)
            changes.upserts[key] = event._replace(after=moved)
    return _rows(changes)


def _rows(changes: TopicChanges) -> list[dict[str, Any] | bytes]:
    """The upserts' rows: dicts, or the JSON bytes the runtime left undecoded (``raw_rows``). An
    upsert (r c u) always has its row: only deletes and tombstones have none."""
    return cast("list[dict[str, Any] | bytes]", [event.after for event in changes.upserts.values()])


def _key_names(changes: TopicChanges) -> list[str]:
    for events in (changes.upserts, changes.deletes):
        for event in events.values():
            return list(event.key)
    for key in changes.tombstones.values():
        return list(key)
    return []


def _older(record: dict[str, Any], entry: TableEntry) -> bool:
    """True when ``record`` is a shape older than the one ``entry`` follows."""
    version, followed = record.get("version"), entry.schema_version
    return isinstance(version, int) and isinstance(followed, int) and version < followed


def _fingerprint(record: dict[str, Any]) -> bytes:
    return orjson.dumps([record.get("version"), record.get("columns")])
