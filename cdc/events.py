"""The change event: what a source emits and what every topic carries.

An event is immutable and cheap (a slotted frozen dataclass). Its values are already JSON-ready in
the contract's form (sources do the type conversion: exact numerics as strings, timestamps as
ISO-8601, binary as base64 ...), so serializing is a single ``orjson.dumps``.

Sources hand the runtime ``Batch`` objects: a list of events plus, optionally, the position that
becomes safe to store once every event of this batch and of all earlier batches is delivered. A
source sets ``checkpoint`` only at a transaction boundary, so a resume never splits a transaction.
A batch with no events and a checkpoint is a heartbeat: it lets the stored position advance while
nothing captured changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, NamedTuple

from cdc.positions import Position

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class Op(StrEnum):
    """Debezium's operation codes."""

    READ = "r"      # a row read by a snapshot
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    TRUNCATE = "t"


class SnapshotMarker(StrEnum):
    """``source.snapshot``: part of a snapshot (``true``), its last row (``last``), streamed
    (``false``), or read by an incremental snapshot while streaming (``incremental``, Debezium's
    value for the same: snapshot/incremental.py)."""

    TRUE = "true"
    LAST = "last"
    FALSE = "false"
    INCREMENTAL = "incremental"


@dataclass(frozen=True, slots=True)
class TableId:
    """A captured table. PostgreSQL: database, schema, table. MySQL: database, no schema, table."""

    db: str
    schema: str | None
    table: str

    @property
    def namespace(self) -> str:
        """The middle part of the topic name: the schema (PostgreSQL) or the database (MySQL)."""
        return self.schema if self.schema is not None else self.db

    def topic(self, prefix: str) -> str:
        return f"{prefix}.{self.namespace}.{self.table}"

    def __str__(self) -> str:
        return f"{self.namespace}.{self.table}"


class TransactionInfo(NamedTuple):
    id: str
    total_order: int              # position of the event within its transaction, from 1
    data_collection_order: int    # position among the transaction's events for the same table, from 1


class ChangeEvent(NamedTuple):
    """One change of one row (or, for ``t``, of one table).

    ``key`` holds the primary-key columns in key order (for a keyless table, the configured key
    columns); it is ``None`` only for a truncate. ``after`` is always the complete row for r/c/u.
    A source may hand ``after`` over already serialized, as an ``orjson.Fragment`` of the row's
    JSON object (the PostgreSQL snapshot does: the server prints it); the encoder writes it as is.
    ``version`` strictly increases for successive changes of the same key within one source.
    ``source_fields`` carries the connector-specific part of the envelope's ``source`` block
    (PostgreSQL ``txId``/``lsn``; MySQL ``file``/``pos``/``row``/``gtid``).

    Immutable and cheap: a tuple. Sources make one per change, so construction is on the hot
    path; a frozen dataclass measured about 1 µs per event here, a tuple about 0.15 µs. The
    invariants are checked by ``check()``, which sources' tests call; the constructor does not.
    """

    op: Op
    table: TableId
    key: Mapping[str, Any] | None
    before: Mapping[str, Any] | None
    after: Mapping[str, Any] | None
    version: int
    ts_ms: int
    snapshot: SnapshotMarker = SnapshotMarker.FALSE
    source_fields: Mapping[str, Any] | None = None
    transaction: TransactionInfo | None = None

    def check(self) -> ChangeEvent:
        """Raise ValueError if the event breaks the contract; return it otherwise."""
        if not INT64_MIN <= self.version <= INT64_MAX:
            raise ValueError(f"version {self.version} of {self.table} does not fit in int64")
        if self.op is Op.TRUNCATE:
            if self.key is not None:
                raise ValueError("a truncate event has no key")
        elif not self.key:
            raise ValueError(f"{self.op.name} event on {self.table} has no key")
        if self.op in (Op.READ, Op.CREATE, Op.UPDATE) and self.after is None:
            raise ValueError(f"{self.op.name} event on {self.table} has no 'after' row")
        if self.op is Op.DELETE and self.after is not None:
            raise ValueError(f"delete event on {self.table} carries an 'after' row")
        return self


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str                 # the database's type name, e.g. "numeric(10,2)", "int4", "varchar"
    key: bool = False         # part of the event key
    nullable: bool = True
    # For a column new in this shape: the value (contract JSON) that rows existing before it got
    # without being written to the log (PostgreSQL's ADD COLUMN ... DEFAULT <constant>); None when
    # there is none or the source cannot tell.
    default: Any = None
    # The column's name in the table's previous shape, when the source knows the column was renamed
    # (MySQL: the DDL said so; PostgreSQL: the same attnum under another name). Its values stay.
    renamed_from: str | None = None


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """A table's columns as of ``version``: published to ``<prefix>.schema-changes`` (compacted,
    keyed by table), before the first event that has the new shape."""

    table: TableId
    columns: tuple[Column, ...]
    version: int
    ts_ms: int
    ddl: str | None = None    # the statement, where the log has it (MySQL)


