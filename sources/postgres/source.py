"""``type: postgres``: logical replication with pgoutput, after a consistent parallel snapshot.

The lifecycle (decision, progress marker, handover) is the ``SnapshotCoordinator``'s
(snapshot/coordinator.py), which this source composes with the PostgreSQL halves below:

  slot.py             the replication slot: name, state, taking it back from a dead process,
                      dropping and creating it; whether a stored LSN can still be streamed from
  snapshot_open.py    the snapshot half: a fresh slot with an exported snapshot, readers in it
                      (snapshot.py reads the chunks; copy_json.py makes their row JSON from
                      the plain COPY text where _copyjson.c is built)
  decoding.py         the streaming half: pgoutput messages into batches; ``commit`` confirms an
                      LSN to the slot, the only place the server is told it may drop WAL
  lookup.py           what the stream looks up in the catalog (tables, types, missing values)
  incremental.py      incremental snapshots' half: the signal table, waiting out older
                      transactions after a low watermark, reading a key range
  verify_reader.py    ``cdc verify``'s half: key ranges read at a known WAL position

``prepare`` checks the server, resolves the captured tables, makes sure the publication covers
them and takes back a slot a dead process of this connector still holds. A new snapshot always
creates the slot anew, so the WAL before it is gone: streaming after a snapshot starts at its
consistent point (``keeps_log_before_snapshot = False``); rows a repeated snapshot no longer has
are deleted by the runtime (cdc/runtime/stale_rows.py).

Threading: all calls on the runtime's thread; ``stop`` may come from another one. Snapshot
readers are threads of their own (snapshot/parallel.py).
"""

from __future__ import annotations

import logging
import time

import psycopg2
import psycopg2.extensions

from cdc.api import (
    IncrementalSnapshotSource,
    SlotDrop,
    SlotListing,
    SlotOwningSource,
    SourceConfig,
    TableReader,
    VerifiableSource,
    servers,
)
from cdc.errors import ConfigError
from cdc.events import TableId
from cdc.positions import PgLsn, Position
from snapshot.coordinator import CoordinatedSource, OpenedSnapshot, SnapshotCoordinator, close_quietly, signal_snapshot
from snapshot.signals import conditions_of
from sources.postgres.catalog import TableMeta, captured_tables, check_readable, check_server, ensure_publication
from sources.postgres.changes import ChangeBuilder
from sources.postgres.config import PostgresConfig
from sources.postgres.deadline import with_connect_timeout
from sources.postgres.decoding import LogicalStream
from sources.postgres.errors import wrap
from sources.postgres.incremental import SignalTable, estimate_rows, filter_error, read_chunk, signal_table_id
from sources.postgres.lookup import CatalogLookup
from sources.postgres.relations import RelationMemory
from sources.postgres.slot import ReplicationSlot
from sources.postgres.slots import list_slots, plan_drop
from sources.postgres.snapshot_open import open_snapshot
from sources.postgres.stream import ReplicationStream
from sources.postgres.toast import ToastStore
from sources.postgres.types import session_options

log = logging.getLogger(__name__)


