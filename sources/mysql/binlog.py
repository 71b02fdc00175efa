"""The replication connection: pymysqlreplication for the protocol, our decoder for the rows.

pymysqlreplication registers as a replica, sends COM_BINLOG_DUMP (by file and position, or by
MariaDB GTID position through ``@slave_connect_state``), reads the packets, frames the events,
follows rotations and parses table maps, query, XID and GTID events. Row events are not decoded
by it: ``row_body`` hands the raw bytes of the row images (after the header it did parse) to the
table's compiled decoder (``decoder.py``).

Two of its behaviours are switched off because they break exactly-once resume:

* on a lost connection it silently reconnects from where *it* thinks it is (in GTID mode: from the
  original start GTID, so everything would come again, mid-transaction state and all). Here a lost
  connection raises ``RetriableError``; the runtime restarts the source from the stored position.
  Its connections are made by ``_Connections`` (its public ``pymysql_wrapper`` argument), which
  opens each of the two it needs (the stream and its control connection) once and refuses a third.
* row events it cannot decode (MariaDB's compressed row events) are dropped silently as
  "not implemented"; here they raise.

Only public API of pymysql and pymysqlreplication is used: ``_Connections`` makes the sockets
itself and hands them to pymysql (``Connection.connect(sock)``), and the row images are the rest of
the packet (``read_all``) after what pymysqlreplication parsed.

Threading: ``next_event`` on the source's thread; ``close`` from any thread (it shuts the sockets
down so that a blocked read returns).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from cdc.errors import CdcError, PermanentError, RetriableError
from cdc.positions import MySqlPosition
from sources.mysql.config import MySqlConfig
from sources.mysql.errors import wrap

log = logging.getLogger(__name__)

EVENTS = [FormatDescriptionEvent, RotateEvent, TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
          XidEvent, QueryEvent, MariadbGtidEvent, GtidEvent, HeartbeatLogEvent, XAPrepareEvent, NotImplementedEvent]

# Event types whose changes we would miss: MariaDB's compressed query and row events, MySQL's
# partial JSON updates and transaction payloads (binlog_transaction_compression).
UNSUPPORTED_EVENTS = {165: "a compressed query event (log_bin_compress)", 166: "a compressed row event",
                      167: "a compressed row event", 168: "a compressed row event", 169: "a compressed row event",
                      170: "a compressed row event", 171: "a compressed row event",
                      39: "a partial JSON update (binlog_row_value_options=PARTIAL_JSON)",
                      40: "a compressed transaction payload (binlog_transaction_compression)"}


# Where an event's body starts in its packet: the OK byte, then the 19-byte event header.
EVENT_BODY = 20


class _Connections:
    """pymysqlreplication's ``pymysql_wrapper``: its connections, on sockets made here so that
    ``shut`` (from any thread) can wake a read blocked on them. pymysqlreplication opens two, the
    stream and its control connection; any further one is its reconnect after a lost connection,
    refused (see the module docstring)."""

    OPENED_ONCE = 2

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.shut_down = False

    def __call__(self, **settings) -> pymysql.connections.Connection:
        with self.lock:
            if self.shut_down:
                raise RetriableError("the binlog connection was closed")
            if len(self.sockets) >= self.OPENED_ONCE:
                raise RetriableError("the binlog connection was lost; the source restarts from the stored position")
            host, port = settings["host"], settings["port"]
            try:
                sock = socket.create_connection((host, port), settings.get("connect_timeout"))
            except OSError as err:  # as pymysql reports a failed connect: CR_CONN_HOST_ERROR
                raise pymysql.err.OperationalError(2003, f"Can't connect to MySQL server on {host!r} ({err})") from err
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            self.sockets.append(sock)
        conn = pymysql.connections.Connection(**settings, defer_connect=True)
        try:
            conn.connect(sock)
        except BaseException:
            sock.close()
            raise
        return conn

    def shut(self) -> None:
        with self.lock:
            self.shut_down = True
            sockets = list(self.sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class BinlogConnection:
    """One dump of the binlog from ``position`` (after it)."""

    def __init__(self, config: MySqlConfig, position: MySqlPosition, by_gtid: bool) -> None:
        settings = config.connection_settings()
        settings.pop("charset", None)
        settings["read_timeout"] = max(60.0, config.heartbeat_interval * 10)
        self.connections = _Connections()
        kwargs = dict(connection_settings=settings, server_id=config.server_id, blocking=True,
                      resume_stream=True, only_events=EVENTS, slave_heartbeat=config.heartbeat_interval,
                      enable_logging=False, filter_non_implemented_events=False,
                      pymysql_wrapper=self.connections)
        if by_gtid:
            kwargs.update(auto_position=position.gtid_set, is_mariadb=True)
        else:
            kwargs.update(log_file=position.file, log_pos=position.pos, is_mariadb=False)
        self.position = position
        self.by_gtid = by_gtid
        self.reader = BinLogStreamReader(**kwargs)
        self._received = False
        self._closed = False

    def next_event(self):
        """The next event (blocks until one comes; the server sends a heartbeat after
        ``heartbeat_interval`` of silence)."""
        try:
            event = self.reader.fetchone()
        except CdcError:
            raise
        except (pymysql.Error, OSError, struct.error) as err:
            if self._closed:
                raise RetriableError("the binlog connection was closed") from err
            where = f"reading the binlog after {self.position}" + (" by GTID" if self.by_gtid else "")
            raise wrap(err, where, reading_binlog=not self._received) from err
        except Exception as err:  # noqa: BLE001 - pymysqlreplication parsing a malformed event
            raise PermanentError(f"reading the binlog after {self.position}: {type(err).__name__}: {err}") from err
        if event is None:
            raise RetriableError("the server ended the binlog dump")
        self._received = True
        return event

    def close(self) -> None:
        self._closed = True
        self.connections.shut()
        try:
            self.reader.close()
        except Exception:  # noqa: BLE001 - closing on the way out
            pass


def row_body(event) -> tuple[bytes, int, int]:
    """(bytes, start, end) of a rows event's row images: what follows the header and the column
    bitmaps pymysqlreplication has read, up to the event's end (a checksum may follow it)."""
    packet = event.packet.packet
    after_event = len(packet.get_all_data()) - (EVENT_BODY + event.event_size)
    rest = packet.read_all()
    return rest, 0, len(rest) - after_event


def event_start(event) -> int:
    """The event's own position in its binlog file (the header carries the next event's)."""
    wrapper = event.packet
    return wrapper.log_pos - wrapper.event_size
