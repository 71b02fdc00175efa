"""``type: postgres``: logical replication with pgoutput, after a consistent parallel snapshot.

Lifecycle (see cdc.api): ``start`` checks the server, resolves the captured tables, makes sure
the publication covers them, and decides from the snapshot mode, the stored position and the
slot whether to snapshot or to stream; ``poll`` returns snapshot batches, then streamed ones;
``commit`` confirms an LSN to the slot, the only place the server is told it may drop WAL.

Snapshot decision:
  no stored position       initial / initial_only / when_needed / always: a fresh slot and a
                           snapshot (an old slot without a stored position is a snapshot that
                           never finished: it is dropped, and the log says so); never: stream
                           from the slot as it is (created now if missing)
  stored position          always: a fresh slot and a snapshot; initial_only: nothing left to do;
                           otherwise stream from it, unless the slot is missing or lost: then
                           when_needed takes a new snapshot, the others stop with PositionLostError

Threading: all calls on the runtime's thread; ``stop`` may come from another one. Snapshot
readers are threads of their own (snapshot/parallel.py).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import deque
from typing import Any, Callable

import psycopg2
import psycopg2.extras

from cdc.api import SnapshotMode, Source, servers
from cdc.errors import PermanentError, PositionLostError, RetriableError
from cdc.events import Batch, Column, SchemaChange, SnapshotEnd, SnapshotMarker
from cdc.positions import PgLsn, Position
from snapshot.parallel import ParallelSnapshot
from sources.postgres import pgoutput as pg
from sources.postgres.catalog import (TableMeta, captured_tables, check_free_slot, check_readable, check_server,
                                      ensure_publication, matches, table_meta)
from sources.postgres.changes import ChangeBuilder
from sources.postgres.config import PostgresConfig
from sources.postgres.errors import wrap
from sources.postgres.slots import RetainedWal
from sources.postgres.snapshot import SnapshotReader, SnapshotRows, plan_chunks
from sources.postgres.stream import ReplicationStream, TransactionBuffer
from sources.postgres.toast import ToastStore
from sources.postgres.deadline import answer_within, with_connect_timeout
from sources.postgres.types import converter_for, load_type_catalog, session_options

log = logging.getLogger(__name__)


def array_element(text: str) -> str | None:
    """The one element of a PostgreSQL array's text (``{0}``, ``{"a, b"}``, ``{NULL}``), or None."""
    inner = text[1:-1]
    if inner == "NULL":
        return None
    if inner.startswith('"'):
        out, escaped = [], False
        for char in inner[1:-1]:
            if escaped or char != "\\":
                out.append(char)
                escaped = False
            else:
                escaped = True
        return "".join(out)
    return inner

HEARTBEAT_PREFIX = "cdc-heartbeat"