class PostgresSource(CoordinatedSource, IncrementalSnapshotSource, SlotOwningSource, VerifiableSource):
    config_model = PostgresConfig
    connector = "postgresql"

    def __init__(self, config: PostgresConfig, position: Position | None) -> None:
        super().__init__(config, position)
        # A snapshot creates the slot anew: the WAL before it is gone (keeps_log_before_snapshot).
        self.coordinator = SnapshotCoordinator(self, config, position, position_types=(PgLsn,),
                                               position_kind="a PostgreSQL LSN", keeps_log_before_snapshot=False,
                                               log=log)
        self.start_position = self.coordinator.start_position
        self.cfg = config
        # A server that hangs must not hang the connect either (see deadline.py).
        self.dsn = with_connect_timeout(config.dsn.get_secret_value(), config.server_timeout)
        self.options = session_options()
        self.app_name = f"cdc-{config.name}"[:63]
        self.setting = servers.setting_of("source", config.name, "dsn")  # named by errors that a setting can fix
        self.role: str | None = servers.postgres.role_of(self.dsn)     # the server's current_user once connected
        self.toast = ToastStore(config.state_dir / config.name / "toast.db")
        # Which OID each table was, across restarts (a drop and re-create while down; relations.py).
        self.relations = RelationMemory(config.state_dir / config.name / "relations.json")
        self.tables: dict[int, TableMeta] = {}
        self.conn: psycopg2.extensions.connection | None = None
        self.slot: ReplicationSlot | None = None     # set by prepare(), with the connection
        self.lookup: CatalogLookup | None = None
        self.protocol: int | None = None
        self.signals: SignalTable | None = None      # set by prepare() where signal_table is
        self.signal_table: TableId | None = None     # its TableId (IncrementalReads)

    @property
    def slot_name(self) -> str | None:
        return None if self.slot is None else self.slot.name

    def lag(self) -> float | None:
        """0 when caught up with the server (``LogicalStream.caught_up``); else now minus the
        commit time of the newest change handled. Called on the polling thread, about once a second."""
        stream = self.coordinator.stream
        if not isinstance(stream, LogicalStream):  # None: not streaming
            return None
        if self.coordinator.snapshot is None and stream.caught_up():
            return 0.0
        if stream.last_commit_ms is None:
            return None
        return max(0.0, time.time() - stream.last_commit_ms / 1000)

    def retained_log_bytes(self) -> int | None:
        stream = self.coordinator.stream
        return stream.retained_bytes() if isinstance(stream, LogicalStream) else None

    def _prepared(self) -> tuple[psycopg2.extensions.connection, ReplicationSlot, CatalogLookup, int]:
        """The connection, slot, catalog and protocol version prepare() set up (the coordinator's
        first call)."""
        conn, slot, lookup, protocol = self.conn, self.slot, self.lookup, self.protocol
        assert conn is not None and slot is not None and lookup is not None and protocol is not None, \
            "prepare() comes first"
        return conn, slot, lookup, protocol

    # -- capabilities ------------------------------------------------------------------------------
    @classmethod
    def signal_snapshot(cls, config: PostgresConfig, tables: list[str], action: str = "execute",
                        where: str | None = None) -> None:
        signal_snapshot(config, tables, action, where, cls.send_signal)

    @classmethod
    def open_reader(cls, config: PostgresConfig) -> TableReader:
        from sources.postgres.verify_reader import PgTableReader  # only `cdc verify` needs it

        return PgTableReader(config)

    @classmethod
    def list_slots(cls, configs, timeout: float) -> SlotListing:
        return list_slots(configs, timeout)

    @classmethod
    def plan_drop(cls, config: SourceConfig, timeout: float) -> SlotDrop:
        assert isinstance(config, PostgresConfig), "the runtime hands a source its own config_model"
        return plan_drop(config, timeout)

    # -- the halves the coordinator drives -------------------------------------------------------
    def prepare(self) -> None:
        cfg, setting = self.cfg, self.setting
        self.conn = conn = servers.postgres.connect(self.dsn, what=f"source {cfg.name}: connecting", setting=setting,
                                                    options=self.options, application_name=self.app_name)
        try:
            check_server(conn)
            with conn.cursor() as cur:
                cur.execute("SELECT current_database(), current_setting('server_version_num')::int, current_user")
                database, version, self.role = cur.fetchall()[0]  # one row
            conn.rollback()
            tables = captured_tables(conn, cfg.tables, database, cfg.key_columns)
            signal_meta = []
            if cfg.signal_table:
                self.signal_table = signal_table_id(cfg.signal_table, database)
                self.signals = SignalTable(self.conn, self.signal_table, cfg.key_columns, cfg.server_timeout,
                                           cfg.name)
                signal_meta = [self.signals.meta]
                tables = [t for t in tables if t.id != self.signal_table]  # its rows are signals, not data
            self.tables.update({t.oid: t for t in tables})
            check_readable(self.conn, tables)
            ensure_publication(self.conn, cfg.publication_name, cfg.tables, tables + signal_meta,
                               cfg.manage_publication, created_by=cfg.name)
            self.slot = ReplicationSlot(cfg, self.conn, database, version, self.dsn, self.options, self.app_name,
                                        setting)
        except psycopg2.Error as err:
            raise wrap(err, f"source {cfg.name}: preparing capture", setting=setting, role=self.role) from err
        self.protocol = cfg.protocol_version or (4 if version >= 160000 else 3 if version >= 150000
                                                 else 2 if version >= 140000 else 1)
        self.lookup = CatalogLookup(cfg, self.conn, database, self.tables, self.dsn, self.options,
                                    in_snapshot=lambda: self.coordinator.snapshot is not None,
                                    phase=lambda: self.phase)
        if self.signals is not None:  # streamed like a captured table, but never snapshotted
            self.lookup.extra_tables[self.signals.meta.oid] = self.signals.meta
        try:
            self.slot.take_back()
        except psycopg2.Error as err:  # e.g. the server restarting while the slot is looked up
            raise wrap(err, f"source {cfg.name}: deciding between snapshot and stream", setting=setting,
                       role=self.role) from err

    def resume_point(self, position: Position) -> PgLsn:
        assert isinstance(position, PgLsn), "the coordinator checked it (position_types)"
        _, slot, _, _ = self._prepared()
        try:
            resumable = slot.check_resumable(position)
            slot.match_failover()
            return resumable
        except psycopg2.Error as err:
            raise wrap(err, f"source {self.cfg.name}: looking up slot {slot.name}", setting=self.setting,
                       role=self.role) from err

    def captured_names(self) -> frozenset[str]:
        return frozenset(str(t.id) for t in self.tables.values())

    def open_snapshot(self, only: frozenset[str] | None = None) -> OpenedSnapshot:
        conn, slot, lookup, _ = self._prepared()
        tables = [t for t in self.tables.values() if only is None or str(t.id) in only]
        try:
            opened = open_snapshot(self.cfg, conn, slot, tables, lookup, self.toast, backfill=only is not None)
        except psycopg2.Error as err:
            raise wrap(err, f"source {self.cfg.name}: opening the snapshot", setting=self.setting,
                       role=self.role) from err
        consistent = opened.consistent
        assert isinstance(consistent, PgLsn), "open_snapshot gives the slot's LSN"
        columns = lookup.all_attnums([t.oid for t in tables])
        for table in tables:  # the snapshot reads these relations as of its consistent point
            self.relations.seen(table.id, table.oid, consistent.lsn)
            self.relations.shaped(table.id, table.oid, columns.get(table.oid, {}), consistent.lsn)
        return opened

    def open_stream(self, position: Position | None, after_snapshot: bool) -> LogicalStream:
        cfg = self.cfg
        conn, slot, lookup, protocol = self._prepared()
        if position is None:  # snapshot: never, nothing stored: the slot as it is (made now if missing)
            try:
                if slot.state() is None:
                    slot.create(export=False)
            except psycopg2.Error as err:
                raise wrap(err, f"source {cfg.name}: creating slot {slot.name}", setting=self.setting,
                           role=self.role) from err
            position = PgLsn(0)
        assert isinstance(position, PgLsn), "the coordinator checked it (position_types)"
        builder = ChangeBuilder(slot.database, lookup.table, lookup.converters_for, self.toast,
                                lookup.type_name, lookup.filled,
                                lookup.attnums)
        builder.oids.update(self.relations.known(slot.database))
        # The captured tables' columns as of the stored position (relations.py), else as they are
        # now: a column renamed before the table's first Relation message of this session, even
        # while the source was down, is then told from a dropped one (changes.py, _renamed).
        builder.column_ids.update(lookup.all_attnums(list(self.tables)))
        builder.column_ids.update(self.relations.columns())
        builder.on_oid = self.relations.seen
        builder.on_columns = self.relations.shaped
        builder.gone_table = lookup.gone_table
        transport = ReplicationStream(self.dsn, self.options, slot.name, cfg.publication_name, protocol,
                                      position.lsn, cfg.status_interval, self.app_name, self.setting,
                                      server_timeout=cfg.server_timeout)
        log.info("streaming from %s (pgoutput protocol %d)", position, protocol,
                 extra={"connector": cfg.name, "phase": "streaming"})
        return LogicalStream(cfg, transport, conn, builder, lookup, self.toast, protocol,
                             slot.name, cfg.state_dir / cfg.name / "spill",
                             on_commit=self.relations.committed)

    def write_signal(self, signal_id: str, kind: str, data: dict) -> int:
        return self._signals().write(signal_id, kind, data)

    def chunk_readable(self) -> bool:
        return self._signals().readable()

    def _signals(self) -> SignalTable:
        assert self.signals is not None, "signals are used only with a signal_table (prepare() opened it)"
        return self.signals

    @classmethod
    def send_signal(cls, config: PostgresConfig, signal_id: str, kind: str, data: dict) -> None:
        dsn = with_connect_timeout(config.dsn.get_secret_value(), config.server_timeout)
        conn = servers.postgres.connect(dsn, what=f"source {config.name}: writing a signal",
                                        setting=servers.setting_of("source", config.name, "dsn"))
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT current_database()")
                (database,) = cur.fetchall()[0]  # one row
            for table, where in (conditions_of(data) or {}).items():  # refused here, not in the daemon's log
                refused = filter_error(conn, TableId(database, *table.split(".", 1)), where)
                if refused is not None:
                    raise ConfigError(f"source {config.name}: the condition {where!r} on {table} is refused: {refused}")
            assert config.signal_table, "signal_snapshot checked it"
            SignalTable(conn, signal_table_id(config.signal_table, database), config.key_columns,
                        config.server_timeout, config.name).write(signal_id, kind, data)
        finally:
            conn.close()

    def _table_meta(self, table: str):
        return next(t for t in self.tables.values() if str(t.id) == table)

    def read_chunk(self, table: str, after: tuple | None, size: int, version: int, where: str | None = None) -> list:
        try:
            conn, _, lookup, _ = self._prepared()
            return read_chunk(conn, lookup, self.toast, self._table_meta(table), after, size, version, where)
        except psycopg2.Error as err:
            raise wrap(err, f"source {self.cfg.name}: reading a chunk of {table} after {after}",
                       setting=self.setting, role=self.role) from err

    def filter_error(self, table: str, where: str) -> str | None:
        return filter_error(self.conn, self._table_meta(table).id, where)

    def estimate_rows(self, table: str) -> int | None:
        try:
            return estimate_rows(self.conn, self._table_meta(table).id)
        except psycopg2.Error as err:
            raise wrap(err, f"source {self.cfg.name}: estimating the rows of {table}",
                       setting=self.setting, role=self.role) from err

    def release(self) -> None:
        close_quietly(self.conn)
        self.toast.close()
