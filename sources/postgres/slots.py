"""Replication slots seen from outside the stream: what each one holds back, who owns it, and
how a source's slot and publication are removed.

A slot keeps every WAL segment from its ``restart_lsn`` on, whatever the tables it serves, until
its consumer confirms a later position; a slot nobody reads (its source removed, renamed, moved to
another database) keeps WAL until the disk fills. ``cdc status`` lists them all with what they
hold (one query per server: ``list_slots``), ``cdc drop`` removes a source's (``plan_drop``: the
``SlotOwningSource`` capability of ``PostgresSource``), and a running source measures its own
(``RetainedWal``) against ``max_retained_wal``.
"""

from __future__ import annotations

import getpass
import logging
import os
import time
from dataclasses import dataclass

import psycopg2
from psycopg2.extensions import parse_dsn

from cdc.api import CdcError, ConfigError, PermanentError, RetriableError, SlotListing, human_bytes, servers
from sources.postgres.catalog import PUBLICATION_COMMENT, _ident
from sources.postgres.config import PostgresConfig

log = logging.getLogger(__name__)

# Every logical slot of the server, whatever its database; retained_bytes is NULL for a slot whose
# restart_lsn is unset (being created) and on a standby (no current WAL position there). failover
# and synced (a standby's copy of a primary's failover slot) came with PostgreSQL 17: read through
# to_jsonb, they are NULL on older servers instead of an error.
SLOTS_SQL = """
SELECT slot_name, database, active, active_pid, wal_status,
       CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn() - restart_lsn END::bigint,
       (to_jsonb(s) ->> 'failover')::boolean, (to_jsonb(s) ->> 'synced')::boolean
FROM pg_replication_slots s WHERE slot_type = 'logical' ORDER BY database, slot_name
"""

RETAINED_SQL = ("SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots "
                "WHERE slot_name = %s")


@dataclass(frozen=True, slots=True)
class SlotInfo:
    server: str              # host:port
    name: str
    database: str
    active: bool
    active_pid: int | None
    wal_status: str | None   # reserved / extended / unreserved / lost (PostgreSQL 13+)
    retained_bytes: int | None
    failover: bool | None = None  # a failover slot (PostgreSQL 17+; None before)
    synced: bool | None = None    # on a standby: a copy of the primary's failover slot (17+)
    owner: str | None = None  # the configured source that uses it; None: an orphan

    def as_row(self) -> dict:
        return {"kind": "slot", "server": self.server, "name": self.name, "database": self.database,
                "active": self.active, "active_pid": self.active_pid, "wal_status": self.wal_status,
                "retained_wal_bytes": self.retained_bytes, "failover": self.failover, "synced": self.synced,
                "owner": self.owner}


def server_of(dsn: str) -> str:
    params = parse_dsn(dsn)
    host = params.get("host") or os.environ.get("PGHOST") or "localhost"
    return f"{host}:{params.get('port') or os.environ.get('PGPORT') or 5432}"


def database_of(dsn: str) -> str:
    """The database a DSN names, by libpq's defaults: dbname, else PGDATABASE, else the user name."""
    params = parse_dsn(dsn)
    user = params.get("user") or os.environ.get("PGUSER") or getpass.getuser()
    return params.get("dbname") or os.environ.get("PGDATABASE") or user


def slot_of(config: PostgresConfig, database: str, existing: set[tuple[str, str]]) -> str:
    """The slot ``config`` uses in ``database``, given the (database, slot) pairs that exist: the
    same choice as the source's (an existing slot of the old default name is kept)."""
    if config.slot is not None:
        return config.slot
    new = config.slot_in(database)
    legacy = config.legacy_slot_name
    if (database, legacy) in existing and (database, new) not in existing:
        return legacy
    return new


def server_slots(conn, server: str, sources: list[PostgresConfig]) -> list[SlotInfo]:
    """Every logical slot on the server behind ``conn``, each with the source among ``sources``
    (those on this server) that owns it."""
    with conn.cursor() as cur:
        cur.execute(SLOTS_SQL)
        rows = cur.fetchall()
    conn.rollback()
    existing = {(database, name) for name, database, *_ in rows}
    owned = {}
    for source in sources:
        database = database_of(source.dsn.get_secret_value())
        owned[(database, slot_of(source, database, existing))] = source.name
    return [SlotInfo(server, name, database, active, pid, wal_status, retained, failover, synced,
                     owned.get((database, name)))
            for name, database, active, pid, wal_status, retained, failover, synced in rows]


def list_slots(sources: list[PostgresConfig], timeout: float) -> SlotListing:
    """A row per slot on the servers ``sources`` capture (one connection and query per server),
    and an error per server that could not be asked."""
    by_server: dict[str, list[PostgresConfig]] = {}
    for source in sources:
        by_server.setdefault(server_of(source.dsn.get_secret_value()), []).append(source)
    listing = SlotListing()
    for server, on_server in by_server.items():
        name = on_server[0].name
        try:
            conn = servers.postgres.connect(on_server[0].dsn.get_secret_value(), what=f"PostgreSQL at {server}",
                                            setting=servers.setting_of("source", name, "dsn"),
                                            connect_timeout=timeout, application_name="cdc-status")
        except CdcError as err:
            listing.problems.append(RetriableError(f"PostgreSQL at {server} (source {name}) is unreachable: {err}")
                                    if err.retriable else PermanentError(f"{err} (source {name})"))
            continue
        try:
            listing.rows.extend(slot.as_row() for slot in server_slots(conn, server, on_server))
        except psycopg2.Error as err:
            listing.problems.append(PermanentError(
                f"PostgreSQL at {server}: cannot list its slots: {str(err).strip().splitlines()[0]}"))
        finally:
            conn.close()
    return listing