class PostgresSource(Source):
    config_model = PostgresConfig
    connector = "postgresql"

    def __init__(self, config: PostgresConfig, position: Position | None) -> None:
        super().__init__(config, position)
        if position is not None and not isinstance(position, PgLsn):
            raise PermanentError(f"source {config.name}: stored position {position} is not a PostgreSQL LSN "
                                 "(was the source's type changed? reset its offset)")
        self.cfg = config
        # A server that hangs must not hang the connect either (see deadline.py).
        self.dsn = with_connect_timeout(config.dsn.get_secret_value(), config.server_timeout)
        self.options = session_options()
        self.app_name = f"cdc-{config.name}"[:63]
        self.setting = servers.setting_of("source", config.name, "dsn")  # named by errors that a setting can fix
        self.role: str | None = servers.postgres.role_of(self.dsn)     # the server's current_user once connected
        self._phase = "starting"
        self._finished = False
        self._stopping = threading.Event()
        self.conn = None
        self.stream: ReplicationStream | None = None
        self.snapshot: ParallelSnapshot | None = None
        self.tables: dict[int, TableMeta] = {}
        self.types: dict[int, Any] = {}
        self.converters: dict[int, Callable[[str], Any]] = {}
        self.last_commit_ms: int | None = None
        self.last_activity = time.monotonic()
        self.buffers: dict[int, TransactionBuffer] = {}
        self.stream_xid: int | None = None
        self.replay = None  # an iterator of Batches replaying a committed streamed transaction
        self.inbox: deque = deque()  # messages read and not yet handled
        self._held = None   # the newest snapshot event, held back to mark the last one "last"
        self._pending_changes: tuple = ()  # the tables' shapes, for the first snapshot batch
        self._snapshot_end: SnapshotEnd | None = None
        self.slot_name = config.slot  # the default needs the database's name: settled in start()
        self.wal_watch: RetainedWal | None = None
        self._idle = False  # the stream's last read brought nothing (lag: see _caught_up)
        self._server_lsn: int | None = None  # pg_current_wal_lsn() at the previous look

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self._phase

    @property
    def finished(self) -> bool:
        return self._finished

    def snapshot_chunks(self) -> tuple[int, int] | None:
        snapshot = self.snapshot
        return None if snapshot is None else (snapshot.tasks_done, snapshot.tasks_total)

    def lag(self) -> float | None:
        """0 when caught up with the server (see ``_caught_up``); else now minus the commit time
        of the newest change handled. Called on the thread that polls, about once a second."""
        if self._caught_up():
            return 0.0
        if self.last_commit_ms is None:
            return None
        return max(0.0, time.time() - self.last_commit_ms / 1000)

    def _caught_up(self) -> bool:
        """Nothing waits here, the stream read nothing last time, and the server has sent us its
        WAL up to where it was at the previous look (``pg_current_wal_lsn()``, a second ago): an
        idle source is not behind, however old its newest commit. A large write to a table not
        captured keeps the server ahead of what it sent, so that is lag, rightly."""
        if self.stream is None or self._phase != "streaming":
            return False
        idle = self._idle and not self.inbox and self.replay is None and not self.buffers
        if not idle:
            self._server_lsn = None
            return False
        before = self._server_lsn
        try:
            with answer_within(self.conn, self.cfg.server_timeout, "reading the server's WAL position"):
                with self.conn.cursor() as cur:
                    cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
                    self._server_lsn = int(cur.fetchone()[0])
                self.conn.commit()
        except psycopg2.Error as err:
            raise wrap(err, "reading the server's WAL position") from err
        return before is not None and self.stream.wal_end >= before

    def start(self) -> None:
        cfg = self.cfg
        setting = self.setting
        self.conn = servers.postgres.connect(self.dsn, what=f"source {cfg.name}: connecting", setting=setting,
                                      options=self.options, application_name=self.app_name)
        try:
            check_server(self.conn)
            with self.conn.cursor() as cur:
                cur.execute("SELECT current_database(), current_setting('server_version_num')::int, current_user")
                self.database, version, self.role = cur.fetchone()
            self.conn.rollback()
            tables = captured_tables(self.conn, cfg.tables, self.database, cfg.key_columns)
            self.tables = {t.oid: t for t in tables}
            check_readable(self.conn, tables)
            ensure_publication(self.conn, cfg.publication_name, cfg.tables, tables, cfg.manage_publication,
                               created_by=cfg.name)
            self.slot_name = self._choose_slot()
        except psycopg2.Error as err:
            raise wrap(err, f"source {cfg.name}: preparing capture", setting=setting, role=self.role) from err
        self.protocol = cfg.protocol_version or (4 if version >= 160000 else 3 if version >= 150000
                                                 else 2 if version >= 140000 else 1)
        self.server_version = version
        state = cfg.state_dir / cfg.name
        self.spill_dir = state / "spill"
        self.toast = ToastStore(state / "toast.db")
        self.decoder = pg.PgOutputDecoder(self.protocol)
        self.builder = ChangeBuilder(self.database, self._lookup_table, self._converters_for, self.toast,
                                     self._type_name, self._filled)
        self._type_names: dict[tuple[int, int], str] = {}
        try:
            self._decide()
        except psycopg2.Error as err:  # e.g. the server restarting while the slot is looked up
            raise wrap(err, f"source {cfg.name}: deciding between snapshot and stream", setting=setting,
                       role=self.role) from err

    def _decide(self) -> None:
        cfg, position, mode = self.cfg, self.start_position, self.cfg.snapshot
        slot = self._slot_state()
        if slot is not None:
            self._release_own_stale_slot(slot)
        if mode is SnapshotMode.ALWAYS or (position is None and mode is not SnapshotMode.NEVER):
            if slot is not None:
                log.warning("slot %s exists but no position was stored (or snapshot: always): taking the "
                            "snapshot again with a fresh slot", self.slot_name,
                            extra={"connector": cfg.name, "phase": "starting"})
            self._start_snapshot(drop_slot=slot is not None)
            return
        if position is not None and mode is SnapshotMode.INITIAL_ONLY:
            self._phase, self._finished = "finished", True
            return
        lost = slot is None or slot["wal_status"] == "lost"
        if position is None:  # snapshot: never
            if slot is None:
                self._create_slot(export=False)
            self._start_stream(0)
            return
        if lost:
            what = "is missing" if slot is None else "has lost the WAL it needs (wal_status=lost)"
            if mode is SnapshotMode.WHEN_NEEDED:
                log.warning("slot %s %s: taking a new snapshot", self.slot_name, what,
                            extra={"connector": cfg.name, "phase": "starting"})
                self._start_snapshot(drop_slot=slot is not None)
                return
            raise PositionLostError(
                f"source {cfg.name}: replication slot {self.slot_name} {what}; changes after {position} "
                "cannot be read. Recovery: take a new snapshot (set snapshot: when_needed, or reset the "
                f"source's offset with a tombstone for {{\"source\": \"{cfg.name}\"}} in the offsets topic)")
        self._start_stream(position.lsn)

    def _choose_slot(self) -> str:
        """The ``slot`` setting; else the default named after database and source, unless only a
        slot of the old default name (``cdc_<name>``) exists in this database: that one is this
        source's from before the upgrade, and keeping it keeps its position."""
        cfg = self.cfg
        if cfg.slot is not None:
            return cfg.slot
        new, legacy = cfg.slot_in(self.database), cfg.legacy_slot_name
        with self.conn.cursor() as cur:
            cur.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name IN (%s, %s) "
                        "AND database = current_database() AND plugin = 'pgoutput'", (new, legacy))
            found = {row[0] for row in cur.fetchall()}
        self.conn.rollback()
        if legacy in found and new not in found:
            log.info("keeping slot %s, named by the old default; a new source here would get %s", legacy, new,
                     extra={"connector": cfg.name, "phase": "starting"})
            return legacy
        return new

    def _slot_state(self) -> dict | None:
        with self.conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            cur.execute("SELECT s.database, s.plugin, s.active_pid, s.wal_status, a.application_name "
                        "FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid "
                        "WHERE s.slot_name = %s", (self.slot_name,))
            row = cur.fetchone()
        self.conn.rollback()
        if row is not None and (row["database"] != self.database or row["plugin"] != "pgoutput"):
            raise PermanentError(f"source {self.cfg.name}: replication slot {self.slot_name} belongs to "
                                 f"database {row['database']} with plugin {row['plugin']}, not to "
                                 f"{self.database} with pgoutput: set the source's `slot:` to another name "
                                 "(a-z, 0-9, _)")
        return row

    def _release_own_stale_slot(self, slot: dict) -> None:
        """A slot still held by a walsender of this same connector is a leftover of a process that
        died (kill -9): the server has not noticed yet. End it rather than wait for its timeout."""
        pid = slot["active_pid"]
        if pid is None:
            return
        if slot["application_name"] != self.app_name:
            raise RetriableError(f"slot {self.slot_name} is in use by another process (pid {pid}, "
                                 f"application {slot['application_name']!r})")
        log.warning("slot %s is held by pid %d, a leftover of an earlier run: ending it", self.slot_name, pid,
                    extra={"connector": self.cfg.name, "phase": "starting"})
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (self.slot_name,))
                row = cur.fetchone()
                if row is None or row[0] is None:
                    break
                time.sleep(0.05)
        self.conn.rollback()

    def _drop_slot(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (self.slot_name,))
        self.conn.commit()

    def _create_slot(self, export: bool):
        """Create the slot; with ``export``, keep its connection open and return (connection,
        consistent LSN, snapshot name): the snapshot lives as long as that connection is idle."""
        check_free_slot(self.conn)
        repl = servers.postgres.connect(self.dsn, what=f"source {self.cfg.name}: opening a replication connection",
                                 setting=self.setting, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                 options=self.options, application_name=self.app_name)
        cur = repl.cursor()
        if self.server_version >= 150000:
            how = "(SNAPSHOT 'export')" if export else "(SNAPSHOT 'nothing')"
        else:
            how = "EXPORT_SNAPSHOT" if export else "NOEXPORT_SNAPSHOT"
        try:
            cur.execute(f'CREATE_REPLICATION_SLOT "{self.slot_name}" LOGICAL pgoutput {how}')
            _, consistent, snapshot_name, _ = cur.fetchone()
        except psycopg2.Error as err:
            repl.close()
            raise wrap(err, f"creating replication slot {self.slot_name}") from err
        if not export:
            repl.close()
            return None
        return repl, PgLsn.parse(consistent), snapshot_name

    # -- snapshot --------------------------------------------------------------------------------
    def _start_snapshot(self, drop_slot: bool) -> None:
        cfg = self.cfg
        if drop_slot:
            self._drop_slot()
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()")
            before = PgLsn.parse(cur.fetchone()[0])  # below every LSN the new slot will send
        self.conn.rollback()
        repl, consistent, snapshot_name = self._create_slot(export=True)
        try:
            readers = [SnapshotReader(self.dsn, self.options, snapshot_name, self.app_name, self.setting)
                       for _ in range(cfg.snapshot_workers)]
            with self.conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                chunks = plan_chunks(self.conn, list(self.tables.values()), cfg.snapshot_chunk_pages)
            self.conn.rollback()
        finally:
            repl.close()  # every reader has imported the snapshot: the exporter may go
        self.consistent = consistent
        self._readers = readers
        # Converters are made here, on this thread, before the readers need them.
        self._converters_for([c.type_oid for t in self.tables.values() for c in t.columns])
        now = int(time.time() * 1000)
        rows = SnapshotRows(before.lsn, now, self._converters_for, self.toast,
                            batch=min(cfg.max_batch_events, 2048), types=self.types)
        # Each table's shape goes out with the first snapshot batch: a sink that types its columns
        # from the schema records (the Delta sink) must not wait for a table's first streamed change.
        self._pending_changes = tuple(
            SchemaChange(t.id, tuple(Column(c.name, c.type_name, c.name in t.key) for c in t.columns),
                         before.lsn, now)
            for t in self.tables.values())
        self._snapshot_end = SnapshotEnd(tuple(t.id for t in self.tables.values()), before.lsn)
        self.snapshot = ParallelSnapshot(readers, chunks, rows.read, name=f"{cfg.name}-snapshot")
        self._phase = "snapshot"
        self._snapshot_rows = 0
        log.info("snapshot of %d tables in %d chunks, consistent at %s, %d readers", len(self.tables),
                 len(chunks), consistent, len(readers), extra={"connector": cfg.name, "phase": "snapshot"})

    def _poll_snapshot(self, timeout: float) -> Batch | None:
        try:
            item = self.snapshot.next_batch(timeout)
        except StopIteration:
            return self._finish_snapshot()
        if item is None:
            return None
        events, qualified, toastable = item
        for key_json, column, value in toastable:
            self.toast.remember(qualified, key_json, column, value)
        self.toast.flush()
        self._snapshot_rows += len(events)
        out = ([self._held] if self._held is not None else []) + events[:-1]
        self._held = events[-1]
        return self._with_changes(Batch(out)) if out else None

    def _with_changes(self, batch: Batch) -> Batch:
        changes, self._pending_changes = self._pending_changes, ()
        return batch.with_schema_changes(changes)

    def _finish_snapshot(self) -> Batch:
        self.snapshot.close()
        for reader in self._readers:
            reader.close()
        self.snapshot = None
        events = []
        if self._held is not None:
            events.append(self._held._replace(snapshot=SnapshotMarker.LAST))
            self._held = None
        log.info("snapshot done: %d rows; streaming from %s", self._snapshot_rows, self.consistent,
                 extra={"connector": self.cfg.name, "phase": "snapshot"})
        if self.cfg.snapshot is SnapshotMode.INITIAL_ONLY:
            self._phase, self._finished = "finished", True
        else:
            self._start_stream(self.consistent.lsn)
        return self._with_changes(Batch(events, self.consistent, snapshot_end=self._snapshot_end))

    # -- streaming -------------------------------------------------------------------------------
    def _start_stream(self, lsn: int) -> None:
        cfg = self.cfg
        self.stream = ReplicationStream(self.dsn, self.options, self.slot_name, cfg.publication_name,
                                        self.protocol, lsn, cfg.status_interval, self.app_name, self.setting,
                                        server_timeout=cfg.server_timeout)
        self._phase = "streaming"
        self.last_activity = time.monotonic()
        self.wal_watch = RetainedWal(cfg.name, self.slot_name, cfg.max_retained_wal, cfg.wal_check_interval)
        log.info("streaming from %s (pgoutput protocol %d)", PgLsn(lsn), self.protocol,
                 extra={"connector": cfg.name, "phase": "streaming"})

    def _heartbeat(self) -> None:
        """Make a little WAL that the slot sends back, so its position moves while nothing captured
        changes (and retained WAL stays small)."""
        try:
            with answer_within(self.conn, self.cfg.server_timeout, "emitting a heartbeat"):
                with self.conn.cursor() as cur:
                    cur.execute("SELECT pg_logical_emit_message(false, %s, '')", (HEARTBEAT_PREFIX,))
                self.conn.commit()
        except psycopg2.Error as err:
            raise wrap(err, "emitting a heartbeat") from err
        self.last_activity = time.monotonic()

    def retained_log_bytes(self) -> int | None:
        return None if self.wal_watch is None else self.wal_watch.bytes

    def _poll_stream(self, timeout: float) -> Batch | None:
        if self.wal_watch.due():
            what = f"measuring the WAL slot {self.slot_name} retains"
            try:
                with answer_within(self.conn, self.cfg.server_timeout, what):
                    self.wal_watch.measure(self.conn, self._phase)
            except psycopg2.Error as err:
                raise wrap(err, what) from err
        if self.replay is not None:
            batch = next(self.replay, None)
            if batch is not None:
                return batch
            self.replay = None
        inbox = self.inbox
        if not inbox:
            inbox.extend(self.stream.read(self.cfg.max_batch_events, timeout))
            self._idle = not inbox
            if not inbox:
                if time.monotonic() - self.last_activity >= self.cfg.heartbeat_interval:
                    self._heartbeat()
                return None
            self.last_activity = time.monotonic()
        builder, decode = self.builder, self.decoder.decode
        events: list = []
        checkpoint: PgLsn | None = None
        row_message = builder.row_message
        while inbox:
            data_start, payload = inbox.popleft()
            if builder.unstamped and data_start:
                events += builder.stamp(data_start)
            if self.stream_xid is None:
                changes = row_message(payload, data_start)  # the compiled path of plain row messages
                if changes is not None:
                    events += changes
                    continue
            message = decode(payload)
            kind = type(message)
            if self.stream_xid is not None and kind not in (pg.StreamStop, pg.StreamStart):
                self.buffers[self.stream_xid].add(data_start, payload)
                if kind is pg.Relation:
                    builder.on_relation(message, data_start)
                continue
            changes = self._changes(kind, message, data_start)
            if changes is not None:
                events += changes
            elif kind is pg.Begin:
                builder.begin(message.xid, message.commit_time_us)
            elif kind is pg.Commit:
                builder.end()
                checkpoint = PgLsn(message.end_lsn)
                self.last_commit_ms = pg.pg_time_to_unix_ms(message.commit_time_us)
            elif kind is pg.Message:
                if not message.transactional and message.prefix == HEARTBEAT_PREFIX and builder.xid is None:
                    checkpoint = PgLsn(message.lsn)
            elif kind is pg.Type:
                self.types.pop(message.oid, None)
                self.converters.pop(message.oid, None)
            elif kind is pg.StreamStart:
                self.stream_xid = message.xid
                if message.xid not in self.buffers:
                    self.buffers[message.xid] = TransactionBuffer(message.xid, self.spill_dir)
            elif kind is pg.StreamStop:
                self.stream_xid = None
                self._keep_within_budget()
            elif kind is pg.StreamAbort:
                buffer = self.buffers.get(message.xid)
                if buffer is not None:
                    if message.subxid == message.xid:
                        buffer.close()
                        del self.buffers[message.xid]
                    else:
                        buffer.aborted_subxacts.add(message.subxid)
            elif kind is pg.StreamCommit:
                # Everything before it goes out first; the transaction follows in pieces.
                self.replay = self._replay(self.buffers.pop(message.xid), message)
                self.toast.flush()
                return Batch(events, checkpoint, builder.take_schema_changes())
        self.toast.flush()
        changes = builder.take_schema_changes()
        if events or checkpoint is not None or changes:
            return Batch(events, checkpoint, changes)
        return None

    def _changes(self, kind: type, message: Any, data_start: int) -> list | None:
        """The events of a data message (Relation: none, after updating the table's shape);
        None when ``message`` is not a data message."""
        builder = self.builder
        if kind is pg.Insert:
            return builder.insert(message, data_start)
        if kind is pg.Update:
            return builder.update(message, data_start)
        if kind is pg.Delete:
            return builder.delete(message, data_start)
        if kind is pg.Truncate:
            return builder.truncate(message, data_start)
        if kind is pg.Relation:
            builder.on_relation(message, data_start)
            return []
        return None

    def _keep_within_budget(self) -> None:
        budget = self.cfg.memory_budget_mb << 20
        while sum(b.memory_bytes for b in self.buffers.values()) > budget:
            largest = max(self.buffers.values(), key=lambda b: b.memory_bytes)
            freed = largest.spill()
            log.info("spilled %d bytes of in-progress transaction %d to disk", freed, largest.xid,
                     extra={"connector": self.cfg.name, "phase": self._phase})

    def _replay(self, buffer: TransactionBuffer, commit: pg.StreamCommit):
        """The committed streamed transaction's changes, as batches; the checkpoint on the last."""
        builder = self.builder
        decoder = pg.PgOutputDecoder(self.protocol)
        decoder.decode(struct.pack("!cIB", b"S", commit.xid, 1))  # its messages carry xids: open a stream block
        builder.begin(commit.xid, commit.commit_time_us)
        events: list = []
        try:
            for data_start, payload in buffer:
                if builder.unstamped and data_start:
                    events += builder.stamp(data_start)
                message = decoder.decode(payload)
                if getattr(message, "xid", None) in buffer.aborted_subxacts:  # Origin has no xid
                    continue
                events += self._changes(type(message), message, data_start) or ()
                if len(events) >= self.cfg.max_batch_events:
                    self.toast.flush()
                    yield Batch(events, None, builder.take_schema_changes())
                    events = []
            builder.end()
            self.last_commit_ms = pg.pg_time_to_unix_ms(commit.commit_time_us)
            self.toast.flush()
            yield Batch(events, PgLsn(commit.end_lsn), builder.take_schema_changes())
        finally:
            buffer.close()

    # -- shared ------------------------------------------------------------------------------------
    def _lookup_table(self, oid: int) -> TableMeta | None:
        meta = self.tables.get(oid)
        if meta is None:
            try:
                candidate = table_meta(self.conn, oid, self.database, self.cfg.key_columns)
            except psycopg2.Error as err:
                raise wrap(err, f"reading the catalog entry of relation {oid}") from err
            if not matches(candidate.id.schema, candidate.id.table, self.cfg.tables):
                return None
            log.info("new table in the publication: %s", candidate.id,
                     extra={"connector": self.cfg.name, "phase": self._phase})
            meta = self.tables[oid] = candidate
        return meta

    def _filled(self, oid: int, names: list[str]) -> dict[str, Any]:
        """The values that rows existing before columns ``names`` were added got without being
        logged: PostgreSQL keeps a constant default of ADD COLUMN as the column's "missing value"
        (``attmissingval``) instead of rewriting the table. From the catalog as it is now, so a
        later rewrite of the table (which clears it) loses it: then the sink is not told."""
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT attname, atttypid, attmissingval::text FROM pg_attribute WHERE attrelid = %s "
                            "AND atthasmissing AND NOT attisdropped AND attname = ANY(%s)", (oid, names))
                found = cur.fetchall()
            self.conn.rollback()
        except psycopg2.Error as err:
            raise wrap(err, f"reading the missing values of relation {oid}") from err
        filled = {}
        for name, type_oid, text in found:
            element = array_element(text)
            if element is not None:
                filled[name] = self._converters_for([type_oid])[0](element)
        return filled

    def _type_name(self, oid: int, modifier: int) -> str:
        name = self._type_names.get((oid, modifier))
        if name is None:
            try:
                with self.conn.cursor() as cur:
                    cur.execute("SELECT format_type(%s, %s)", (oid, modifier if modifier >= 0 else None))
                    name = self._type_names[(oid, modifier)] = cur.fetchone()[0]
                self.conn.rollback()
            except psycopg2.Error as err:
                raise wrap(err, f"naming type {oid}") from err
        return name

    def _converters_for(self, oids: list[int]) -> list[Callable[[str], Any]]:
        missing = [o for o in oids if o not in self.converters]
        if missing:
            conn = psycopg2.connect(self.dsn, options=self.options) if self.snapshot is not None else self.conn
            try:
                self.types.update(load_type_catalog(conn, [o for o in missing if o not in self.types]))
                conn.rollback()
            finally:
                if conn is not self.conn:
                    conn.close()
            for oid in missing:
                self.converters[oid] = converter_for(oid, self.types)
        return [self.converters[o] for o in oids]

    def poll(self, timeout: float) -> Batch | None:
        if self._finished or self._stopping.is_set():
            self._stopping.wait(timeout)
            return None
        if self.snapshot is not None:
            return self._poll_snapshot(timeout)
        return self._poll_stream(timeout)

    def commit(self, position: Position) -> None:
        assert isinstance(position, PgLsn)
        if self.stream is not None:
            self.stream.confirm(position.lsn)

    def stop(self) -> None:
        self._stopping.set()
        if self.snapshot is not None:
            self.snapshot.close()
            for reader in getattr(self, "_readers", []):
                reader.close()
        for resource in (self.stream, self.conn):
            if resource is not None:
                try:
                    resource.close()
                except Exception:  # noqa: BLE001 - closing on the way out
                    pass
        for buffer in self.buffers.values():
            buffer.close()
        if hasattr(self, "toast"):
            self.toast.close()
