"""The documents' state: the rows of the joined tables in a SQLite file, and what reads them.

One file per generation of the sink, ``<state_dir>/<sink>.g<N>.db``, in WAL mode. Per table of
the plan (``t<i>``, in the plan's order): each row under the canonical bytes of its key (keys.py),
with its version, whether it is deleted (a delete is remembered, with its version, so that an
older write of the key arriving later is refused) and its body (the row's columns the state keeps,
as JSON); one column and index per foreign-key column list its edges navigate (``f<j>``, the
canonical bytes of the key the row references, null for no reference). Beside them:

* ``registers``: each document's version (``R``; the design's section 2), the number written
  with it. It grows with every change that reaches the document.
* ``outbox``: documents to write, with the version to write them at, the record whose change
  reached them last (for a dead letter) and their share (``share_of``: which member of a group
  writes them; 0 for a sink that runs as one process). A document leaves the outbox once written
  at that version; a later change puts it back. A member of a group keeps the documents of
  shares it does not own there until it owns them (sinks/documents/shared.py).
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
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import orjson
from orjson import Fragment, dumps

from cdc.api import RebuildRequired
from sinks.documents.plan import NodePlan, Plan

DocumentId = tuple[str, bytes]  # (document name, the root row's key bytes)
CACHE_KIB, MMAP_BYTES = 256 * 1024, 4 << 30  # the state's page cache, and how much of it is mapped
# A row's ``at``: the partition and offset of the record it came from, in one integer.
AT_SHIFT, AT_MASK = 40, (1 << 40) - 1


def at_of(partition: int, offset: int) -> int:
    return (partition << AT_SHIFT) | offset


def share_of(doc: str, doc_id: bytes, shares: int) -> int:
    """The share a document belongs to among ``shares``: the same in every member (its name and
    its root key's bytes, hashed)."""
    return zlib.crc32(doc_id, zlib.crc32(doc.encode())) % shares if shares > 1 else 0


class State:
    """The state file of one generation (one thread uses it)."""

    def __init__(self, path: Path, plan: Plan, shares: int = 1) -> None:
        self.path, self.plan, self.shares = path, plan, shares
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
        self._built: dict[tuple[int, bytes], bytes] = {}  # lookups' JSON inside reading(), by (node, key)
        # Inside reading(): a child table's live rows per (table, fk column, referenced key) (warm),
        # and the foreign-key columns of the rows read (the keys they reference, as stored).
        self._kids: dict[tuple[str, str, bytes], list[tuple[bytes, dict]]] | None = None
        self._refs: dict[tuple[str, bytes], tuple[bytes | None, ...]] = {}
        # Per node: (field, column, the column's earlier names) of every column it shows.
        self._shown: dict[int, tuple[tuple[str, str, tuple[str, ...]], ...]] = {}
        self._sql: dict[str, str | None] = {}  # per document: the query assembling it (sql_of)
        self._encoders: dict[str, Callable[[bytes, int, Mapping[str, Any] | None, int], tuple[Any, ...]]] = {}
        self._slot = {table: {cols: j for j, cols in enumerate(fks)} for table, fks in self.fks.items()}
        self._fcols = {table: "".join(f", {column}" for column, _ in fks.values()) for table, fks in self.fks.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # a process kill loses nothing committed
        # A state of millions of rows is read at random (children by foreign key): pages stay in
        # memory rather than SQLite's default 2 MiB, and the file is read through mmap.
        self.db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        self.db.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
        # A batch of changes rewrites pages all over the file; checkpointing every 64 MiB of WAL
        # rather than SQLite's 4 MiB writes each page back once for many batches.
        self.db.execute("PRAGMA wal_autocheckpoint=16384")
        self.db.create_function("cdc_share", 2, lambda doc, doc_id: share_of(doc, doc_id, shares), deterministic=True)
        self._create()

    def _create(self) -> None:
        db = self.db
        db.execute("BEGIN")
        for table, name in self.names.items():
            fks = "".join(f", {column} BLOB" for column, _ in self.fks[table].values())
            db.execute(f"CREATE TABLE IF NOT EXISTS {name} (pk BLOB PRIMARY KEY, ver INTEGER NOT NULL, "
                       f"dead INTEGER NOT NULL, body BLOB{fks}, at INTEGER, plain INTEGER) WITHOUT ROWID")
            had = {c for _, c, *_ in db.execute(f"PRAGMA table_info({name})")}
            for column in ("at", "plain"):  # a state made before rows kept them
                if column not in had:
                    db.execute(f"ALTER TABLE {name} ADD COLUMN {column} INTEGER")
        db.execute("CREATE TABLE IF NOT EXISTS registers (doc TEXT, id BLOB, ver INTEGER NOT NULL, "
                   "PRIMARY KEY (doc, id)) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS outbox (doc TEXT, id BLOB, ver INTEGER NOT NULL, topic TEXT, "
                   "part INTEGER, off INTEGER, share INTEGER, PRIMARY KEY (doc, id)) WITHOUT ROWID")
        if "share" not in {c for _, c, *_ in db.execute("PRAGMA table_info(outbox)")}:  # made before shares
            db.execute("ALTER TABLE outbox ADD COLUMN share INTEGER")
        if self.shares > 1:  # a member of a group reads its shares' entries (outbox)
            db.execute("CREATE INDEX IF NOT EXISTS outbox_share ON outbox (share, doc, id)")
        else:
            db.execute("DROP INDEX IF EXISTS outbox_share")
        db.execute("CREATE TABLE IF NOT EXISTS offsets (topic TEXT, part INTEGER, next INTEGER NOT NULL, "
                   "PRIMARY KEY (topic, part)) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS truncated (tbl TEXT PRIMARY KEY, ver INTEGER NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS seeded (doc TEXT, id BLOB, PRIMARY KEY (doc, id)) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        found = dict(db.execute("SELECT k, v FROM meta").fetchall())
        if found.get("building") != "1":  # a building state makes them when its load ends
            self._indexes()
        if not found:
            db.executemany("INSERT INTO meta VALUES (?, ?)", [("digest", self.plan.digest),
                                                             ("source", self.plan.source)])
        self._plain_columns(found)
        if found.get("shares") != str(self.shares):  # made with another count (or before shares)
            db.execute("UPDATE outbox SET share = cdc_share(doc, id)")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('shares', ?)", (str(self.shares),))
        db.execute("COMMIT")
        if found and found.get("digest") != self.plan.digest:
            self.db.close()
            raise RebuildRequired(f"documents state {self.path.name} was made for another declaration or other "
                                 f"key types (plan {found.get('digest')}, now {self.plan.digest}): rebuild")

    def _plain_columns(self, meta: Mapping[str, str]) -> None:
        """A row is stored ``plain`` when its body's columns are the plan's ``columns`` of its
        table, in order (the SQL assembly then uses the body as the object of a node showing
        every column). Where the plan's columns changed since (``Keeper.follow_shapes``), no
        stored row is plain any more."""
        for table, name in self.names.items():
            columns = orjson.dumps(self.plan.tables[table].columns).decode()
            if meta.get(f"plain {table}") != columns:
                self.db.execute(f"UPDATE {name} SET plain = 0 WHERE plain = 1")
                self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"plain {table}", columns))

    def _indexes(self, drop: bool = False) -> None:
        """The foreign-key indexes (reach and assembly navigate them), made or dropped."""
        for table, name in self.names.items():
            for column, _ in self.fks[table].values():
                self.db.execute(f"DROP INDEX IF EXISTS {name}_{column}" if drop else
                                f"CREATE INDEX IF NOT EXISTS {name}_{column} ON {name} ({column})")

    def close(self) -> None:
        self.db.close()

    def shown_again(self) -> None:
        """The plan changed what nodes show (``Keeper.follow_shapes``): the fields are chosen again."""
        self._shown, self._sql, self._encoders = {}, {}, {}
        in_transaction = self.db.in_transaction
        if not in_transaction:
            self.db.execute("BEGIN IMMEDIATE")
        self._plain_columns(dict(self.db.execute("SELECT k, v FROM meta").fetchall()))
        if not in_transaction:
            self.db.execute("COMMIT")

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
        self._rows, self._built, self._kids, self._refs = {}, {}, {}, {}
        try:
            yield
        finally:
            self._rows, self._built, self._kids, self._refs = None, {}, None, {}

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

    def put(self, table: str, pk: bytes, version: int, row: Mapping[str, Any] | None, at: int = -1) -> None:
        """The key's row at ``version`` (None: deleted, remembered at that version); ``at``: the
        record it came from (``origin``)."""
        self.db.execute(self._insert(table), self._values(table, pk, version, row, at))

    def _insert(self, table: str, newer_only: bool = False) -> str:
        """The statement storing a row; ``newer_only``: only over an older version of its key."""
        columns = ["pk", "ver", "dead", "body", *(column for column, _ in self.fks[table].values()), "at", "plain"]
        name = self.names[table]
        if not newer_only:
            return f"INSERT OR REPLACE INTO {name} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        return (f"INSERT INTO {name} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
                f"ON CONFLICT (pk) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in columns[1:])} "
                f"WHERE excluded.ver > {name}.ver")

    def _values(self, table: str, pk: bytes, version: int, row: Mapping[str, Any] | None, at: int) -> tuple[Any, ...]:
        values = self.encoder(table)(pk, version, row, at)
        if self._rows is not None:
            kept_columns = self.plan.tables[table].kept
            kept = None if row is None else dict(row) if kept_columns is None else _kept(row, kept_columns)
            self._rows[(table, pk)] = (version, row is None, kept)
        return values

    def encoder(self, table: str) -> Callable[[bytes, int, Mapping[str, Any] | None, int], tuple[Any, ...]]:
        """What the statement of ``_insert`` stores for a row of ``table`` at ``version`` (None:
        deleted) under key ``pk``, from record ``at``: one function per table, made once."""
        made = self._encoders.get(table)
        if made is None:
            kept, columns = self.plan.tables[table].kept, self.plan.tables[table].columns
            refs = tuple(edge.reference for _, edge in self.fks[table].values())
            nulls = (None,) * len(refs)

            def made(pk: bytes, version: int, row: Mapping[str, Any] | None, at: int) -> tuple[Any, ...]:
                if row is None:
                    return (pk, version, 1, None, *nulls, at, 0)
                stored = (row if type(row) is dict else dict(row)) if kept is None else _kept(row, kept)
                return (pk, version, 0, dumps(stored), *[ref(row) for ref in refs], at, int(tuple(stored) == columns))
            self._encoders[table] = made
        return made

    def prefetch(self, keys: Iterable[tuple[str, bytes]]) -> None:
        """Read the rows of ``keys`` into the transaction's cache, a few hundred per query."""
        cache = self._rows
        if cache is None:
            return
        by_table: dict[str, list[bytes]] = {}
        for table, pk in keys:
            if (table, pk) not in cache:
                by_table.setdefault(table, []).append(pk)
        reading = self._kids is not None
        for table, pks in by_table.items():
            name = self.names[table]
            for start in range(0, len(pks), 500):
                part = pks[start:start + 500]
                for pk in part:
                    cache[(table, pk)] = None
                for pk, ver, dead, body, *refs in self.db.execute(
                        f"SELECT pk, ver, dead, body{self._fcols[table] if reading else ''} FROM {name} "
                        f"WHERE pk IN ({', '.join('?' * len(part))})", part):
                    cache[(table, pk)] = (ver, bool(dead), None if body is None else orjson.loads(body))
                    if reading:
                        self._refs[(table, pk)] = tuple(refs)

    def put_many(self, rows: Sequence[tuple[str, bytes, int, Mapping[str, Any] | None, int]]) -> None:
        """``put`` of each (table, key, version, row, at), a statement per table."""
        by_table: dict[str, list[tuple[Any, ...]]] = {}
        for table, pk, version, row, at in rows:
            by_table.setdefault(table, []).append(self._values(table, pk, version, row, at))
        for table, values in by_table.items():
            self.db.executemany(self._insert(table), values)

    def load(self, table: str, values: list[tuple[Any, ...]]) -> int:
        """A building state's rows of ``table`` (``encoder``'s values), each only over an older
        version of its key (the statement decides: nothing is read first). Returns how many were
        stored (not those an older version lost)."""
        before = self.db.total_changes
        self.db.executemany(self._insert(table, newer_only=True), values)
        if self._rows:  # the statement decided: the transaction's cache does not know how
            for pk, *_ in values:
                self._rows.pop((table, pk), None)
        return self.db.total_changes - before

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
        if self._kids is not None and (table, column, key) in self._kids:  # warm()
            return self._kids[(table, column, key)]
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
        registers, outbox, shares = [], [], self.shares
        for (doc, doc_id), (version, (topic, part_, off)) in reached.items():
            register = max(held.get((doc, doc_id), 0) + 1, version)
            registers.append((doc, doc_id, register))
            outbox.append((doc, doc_id, register, topic, part_, off, share_of(doc, doc_id, shares)))
        db.executemany("INSERT OR REPLACE INTO registers VALUES (?, ?, ?)", registers)
        db.executemany("INSERT OR REPLACE INTO outbox VALUES (?, ?, ?, ?, ?, ?, ?)", outbox)

    def outbox(self, limit: int = -1, after: DocumentId | None = None, shares: frozenset[int] | None = None,
               ) -> list[tuple[str, bytes, int, tuple[str, int, int]]]:
        """The outbox in document order (within each share, for ``shares``): ``limit`` entries
        (-1: all) after ``after``; only those of ``shares`` unless it is None (every entry)."""
        args: tuple[Any, ...] = ()
        if shares is None:
            where, args = ("WHERE (doc, id) > (?, ?) ", after) if after is not None else ("", ())
            order = "doc, id"
        else:
            if not shares:
                return []
            where = f"WHERE share IN ({', '.join(str(int(share)) for share in sorted(shares))}) "
            if after is not None:
                where += "AND (share, doc, id) > (?, ?, ?) "
                args = (share_of(after[0], after[1], self.shares), *after)
            order = "share, doc, id"
        return [(doc, doc_id, ver, (topic, part, off)) for doc, doc_id, ver, topic, part, off in
                self.db.execute(f"SELECT doc, id, ver, topic, part, off FROM outbox {where}ORDER BY {order} "
                                f"LIMIT ?", (*args, limit))]

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
        wanted = list(docs)
        by_doc: dict[str, list[bytes]] = {}
        for doc, doc_id in wanted:
            by_doc.setdefault(doc, []).append(doc_id)
        seeded: set[DocumentId] = set()
        for doc, ids in by_doc.items():
            for start in range(0, len(ids), 500):
                part = ids[start:start + 500]
                seeded.update((doc, doc_id) for (doc_id,) in self.db.execute(
                    f"SELECT id FROM seeded WHERE doc = ? AND id IN ({', '.join('?' * len(part))})", (doc, *part)))
        return [doc for doc in wanted if doc not in seeded]

    def unseed(self) -> None:
        """Every document is seeded again before its next write (a member gained shares: the
        versions their previous owner wrote are read from the target first)."""
        self.db.execute("DELETE FROM seeded")

    def seed(self, docs: list[DocumentId], versions: list[int | None]) -> None:
        """Each document's register (and outbox version) above the version the seeding
        generation holds of it (None: it holds none), once per document."""
        db = self.db
        raised = [(held + 1, doc, doc_id, held) for (doc, doc_id), held in zip(docs, versions, strict=True)
                  if held is not None]
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("UPDATE registers SET ver = ? WHERE doc = ? AND id = ? AND ver <= ?", raised)
            db.executemany("UPDATE outbox SET ver = ? WHERE doc = ? AND id = ? AND ver <= ?", raised)
            db.executemany("INSERT OR IGNORE INTO seeded VALUES (?, ?)", docs)
            db.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise

    # --- the shapes documents are written in --------------------------------------------------------

    def planned(self) -> dict[str, int]:
        """Per topic, the shape version the documents' plan was made from (``set_planned``)."""
        found = self.db.execute("SELECT v FROM meta WHERE k = 'planned'").fetchone()
        return {} if found is None or found[0] is None else dict(orjson.loads(found[0]))

    def set_planned(self, versions: Mapping[str, int]) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('planned', ?)", (orjson.dumps(dict(versions)).decode(),))

    # --- building (a new generation's load) --------------------------------------------------------

    def building(self) -> bool:
        """A new generation's state while it is loaded from the topics (``set_building``)."""
        found = self.db.execute("SELECT v FROM meta WHERE k = 'building'").fetchone()
        return found is not None and found[0] == "1"

    def set_building(self) -> None:
        """Rows are loaded without reach, registers or outbox until ``finish_building``: nobody
        reads the generation yet, and every document is assembled once at the end. The
        foreign-key indexes are made then too (one sort each, not one insert per row)."""
        self.db.execute("BEGIN IMMEDIATE")
        self._indexes(drop=True)
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('building', '1')")
        self.db.execute("COMMIT")

    def finish_building(self) -> int:
        """Every document whose root row lives goes into the outbox, its register above both
        the one it had (copied from the generation readers see) and every version in the state
        (so above every version that reached it); in one transaction. Returns how many."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            self._indexes()
            top = max((self.newest(table) for table in self.names), default=0)
            count = 0
            for doc, number in self.plan.roots.items():
                tplan = self.plan.tables[self.plan.nodes[number].table]
                name = self.names[tplan.table]
                db.execute(f"INSERT OR REPLACE INTO registers SELECT ?, t.pk, max(coalesce(r.ver, 0) + 1, ?) "
                           f"FROM {name} t LEFT JOIN registers r ON r.doc = ? AND r.id = t.pk WHERE t.dead = 0",
                           (doc, top, doc))
                count += db.execute(
                    f"INSERT OR REPLACE INTO outbox SELECT ?, t.pk, r.ver, ?, coalesce(t.at >> {AT_SHIFT}, 0), "
                    f"coalesce(t.at & {AT_MASK}, -1), cdc_share(?, t.pk) FROM {name} t JOIN registers r "
                    f"ON r.doc = ? AND r.id = t.pk WHERE t.dead = 0", (doc, tplan.topic, doc, doc)).rowcount
            db.execute("DELETE FROM meta WHERE k = 'building'")
            db.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise
        return count

    # --- offsets ----------------------------------------------------------------------------------

    def advance(self, nexts: Mapping[tuple[str, int], int]) -> None:
        self.db.executemany("INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, part) DO UPDATE SET "
                            "next = max(next, excluded.next)", [(t, p, n) for (t, p), n in nexts.items()])

    def offsets(self) -> dict[tuple[str, int], int]:
        return {(t, p): n for t, p, n in self.db.execute("SELECT topic, part, next FROM offsets")}

    def empty(self) -> bool:
        return not self.db.execute("SELECT 1 FROM offsets LIMIT 1").fetchall()

    # --- assembly ---------------------------------------------------------------------------------

    def assemble(self, doc: str, doc_id: bytes) -> bytes | None:
        """The document as the state stands, as JSON (None: its root row is deleted or was never
        seen). Each node's object is serialized once: a lookup shared by many documents is spliced
        into each of them as the same bytes (``orjson.Fragment``), never parsed again."""
        root = self.plan.nodes[self.plan.roots[doc]]
        row = self._live(root.table, doc_id)
        return None if row is None else self._build(root, row, doc_id)

    def warm(self, docs: Iterable[DocumentId]) -> None:
        """Inside ``reading()``: the rows the assembly of ``docs`` reads, a query per node for a
        few hundred keys at a time, rather than one per row and per child list."""
        by_doc: dict[str, list[bytes]] = {}
        for doc, doc_id in docs:
            by_doc.setdefault(doc, []).append(doc_id)
        for doc, ids in by_doc.items():
            root = self.plan.nodes[self.plan.roots[doc]]
            self.prefetch((root.table, pk) for pk in ids)
            self._warm_below(root, [(pk, row) for pk in ids if (row := self._live(root.table, pk)) is not None])

    def _warm_below(self, node: NodePlan, rows: Sequence[tuple[bytes, Mapping[str, Any]]]) -> None:
        for number in node.below:
            below = self.plan.nodes[number]
            assert below.edge is not None
            found: Sequence[tuple[bytes, Mapping[str, Any]]]
            if below.kind == "lookup":
                refs = list({ref for pk, row in rows if (ref := self._reference(node.table, pk, below.edge, row))
                             is not None and (below.number, ref) not in self._built})
                self.prefetch((below.table, ref) for ref in refs)
                found = [(ref, row) for ref in refs if (row := self._live(below.table, ref)) is not None]
            else:  # a child's rows reference the key of the row they hang from: its key bytes
                found = self._children(below.table, below.edge.fk_columns, [pk for pk, _ in rows])
            if found and below.below:
                self._warm_below(below, found)

    def _children(self, table: str, fk_columns: tuple[str, ...], keys: list[bytes]) -> list[tuple[bytes, dict]]:
        """The live rows of ``table`` referencing any of ``keys``, kept for ``_referencing``."""
        kids = self._kids
        assert kids is not None
        column, _ = self.fks[table][fk_columns]
        need = [key for key in dict.fromkeys(keys) if (table, column, key) not in kids]
        for key in need:
            kids[(table, column, key)] = []
        for start in range(0, len(need), 500):
            part = need[start:start + 500]
            for key, pk, body, *refs in self.db.execute(
                    f"SELECT {column}, pk, body{self._fcols[table]} FROM {self.names[table]} WHERE {column} IN "
                    f"({', '.join('?' * len(part))}) AND dead = 0", part):
                kids[(table, column, key)].append((pk, orjson.loads(body)))
                self._refs[(table, pk)] = tuple(refs)
        return [pair for key in keys for pair in kids[(table, column, key)]]

    def _reference(self, table: str, pk: bytes, edge: Any, row: Mapping[str, Any]) -> bytes | None:
        """The key ``row`` (``table``'s row of key ``pk``) references through ``edge``: as stored,
        when it was read inside ``reading()``."""
        refs = self._refs.get((table, pk))
        return edge.reference(row) if refs is None else refs[self._slot[table][edge.fk_columns]]

    def _fields(self, node: NodePlan) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        """(field, column, the column's earlier names) of what ``node`` shows, made once."""
        fields = self._shown.get(node.number)
        if fields is None:
            tplan = self.plan.tables[node.table]
            shown = node.project({c: c for c in tplan.columns}, tplan.columns)
            fields = self._shown[node.number] = tuple((name, column, tplan.earlier.get(column, ()))
                                                       for name, column in shown.items())
        return fields

    # SQL assembly: SQLite concatenates each document's JSON from the rows' bodies (``->`` gives a
    # value's JSON text as stored, which orjson wrote), the same bytes ``_build`` makes, without a
    # row decoded in Python. Children are ordered by the query; a node it cannot order exactly as
    # ``_ordered`` does leaves its document to ``_build``.

    def assembled(self, docs: Iterable[DocumentId]) -> dict[DocumentId, bytes | None]:
        """The documents among ``docs`` that SQL assembles (``assemble``'s answer each); the
        others are left out."""
        by_doc: dict[str, list[bytes]] = {}
        for doc, doc_id in docs:
            if self.sql_of(doc) is not None:
                by_doc.setdefault(doc, []).append(doc_id)
        out: dict[DocumentId, bytes | None] = {}
        for doc, ids in by_doc.items():
            query = self.sql_of(doc)
            assert query is not None
            out.update(((doc, doc_id), None) for doc_id in ids)
            for start in range(0, len(ids), 500):
                part = ids[start:start + 500]
                out.update(((doc, doc_id), body) for doc_id, body in
                           self.db.execute(f"{query}{', '.join('?' * len(part))})", part))
        return out

    def sql_of(self, doc: str) -> str | None:
        """The query assembling documents ``doc``, up to the list of their root keys (``?, ...)``
        follows), or None where the Python assembly must do it."""
        if doc not in self._sql:
            root = self.plan.nodes[self.plan.roots[doc]]
            try:
                self._sql[doc] = (f"SELECT r.pk, CAST({self._object_sql(root, 'r')} AS BLOB) FROM "
                                  f"{self.names[root.table]} r WHERE r.dead = 0 AND r.pk IN (")
            except _NotInSql:
                self._sql[doc] = None
        return self._sql[doc]

    def _object_sql(self, node: NodePlan, row: str) -> str:
        """The SQL text of ``_build``'s bytes for ``node``, whose row is ``row`` (an alias)."""
        fields: dict[str, str] = {}
        shown = self._fields(node)
        columns = self.plan.tables[node.table].columns
        # Shows every column of its table, as named, in order: a plain row's body is its object.
        whole = [(n, c) for n, c, _ in shown] == [(c, c) for c in columns] and bool(columns) and not any(
            self.plan.nodes[number].field in columns for number in node.below)
        for name, column, earlier in shown:
            value = f"{row}.body -> {_sql_path(column)}"
            if earlier:  # present under its name (null or not), else under the first earlier name it has
                value = "CASE " + " ".join(f"WHEN json_type({row}.body, {_sql_path(c)}) IS NOT NULL THEN "
                                           f"{row}.body -> {_sql_path(c)}" for c in (column, *earlier)) + " END"
            fields[name] = f"coalesce({value}, 'null')"
        for number in node.below:
            below = self.plan.nodes[number]
            assert below.edge is not None and below.field is not None
            alias, name = f"n{below.number}", self.names[below.table]
            if below.kind == "lookup":
                ref, _ = self.fks[node.table][below.edge.fk_columns]
                fields[below.field] = (f"coalesce((SELECT {self._object_sql(below, alias)} FROM {name} {alias} "
                                       f"WHERE {alias}.pk = {row}.{ref} AND {alias}.dead = 0), 'null')")
            else:
                fk, _ = self.fks[below.table][below.edge.fk_columns]
                fields[below.field] = (
                    f"'[' || coalesce((SELECT group_concat(v, ',') FROM (SELECT {self._object_sql(below, alias)} AS v "
                    f"FROM {name} {alias} WHERE {alias}.{fk} = {row}.pk AND {alias}.dead = 0 ORDER BY "
                    f"{self._order_sql(below, alias)})), '') || ']'")
        if not fields:
            return "'{}'"
        parts = [f"{_sql_text(orjson.dumps(name).decode() + ':')} || {value}" for name, value in fields.items()]
        if whole:
            head = "'{' || " + " || ',' || ".join(parts[:len(shown)])
            head = f"CASE WHEN {row}.plain = 1 THEN substr({row}.body, 1, length({row}.body) - 1) ELSE {head} END"
            parts = [head, *parts[len(shown):]]
            return " || ',' || ".join(parts) + " || '}'"
        return "'{' || " + " || ',' || ".join(parts) + " || '}'"

    def _order_sql(self, node: NodePlan, row: str) -> str:
        """``_ordered``'s order: the order-by columns, nulls last either way, then the key's values."""
        families = self.plan.tables[node.table].families
        if not all(f in _SQL_ORDERED for f in (*node.order_families, *families)):
            raise _NotInSql(f"{node.table} ordered by {node.order_by} (families {node.order_families}, key {families})")
        terms = []
        for column, descending in node.order_by:
            value = f"({row}.body ->> {_sql_path(column)})"
            terms += [f"{value} IS NULL", value + (" DESC" if descending else "")]
        terms += [f"json_extract(CAST({row}.pk AS TEXT), '$[{i}]')" for i in range(len(families))]
        return ", ".join(terms)

    def _lookup(self, node: NodePlan, pk: bytes | None) -> bytes | None:
        """A lookup's object, built once per flush and shared by the documents holding it."""
        if pk is None:
            return None
        done = self._built.get((node.number, pk))
        if done is None:
            found = self._live(node.table, pk)
            if found is None:
                return None
            done = self._build(node, found, pk)
            if self._rows is not None:  # inside reading(): the state holds still
                self._built[(node.number, pk)] = done
        return done

    def _build(self, node: NodePlan, row: Mapping[str, Any], pk: bytes) -> bytes:
        """``row``'s object (``pk``: its key bytes) with what hangs from it, as JSON."""
        fields = self._fields(node)
        out: dict[str, Any] = {name: row[column] if column in row else _earlier(row, names)
                               for name, column, names in fields}
        for number in node.below:
            below = self.plan.nodes[number]
            assert below.edge is not None and below.field is not None
            if below.kind == "lookup":
                built = self._lookup(below, self._reference(node.table, pk, below.edge, row))
                out[below.field] = None if built is None else Fragment(built)
            else:
                children = self._referencing(below.table, below.edge.fk_columns, pk)
                families = self.plan.tables[below.table].families
                out[below.field] = Fragment(b"[" + b",".join(
                    [self._build(below, child, child_pk) for child_pk, child in _ordered(below, children, families)])
                    + b"]")
        return dumps(out)


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _sql_path(column: str) -> str:
    """A JSON path to a column of a row's body, as a SQL literal."""
    if any(c in column for c in '"\\') or any(ord(c) < 32 for c in column):
        raise _NotInSql(f"column name {column!r}")
    return _sql_text(f'$."{column}"')


class _NotInSql(Exception):
    """A node the SQL assembly cannot express exactly as the Python one does."""


# Families SQLite orders as ``sort_value`` does (numbers numerically, text by code point,
# booleans false first); the others (numeric text, timestamps with offsets) are ordered in Python.
_SQL_ORDERED = frozenset({"integer", "text", "uuid", "date", "binary", "boolean"})


def _kept(row: Mapping[str, Any], columns: frozenset[str]) -> dict[str, Any]:
    return {c: v for c, v in row.items() if c in columns}


def _earlier(row: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    """A column's value in a row of an older shape: under its newest earlier name the row has
    (renamed since), else None (added since)."""
    for name in names:
        if name in row:
            return row[name]
    return None


def _ordered(node: NodePlan, rows: list[tuple[bytes, dict]], key_families: tuple[str, ...],
             ) -> Iterator[tuple[bytes, dict]]:
    """A child's rows by its ``order_by`` (nulls last either way), ties by key, each value
    compared as its type orders in the source: numbers (exact numerics arrive as text) as
    numbers, instants as instants, text by code point."""
    if len(rows) < 2:
        return iter(rows)
    ordered = _by_order(node, rows)
    if node.order_by and not _ties(node, ordered):
        return iter(ordered)  # the key decides nothing (the usual case: a line number per item)
    ordered = sorted(rows, key=lambda pair: tuple(sort_value(v, f) for v, f in
                                                  zip(orjson.loads(pair[0]), key_families)))
    return iter(_by_order(node, ordered))


def _by_order(node: NodePlan, rows: list[tuple[bytes, dict]]) -> list[tuple[bytes, dict]]:
    """``rows`` stably sorted by the order-by columns, the last one first."""
    ordered = rows
    for (column, descending), family in zip(reversed(node.order_by), reversed(node.order_families)):
        values = [pair for pair in ordered if pair[1].get(column) is not None]
        nulls = [pair for pair in ordered if pair[1].get(column) is None]
        values.sort(key=lambda pair: sort_value(pair[1][column], family), reverse=descending)
        ordered = values + nulls
    return ordered


def _ties(node: NodePlan, ordered: list[tuple[bytes, dict]]) -> bool:
    """Whether two neighbours of ``ordered`` have the same order-by values (as their type
    compares them: numerics spelled differently, one instant at two offsets)."""
    columns = [c for c, _ in node.order_by]
    if len(columns) == 1:
        (column,) = columns
        raw: list[Any] = [row.get(column) for _, row in ordered]
    else:
        raw = [tuple(row.get(c) for c in columns) for _, row in ordered]
    if any(a == b for a, b in zip(raw, raw[1:])):
        return True
    if all(f in _EQUAL_AS_SENT for f in node.order_families):
        return False  # different values as sent are different values
    rows = raw if len(columns) > 1 else [(value,) for value in raw]
    values = [tuple(None if v is None else sort_value(v, f) for v, f in zip(r, node.order_families)) for r in rows]
    return any(a == b for a, b in zip(values, values[1:]))


# Families whose values compare equal exactly when the events carry them equal.
_EQUAL_AS_SENT = frozenset({"integer", "text", "uuid", "date", "binary", "boolean"})


def sort_value(value: Any, family: str) -> tuple:
    """A value as its column's type orders it; values of different kinds (a column whose type
    changed) order by kind instead of failing: numbers, then instants, then text, then the rest."""
    if isinstance(value, bool):
        return (3, int(value))
    if isinstance(value, (int, float)):
        return (0, value)  # ints, floats and Decimals compare with each other exactly
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


def state_offsets(path: Path) -> dict[tuple[str, int], int]:
    """The next offset of each partition a state file holds ({} for none, or no file)."""
    if not path.exists():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {(t, p): n for t, p, n in db.execute("SELECT topic, part, next FROM offsets")}
    except sqlite3.OperationalError:  # made but never written (no tables yet)
        return {}
    finally:
        db.close()