@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    """A snapshot's end: the tables it read (empty ones included) and its rows' version."""

    tables: tuple[TableId, ...]
    version: int


@dataclass(frozen=True, slots=True)
class Batch:
    """Events in log order, and the position that is safe to store once they are all delivered.

    ``schema_changes`` are published before ``events``: a change of a table's shape comes before
    the first event that carries it. ``snapshot_end`` is set on the batch whose checkpoint ends a
    snapshot (its events, if any, are the snapshot's last): the runner then deletes what an
    earlier attempt left in the topics that this snapshot did not read (cdc/runtime/stale_rows.py).
    ``caught_up`` says the source had read everything its server had sent when it made the batch
    (nothing follows at once): the runner has the log send it now rather than hold it back to
    batch it with later records. A source that cannot tell leaves it False.
    """

    events: list[ChangeEvent]
    checkpoint: Position | None = None
    schema_changes: tuple[SchemaChange, ...] = ()
    snapshot_end: SnapshotEnd | None = None
    caught_up: bool = False

    def with_schema_changes(self, changes: tuple[SchemaChange, ...]) -> Batch:
        """This batch with ``changes`` published before its own schema changes."""
        return replace(self, schema_changes=changes + self.schema_changes) if changes else self


class RowBlock:
    """Snapshot rows of one table with a single integer key, kept as the text they were read as.

    ``block`` holds whole lines ``<key>\\t<row JSON>[\\t...]\\n``; line *i* stands for the event
    ``ChangeEvent(READ, table, {key_name: int(key)}, None, Fragment(row JSON), version, ts_ms,
    SnapshotMarker.TRUE, source_fields)``. Whoever makes one guarantees that the key text is how
    ``orjson`` writes that int (no sign but ``-``, no leading zero) and the row JSON is the row's
    JSON as it goes into the envelope (no escapes to undo), so the ``json`` format makes each
    record straight from its line (``EnvelopeEncoder.emit``; ``cdc/_encode.c`` ``emit_rows``)
    with the very bytes the events give, without the events: a snapshot row then costs no tuple,
    dict, int or Fragment in the publishing process.

    Everything else sees a sequence of events: ``events()`` (and iteration, ``len``, indexing)
    makes them once with ``materialize(block)``, the source's own maker; the first and the last
    event alone are made without the rest (the runtime looks at the first, the coordinator takes
    the last off: ``split_last``).
    """

    __slots__ = ("table", "key_name", "block", "count", "version", "ts_ms", "source_fields", "_materialize",
                 "_events")

    def __init__(self, table: TableId, key_name: str, block: bytes, count: int, version: int, ts_ms: int,
                 source_fields: Mapping[str, Any] | None, materialize) -> None:
        self.table, self.key_name, self.block, self.count = table, key_name, block, count
        self.version, self.ts_ms, self.source_fields = version, ts_ms, source_fields
        self._materialize = materialize
        self._events: list[ChangeEvent] | None = None

    def events(self) -> list[ChangeEvent]:
        if self._events is None:
            self._events = self._materialize(self.block)
        return self._events

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self.events())

    def __getitem__(self, index):
        if self._events is None and isinstance(index, int) and index in (0, -1, self.count - 1):
            return self._materialize(self._line(0 if index == 0 else self.count - 1))[0]
        return self.events()[index]

    def _line(self, index: int) -> bytes:
        block = self.block
        if index == 0:
            return block[:block.index(b"\n") + 1]
        return block[block.rindex(b"\n", 0, len(block) - 1) + 1:] if self.count > 1 else block

    def split_last(self) -> tuple[RowBlock | None, ChangeEvent]:
        """(this block without its last line, or None if that was its only one; the last event)."""
        last = self[-1]
        if self.count == 1:
            return None, last
        cut = self.block.rindex(b"\n", 0, len(self.block) - 1) + 1
        return RowBlock(self.table, self.key_name, self.block[:cut], self.count - 1, self.version, self.ts_ms,
                        self.source_fields, self._materialize), last
