"""The log on one machine: a SQLite database in WAL mode standing in for a set of compacted Kafka topics.

Why SQLite: a capture process, a sink process and a ``tail`` process must share the log without a
broker. WAL mode lets readers run while one writer commits, and a commit is atomic, so a batch that
``publish`` hands over survives a ``kill -9`` whole or not at all. Because the commit happens inside
``publish``, the writer's ``poll``/``flush`` have nothing to wait for.

Durability: ``fsync=True`` (``synchronous=FULL``) syncs the WAL at every commit, surviving power
loss; ``fsync=False`` (``NORMAL``) syncs only at checkpoints, surviving a process crash but perhaps
not an OS crash.

Threads and processes: any number of processes may open the same directory. A Log object may be
shared between threads (its own calls use one connection per thread); each writer and reader owns
a connection and is used by one thread at a time. Writes are short ``BEGIN IMMEDIATE``
transactions and every connection waits on a locked database (``busy_timeout``) instead of failing.

Layout: a record's integer primary key is ``partition id << 40 | offset``, so each partition is one
contiguous range of the table's own b-tree: appends and range reads need no second index, and a
compacted gap is simply a missing key. ``partitions.next_offset`` is the high-water mark, kept apart
from the records so that compaction never lowers it. A new log's pages are 32 KiB. The ``log`` view
shows topic/partition/offset. A record's headers are one column, packed (cdc/log/packed_headers.py;
NULL: none). A database made before that column existed gets it, empty, when it is opened: its
records read with no headers.

Compaction (Kafka's rules): only the latest record per key stays, a tombstone goes once it is older
than ``delete_retention_ms``, and nothing younger than ``min_compaction_lag_ms`` is removed. It is
incremental: ``clean_offset`` marks how far each partition has been deduplicated, and the ``latest``
table holds the id of each key's record in that clean section. A pass takes the records written
since, a chunk at a time: a key's newest record there deletes its older ones in the chunk and the
one ``latest`` names, and takes its place in ``latest``. No index of every record's key is kept:
appends stay appends, and ``latest`` is updated in key order, a chunk at once, by the compaction
rather than by every publish. A writer compacts the topics it writes to every
``compact_interval`` seconds, in a pass with a time budget (``EmbeddedWriter._compact``). A log
that an older version of the framework opened (it compacted by an index of every key, which it
makes again) gets ``latest`` made again from its clean sections at the next opening; an older
and a newer version writing the same log at once is not supported.

Unknown topic: ``publish`` to a topic that ``ensure_topic`` never created raises ``DeliveryError``
(``retriable=False``) at once, writes nothing of the batch and poisons the writer, as a failed
Kafka delivery does.

The SQLite layout and its primitives are in ``embedded_store``, compaction in ``embedded_compaction``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from cdc.errors import DeliveryError, PermanentError, TopicConfigError
from cdc.log.base import Log, LogReader, LogRecord, LogWriter, TopicPartition, TopicSettings
from cdc.log.embedded_compaction import compact_topic
from cdc.log.embedded_store import (
    _BITS,
    _MASK,
    _SCHEMA,
    _VIEW,
    PAGE_SIZE,
    _now_ms,
    _packer,
    _Topic,
    _transaction,
    _unavailable,
)
from cdc.log.packed_headers import unpack
from cdc.log.partitioner import partition_for
from cdc.positions import Position
from cdc.serde import Record

_log = logging.getLogger(__name__)

_BUSY_MS = 30_000               # how long a connection waits for another's write lock
_WAIT_S = 0.025                 # how often a blocked poll looks for new commits
_PASS_S = 1.0                   # a writer's compaction pass starts no chunk after this long ...
_PASS_MAX_S = 8.0               # ... twice that after each pass that could not finish, up to this


def _before_latest(conn: sqlite3.Connection) -> bool:
    """Whether an older version of the framework, which compacted by an index of every record's
    key, made this database or opened it since (asked before the schema statements run, which
    drop that index): then its compactions and deleted topics are not in ``latest``."""
    names = {name for name, in conn.execute("SELECT name FROM sqlite_master WHERE name IN ('records', 'latest', "
                                            "'records_by_key')")}
    return names == {"records"} or "records_by_key" in names


def _fill_latest(conn: sqlite3.Connection) -> None:
    """``latest`` made again from each partition's clean section (where that version's compaction
    left one record per key); in the schema transaction, so one process of several opening the
    log at once does it."""
    _log.info("embedded log: an older version compacted this log; finding each key's clean record again")
    conn.execute("DELETE FROM latest")
    for pid, clean in conn.execute("SELECT id, clean_offset FROM partitions").fetchall():
        base = pid << _BITS
        conn.execute("INSERT INTO latest SELECT ?, key, MAX(id) FROM records WHERE id >= ? AND id < ? "
                     "AND key IS NOT NULL GROUP BY key", (pid, base, base | clean))


def _add_headers(conn: sqlite3.Connection) -> None:
    """A database made before records had headers gets the column (its records have none); in
    the schema transaction, so one process of several opening it at once adds it."""
    if "headers" not in {row[1] for row in conn.execute("PRAGMA table_info(records)")}:
        _log.info("embedded log: adding the headers column to the records of an older database")
        conn.execute("ALTER TABLE records ADD COLUMN headers BLOB")
        conn.execute("DROP VIEW IF EXISTS log")



def log_file(path: str | os.PathLike) -> Path:
    """The database file of the embedded log in directory ``path`` (there once a log was opened)."""
    return Path(path) / "log.db"


class EmbeddedLog(Log):
    def __init__(self, path: str | os.PathLike, defaults: TopicSettings | None = None, *,
                 fsync: bool = True, compact_interval: float = 5.0) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.file = log_file(self.path)
        self.defaults = defaults or TopicSettings()
        self.fsync = fsync
        self.compact_interval = compact_interval
        self._topics: dict[str, _Topic] = {}  # cached: only set_cleanup_policy changes a topic
        self._lock = threading.Lock()
        self._open_conns: set[sqlite3.Connection] = set()
        self._local = threading.local()
        with _unavailable(f"opening {self.file}"):
            conn = self._conn()
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # before WAL mode: a new file only
            conn.execute("PRAGMA journal_mode = WAL")
            with _transaction(conn):
                before_latest = _before_latest(conn)
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                if before_latest:
                    _fill_latest(conn)
                # A log made before topics had a retention (delete policy): none, i.e. for ever.
                if "retention_ms" not in {row[1] for row in conn.execute("PRAGMA table_info(topics)")}:
                    conn.execute("ALTER TABLE topics ADD COLUMN retention_ms INTEGER")
                _add_headers(conn)
                conn.execute(_VIEW)

    # -- connections --------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.file, timeout=_BUSY_MS / 1000, isolation_level=None,
                               check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
        conn.execute(f"PRAGMA synchronous = {'FULL' if self.fsync else 'NORMAL'}")
        with self._lock:
            self._open_conns.add(conn)
        return conn

    def _release(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            self._open_conns.discard(conn)
        conn.close()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._open()
        return conn

    def close(self) -> None:
        with self._lock:
            conns, self._open_conns = self._open_conns, set()
        for conn in conns:
            conn.close()
        self._local = threading.local()

    # -- topics -------------------------------------------------------------------------------

    def _topic(self, name: str, conn: sqlite3.Connection) -> _Topic | None:
        topic = self._topics.get(name)
        if topic is None:
            row = conn.execute("SELECT cleanup_policy, min_compaction_lag_ms, delete_retention_ms, retention_ms "
                               "FROM topics WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            ids = tuple(i for i, in conn.execute(
                "SELECT id FROM partitions WHERE topic = ? ORDER BY partition", (name,)))
            policy, lag_ms, delete_retention_ms, retention_ms = row
            topic = self._topics[name] = _Topic(name, policy, lag_ms, delete_retention_ms, retention_ms, ids)
        return topic

    def _require(self, name: str) -> _Topic:
        topic = self._topic(name, self._conn())
        if topic is None:
            raise TopicConfigError(f"topic {name} does not exist")
        return topic

    def create_topic_unchecked(self, name: str, settings: TopicSettings | None = None,
                               cleanup_policy: str = "delete") -> None:
        """Create ``name`` with any cleanup policy, if missing (tests use it for non-compacted topics)."""
        s = settings or self.defaults
        with _unavailable(f"creating topic {name}"), _transaction(self._conn()) as conn:
            made = conn.execute("INSERT OR IGNORE INTO topics VALUES (?, ?, ?, ?, ?, ?)",
                                (name, s.partitions, cleanup_policy, s.min_compaction_lag_ms,
                                 s.delete_retention_ms, s.retention_ms)).rowcount
            if made:
                conn.executemany("INSERT INTO partitions (topic, partition) VALUES (?, ?)",
                                 [(name, p) for p in range(s.partitions)])

    def ensure_topic(self, topic: str, settings: TopicSettings | None = None) -> None:
        policy = (settings or self.defaults).cleanup_policy
        with _unavailable(f"ensuring topic {topic}"):
            existing = self._topic(topic, self._conn())
            if existing is None:
                self.create_topic_unchecked(topic, settings, cleanup_policy=policy)
                existing = self._require(topic)
        if existing.cleanup_policy != policy:
            raise TopicConfigError(f"topic {topic} has cleanup.policy={existing.cleanup_policy}; "
                                   f"it must be {policy} (change or delete the topic)")

    def cleanup_policy(self, topic: str) -> tuple[str, int | None] | None:
        with _unavailable(f"reading topic {topic}"):
            self._topics.pop(topic, None)  # another process may have changed it
            existing = self._topic(topic, self._conn())
        return None if existing is None else (existing.cleanup_policy, existing.retention_ms)

    def set_cleanup_policy(self, topic: str, policy: str, retention_ms: int | None) -> None:
        with _unavailable(f"changing topic {topic}"), _transaction(self._conn()) as conn:
            if not conn.execute("UPDATE topics SET cleanup_policy = ?, retention_ms = ? WHERE name = ?",
                                (policy, retention_ms, topic)).rowcount:
                raise TopicConfigError(f"topic {topic} does not exist")
        self._topics.pop(topic, None)

    def delete_retention_ms(self, topic: str) -> int | None:
        with _unavailable(f"reading topic {topic}"):
            return self._require(topic).delete_retention_ms

    def delete_topic(self, topic: str) -> None:
        with _unavailable(f"deleting topic {topic}"), _transaction(self._conn()) as conn:
            ids = [i for i, in conn.execute("SELECT id FROM partitions WHERE topic = ?", (topic,))]
            for pid in ids:
                conn.execute("DELETE FROM records WHERE id >= ? AND id < ?", (pid << _BITS, (pid + 1) << _BITS))
                conn.execute("DELETE FROM latest WHERE pid = ?", (pid,))
            conn.execute("DELETE FROM partitions WHERE topic = ?", (topic,))
            conn.execute("DELETE FROM group_offsets WHERE topic = ?", (topic,))
            conn.execute("DELETE FROM topics WHERE name = ?", (topic,))
        self._topics.pop(topic, None)

    def topics(self) -> list[str]:
        with _unavailable("listing topics"):
            return [name for name, in self._conn().execute("SELECT name FROM topics ORDER BY name")]

    def partitions(self, topic: str, fresh: bool = False) -> int:  # a topic's partitions never change here
        with _unavailable(f"reading topic {topic}"):
            return len(self._require(topic).ids)

    def end_offsets(self, topic: str) -> dict[TopicPartition, int]:
        with _unavailable(f"reading end offsets of {topic}"):
            self._require(topic)
            rows = self._conn().execute("SELECT partition, next_offset FROM partitions WHERE topic = ?",
                                        (topic,))
            return {(topic, p): end for p, end in rows}

    def writer(self) -> EmbeddedWriter:
        return EmbeddedWriter(self)

    def reader(self, group: str | None = None) -> EmbeddedReader:
        return EmbeddedReader(self, group)

    # -- compaction ---------------------------------------------------------------------------

    def compact(self, topic: str) -> None:
        with _unavailable(f"compacting {topic}"):
            compact_topic(self._require(topic), self._conn())


class EmbeddedWriter(LogWriter):
    def __init__(self, log: EmbeddedLog) -> None:
        self._log = log
        self._conn = log._open()
        self._conn.execute("PRAGMA cache_size = -65536")  # 64 MiB: the compaction's pages of ``latest``
        self._safe: Position | None = None
        self._error: DeliveryError | None = None
        self._written: set[str] = set()  # topics this writer compacts from time to time
        self._compacted_at = time.monotonic()
        self._passes = 0  # compaction passes so far: where the next one starts
        self._behind = 0  # passes in a row that ran out of their budget

    def publish(self, records: Iterable[Record], checkpoint: Position | None = None) -> None:
        if self._error is not None:
            raise self._error
        if records:
            try:
                self._append(records)
            except DeliveryError as err:
                self._error = err
                raise
            except sqlite3.Error as err:
                self._error = DeliveryError(f"embedded log: publish failed: {err}",
                                            retriable=isinstance(err, sqlite3.OperationalError))
                raise self._error from err
        if checkpoint is not None:
            self._safe = checkpoint
        if time.monotonic() - self._compacted_at >= self._log.compact_interval:
            self._compact()

    def _compact(self) -> None:
        # The batch is committed already: a failed pass must not look like a failed publish. A
        # pass stops starting chunks after its budget (its publish waits meanwhile): _PASS_S, twice
        # that after each pass that could not finish, up to _PASS_MAX_S, so that a writer that
        # outruns its compaction is slowed down rather than leave it behind for ever. Each pass
        # starts at the next topic and partition, so none starves behind a busy one.
        self._compacted_at = time.monotonic()
        deadline = self._compacted_at + min(_PASS_S * 2 ** self._behind, _PASS_MAX_S)
        names = sorted(self._written)
        finished = True
        try:
            for k in range(len(names)):
                name = names[(self._passes + k) % len(names)]
                try:
                    topic = self._log._require(name)
                except TopicConfigError:  # deleted meanwhile (by another process)
                    self._written.discard(name)
                    continue
                if not compact_topic(topic, self._conn, deadline, self._passes):
                    finished = False
                    break
        except sqlite3.OperationalError as err:
            _log.warning("embedded log: compaction skipped, will retry: %s", err)
        self._behind = 0 if finished else self._behind + 1
        self._passes += 1

    def _append(self, records: Iterable[Record]) -> None:
        conn = self._conn
        topics: dict[str, _Topic] = {}
        pids: list[int] = []
        copies: list[Record] = []
        add_pid, add_copy = pids.append, copies.append
        for record in records:  # the partition of each record, outside the write lock
            topic = topics.get(record.topic)
            if topic is None:
                topic = topics[record.topic] = self._known(record.topic)
            ids = topic.ids
            if record.to_all_partitions:
                for pid in ids:
                    add_pid(pid)
                    add_copy(record)
            else:
                add_pid(ids[0] if len(ids) == 1 else ids[partition_for(record.key, len(ids))])
                add_copy(record)
        if not copies:
            return
        now = _now_ms()
        touched = sorted(set(pids))
        packed = _packer()
        with _transaction(conn):
            marks = ",".join("?" * len(touched))
            nxt = {pid: (pid << _BITS) | end for pid, end in conn.execute(
                f"SELECT id, next_offset FROM partitions WHERE id IN ({marks})", touched)}
            if len(touched) == 1:
                first = nxt[touched[0]]
                rows = [(i, r.key, r.value, now, packed(r.headers))
                        for i, r in zip(range(first, first + len(copies)), copies)]
                nxt[touched[0]] = first + len(copies)
            else:
                rows = []
                add_row = rows.append
                for pid, r in zip(pids, copies):
                    i = nxt[pid]
                    nxt[pid] = i + 1
                    add_row((i, r.key, r.value, now, packed(r.headers)))
            conn.executemany("INSERT INTO records (id, key, value, timestamp_ms, headers) VALUES (?, ?, ?, ?, ?)",
                             rows)
            conn.executemany("UPDATE partitions SET next_offset = ? WHERE id = ?",
                             [(i & _MASK, pid) for pid, i in nxt.items()])
        self._written.update(topics)

    def _known(self, name: str) -> _Topic:
        topic = self._log._topic(name, self._conn)
        if topic is not None:
            return topic
        raise DeliveryError(f"topic {name} does not exist in the embedded log (call ensure_topic "
                            "first); nothing of this batch was written", retriable=False)

    def fail(self, error: DeliveryError) -> None:
        if self._error is None:
            self._error = error

    def poll(self) -> Position | None:
        if self._error is not None:
            raise self._error
        return self._safe

    def flush(self, timeout: float = 30.0) -> Position | None:
        return self.poll()  # every publish committed before it returned

    @property
    def outstanding(self) -> int:
        return 0

    def close(self) -> None:
        self._log._release(self._conn)


class EmbeddedReader(LogReader):
    def __init__(self, log: EmbeddedLog, group: str | None) -> None:
        self._log = log
        self._group = group
        self._conn = log._open()
        self._positions: dict[TopicPartition, int] = {}
        self._ids: dict[TopicPartition, int] = {}  # resolved once the topic exists
        self._turn = 0

    def assign(self, start: dict[TopicPartition, int]) -> None:
        self._positions = dict(start)
        self._ids = {}

    def position(self, tp: TopicPartition) -> int:
        return self._positions[tp]

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]:
        deadline = time.monotonic() + timeout
        with _unavailable("polling"):
            while True:
                version = self._version()
                records, moved = self._fetch(max(1, max_records))
                if records:
                    return records
                if moved:
                    continue  # skipped a compacted gap: look again at once
                while self._version() == version:  # nothing new: wait for another commit
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return []
                    time.sleep(min(_WAIT_S, left))

    def _version(self) -> int:
        return self._conn.execute("PRAGMA data_version").fetchone()[0]

    def _fetch(self, budget: int) -> tuple[list[LogRecord], bool]:
        conn = self._conn
        for tp in self._positions.keys() - self._ids.keys():
            known = self._log._topic(tp[0], conn)
            if known is not None and 0 <= tp[1] < len(known.ids):
                self._ids[tp] = known.ids[tp[1]]
        # The ends first: every offset below them is committed, so a missing one is a compacted gap.
        ends = dict(conn.execute("SELECT id, next_offset FROM partitions"))
        tps = list(self._positions)
        turn = self._turn % len(tps) if tps else 0
        self._turn += 1
        ready = [(tp, self._ids[tp], ends[self._ids[tp]]) for tp in tps[turn:] + tps[:turn]
                 if tp in self._ids and self._positions[tp] < ends[self._ids[tp]]]
        out: list[LogRecord] = []
        moved = False
        for n, (tp, pid, end) in enumerate(ready):
            share = -(-budget // (len(ready) - n))  # what is left, split among the partitions left
            base = pid << _BITS
            rows = conn.execute("SELECT id, key, value, timestamp_ms, headers FROM records WHERE id >= ? "
                                "AND id < ? ORDER BY id LIMIT ?",
                                (base | self._positions[tp], base | end, share)).fetchall()
            topic, partition = tp
            out.extend([LogRecord(topic, partition, i & _MASK, k, v, ts, None if h is None else unpack(h))
                        for i, k, v, ts, h in rows])
            position = (rows[-1][0] & _MASK) + 1 if len(rows) == share else end
            moved = moved or position != self._positions[tp]
            self._positions[tp] = position
            budget -= len(rows)
            if budget <= 0:
                break
        return out, moved

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self._group is None:
            raise PermanentError("this reader has no consumer group (reader(group=None)), so it "
                                 "cannot commit offsets; open it with log.reader('<group>')")
        with _unavailable(f"committing offsets of group {self._group}"), _transaction(self._conn) as conn:
            conn.executemany("INSERT INTO group_offsets VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE "
                             "SET next_offset = excluded.next_offset",
                             [(self._group, t, p, o) for (t, p), o in offsets.items()])

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        out: dict[TopicPartition, int | None] = {}
        with _unavailable(f"reading offsets of group {self._group}"):
            for topic, partition in partitions:
                row = self._conn.execute("SELECT next_offset FROM group_offsets WHERE grp = ? "
                                         "AND topic = ? AND partition = ?",
                                         (self._group, topic, partition)).fetchone()
                out[(topic, partition)] = None if row is None else row[0]
        return out

    def close(self) -> None:
        self._log._release(self._conn)
