"""``type: mysql``: MariaDB/MySQL row binlog capture, after a consistent parallel snapshot.

Lifecycle (see cdc.api): ``start`` checks the server's settings and the user's privileges,
loads the captured tables' definitions and decides from the snapshot mode and the stored position
whether to snapshot or to stream; ``poll`` returns snapshot batches, then streamed ones;
``commit`` only records the position: a binlog reader holds nothing on the server (binlogs are
kept by ``binlog_expire_logs_seconds``, which must outlast any outage of the connector).

Snapshot decision (as the PostgreSQL source):
  no stored position       initial / initial_only / when_needed / always: a consistent snapshot,
                           then streaming from its binlog position; never: streaming from the
                           server's current position
  stored position          always: a new snapshot; initial_only: nothing left to do; otherwise
                           streaming from it, unless the server purged the binlog it needs: then
                           when_needed takes a new snapshot, the others stop with PositionLostError
  stored snapshot marker   a snapshot that did not finish: a new one (never: streaming from it)

Handover: before the first snapshot row goes out, the source stores a ``SnapshotProgress``
marker holding where streaming will start (the runtime stores it; ``poll`` waits for the
``commit``). A re-snapshot (after a crash mid-snapshot, or ``always`` over a stored position)
streams from that *earlier* position, not from its own: the topics may hold rows of the earlier
attempt, and only the changes in between (deletes above all) bring those rows up to date.
Replayed changes carry lower versions than the new snapshot's rows, so sinks, which keep the
highest version per key, end with the newer row; a delete in between removes a row the new
snapshot no longer has. Where that earlier binlog is gone, streaming starts at the new snapshot
and the log says that rows deleted meanwhile may linger.

Resume: by GTID position (MariaDB ``domain-server-seq``, ``@slave_connect_state``) when the
server has GTIDs and ``gtid`` is on, otherwise by binlog file and position; either way right
after the last transaction whose events the log acknowledged.

Threading: all calls on the runtime's thread; ``stop`` may come from another one. Snapshot
readers are threads of their own (snapshot/parallel.py).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from cdc.api import SnapshotMode, Source
from cdc.errors import CdcError, PermanentError, PositionLostError
from cdc.events import Batch, SnapshotEnd, SnapshotMarker
from cdc.positions import MySqlPosition, Position, SnapshotProgress
from snapshot.parallel import ParallelSnapshot
from sources.mysql.binlog import BinlogConnection
from sources.mysql.catalog import (captured_tables, check_position, check_privileges, check_settings, connect,
                                   current_position, gtid_at, is_mariadb, json_columns, load_schemas, matches,
                                   server_variables)
from sources.mysql.changes import version_of
from sources.mysql.config import MySqlConfig
from sources.mysql.errors import wrap
from sources.mysql.schema import SchemaTracker
from sources.mysql.snapshot import SnapshotRows, open_readers, plan_chunks
from sources.mysql.stream import BinlogStream

log = logging.getLogger(__name__)


class MySqlSource(Source):
    config_model = MySqlConfig
    connector = "mysql"

    def __init__(self, config: MySqlConfig, position: Position | None) -> None:
        super().__init__(config, position)
        if position is not None and not isinstance(position, (MySqlPosition, SnapshotProgress)):
            raise PermanentError(f"source {config.name}: stored position {position} is not a binlog position "
                                 "(was the source's type changed? reset its offset)")
        self.cfg = config
        self._phase = "starting"
        self._finished = False
        self._stopping = threading.Event()
        self.conn = None
        self.stream: BinlogStream | None = None
        self.snapshot: ParallelSnapshot | None = None
        self._readers: list = []
        self._held = None                 # the newest snapshot event, held back to mark the last one
        self._pending_changes: tuple = ()  # schema records for the next batch
        self._snapshot_end: SnapshotEnd | None = None
        self.acknowledged: Position | None = position
        self._idle = False  # the stream's last poll brought nothing (lag: see _caught_up)
        self._server_at: tuple[str, int] | None = None  # SHOW MASTER STATUS at the previous look

    def _extra(self) -> dict:
        return {"connector": self.cfg.name, "phase": self._phase}

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
        if self.stream is None or self.stream.last_commit_ms is None:
            return None
        return max(0.0, time.time() - self.stream.last_commit_ms / 1000)

    def _caught_up(self) -> bool:
        """The stream's last poll brought nothing and it has read the binlog up to where the
        server's was at the previous look (SHOW MASTER STATUS, a second ago): an idle source is
        not behind, however old its newest commit."""
        if self.stream is None or self.snapshot is not None or not self._idle:
            self._server_at = None
            return False
        before = self._server_at
        try:
            self.conn.ping(reconnect=True)  # the control connection may have idled past wait_timeout
        except Exception as err:  # noqa: BLE001 - classified by wrap
            raise wrap(err, "reconnecting to read the binlog position") from err
        self._server_at = current_position(self.conn)
        read_to = self.stream.read_to
        return before is not None and read_to is not None and _binlog_key(read_to) >= _binlog_key(before)

    def _captured(self, db: str, table: str) -> bool:
        return matches(db, table, self.cfg.tables)

    def start(self) -> None:
        cfg = self.cfg
        self.conn = connect(cfg)
        variables = server_variables(self.conn)
        check_settings(variables)
        check_privileges(self.conn)
        self.dbms = "mariadb" if is_mariadb(variables) else "mysql"
        names = captured_tables(self.conn, cfg.tables)
        self.tracker = SchemaTracker(self._captured, load_schemas(self.conn, names, cfg.key_columns))
        log.info("%s %s, %d tables captured", self.dbms, variables.get("version"), len(names), extra=self._extra())
        self._decide()

    def _decide(self) -> None:
        cfg, stored, mode = self.cfg, self.start_position, self.cfg.snapshot
        if isinstance(stored, SnapshotProgress):
            # A snapshot began (its marker was stored before any of its rows went out) and never
            # finished: take it again, and stream from where the first attempt was consistent.
            if mode is SnapshotMode.NEVER:
                self._stream_from_stored(stored.at)
            else:
                log.info("the snapshot consistent at %s did not finish: taking it again", stored.at,
                         extra=self._extra())
                self._start_snapshot(since=stored.at)
            return
        if mode is SnapshotMode.ALWAYS or (stored is None and mode is not SnapshotMode.NEVER):
            self._start_snapshot(since=stored)
            return
        if stored is not None and mode is SnapshotMode.INITIAL_ONLY:
            self._phase, self._finished = "finished", True
            return
        if stored is None:  # snapshot: never
            file, pos = current_position(self.conn)
            position = MySqlPosition(file, pos, gtid_at(self.conn, file, pos) if self.dbms == "mariadb" else None)
            version, now = version_of(position.file_index, pos), int(time.time() * 1000)
            self._pending_changes = tuple(s.change(version, now, None) for s in self.tracker.tables.values())
            self._start_stream(position)
            return
        self._stream_from_stored(stored)

    def _stream_from_stored(self, position: MySqlPosition) -> None:
        try:
            check_position(self.conn, position, self._by_gtid(position), self.cfg.name)
        except PositionLostError:
            if self.cfg.snapshot is not SnapshotMode.WHEN_NEEDED:
                raise
            log.warning("the binlog of the stored position %s is gone: taking a new snapshot", position,
                        extra=self._extra())
            self._start_snapshot(since=None)
            return
        # Every row names its shape (cdc/schema_order.py): the shapes as of the resume point go
        # out first, with its version, below every row the stream sends from there. They are the
        # catalog's (as the decoder's are) until the stream reaches a DDL, which publishes its own.
        version, now = version_of(position.file_index, position.pos), int(time.time() * 1000)
        self._pending_changes = tuple(s.change(version, now, None) for s in self.tracker.tables.values())
        self._start_stream(self._with_gtid(position))

    def _with_gtid(self, position: MySqlPosition) -> MySqlPosition:
        if self.dbms == "mariadb" and position.gtid_set is None:
            return dataclasses.replace(position, gtid_set=gtid_at(self.conn, position.file, position.pos))
        return position

    def _by_gtid(self, position: MySqlPosition) -> bool:
        return self.cfg.gtid and self.dbms == "mariadb" and bool(position.gtid_set)

    # -- snapshot --------------------------------------------------------------------------------
    def _start_snapshot(self, since: MySqlPosition | None) -> None:
        """``since``: where the topics may already be (a stored position, or an unfinished snapshot's);
        streaming resumes there rather than at the new snapshot, so that changes in between (deletes
        above all) reach rows an earlier attempt already published."""
        cfg = self.cfg
        self._phase = "snapshot"
        if since is not None:
            try:
                check_position(self.conn, since, self._by_gtid(since), cfg.name)
                since = self._with_gtid(since)
            except PositionLostError as err:
                log.warning("%s; streaming will start at the new snapshot: rows deleted since then may stay in "
                            "the topics until they are reset", err, extra=self._extra())
                since = None
        readers, (file, pos), method = open_readers(cfg, cfg.snapshot_workers, self._extra())
        self._readers = readers
        try:
            gtid = gtid_at(self.conn, file, pos) if self.dbms == "mariadb" else None
            self.consistent = MySqlPosition(file, pos, gtid)
            # The definitions read after the snapshot opened (a DDL in between is not covered).
            schemas = load_schemas(self.conn, captured_tables(self.conn, cfg.tables), cfg.key_columns)
            self.tracker = SchemaTracker(self._captured, schemas)
            chunks = plan_chunks(readers[0], list(schemas.values()), cfg.snapshot_chunk_rows)
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        self.stream_from = since or self.consistent
        # Stored before any row goes out (``_poll_snapshot`` waits for its commit): a crash from
        # now on restarts the snapshot and streams from ``stream_from``.
        self._progress = SnapshotProgress(self.stream_from)
        self._progress_stored = self.start_position == self._progress
        self._progress_sent = False
        version, now = version_of(self.consistent.file_index, pos), int(time.time() * 1000)
        rows = SnapshotRows(version, now, {"file": file, "pos": pos, "row": 0, "gtid": gtid},
                            batch=min(cfg.max_batch_events, 2048))
        self._pending_changes = tuple(s.change(version, now, None) for s in schemas.values())
        self._snapshot_end = SnapshotEnd(tuple(s.id for s in schemas.values()), version)
        self.snapshot = ParallelSnapshot(readers, chunks, rows.read, name=f"{cfg.name}-snapshot")
        self._snapshot_rows = 0
        log.info("snapshot of %d tables in %d chunks, consistent at %s, %d readers (%s); streaming will start "
                 "after %s", len(schemas), len(chunks), self.consistent, len(readers), method, self.stream_from,
                 extra=self._extra())

    def _poll_snapshot(self, timeout: float) -> Batch | None:
        if not self._progress_stored:
            if not self._progress_sent:
                self._progress_sent = True
                return self._with_changes(Batch([], self._progress))
            self._stopping.wait(min(timeout, 0.05))  # until the runtime stored the marker
            return None
        try:
            events = self.snapshot.next_batch(timeout)
        except StopIteration:
            return self._finish_snapshot()
        if events is None:
            return None
        self._snapshot_rows += len(events)
        out = ([self._held] if self._held is not None else []) + events[:-1]
        self._held = events[-1]
        return self._with_changes(Batch(out)) if out else None

    def _finish_snapshot(self) -> Batch:
        self.snapshot.close()
        for reader in self._readers:
            reader.close()
        self.snapshot, self._readers = None, []
        events = []
        if self._held is not None:
            events.append(self._held._replace(snapshot=SnapshotMarker.LAST))
            self._held = None
        log.info("snapshot done: %d rows; streaming from %s", self._snapshot_rows, self.consistent,
                 extra=self._extra())
        if self.cfg.snapshot is SnapshotMode.INITIAL_ONLY:
            self._phase, self._finished = "finished", True
        else:
            self._start_stream(self.stream_from)
        return self._with_changes(Batch(events, self.stream_from, snapshot_end=self._snapshot_end))

    def _with_changes(self, batch: Batch) -> Batch:
        changes, self._pending_changes = self._pending_changes, ()
        return batch.with_schema_changes(changes)

    # -- streaming -------------------------------------------------------------------------------
    def _start_stream(self, position: MySqlPosition) -> None:
        by_gtid = self._by_gtid(position)
        connection = BinlogConnection(self.cfg, position, by_gtid)
        self.stream = BinlogStream(connection, position, self.tracker, self._captured, self.cfg.key_columns,
                                   self.dbms, self._json_columns, self.cfg.name)
        self._phase = "streaming"
        log.info("streaming after %s (by %s)", position, "GTID" if by_gtid else "file and position",
                 extra=self._extra())

    def _json_columns(self, db: str, table: str) -> set[str]:
        """The catalog's JSON columns of a table the stream meets without a known definition. The
        control connection may have sat idle for hours (wait_timeout): ping it back first."""
        try:
            self.conn.ping(reconnect=True)
        except Exception as err:  # noqa: BLE001 - classified by wrap
            raise wrap(err, "reconnecting to read the catalog") from err
        return json_columns(self.conn, db, table)

    def poll(self, timeout: float) -> Batch | None:
        if self._finished or self._stopping.is_set():
            self._stopping.wait(timeout)
            return None
        if self.snapshot is not None:
            return self._poll_snapshot(timeout)
        if self._pending_changes:
            return self._with_changes(Batch([]))
        try:
            batch = self.stream.poll(self.cfg.max_batch_events, timeout)
            self._idle = batch is None
            return batch
        except CdcError:
            if self._stopping.is_set():
                return None
            raise

    def commit(self, position: Position) -> None:
        """Nothing to advance on the server; a stored snapshot marker lets the snapshot's rows go."""
        if isinstance(position, SnapshotProgress):
            self._progress_stored = True
        self.acknowledged = position

    def stop(self) -> None:
        self._stopping.set()
        if self.snapshot is not None:
            self.snapshot.close()
        for reader in self._readers:
            reader.close()
        if self.stream is not None:
            self.stream.close()
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - closing on the way out
                pass


def _binlog_key(at: tuple[str, int]) -> tuple[int, int]:
    """(binlog file, position) in the server's order: the file's numeric suffix, then the position."""
    file, pos = at
    return int(file.rsplit(".", 1)[-1]), pos
