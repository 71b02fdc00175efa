"""The documents' state: the rows of the joined tables in a SQLite file, and what reads them.

One file per generation of the sink, ``<state_dir>/<sink>.g<N>.db``, in WAL mode. Per table of
the plan (``t<i>``, in the plan's order): each row under the canonical bytes of its key (keys.py),
with its version, whether it is deleted (a delete is remembered, with its version, so that an
older write of the key arriving later is refused) and its body (the row's columns the state keeps,
as JSON); one column and index per foreign-key column list its edges navigate (``f<j>``, the
canonical bytes of the key the row references, null for no reference). Beside them:

* ``registers``: each document's version (``R``; the design's section 2), the number written
  with it. It grows with every change that reaches the document.
* ``outbox``: documents to write, with the version to write them at, and the record whose change
  reached them last (for a dead letter). A document leaves the outbox once written at that
  version; a later change puts it back.
* ``offsets``: per topic and partition, the next offset to apply. ``truncated``: per table, the
  version of its last truncate (older rows are dead, older writes refused). ``meta``: the plan's
  digest and the source.

Everything a batch changes commits in one transaction, so the rows, the registers, the outbox and
the offsets agree after a kill -9 at any point.

Reach (which documents a row belongs to) and assembly (a document from the rows) read the same
tables through the foreign-key indexes: a row is stored whether what it references exists or not,
and the other side's walk finds it later.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import orjson

from cdc.api import RebuildRequired
from sinks.documents.plan import NodePlan, Plan

DocumentId = tuple[str, bytes]  # (document name, the root row's key bytes)


class State:
    """The state file of one generation (one thread uses it)."""

    def __init__(self, path: Path, plan: Plan) -> None:
        self.path, self.plan = path, plan
        self.names = {table: f"t{i}" for i, table in enumerate(plan.tables)}
        # Per table: fk column list -> its column (f<j>) and the edge whose key bytes fill it.
        self.fks: dict[str, dict[tuple[str, ...], tuple[str, Any]]] = {}
        for table, tplan in plan.tables.items():
            edges = {n.edge.fk_columns: n.edge for n in plan.nodes if n.edge is not None and n.edge.fk_table == table}
            self.fks[table] = {cols: (f"f{j}", edges[cols]) for j, cols in enumerate(tplan.indexes)}
        # Rows by (table, key) as read or written in the open transaction, or during one flush's
        # assembly (nothing changes then); None outside both. Lookups shared by many documents
        # (a product in thousands of orders) are read once per batch, not once per document.
        self._rows: dict[tuple[str, bytes], tuple[int, bool, dict[str, Any] | None] | None] | None = None
        self._truncated: dict[str, int | None] = {}
        self._built: dict[tuple[int, bytes], dict[str, Any]] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # a process kill loses nothing committed
        self._create()

    def _create(self) -> None:
        db = self.db
        db.execute("BEGIN")
        for table, name in self.names.items():
            fks = "".join(f", {column} BLOB" for column, _ in self.fks[table].values())
            db.execute(f"CREATE TABLE IF NOT EXISTS {name} (pk BLOB PRIMARY KEY, ver INTEGER NOT NULL, "
                       f"dead INTEGER NOT NULL, body BLOB{fks}) WITHOUT ROWID")
            for column, _ in self.fks[table].values():
                db.execute(f"CREATE INDEX IF NOT EXISTS {name}_{column} ON {name} ({column})")
        db.execute("CREATE TABLE IF NOT EXISTS registers (doc TEXT, id BLOB, ver INTEGER NOT NULL, "
                   "PRIMARY KEY (doc, id)) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS outbox (doc TEXT, id BLOB, ver INTEGER NOT NULL, topic TEXT, "
                   "part INTEGER, off INTEGER, PRIMARY KEY (doc, id)) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS offsets (topic TEXT, part INTEGER, next INTEGER NOT NULL, "
                   "PRIMARY KEY (topic, part)) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS truncated (tbl TEXT PRIMARY KEY, ver INTEGER NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS seeded (doc TEXT, id BLOB, PRIMARY KEY (doc, id)) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        found = dict(db.execute("SELECT k, v FROM meta").fetchall())
        if not found:
            db.executemany("INSERT INTO meta VALUES (?, ?)", [("digest", self.plan.digest),
                                                             ("source", self.plan.source)])
        db.execute("COMMIT")
        if found and found.get("digest") != self.plan.digest:
            self.db.close()
            raise RebuildRequired(f"documents state {self.path.name} was made for another declaration or other "
                                 f"key types (plan {found.get('digest')}, now {self.plan.digest}): rebuild")

    def close(self) -> None:
        self.db.close()

    # --- transactions -----------------------------------------------------------------------------

    def begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self._rows, self._truncated = {}, {}

    def commit(self) -> None:
        self.db.execute("COMMIT")
        self._rows, self._truncated = None, {}

    def rollback(self) -> None:
        self._rows, self._truncated = None, {}
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Assemblies in between: rows and built lookups are read once (the state holds still)."""
        self._rows, self._built = {}, {}
        try:
            yield
        finally:
            self._rows, self._built = None, {}

    # --- rows -------------------------------------------------------------------------------------

    def row(self, table: str, pk: bytes) -> tuple[int, bool, dict[str, Any] | None] | None:
        """(version, dead, row) of a key the state has seen, else None."""
        cache = self._rows
        if cache is not None and (table, pk) in cache:
            return cache[(table, pk)]
        found = self.db.execute(f"SELECT ver, dead, body FROM {self.names[table]} WHERE pk = ?", (pk,)).fetchone()
        out = None if found is None else (found[0], bool(found[1]), None if found[2] is None else orjson.loads(found[2]))
        if cache is not None:
            cache[(table, pk)] = out
        return out

    def put(self, table: str, pk: bytes, version: int, row: Mapping[str, Any] | None) -> None:
        """The key's row at ``version`` (None: deleted, remembered at that version)."""
        self.db.execute(self._insert(table), self._values(table, pk, version, row))

    def _insert(self, table: str) -> str:
        columns = ["pk", "ver", "dead", "body", *(column for column, _ in self.fks[table].values())]
        return (f"INSERT OR REPLACE INTO {self.names[table]} ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' * len(columns))})")

    def _values(self, table: str, pk: bytes, version: int, row: Mapping[str, Any] | None) -> list[Any]:
        kept_columns = self.plan.tables[table].kept
        body = None
        kept: dict[str, Any] | None = None
        if row is not None:
            kept = dict(row) if kept_columns is None else {c: v for c, v in row.items() if c in kept_columns}
            body = orjson.dumps(kept)
        if self._rows is not None:
            self._rows[(table, pk)] = (version, row is None, kept)
        return [pk, version, int(row is None), body,
                *((None if row is None else edge.reference(row)) for _, edge in self.fks[table].values())]

    def prefetch(self, keys: Iterable[tuple[str, bytes]]) -> None:
        """Read the rows of ``keys`` into the transaction's cache, a few hundred per query."""
        cache = self._rows
        if cache is None:
            return
        by_table: dict[str, list[bytes]] = {}
        for table, pk in keys:
            if (table, pk) not in cache:
                by_table.setdefault(table, []).append(pk)
        for table, pks in by_table.items():
            name = self.names[table]
            for start in range(0, len(pks), 500):
                part = pks[start:start + 500]
                for pk in part:
                    cache[(table, pk)] = None
                for pk, ver, dead, body in self.db.execute(
                        f"SELECT pk, ver, dead, body FROM {name} WHERE pk IN ({', '.join('?' * len(part))})", part):
                    cache[(table, pk)] = (ver, bool(dead), None if body is None else orjson.loads(body))

    def put_many(self, rows: list[tuple[str, bytes, int, Mapping[str, Any] | None]]) -> None:
        """``put`` of each (table, key, version, row), a statement per table."""
        by_table: dict[str, list[list[Any]]] = {}
        for table, pk, version, row in rows:
            by_table.setdefault(table, []).append(self._values(table, pk, version, row))
        for table, values in by_table.items():
            self.db.executemany(self._insert(table), values)

    def newest(self, table: str) -> int:
        """The highest version the state has of ``table``'s rows (0: none)."""
        return self.db.execute(f"SELECT coalesce(max(ver), 0) FROM {self.names[table]}").fetchone()[0]

    def truncated(self, table: str) -> int | None:
        if table not in self._truncated:
            found = self.db.execute("SELECT ver FROM truncated WHERE tbl = ?", (table,)).fetchone()
            self._truncated[table] = None if found is None else found[0]
        return self._truncated[table]

    def truncate(self, table: str, version: int) -> list[dict[str, Any]]:
        """Every live row of ``table`` older than ``version`` dies; returns them (their documents
        change). Later writes older than ``version`` are refused (``truncated``)."""
        name = self.names[table]
        rows = [orjson.loads(body) for (body,) in
                self.db.execute(f"SELECT body FROM {name} WHERE dead = 0 AND ver < ?", (version,))]
        fks = "".join(f", {column} = NULL" for column, _ in self.fks[table].values())
        self.db.execute(f"UPDATE {name} SET dead = 1, body = NULL{fks} WHERE dead = 0 AND ver < ?", (version,))
        self._rows = {} if self._rows is not None else None  # rows of the table died: read them again
        self._truncated.pop(table, None)
        self.db.execute("INSERT INTO truncated VALUES (?, ?) ON CONFLICT (tbl) DO UPDATE SET ver = "
                        "max(ver, excluded.ver)", (table, version))
        return rows

    def _live(self, table: str, pk: bytes | None) -> dict[str, Any] | None:
        if pk is None:
            return None
        found = self.row(table, pk)
        return None if found is None or found[1] else found[2]

    def _referencing(self, table: str, fk_columns: tuple[str, ...], key: bytes) -> list[tuple[bytes, dict]]:
        column, _ = self.fks[table][fk_columns]
        return [(pk, orjson.loads(body)) for pk, body in self.db.execute(
            f"SELECT pk, body FROM {self.names[table]} WHERE {column} = ? AND dead = 0", (key,))]

    # --- reach ------------------------------------------------------------------------------------

    def documents_of(self, table: str, row: Mapping[str, Any]) -> set[DocumentId]:
        """The documents ``row`` (of ``table``) is part of, as the state stands."""
        out: set[DocumentId] = set()
        for number in self.plan.tables[table].nodes:
            out |= self._reach(self.plan.nodes[number], row)
        return out

    def _reach(self, node: NodePlan, row: Mapping[str, Any]) -> set[DocumentId]:
        tplan = self.plan.tables[node.table]
        if node.kind == "root":
            key = tplan.key_of(row)
            return set() if key is None else {(node.document, key)}
        assert node.parent is not None and node.edge is not None
        parent = self.plan.nodes[node.parent]
        if node.kind == "child":  # the parent row it references
            found = self._live(parent.table, node.edge.reference(row))
            return set() if found is None else self._reach(parent, found)
        key = tplan.key_of(row)  # a lookup: the parent rows referencing it
        out: set[DocumentId] = set()
        if key is not None:
            for _, referencing in self._referencing(parent.table, node.edge.fk_columns, key):
                out |= self._reach(parent, referencing)
        return out

    # --- registers and the outbox -----------------------------------------------------------------

    def bump(self, reached: Mapping[DocumentId, tuple[int, tuple[str, int, int]]]) -> None:
        """Each reached document's register to max(R + 1, the highest version reaching it), and
        the document into the outbox at that version: the registers read a few hundred per
        query, written in one statement per table."""
        db = self.db
        held: dict[DocumentId, int] = {}
        by_doc: dict[str, list[bytes]] = {}
        for doc, doc_id in reached:
            by_doc.setdefault(doc, []).append(doc_id)
        for doc, ids in by_doc.items():
            for start in range(0, len(ids), 500):
                part = ids[start:start + 500]
                held.update(((doc, doc_id), ver) for doc_id, ver in db.execute(
                    f"SELECT id, ver FROM registers WHERE doc = ? AND id IN ({', '.join('?' * len(part))})",
                    (doc, *part)))
        registers, outbox = [], []
        for (doc, doc_id), (version, (topic, part_, off)) in reached.items():
            register = max(held.get((doc, doc_id), 0) + 1, version)
            registers.append((doc, doc_id, register))
            outbox.append((doc, doc_id, register, topic, part_, off))
        db.executemany("INSERT OR REPLACE INTO registers VALUES (?, ?, ?)", registers)
        db.executemany("INSERT OR REPLACE INTO outbox VALUES (?, ?, ?, ?, ?, ?)", outbox)

    def outbox(self) -> list[tuple[str, bytes, int, tuple[str, int, int]]]:
        return [(doc, doc_id, ver, (topic, part, off)) for doc, doc_id, ver, topic, part, off in
                self.db.execute("SELECT doc, id, ver, topic, part, off FROM outbox ORDER BY doc, id")]

    def written(self, done: Iterable[tuple[str, bytes, int]]) -> None:
        """Documents written at their outbox version leave it (a later bump's entry stays)."""
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany("DELETE FROM outbox WHERE doc = ? AND id = ? AND ver = ?", list(done))
        self.db.execute("COMMIT")

    def copy_registers(self, other: Path) -> None:
        """Registers of an earlier generation's state (a rebuild's): the new generation's versions
        start above them, so no reader sees a document's version go back across the switch."""
        if not other.exists():
            return
        self.db.execute("ATTACH DATABASE ? AS old", (str(other),))
        try:
            self.db.execute("INSERT OR REPLACE INTO registers SELECT doc, id, ver FROM old.registers")
        finally:
            self.db.execute("DETACH DATABASE old")

    # --- seeding (a rebuild without the earlier state) ---------------------------------------------

    def seed_from(self) -> int | None:
        """The generation whose documents' versions this state's registers must start above
        (a rebuild that had no earlier state to copy them from); None: none."""
        found = self.db.execute("SELECT v FROM meta WHERE k = 'seed_from'").fetchone()
        return None if found is None or found[0] is None else int(found[0])

    def set_seed_from(self, generation: int | None) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('seed_from', ?)",
                        (None if generation is None else str(generation),))

    def unseeded(self, docs: Iterable[DocumentId]) -> list[DocumentId]:
        return [doc for doc in docs if self.db.execute("SELECT 1 FROM seeded WHERE doc = ? AND id = ?",
                                                       doc).fetchone() is None]

    def seed(self, docs: list[DocumentId], versions: list[int | None]) -> None:
        """Each document's register (and outbox version) above the version the seeding
        generation holds of it (None: it holds none), once per document."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for (doc, doc_id), held in zip(docs, versions, strict=True):
                if held is not None:
                    db.execute("UPDATE registers SET ver = ? WHERE doc = ? AND id = ? AND ver <= ?",
                               (held + 1, doc, doc_id, held))
                    db.execute("UPDATE outbox SET ver = ? WHERE doc = ? AND id = ? AND ver <= ?",
                               (held + 1, doc, doc_id, held))
                db.execute("INSERT OR IGNORE INTO seeded VALUES (?, ?)", (doc, doc_id))
            db.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise

    # --- offsets ----------------------------------------------------------------------------------

    def advance(self, nexts: Mapping[tuple[str, int], int]) -> None:
        self.db.executemany("INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, part) DO UPDATE SET "
                            "next = max(next, excluded.next)", [(t, p, n) for (t, p), n in nexts.items()])

    def offsets(self) -> dict[tuple[str, int], int]:
        return {(t, p): n for t, p, n in self.db.execute("SELECT topic, part, next FROM offsets")}

    def empty(self) -> bool:
        return not self.db.execute("SELECT 1 FROM offsets LIMIT 1").fetchall()

    # --- assembly ---------------------------------------------------------------------------------

    def assemble(self, doc: str, doc_id: bytes) -> dict[str, Any] | None:
        """The document as the state stands (None: its root row is deleted or was never seen)."""
        root = self.plan.nodes[self.plan.roots[doc]]
        row = self._live(root.table, doc_id)
        return None if row is None else self._build(root, row)

    def _lookup(self, node: NodePlan, pk: bytes | None) -> dict[str, Any] | None:
        """A lookup's object, built once per flush and shared by the documents holding it (they
        are serialized, never changed)."""
        if pk is None:
            return None
        done = self._built.get((node.number, pk))
        if done is None:
            found = self._live(node.table, pk)
            if found is None:
                return None
            done = self._build(node, found)
            if self._rows is not None:  # inside reading(): the state holds still
                self._built[(node.number, pk)] = done
        return done

    def _build(self, node: NodePlan, row: Mapping[str, Any]) -> dict[str, Any]:
        out = node.project(row, list(row))
        for number in node.below:
            below = self.plan.nodes[number]
            assert below.edge is not None and below.field is not None
            if below.kind == "lookup":
                out[below.field] = self._lookup(below, below.edge.reference(row))
            else:
                key = self.plan.tables[node.table].key_of(row)
                children = [] if key is None else self._referencing(below.table, below.edge.fk_columns, key)
                families = self.plan.tables[below.table].families
                out[below.field] = [self._build(below, child) for child in _ordered(below, children, families)]
        return out


def _ordered(node: NodePlan, rows: list[tuple[bytes, dict]], key_families: tuple[str, ...]) -> Iterator[dict]:
    """A child's rows by its ``order_by`` (nulls last either way), ties by key, each value
    compared as its type orders in the source: numbers (exact numerics arrive as text) as
    numbers, instants as instants, text by code point."""
    ordered = sorted(rows, key=lambda pair: tuple(sort_value(v, f) for v, f in
                                                  zip(orjson.loads(pair[0]), key_families)))
    for (column, descending), family in zip(reversed(node.order_by), reversed(node.order_families)):
        values = [pair for pair in ordered if pair[1].get(column) is not None]
        nulls = [pair for pair in ordered if pair[1].get(column) is None]
        values.sort(key=lambda pair: sort_value(pair[1][column], family), reverse=descending)
        ordered = values + nulls
    return (row for _, row in ordered)


def sort_value(value: Any, family: str) -> tuple:
    """A value as its column's type orders it; values of different kinds (a column whose type
    changed) order by kind instead of failing: numbers, then instants, then text, then the rest."""
    if isinstance(value, bool):
        return (3, int(value))
    if isinstance(value, (int, float)):
        return (0, Decimal(value) if isinstance(value, int) else value)
    if isinstance(value, str):
        if family.startswith("numeric"):
            try:
                return (0, Decimal(value))
            except InvalidOperation:
                return (2, value)
        if family in ("timestamptz", "timestamp"):
            try:
                instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
                return (1, instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC))
            except ValueError:
                return (2, value)
        return (2, value)
    return (4, orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def state_figures(path: Path) -> tuple[int | None, int | None]:
    """(rows kept, bytes on disk) of a state file, read without opening it for writing; (None,
    None) when there is none."""
    if not path.exists():
        return None, None
    size = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                  "AND name GLOB 't[0-9]*'")]
        return sum(db.execute(f"SELECT count(*) FROM {name}").fetchone()[0] for name in tables), size
    finally:
        db.close()


def documents_path(state_dir: Path, sink: str, generation: int) -> Path:
    return state_dir / f"{sink}.g{generation}.db"
