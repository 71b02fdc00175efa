"""A deadline on the target's answers, for a server that stops answering while its connection
stays open.

A hung or SIGSTOPped server, or a route that drops packets while something in between keeps
acknowledging, leaves TCP content, and neither psycopg2 nor PyMySQL has a client-side timeout on a
query: a write on such a connection waits for ever, the runner never retries, and the group's
offsets never move. ``WriteDeadline.watch`` bounds that: if the block has not finished when the
timer fires, the timer shuts down the sockets of every connection the engine opened (through duplicates: the
drivers own the descriptors; PyMySQL, which shows none, is handed sockets made here), the blocked
call fails at once, the pool is emptied, and the error that leaves the block is a
``RetriableError`` saying what got no answer and for how long. The runner then retries the batch on new connections, which ``connect_timeout``
bounds in turn. Shutting down every connection, not only the one in use, also covers a pool's
pre-ping on an idle connection, which runs before the block knows which connection it got.

SQLite and DuckDB targets are files in this process: no deadline.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pymysql
import sqlalchemy as sa

from cdc.api import RetriableError

NETWORK_KINDS = ("postgresql", "mysql")


def _socket_of(dbapi_connection: Any) -> socket.socket | None:
    """A duplicate of a psycopg2 connection's socket (its ``fileno()``)."""
    with contextlib.suppress(Exception):
        return socket.socket(fileno=os.dup(dbapi_connection.fileno()))
    return None


def _pymysql_socket(connection: Any) -> socket.socket:
    """A TCP socket to the server of a PyMySQL connection made with ``defer_connect``, made as
    PyMySQL makes its own (its public settings: host, port, connect_timeout, bind_address)."""
    source = (connection.bind_address, 0) if connection.bind_address else None
    try:
        sock = socket.create_connection((connection.host, connection.port), connection.connect_timeout, source)
    except OSError as err:  # as PyMySQL reports a failed connect: CR_CONN_HOST_ERROR
        raise pymysql.err.OperationalError(2003, f"Can't connect to MySQL server on {connection.host!r} ({err})") \
            from err
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return sock


class WriteDeadline:
    """Used from the sink's thread; the timer thread only shuts sockets down."""

    def __init__(self, engine: sa.engine.Engine, kind: str, seconds: float | None) -> None:
        self.engine = engine
        self.seconds = seconds if kind in NETWORK_KINDS else None
        self._connections: weakref.WeakSet = weakref.WeakSet()
        self._pymysql_sockets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._expired = False  # the current block's deadline passed
        if self.seconds is not None:
            sa.event.listen(engine, "connect", lambda dbapi_connection, _record: self._track(dbapi_connection))
            if engine.dialect.driver == "pymysql":
                sa.event.listen(engine, "do_connect", self._connect_pymysql)
                sa.event.listen(engine, "close", lambda dbapi_connection, _record: self._forget(dbapi_connection))

    def _connect_pymysql(self, dialect: Any, _record: Any, cargs: list, cparams: dict) -> Any:
        """PyMySQL has no public ``fileno()``: its TCP socket is made here and handed to it (its public
        ``connect(sock)``), and a duplicate stays here to be shut down, from the handshake on:
        PyMySQL's ``connect_timeout`` bounds only the TCP connect, so a pre-ping's reconnect on a
        stalled server would wait in the handshake for ever. A connection through a unix socket is
        left to PyMySQL (it treats those as secure, which it is told only when it makes the socket
        itself), and keeps no deadline."""
        connection = dialect.loaded_dbapi.connect(*cargs, **cparams, defer_connect=True)
        if connection.unix_socket:
            connection.connect()
            return connection
        sock = _pymysql_socket(connection)
        duplicate = socket.socket(fileno=os.dup(sock.fileno()))  # TLS wraps ``sock`` into another object
        weakref.finalize(connection, duplicate.close)  # should the pool never report its close
        with self._lock:
            self._pymysql_sockets[connection] = duplicate
            expired = self._expired
        if expired:  # opened after the deadline passed, within the same block: it gets no answer either
            with contextlib.suppress(OSError):
                duplicate.shutdown(socket.SHUT_RDWR)
        try:
            connection.connect(sock)
        except BaseException:
            sock.close()
            self._forget(connection)
            raise
        return connection

    def _forget(self, dbapi_connection: Any) -> None:
        # The duplicate would keep the TCP connection open after PyMySQL closed its own descriptor.
        with self._lock, contextlib.suppress(TypeError):
            duplicate = self._pymysql_sockets.pop(dbapi_connection, None)
            if duplicate is not None:
                duplicate.close()

    def _track(self, dbapi_connection: Any) -> None:
        with contextlib.suppress(TypeError):  # a driver object that takes no weak reference
            self._connections.add(dbapi_connection)

    def _expire(self, fired: threading.Event) -> None:
        fired.set()
        with self._lock:
            self._expired = True
            ours = list(self._pymysql_sockets.values())
        for sock in ours:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for connection in list(self._connections):
            if connection in self._pymysql_sockets:
                continue
            duplicate = _socket_of(connection)
            if duplicate is not None:
                with contextlib.suppress(OSError):
                    duplicate.shutdown(socket.SHUT_RDWR)
                duplicate.close()

    @contextlib.contextmanager
    def watch(self, what: str) -> Iterator[None]:
        if self.seconds is None:
            yield
            return
        fired = threading.Event()
        with self._lock:
            self._expired = False
        timer = threading.Timer(self.seconds, self._expire, (fired,))
        timer.daemon = True
        timer.start()
        try:
            yield
        except Exception as err:
            if fired.is_set():
                self.engine.dispose()
                raise RetriableError(f"{what}: no answer from the target within {self.seconds:g}s (it hangs, "
                                     "or the network drops packets); retrying on new connections") from err
            raise
        finally:
            timer.cancel()
