"""Stalls and breaks of one connection at a time. A stall is a server that stops answering but
keeps its connections open (a hung or SIGSTOPped server, a black-holed route). TCP does not
notice (the peer's kernel, or here the proxy's, keeps acknowledging), so only the client's own
timeouts can. A break (cut, RST) must be taken for what it is: retriable.

The fault campaigns (test_pipeline_faults.py) hold each stall for a few seconds and check that
the pipeline recovers when it ends. These tests ask the harder question, each on one connection:
is a stall that does not end noticed? The PostgreSQL source's is (``server_timeout``: keepalive
requests on the replication stream, a deadline on the heartbeat, a connect timeout); the SQL
sink's too, on PostgreSQL and MariaDB targets (``write_timeout``: the sockets of a write that gets
no answer are shut down, and the batch is retried on new connections).
"""

from __future__ import annotations

import threading
import uuid

import pytest

from cdc.errors import CdcError
from cdc.log.embedded import EmbeddedLog
from tests.faults.harness import wait_for
from tests.faults.proxy import FaultProxy
from tests.integration.pg_capture import Capture, execute, pg_config

pytestmark = [pytest.mark.faults, pytest.mark.postgres]

NOTICE_WITHIN = 15.0  # seconds; fifteen times the status and heartbeat intervals below


def _pg_address(pg_admin_dsn: str) -> str:
    return pg_admin_dsn.split("@", 1)[1].split("/", 1)[0]


def test_a_stalled_postgres_source_connection_is_noticed(pg_dsn, pg_admin_dsn, tmp_path):
    """Before server_timeout, the heartbeat sent after a second of silence blocked in libpq for
    ever (pg_logical_emit_message on the stalled control connection), and the replication stream
    would have waited for ever too: nothing raised, the supervisor never restarted the worker."""
    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    with FaultProxy(_pg_address(pg_admin_dsn), name="pg-src") as proxy:
        dsn = f"postgresql://postgres@{proxy.address}/{pg_dsn.rsplit('/', 1)[1]}"
        config = pg_config(dsn, tmp_path, name="stalled", slot=f"s_{uuid.uuid4().hex[:8]}", server_timeout=5)
        log = EmbeddedLog(tmp_path / "log")
        capture = Capture(config, log, "stall").start()
        try:
            # Evidence first: the snapshot's end and a streamed change are stored.
            wait_for(lambda: capture.offsets.load("stalled") is not None, timeout=60, what="a stored position")
            execute(pg_dsn, "INSERT INTO t VALUES (2, 'b')")
            stored = capture.offsets.load("stalled")
            wait_for(lambda: capture.offsets.load("stalled") != stored, timeout=60, what="the position to move")
            proxy.stall()
            execute(pg_dsn, "INSERT INTO t VALUES (3, 'c')")
            noticed = _wait_for_error(capture, NOTICE_WITHIN)
        finally:
            proxy.heal()
            capture.stop_event.set()
            capture.thread.join(60)
            log.close()
    assert noticed is not None and noticed.retriable, f"the stall was not noticed within {NOTICE_WITHIN:.0f}s"


def _write_through_a_stall(proxy: FaultProxy, url: str) -> BaseException | None:
    """What a SQL sink's write on ``url`` (through ``proxy``) raised within NOTICE_WITHIN of the
    proxy's stall, or None when it had not ended by then."""
    from sinks.sql.config import SqlSinkConfig
    from sinks.sql.sink import SqlSink
    from tests.unit.test_sql_sink import upsert

    sink = SqlSink(SqlSinkConfig(name="stalled", topics=["*"], url=url, write_timeout=5, connect_timeout=5))
    sink.start()
    writer: threading.Thread | None = None
    outcome: dict[str, BaseException | None] = {}
    noticed: dict[str, BaseException | None] = {}
    try:
        sink.write([upsert(1, 1, v="a")])  # evidence: the path works
        proxy.stall()

        def write() -> None:
            try:
                sink.write([upsert(2, 2, v="b")])
                outcome["error"] = None
            except BaseException as err:  # noqa: BLE001 - the outcome under test
                outcome["error"] = err

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(NOTICE_WITHIN)
        noticed = dict(outcome)  # before the stall ends
    finally:
        proxy.heal()
        proxy.cut()  # releases a write still blocked, so the sink can stop
        if writer is not None:
            writer.join(30)
        sink.stop()
    return noticed.get("error")


