"""``type: mysql``: MariaDB/MySQL row binlog capture, after a consistent parallel snapshot.

The lifecycle (decision, progress marker, handover) is the ``SnapshotCoordinator``'s
(snapshot/coordinator.py), which this source composes with the MySQL halves. ``prepare`` checks the server's settings and the user's
privileges and loads the captured tables' definitions; ``resume_point`` checks that the server
still has the binlog of a position (by GTID or by file); ``open_snapshot`` opens the consistent
readers (``sources/mysql/snapshot.py``); ``open_stream`` reads the binlog after a position.
``commit`` only records the position: a binlog reader holds nothing on the server (binlogs are
kept by ``binlog_expire_logs_seconds``, which must outlast any outage of the connector).

The binlog before a new snapshot stays readable, so a re-snapshot (after a crash mid-snapshot, or
``always`` over a stored position) streams from that *earlier* position, not from its own (see the
coordinator's handover rule).

Resume: by GTID position (MariaDB ``domain-server-seq``, ``@slave_connect_state``) when the
server has GTIDs and ``gtid`` is on, otherwise by binlog file and position; either way right
after the last transaction whose events the log acknowledged.

Incremental snapshots (``snapshot/incremental.py``): ``incremental.py`` writes the signal table's
rows and reads key ranges; the stream reads the signal table (``_streamed``) but no snapshot does.
``cdc verify`` reads key ranges at a binlog position through ``verify_reader.py``.

Threading: all calls on the runtime's thread; ``stop`` may come from another one.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import pymysql

from cdc.api import IncrementalSnapshotSource, TableReader, VerifiableSource
from cdc.errors import ConfigError
from cdc.events import Batch, SnapshotEnd, TableId
from cdc.positions import MySqlPosition, Position
from snapshot.coordinator import CoordinatedSource, OpenedSnapshot, SnapshotCoordinator, close_quietly, signal_snapshot
from snapshot.signals import conditions_of
from sources.mysql.binlog import BinlogConnection
from sources.mysql.catalog import (
    captured_tables,
    check_position,
    check_privileges,
    check_settings,
    connect,
    current_position,
    gtid_at,
    is_mariadb,
    json_columns,
    load_schemas,
    matches,
    server_variables,
)
from sources.mysql.changes import version_of
from sources.mysql.config import MySqlConfig
from sources.mysql.errors import wrap
from sources.mysql.incremental import ChunkReader, SignalTable, estimate_rows, filter_error
from sources.mysql.schema import SchemaTracker
from sources.mysql.snapshot import SnapshotRows, open_readers, plan_chunks
from sources.mysql.stream import BinlogStream

log = logging.getLogger(__name__)


class _Stream:
    """The binlog stream as the coordinator drives it."""

    def __init__(self, stream: BinlogStream, max_events: int) -> None:
        self.binlog, self.max_events = stream, max_events
        self.idle = False  # the last poll brought nothing (lag: MySqlSource._caught_up)

    def poll(self, timeout: float) -> Batch | None:
        batch = self.binlog.poll(self.max_events, timeout)
        self.idle = batch is None
        return batch

    def commit(self, position: Position) -> None:
        """Nothing to advance on the server."""

    @property
    def connection(self) -> BinlogConnection:
        return self.binlog.connection

    def close(self) -> None:
        self.binlog.close()


class MySqlSource(CoordinatedSource, IncrementalSnapshotSource, VerifiableSource):
    config_model = MySqlConfig
    connector = "mysql"

    def __init__(self, config: MySqlConfig, position: Position | None) -> None:
        super().__init__(config, position)
        self.coordinator = SnapshotCoordinator(self, config, position, position_types=(MySqlPosition,),
                                               position_kind="a binlog position", log=log)
        self.start_position = self.coordinator.start_position
        self.cfg = config
        # The control connection, the tables' definitions and the server's kind: set by prepare(),
        # the coordinator's first call.
        self.conn: pymysql.connections.Connection | None = None
        self.tracker: SchemaTracker | None = None
        self.dbms: str | None = None
        self._server_at: tuple[str, int] | None = None  # SHOW MASTER STATUS at the previous look
        self.signals: SignalTable | None = None  # set by prepare() where signal_table is
        self.signal_table: TableId | None = None  # its TableId (IncrementalReads)
        self.chunks = ChunkReader(config)
        self._low_at: tuple[str, int] = ("", 4)

    def lag(self) -> float | None:
        """0 when caught up with the server (see ``_caught_up``); else now minus the commit time
        of the newest change handled. Called on the polling thread, about once a second."""
        if self._caught_up():
            return 0.0
        stream = self.coordinator.stream
        binlog = stream.binlog if isinstance(stream, _Stream) else None
        if binlog is None or binlog.last_commit_ms is None:
            return None
        return max(0.0, time.time() - binlog.last_commit_ms / 1000)

    def _caught_up(self) -> bool:
        """The stream's last poll brought nothing and it has read the binlog up to where the
        server's was at the previous look (SHOW MASTER STATUS, a second ago): an idle source is
        not behind, however old its newest commit."""
        stream = self.coordinator.stream
        if not isinstance(stream, _Stream) or self.coordinator.snapshot is not None or not stream.idle:
            self._server_at = None
            return False
        before = self._server_at
        conn = self._control()
        try:
            conn.ping(reconnect=True)  # the control connection may have idled past wait_timeout
        except Exception as err:  # noqa: BLE001 - classified by wrap
            raise wrap(err, "reconnecting to read the binlog position") from err
        self._server_at = current_position(conn)
        read_to = stream.binlog.read_to
        return before is not None and read_to is not None and _binlog_key(read_to) >= _binlog_key(before)

    @classmethod
    def open_reader(cls, config: MySqlConfig) -> TableReader:
        from sources.mysql.verify_reader import MySqlTableReader  # only `cdc verify` needs it

        return MySqlTableReader(config)

    @classmethod
    def signal_snapshot(cls, config: MySqlConfig, tables: list[str], action: str = "execute",
                        where: str | None = None) -> None:
        signal_snapshot(config, tables, action, where, cls.send_signal)

    def _control(self) -> pymysql.connections.Connection:
        conn = self.conn
        assert conn is not None, "prepare() connects first"
        return conn

    def _tracked(self) -> SchemaTracker:
        tracker = self.tracker
        assert tracker is not None, "prepare() reads the definitions first"
        return tracker

    def _extra(self) -> dict:
        return {"connector": self.cfg.name, "phase": self.phase}

    def _captured(self, db: str, table: str) -> bool:
        """A table whose rows are data: snapshotted and published."""
        return matches(db, table, self.cfg.tables) and not self._is_signal_table(db, table)

    def _streamed(self, db: str, table: str) -> bool:
        """A table the stream reads: the captured ones and the signal table."""
        return matches(db, table, self.cfg.tables) or self._is_signal_table(db, table)

    def _is_signal_table(self, db: str, table: str) -> bool:
        signal = self.signal_table
        return signal is not None and (db, table) == (signal.db, signal.table)

    def _captured_tables(self) -> list[tuple[str, str]]:
        return [(db, t) for db, t in captured_tables(self.conn, self.cfg.tables) if self._captured(db, t)]

    # -- the halves the coordinator drives -------------------------------------------------------
    def prepare(self) -> None:
        cfg = self.cfg
        self.conn = connect(cfg)
        variables = server_variables(self.conn)
        check_settings(variables)
        check_privileges(self.conn)
        self.dbms = "mariadb" if is_mariadb(variables) else "mysql"
        if cfg.signal_table:
            self.signals = SignalTable(self.conn, cfg.signal_table, cfg.name)
            self.signal_table = self.signals.id
        names = self._captured_tables()
        self.tracker = SchemaTracker(self._streamed, load_schemas(self.conn, names, cfg.key_columns))
        log.info("%s %s, %d tables captured", self.dbms, variables.get("version"), len(names), extra=self._extra())

    def resume_point(self, position: Position) -> MySqlPosition:
        assert isinstance(position, MySqlPosition), "the coordinator checked it (position_types)"
        check_position(self.conn, position, self._by_gtid(position), self.cfg.name)
        return self._with_gtid(position)

    def _with_gtid(self, position: MySqlPosition) -> MySqlPosition:
        if self.dbms == "mariadb" and position.gtid_set is None:
            return dataclasses.replace(position, gtid_set=gtid_at(self.conn, position.file, position.pos))
        return position

    def _by_gtid(self, position: MySqlPosition) -> bool:
        return self.cfg.gtid and self.dbms == "mariadb" and bool(position.gtid_set)

    def captured_names(self) -> frozenset[str]:
        return frozenset(str(s.id) for s in self._tracked().tables.values() if s.id != self.signal_table)

    def open_snapshot(self, only: frozenset[str] | None = None) -> OpenedSnapshot:
        cfg = self.cfg
        readers, (file, pos), method = open_readers(cfg, cfg.snapshot_workers, self._extra())
        try:
            gtid = gtid_at(self.conn, file, pos) if self.dbms == "mariadb" else None
            consistent = MySqlPosition(file, pos, gtid)
            # The definitions read after the snapshot opened (a DDL in between is not covered).
            schemas = load_schemas(self.conn, self._captured_tables(), cfg.key_columns)
            self.tracker = SchemaTracker(self._streamed, schemas)
            if only is not None:  # a backfill: the other tables' topics are complete
                schemas = {name: s for name, s in schemas.items() if str(s.id) in only}
            chunks = plan_chunks(readers[0], list(schemas.values()), cfg.snapshot_chunk_rows)
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        version, now = version_of(consistent.file_index, pos), int(time.time() * 1000)
        rows = SnapshotRows(version, now, {"file": file, "pos": pos, "row": 0, "gtid": gtid},
                            batch=min(cfg.max_batch_events, 2048))
        return OpenedSnapshot(readers, chunks, rows.read, consistent,
                              tuple(s.change(version, now, None) for s in schemas.values()),
                              SnapshotEnd(tuple(s.id for s in schemas.values()), version), described=method)

    def open_stream(self, position: Position | None, after_snapshot: bool) -> _Stream:
        if position is None:  # snapshot: never, nothing stored: from the server's position now
            file, pos = current_position(self.conn)
            position = MySqlPosition(file, pos, gtid_at(self.conn, file, pos) if self.dbms == "mariadb" else None)
        assert isinstance(position, MySqlPosition), "the coordinator checked it (position_types)"
        tracker, dbms = self._tracked(), self.dbms
        assert dbms is not None, "prepare() asks the server first"
        if not after_snapshot:
            # Every row names its shape (cdc/schema_order.py). The catalog read at start may be
            # ahead of the resume point (DDL while the source was down), so a table's shape goes
            # out at its first table map (the binlog's columns as of there) or DDL statement,
            # before its rows, not from the catalog here (schema.py, ``defer``).
            tracker.defer()
        by_gtid = self._by_gtid(position)
        connection = BinlogConnection(self.cfg, position, by_gtid)
        stream = BinlogStream(connection, position, tracker, self._streamed, self.cfg.key_columns,
                              dbms, self._json_columns, self.cfg.name)
        log.info("streaming after %s (by %s)", position, "GTID" if by_gtid else "file and position",
                 extra=self._extra())
        return _Stream(stream, self.cfg.max_batch_events)

    def _json_columns(self, db: str, table: str) -> set[str]:
        """The catalog's JSON columns of a table the stream meets without a known definition. The
        control connection may have sat idle for hours (wait_timeout): ping it back first."""
        self._ping()
        return json_columns(self.conn, db, table)

    def _ping(self) -> None:
        """The control connection may have sat idle past wait_timeout: reconnect it if so."""
        try:
            self._control().ping(reconnect=True)
        except Exception as err:  # noqa: BLE001 - classified by wrap
            raise wrap(err, "reconnecting to the server") from err

    def write_signal(self, signal_id: str, kind: str, data: dict) -> int:
        assert self.signals is not None, "signals are written only with a signal_table (prepare() opened it)"
        version, file, pos = self.signals.write(signal_id, kind, data)
        self._low_at = (file, pos)  # the source block of the chunk read next
        return version

    def chunk_readable(self) -> bool:
        """The binlog is in commit order: a read after the low watermark sees all before it."""
        return True

    @classmethod
    def send_signal(cls, config: MySqlConfig, signal_id: str, kind: str, data: dict) -> None:
        conn = connect(config)
        try:
            for table, where in (conditions_of(data) or {}).items():  # refused here, not in the daemon's log
                db, name = table.split(".", 1)
                refused = filter_error(conn, TableId(db, None, name), where)
                if refused is not None:
                    raise ConfigError(f"source {config.name}: the condition {where!r} on {table} is refused: {refused}")
            assert config.signal_table, "signal_snapshot checked it"
            SignalTable(conn, config.signal_table, config.name).write(signal_id, kind, data)
        finally:
            close_quietly(conn)

    def _schema_of(self, table: str):
        return next(s for s in self._tracked().tables.values() if str(s.id) == table)

    def read_chunk(self, table: str, after: tuple | None, size: int, version: int, where: str | None = None) -> list:
        file, pos = self._low_at
        return self.chunks.read(self._schema_of(table), after, size, version, file, pos, where)

    def filter_error(self, table: str, where: str) -> str | None:
        self._ping()
        return filter_error(self.conn, self._schema_of(table).id, where)

    def estimate_rows(self, table: str) -> int | None:
        self._ping()
        return estimate_rows(self.conn, self._schema_of(table).id)

    def release(self) -> None:
        self.chunks.close()
        close_quietly(self.conn)


def _binlog_key(at: tuple[str, int]) -> tuple[int, int]:
    """(binlog file, position) in the server's order: the file's numeric suffix, then the position."""
    file, pos = at
    return int(file.rsplit(".", 1)[-1]), pos
