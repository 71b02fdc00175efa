"""The source's replication slot: its name, its state, and creating, dropping or taking it back.

A slot is created by a snapshot (with an exported snapshot the readers import) or, with
``snapshot: never`` and nothing stored, without one. A slot still held by a walsender of this same
connector is a leftover of a process that died (kill -9) and is ended; one held by anybody else is
a retriable error. Names: ``slots.py`` (the default ``cdc_<db>_<source>``, kept for ``cdc status``
and ``cdc drop``).

Failover (PostgreSQL 17+, ``failover_slot``, on by default): the slot is created with ``FAILOVER``,
and an existing one is switched with ``ALTER_REPLICATION_SLOT`` to match the setting, so a standby
that synchronizes slots (``sync_replication_slots = on``) holds a copy a promoted standby streams
from. https://www.postgresql.org/docs/17/logicaldecoding-explanation.html#LOGICALDECODING-REPLICATION-SLOTS-SYNCHRONIZATION

Threading: the source's thread only.
"""

from __future__ import annotations

import logging
import time

import psycopg2
import psycopg2.extras

from cdc.api import servers
from cdc.errors import PermanentError, PositionLostError, RetriableError
from cdc.positions import PgLsn
from sources.postgres.catalog import check_free_slot
from sources.postgres.config import PostgresConfig
from sources.postgres.errors import wrap

log = logging.getLogger(__name__)


class ReplicationSlot:
    def __init__(self, config: PostgresConfig, conn, database: str, server_version: int, dsn: str, options: str,
                 app_name: str, setting) -> None:
        self.cfg, self.conn, self.database, self.server_version = config, conn, database, server_version
        self.dsn, self.options, self.app_name, self.setting = dsn, options, app_name, setting
        self.name = self._choose()

    def _extra(self) -> dict:
        return {"connector": self.cfg.name, "phase": "starting"}

    def _choose(self) -> str:
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
                     extra=self._extra())
            return legacy
        return new

    @property
    def failover(self) -> bool | None:
        """Whether the slot is to be a failover slot; None where the server has none (before 17)."""
        return self.cfg.failover_slot if self.server_version >= 170000 else None

    def _replication_connection(self):
        return servers.postgres.connect(self.dsn, what=f"source {self.cfg.name}: opening a replication connection",
                                        setting=self.setting,
                                        connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                        options=self.options, application_name=self.app_name)

    def match_failover(self) -> None:
        """Switch an existing slot's failover flag to the setting (a slot made before 17, or before
        the setting changed). The slot must not be streaming: call it before the stream starts."""
        wanted = self.failover
        if wanted is None:
            return
        with self.conn.cursor() as cur:
            cur.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (self.name,))
            row = cur.fetchone()
        self.conn.rollback()
        if row is None or row[0] == wanted:
            return
        repl = self._replication_connection()
        try:
            repl.cursor().execute(f'ALTER_REPLICATION_SLOT "{self.name}" (FAILOVER {str(wanted).lower()})')
        except psycopg2.Error as err:
            raise wrap(err, f"setting failover of replication slot {self.name}") from err
        finally:
            repl.close()
        log.info("slot %s: failover %s (failover_slot: %s)", self.name, "on" if wanted else "off",
                 str(wanted).lower(), extra=self._extra())

    def state(self) -> dict | None:
        """The slot's row (database, plugin, active_pid, wal_status, application_name), or None."""
        with self.conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            cur.execute("SELECT s.database, s.plugin, s.active_pid, s.wal_status, a.application_name "
                        "FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid "
                        "WHERE s.slot_name = %s", (self.name,))
            row = cur.fetchone()
        self.conn.rollback()
        if row is not None and (row["database"] != self.database or row["plugin"] != "pgoutput"):
            raise PermanentError(f"source {self.cfg.name}: replication slot {self.name} belongs to "
                                 f"database {row['database']} with plugin {row['plugin']}, not to "
                                 f"{self.database} with pgoutput: set the source's `slot:` to another name "
                                 "(a-z, 0-9, _)")
        return row

    def take_back(self) -> None:
        """End a walsender of this connector that still holds the slot (a leftover of a process
        that died: the server has not noticed yet) rather than wait for its timeout."""
        slot = self.state()
        if slot is None or slot["active_pid"] is None:
            return
        pid = slot["active_pid"]
        if slot["application_name"] != self.app_name:
            raise RetriableError(f"slot {self.name} is in use by another process (pid {pid}, "
                                 f"application {slot['application_name']!r})")
        log.warning("slot %s is held by pid %d, a leftover of an earlier run: ending it", self.name, pid,
                    extra=self._extra())
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (self.name,))
                row = cur.fetchone()
                if row is None or row[0] is None:
                    break
                time.sleep(0.05)
        self.conn.rollback()

    def check_resumable(self, position: PgLsn) -> PgLsn:
        """``position``, if the slot can still stream from it; else PositionLostError with the recovery."""
        slot = self.state()
        if slot is not None and slot["wal_status"] != "lost":
            return position
        what = ("is missing" if slot is None else "was invalidated by the server: it held back more WAL than "
                "max_slot_wal_keep_size allows, and the WAL it needs is gone (wal_status=lost)")
        raise PositionLostError(
            f"source {self.cfg.name}: replication slot {self.name} {what}; changes after {position} "
            "cannot be read. Recovery: take a new snapshot (set snapshot: when_needed, or reset the "
            f"source's offset with a tombstone for {{\"source\": \"{self.cfg.name}\"}} in the offsets topic)")

    def drop_if_present(self) -> None:
        """Before a snapshot: an old slot is an earlier snapshot's or stream's, and is replaced."""
        if self.state() is None:
            return
        log.warning("slot %s exists but a snapshot is to be taken: taking it with a fresh slot", self.name,
                    extra=self._extra())
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (self.name,))
        self.conn.commit()

    def create(self, export: bool, temporary: bool = False):
        """Create the slot; with ``export``, keep its connection open and return (connection,
        consistent LSN, snapshot name): the snapshot lives as long as that connection is idle.
        ``temporary``: a slot of another name that goes with its connection, only for the
        exported snapshot (a backfill's: the source's own slot keeps its position)."""
        check_free_slot(self.conn)
        name = f"{self.name[:54]}_backfill" if temporary else self.name
        repl = self._replication_connection()
        cur = repl.cursor()
        failover = bool(self.failover) and not temporary  # a temporary slot cannot fail over
        if self.server_version >= 150000:
            how = f"(SNAPSHOT '{'export' if export else 'nothing'}'{', FAILOVER' if failover else ''})"
        else:
            how = "EXPORT_SNAPSHOT" if export else "NOEXPORT_SNAPSHOT"
        try:
            kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
            cur.execute(f'CREATE_REPLICATION_SLOT "{name}" {kind} pgoutput {how}')
            _, consistent, snapshot_name, _ = cur.fetchone()
        except psycopg2.Error as err:
            repl.close()
            raise wrap(err, f"creating replication slot {name}") from err
        if failover:
            log.info("slot %s is a failover slot: standbys with sync_replication_slots = on keep a copy", name,
                     extra=self._extra())
        if not export:
            repl.close()
            return None
        return repl, PgLsn.parse(consistent), snapshot_name