class SourceDrop:
    """``cdc drop`` of a source: its slot, its publication when this project created it (the
    stored offset is the runtime's, reset before ``drop``). Made by ``plan_drop``."""

    def __init__(self, config: PostgresConfig, conn, database: str, slot: str, exists: bool,
                 ours: bool | None) -> None:
        self.config, self.conn, self.slot, self.exists, self.ours = config, conn, slot, exists, ours
        publication = config.publication_name
        self.plan = [f"replication slot {slot} in database {database}" if exists else f"(no slot {slot} exists)",
                     {None: f"(no publication {publication} exists)", True: f"publication {publication}",
                      False: f"(publication {publication} is kept: cdc did not create it)"}[ours]]

    def drop(self) -> None:
        try:
            if self.exists:
                drop_slot(self.conn, self.slot)
            if self.ours:
                drop_publication(self.conn, self.config.publication_name)
        except psycopg2.Error as err:
            raise _drop_error(self.config, err) from None

    def close(self) -> None:
        self.conn.close()


def plan_drop(config: PostgresConfig, timeout: float) -> SourceDrop:
    """What ``cdc drop`` removes for ``config``; ``ConfigError`` while a process streams from its slot."""
    try:
        conn = psycopg2.connect(config.dsn.get_secret_value(), connect_timeout=timeout, application_name="cdc-drop")
    except psycopg2.Error as err:
        raise PermanentError(f"cdc drop: cannot connect for source {config.name}: "
                             f"{str(err).strip().splitlines()[0]}") from None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_database()")
            (database,) = cur.fetchall()[0]  # one row
            cur.execute("SELECT database, slot_name, active_pid FROM pg_replication_slots "
                        "WHERE database = current_database()")
            slots = {(db, name): pid for db, name, pid in cur.fetchall()}
        conn.rollback()
        slot = slot_of(config, database, set(slots))
        if slots.get((database, slot)) is not None:
            raise ConfigError(f"slot {slot} of source {config.name} is active (pid {slots[(database, slot)]}): "
                              "a process streams from it; stop it first")
        return SourceDrop(config, conn, database, slot, (database, slot) in slots,
                        publication_is_ours(conn, config.publication_name))
    except BaseException as err:
        conn.close()
        if isinstance(err, psycopg2.Error):
            raise _drop_error(config, err) from None
        raise


def _drop_error(config: PostgresConfig, err: psycopg2.Error) -> PermanentError:
    return PermanentError(f"cdc drop of source {config.name}: {str(err).strip().splitlines()[0]}")


def publication_is_ours(conn, publication: str) -> bool | None:
    """True when the publication carries the comment this project gives the ones it creates;
    None when there is no such publication."""
    with conn.cursor() as cur:
        cur.execute("SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s",
                    (publication,))
        row = cur.fetchone()
    conn.rollback()
    if row is None:
        return None
    return (row[0] or "").startswith(PUBLICATION_COMMENT.format(source=""))


def drop_slot(conn, slot: str) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    conn.commit()


def drop_publication(conn, publication: str) -> None:
    with conn.cursor() as cur:
        cur.execute(f"DROP PUBLICATION {_ident(publication)}")
    conn.commit()


class RetainedWal:
    """The WAL the source's own slot holds back, measured every ``interval`` seconds; a warning
    each time it is above ``budget`` bytes (None: measured, never warned about). ``measure``
    returns whether it is above: under ``on_retained_wal: drop`` the stream then drops the slot."""

    def __init__(self, connector: str, slot: str, budget: int | None, interval: float,
                 policy: str = "warn") -> None:
        self.connector, self.slot, self.budget, self.interval = connector, slot, budget, interval
        self.policy = policy
        self.bytes: int | None = None
        self._due = 0.0  # the first poll measures

    def due(self) -> bool:
        return time.monotonic() >= self._due

    def measure(self, conn, phase: str) -> bool:
        self._due = time.monotonic() + self.interval
        with conn.cursor() as cur:
            cur.execute(RETAINED_SQL, (self.slot,))
            row = cur.fetchone()
        conn.rollback()
        self.bytes = None if row is None or row[0] is None else int(row[0])
        above = self.budget is not None and self.bytes is not None and self.bytes > self.budget
        if above and self.policy == "warn":
            log.warning("slot %s retains %s of WAL, above max_retained_wal (%s): the server keeps it until "
                        "this source confirms a later position (is the source stalled, or does the server "
                        "write much WAL outside the captured tables while heartbeats are rare?)", self.slot,
                        human_bytes(self.bytes), human_bytes(self.budget),
                        extra={"connector": self.connector, "phase": phase})
        return above


def drop_released_slot(conn, slot: str, wait: float) -> None:
    """Drop ``slot`` once its walsender has let it go (a closed replication connection frees it a
    moment later, not at once); ``wait`` seconds at most, then the server's own error."""
    deadline = time.monotonic() + wait
    with conn.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
            if row is None or row[0] is None:
                break
            time.sleep(0.05)
        conn.rollback()
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,))
    conn.commit()
