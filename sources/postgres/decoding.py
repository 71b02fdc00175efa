"""The streaming half of the PostgreSQL source: pgoutput messages from the slot, into batches.

Each message type has one handler (``_data`` for rows and relations, ``_control`` for the rest),
so adding a message type is adding a row to a table, not a branch to a chain. A batch's checkpoint
is the end LSN of the last transaction it completes (or a heartbeat's LSN between transactions).
Large transactions streamed while in progress (protocol >= 2) are buffered per xid (spilled to
disk past ``memory_budget_mb``) and replayed as batches once committed.

``commit`` confirms an LSN to the slot: the only place the server is told it may drop WAL.

Threading: the source's thread only.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2

from cdc.events import Batch
from cdc.positions import PgLsn, Position
from sources.postgres import pgoutput as pg
from sources.postgres.changes import ChangeBuilder
from sources.postgres.config import PostgresConfig
from sources.postgres.deadline import answer_within
from sources.postgres.errors import SlotOverBudget, wrap
from sources.postgres.lookup import CatalogLookup
from sources.postgres.slots import RetainedWal, drop_released_slot, human_bytes
from sources.postgres.stream import ReplicationStream, TransactionBuffer
from sources.postgres.toast import ToastStore

log = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "cdc-heartbeat"


class LogicalStream:
    def __init__(self, config: PostgresConfig, transport: ReplicationStream, conn, builder: ChangeBuilder,
                 lookup: CatalogLookup, toast: ToastStore, protocol: int, slot: str, spill_dir: Path,
                 on_commit: Callable[[int], None] = lambda lsn: None) -> None:
        self.cfg, self.transport, self.conn, self.builder = config, transport, conn, builder
        self.on_commit = on_commit  # told each LSN stored, before the server is (relations.py)
        self.lookup, self.toast, self.protocol, self.slot, self.spill_dir = lookup, toast, protocol, slot, spill_dir
        self.decoder = pg.PgOutputDecoder(protocol)
        self.wal_watch = RetainedWal(config.name, slot, config.max_retained_wal, config.wal_check_interval,
                                     config.on_retained_wal)
        self.last_commit_ms: int | None = None
        self.last_activity = time.monotonic()
        self.buffers: dict[int, TransactionBuffer] = {}
        self.stream_xid: int | None = None  # the xid of the streamed transaction being received
        self.replay = None  # an iterator of Batches replaying a committed streamed transaction
        self.inbox: deque = deque()  # messages read and not yet handled
        self._idle = False  # the last read brought nothing (see caught_up)
        self._server_lsn: int | None = None  # pg_current_wal_lsn() at the previous look
        self._checkpoint: PgLsn | None = None
        self._data: dict[type, Callable[[Any, int], list]] = {
            pg.Insert: builder.insert, pg.Update: builder.update, pg.Delete: builder.delete,
            pg.Truncate: builder.truncate, pg.Relation: self._relation,
        }
        self._control: dict[type, Callable[[Any], None]] = {
            pg.Begin: self._begin, pg.Commit: self._commit, pg.Message: self._message, pg.Type: self._type,
            pg.StreamStart: self._stream_start, pg.StreamStop: self._stream_stop,
            pg.StreamAbort: self._stream_abort, pg.StreamCommit: self._stream_commit,
        }

    def _extra(self) -> dict:
        return {"connector": self.cfg.name, "phase": "streaming"}

    # -- the Stream contract -----------------------------------------------------------------------
    def poll(self, timeout: float) -> Batch | None:
        if self.wal_watch.due():
            what = f"measuring the WAL slot {self.slot} retains"
            try:
                with answer_within(self.conn, self.cfg.server_timeout, what):
                    above = self.wal_watch.measure(self.conn, "streaming")
            except psycopg2.Error as err:
                raise wrap(err, what) from err
            if above and self.cfg.on_retained_wal == "drop":
                self._drop_slot_over_budget()
        if self.replay is not None:
            batch = next(self.replay, None)
            if batch is not None:
                return batch
            self.replay = None
        inbox = self.inbox
        caught_up = False
        if not inbox:
            inbox.extend(self.transport.read(self.cfg.max_batch_events, timeout))
            self._idle = not inbox
            caught_up = len(inbox) < self.cfg.max_batch_events  # the read emptied what the server sent
            if not inbox:
                if time.monotonic() - self.last_activity >= self.cfg.heartbeat_interval:
                    self._heartbeat()
                return None
            self.last_activity = time.monotonic()
        builder, decode, data, control = self.builder, self.decoder.decode, self._data, self._control
        events: list = []
        self._checkpoint = None
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
                if isinstance(message, pg.Relation):
                    builder.on_relation(message, data_start)
                continue
            handle = data.get(kind)
            if handle is not None:
                events += handle(message, data_start)
                continue
            on_control = control.get(kind)
            if on_control is not None:
                on_control(message)
                if self.replay is not None:  # a streamed transaction committed: what came before goes first
                    self.toast.flush()
                    return Batch(events, self._checkpoint, builder.take_schema_changes())
        self.toast.flush()
        schema_changes = builder.take_schema_changes()
        if events or self._checkpoint is not None or schema_changes:
            return Batch(events, self._checkpoint, schema_changes, caught_up=caught_up)
        return None

    def commit(self, position: Position) -> None:
        assert isinstance(position, PgLsn)
        self.on_commit(position.lsn)
        self.transport.confirm(position.lsn)

    def close(self) -> None:
        try:
            self.transport.close()
        finally:
            for buffer in self.buffers.values():
                buffer.close()

    @property
    def silence(self):
        """The transport's watch on a server that stopped talking (sources/postgres/deadline.py)."""
        return self.transport.silence

    def caught_up(self) -> bool:
        """Nothing waits here, the last read brought nothing, and the server has sent us its WAL
        up to where it was at the previous look (``pg_current_wal_lsn()``, a second ago): an
        idle source is not behind, however old its newest commit. A large write to a table not
        captured keeps the server ahead of what it sent, so that is lag, rightly. Called on the
        polling thread (it uses the same connection as the heartbeats)."""
        if not (self._idle and not self.inbox and self.replay is None and not self.buffers):
            self._server_lsn = None
            return False
        before = self._server_lsn
        what = "reading the server's WAL position"
        try:
            with answer_within(self.conn, self.cfg.server_timeout, what):
                with self.conn.cursor() as cur:
                    cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
                    self._server_lsn = int(cur.fetchone()[0])
                self.conn.commit()
        except psycopg2.Error as err:
            raise wrap(err, what) from err
        return before is not None and self.transport.wal_end >= before

    def retained_bytes(self) -> int | None:
        return self.wal_watch.bytes

    # -- handlers ----------------------------------------------------------------------------------
    def _relation(self, message: pg.Relation, data_start: int) -> list:
        self.builder.on_relation(message, data_start)
        return []

    def _begin(self, message: pg.Begin) -> None:
        self.builder.begin(message.xid, message.commit_time_us)

    def _commit(self, message: pg.Commit) -> None:
        self.builder.end()
        self._checkpoint = PgLsn(message.end_lsn)
        self.last_commit_ms = pg.pg_time_to_unix_ms(message.commit_time_us)

    def _message(self, message: pg.Message) -> None:
        if not message.transactional and message.prefix == HEARTBEAT_PREFIX and self.builder.xid is None:
            self._checkpoint = PgLsn(message.lsn)

    def _type(self, message: pg.Type) -> None:
        self.lookup.forget_type(message.oid)

    def _stream_start(self, message: pg.StreamStart) -> None:
        self.stream_xid = message.xid
        if message.xid not in self.buffers:
            self.buffers[message.xid] = TransactionBuffer(message.xid, self.spill_dir)

    def _stream_stop(self, message: pg.StreamStop) -> None:
        self.stream_xid = None
        self._keep_within_budget()

    def _stream_abort(self, message: pg.StreamAbort) -> None:
        buffer = self.buffers.get(message.xid)
        if buffer is None:
            return
        if message.subxid == message.xid:
            buffer.close()
            del self.buffers[message.xid]
        else:
            buffer.aborted_subxacts.add(message.subxid)

    def _stream_commit(self, message: pg.StreamCommit) -> None:
        self.replay = self._replay(self.buffers.pop(message.xid), message)

    # -- helpers -----------------------------------------------------------------------------------
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

    def _drop_slot_over_budget(self) -> None:
        """``on_retained_wal: drop``: give the slot up so the server frees the WAL it holds, and
        raise ``SlotOverBudget`` (a PositionLostError: the coordinator takes a new snapshot)."""
        retained, budget = human_bytes(self.wal_watch.bytes), human_bytes(self.cfg.max_retained_wal)
        log.warning("slot %s retains %s of WAL, above max_retained_wal (%s): dropping it (on_retained_wal: drop); "
                    "a new snapshot follows", self.slot, retained, budget, extra=self._extra())
        self.transport.close()  # the slot stays active while our walsender holds it
        what = f"dropping slot {self.slot}"
        try:
            with answer_within(self.conn, self.cfg.server_timeout, what):
                drop_released_slot(self.conn, self.slot, self.cfg.server_timeout)
        except psycopg2.Error as err:
            raise wrap(err, what) from err
        raise SlotOverBudget(f"source {self.cfg.name}: replication slot {self.slot} retained {retained} of WAL, above "
                             f"max_retained_wal ({budget}), and was dropped (on_retained_wal: drop); changes after "
                             "the last confirmed position are read by a new snapshot (snapshot: when_needed)")

    def _keep_within_budget(self) -> None:
        budget = self.cfg.memory_budget_mb << 20
        while sum(b.memory_bytes for b in self.buffers.values()) > budget:
            largest = max(self.buffers.values(), key=lambda b: b.memory_bytes)
            freed = largest.spill()
            log.info("spilled %d bytes of in-progress transaction %d to disk", freed, largest.xid,
                     extra=self._extra())

    def _replay(self, buffer: TransactionBuffer, commit: pg.StreamCommit):
        """The committed streamed transaction's changes, as batches; the checkpoint on the last."""
        builder, data = self.builder, self._data
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
                handle = data.get(type(message))
                if handle is not None:
                    events += handle(message, data_start)
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