def test_a_stalled_sql_target_connection_is_noticed(pg_admin_dsn, tmp_path):
    name = f"target_{uuid.uuid4().hex[:8]}"
    execute(pg_admin_dsn, f'CREATE DATABASE "{name}"')
    try:
        with FaultProxy(_pg_address(pg_admin_dsn), name="pg-tgt") as proxy:
            error = _write_through_a_stall(proxy, f"postgresql+psycopg2://postgres@{proxy.address}/{name}")
    finally:
        execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert isinstance(error, CdcError) and error.retriable, \
        f"the write on a stalled connection did not fail within {NOTICE_WITHIN:.0f}s"


@pytest.mark.mysql
def test_a_stalled_mysql_target_connection_is_noticed(mysql_url, mysql_db):
    # PyMySQL shows no socket: the deadline makes the sockets it hands PyMySQL (sinks/sql/deadline.py).
    with FaultProxy(mysql_url.split("@", 1)[1], name="mysql-tgt") as proxy:
        error = _write_through_a_stall(proxy, f"mysql+pymysql://root@{proxy.address}/{mysql_db}")
    assert isinstance(error, CdcError) and error.retriable, \
        f"the write on a stalled connection did not fail within {NOTICE_WITHIN:.0f}s"


# Serial: it needs a server with no WAL from anyone else; another test's writes make the walsender
# send keepalives of its own, so the source never has to ask for one (it failed so beside others).
@pytest.mark.serial
def test_an_idle_postgres_source_is_not_taken_for_stalled(pg_dsn, tmp_path):
    """No change and no heartbeat for a while: the keepalive replies the stream asks for are the
    only signs of life, and they must be enough."""
    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    config = pg_config(pg_dsn, tmp_path, name="idle", slot=f"s_{uuid.uuid4().hex[:8]}", server_timeout=2,
                       status_interval=1, heartbeat_interval=3600)
    log = EmbeddedLog(tmp_path / "log")
    capture = Capture(config, log, "idle").start()
    try:
        wait_for(lambda: capture.source.coordinator.stream is not None, timeout=60, what="streaming")
        # Evidence that quiet outlasted server_timeout twice over, asked about all along: six
        # keepalive requests at least 2/3 s apart (min(status_interval, server_timeout / 3)).
        wait_for(lambda: capture.error is not None or capture.source.coordinator.stream.silence.asked >= 6,
                 timeout=60, what="six keepalive requests")
        assert capture.error is None, f"an idle source was taken for a stalled one: {capture.error!r}"
    finally:
        capture.stop()
        log.close()


def _wait_for_error(capture: Capture, seconds: float) -> CdcError | None:
    """The error the capture failed with, if it failed within ``seconds``."""
    capture.thread.join(seconds)
    error = capture.error
    return error if isinstance(error, CdcError) else None


@pytest.mark.parametrize("fault", ["cut", "reset"])
def test_a_broken_replication_connection_is_retriable(pg_dsn, pg_admin_dsn, tmp_path, fault):
    """A cut or RST of the replication connection surfaces from psycopg2 as a bare DatabaseError
    without SQLSTATE ("error with status PGRES_COPY_BOTH and no message from the libpq"). Taken for
    permanent, it stopped the source for good on a network blip (found by the fault campaign)."""
    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    with FaultProxy(_pg_address(pg_admin_dsn), name="pg-src") as proxy:
        dsn = f"postgresql://postgres@{proxy.address}/{pg_dsn.rsplit('/', 1)[1]}"
        config = pg_config(dsn, tmp_path, name="broken", slot=f"s_{uuid.uuid4().hex[:8]}")
        log = EmbeddedLog(tmp_path / "log")
        capture = Capture(config, log, "broken").start()
        try:
            wait_for(lambda: capture.source.coordinator.stream is not None, timeout=60, what="streaming")
            getattr(proxy, fault)()
            error = _wait_for_error(capture, 60)
        finally:
            capture.stop_event.set()
            capture.thread.join(60)
            log.close()
    assert error is not None, "the broken connection was not noticed"
    assert error.retriable, f"a broken connection was taken for a permanent error: {error!r}"
