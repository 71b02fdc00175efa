"""The binlog connection (sources/mysql/binlog.py) against the real MariaDB, through pymysql's and
pymysqlreplication's public API only: ``close`` from another thread wakes a read blocked on the
binlog socket, and a connection the server drops is never silently reconnected."""

from __future__ import annotations

import queue
import threading

import pytest

from cdc.errors import RetriableError
from cdc.positions import MySqlPosition
from sources.mysql.binlog import BinlogConnection
from sources.mysql.catalog import current_position
from tests.conftest import mysql_connect
from tests.integration.test_mysql_source import mysql_config

pytestmark = pytest.mark.mysql

# The server's heartbeat is the only thing that could wake a blocked read besides ``close``; at
# its longest it comes well after the thread is expected to have ended.
QUIET = 60.0


def _reading(mysql_url: str, mysql_db: str):
    """A BinlogConnection from the server's position now, read on a thread that reports each event
    it gets and, at the end, the exception that stopped it."""
    conn = mysql_connect(mysql_url)
    try:
        file, pos = current_position(conn)
    finally:
        conn.close()
    binlog = BinlogConnection(mysql_config(mysql_url, mysql_db, heartbeat_interval=QUIET), MySqlPosition(file, pos),
                              by_gtid=False)
    reports: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            while True:
                reports.put(binlog.next_event())
        except BaseException as err:  # noqa: BLE001 - handed to the test
            reports.put(err)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    # The dump's first events (its rotate and format description) come at once: after them the
    # thread waits on the socket.
    first = reports.get(timeout=QUIET)
    assert not isinstance(first, BaseException), first
    return binlog, thread, reports


def _ending(reports: queue.Queue) -> BaseException:
    while True:
        report = reports.get(timeout=QUIET)
        if isinstance(report, BaseException):
            return report


def test_close_from_another_thread_wakes_a_blocked_read(mysql_url, mysql_db):
    binlog, thread, reports = _reading(mysql_url, mysql_db)
    binlog.close()
    ending = _ending(reports)
    thread.join(QUIET)
    assert not thread.is_alive()
    assert isinstance(ending, RetriableError) and "closed" in str(ending), repr(ending)


def test_a_dropped_binlog_connection_is_not_reconnected(mysql_url, mysql_db):
    binlog, thread, reports = _reading(mysql_url, mysql_db)
    try:
        admin = mysql_connect(mysql_url)
        try:
            with admin.cursor() as cur:
                cur.execute("SELECT id FROM information_schema.processlist WHERE command LIKE 'Binlog Dump%%' "
                            "AND id <> CONNECTION_ID()")
                dumps = [row[0] for row in cur.fetchall()]
                assert dumps, "no binlog dump on the server"
                for dump in dumps:
                    cur.execute(f"KILL CONNECTION {int(dump)}")
        finally:
            admin.close()
        ending = _ending(reports)
        assert isinstance(ending, RetriableError) and "lost" in str(ending), repr(ending)
    finally:
        binlog.close()
        thread.join(QUIET)
