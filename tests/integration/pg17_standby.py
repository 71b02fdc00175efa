"""A PostgreSQL 17 primary and a physical standby of it, both of a test's own (not the stack's:
the primary's `synchronized_standby_slots` would hold back every other test's failover slots).

The standby is made without pg_basebackup (the bundled binaries have no client programs, and
Debian's PostgreSQL 15 pg_basebackup refuses a 17 server) through the low-level backup API:
https://www.postgresql.org/docs/17/continuous-archiving.html#BACKUP-LOWLEVEL-BASE-BACKUP
a physical slot for the standby first (so the primary keeps the WAL from the backup's start),
``pg_backup_start``, a copy of the data directory without what a base backup leaves out,
``pg_backup_stop``, whose label file becomes the copy's ``backup_label``; then ``standby.signal``
and the settings slot synchronization needs (``primary_slot_name``, ``hot_standby_feedback``,
``sync_replication_slots``, a ``primary_conninfo`` with a dbname):
https://www.postgresql.org/docs/17/logicaldecoding-explanation.html#LOGICALDECODING-REPLICATION-SLOTS-SYNCHRONIZATION
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psycopg2

from cdc.dev.services import LOOPBACK, Postgres17, _chown_tree

STANDBY_SLOT = "standby1"
# A base backup leaves out the contents of these (they are rebuilt, or would be wrong on a copy):
# https://www.postgresql.org/docs/17/protocol-replication.html#PROTOCOL-REPLICATION-BASE-BACKUP
EMPTIED = {"pg_wal", "pg_replslot", "pg_stat_tmp", "pg_dynshmem", "pg_notify", "pg_serial", "pg_snapshots",
           "pg_subtrans"}
LEFT_OUT = {"postmaster.pid", "postmaster.opts", "backup_label", "tablespace_map", "standby.signal"}


class TestServer:
    """One server: its own root directory (world-traversable: the server runs as ``postgres``
    when we are root), its process in a session of its own."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cdc-pg17-"))
        os.chmod(self.root, 0o755)
        self.service = Postgres17(self.root)
        self.process = None

    @property
    def port(self) -> int:
        return self.service.port

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{LOOPBACK}:{self.port}/{database}"

    def start(self, timeout: float = 120) -> None:
        self.process = self.service.launch()
        deadline = time.monotonic() + timeout
        while not self.service.probe():
            if self.process.poll() is not None:
                raise AssertionError(f"PostgreSQL 17 exited ({self.process.returncode}):\n{self.service.log_tail()}")
            assert time.monotonic() < deadline, f"PostgreSQL 17 did not answer:\n{self.service.log_tail()}"
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the whole server (a crash of the primary's machine, as far as clients see)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def sql(self, statement: str, params: tuple = (), database: str = "postgres") -> list[tuple]:
        conn = psycopg2.connect(self.dsn(database), connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(statement, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()


def start_primary() -> TestServer:
    primary = TestServer()
    primary.service.prepare()
    primary.start()
    return primary


def _copy_data_directory(source: Path, target: Path) -> None:
    """The running primary's files, as a base backup takes them: files may vanish meanwhile
    (temporary ones), which is fine, since WAL replay from the backup's start makes it consistent."""
    target.mkdir(mode=0o700)
    for dirpath, dirnames, filenames in os.walk(source):
        relative = Path(dirpath).relative_to(source)
        emptied = bool(relative.parts) and relative.parts[0] in EMPTIED
        if emptied:  # kept empty, but for pg_wal's own subdirectories
            dirnames[:] = [d for d in dirnames if d in ("archive_status", "summaries")]
        for name in dirnames:
            (target / relative / name).mkdir(mode=0o700, exist_ok=True)
        if emptied:
            continue
        for name in filenames:
            if relative == Path(".") and name in LEFT_OUT:
                continue
            try:
                shutil.copy2(Path(dirpath) / name, target / relative / name)
            except FileNotFoundError:
                pass


def start_standby(primary: TestServer) -> TestServer:
    """A streaming standby of ``primary`` that synchronizes its failover slots."""
    standby = TestServer()
    standby.service.dir.mkdir()
    os.chmod(standby.service.dir, 0o755)
    from cdc.dev import postgres17

    postgres17.place(standby.root / "postgres17-install")
    primary.sql("SELECT pg_create_physical_replication_slot(%s, true)", (STANDBY_SLOT,))
    conn = psycopg2.connect(primary.dsn())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_backup_start('cdc-standby', true)")
            _copy_data_directory(primary.service.data, standby.service.data)
            cur.execute("SELECT labelfile, spcmapfile FROM pg_backup_stop(false)")
            label, tablespace_map = cur.fetchone()
    finally:
        conn.close()
    data = standby.service.data
    (data / "backup_label").write_text(label)
    if tablespace_map:
        (data / "tablespace_map").write_text(tablespace_map)
    (data / "standby.signal").write_text("")
    with open(data / "postgresql.auto.conf", "a") as conf:
        conf.write(f"primary_conninfo = 'host={LOOPBACK} port={primary.port} user=postgres dbname=postgres "
                   f"application_name={STANDBY_SLOT}'\n"
                   f"primary_slot_name = '{STANDBY_SLOT}'\n"
                   "hot_standby_feedback = on\n"
                   "sync_replication_slots = on\n")
    _chown_tree(standby.service.dir, standby.service.owner())
    standby.start()
    return standby
