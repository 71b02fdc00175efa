"""A deadline on the target's answers, for a server that stops answering while its connection
stays open.

A hung or SIGSTOPped server, or a route that drops packets while something in between keeps
acknowledging, leaves TCP content, and neither psycopg2 nor PyMySQL has a client-side timeout on a
query: a write on such a connection waits for ever, the runner never retries, and the group's
offsets never move. ``WriteDeadline.watch`` bounds that: if the block has not finished when the
timer fires, the timer shuts down the sockets of every connection the engine opened (through
duplicates: the drivers own the descriptors), the blocked call fails at once, the pool is
emptied, and the error that leaves the block is a ``RetriableError`` saying what got no answer
and for how long. The runner then retries the batch on new connections, which ``connect_timeout``
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

import sqlalchemy as sa

from cdc.api import RetriableError

NETWORK_KINDS = ("postgresql", "mysql")


def _socket_of(dbapi_connection: Any) -> socket.socket | None:
    """A duplicate of the connection's socket (psycopg2: ``fileno()``; PyMySQL: ``_sock``).

    PyMySQL has no public ``fileno()``: its private ``_sock`` is read here and nowhere else, and
    tests/integration/test_third_party_internals.py fails if a PyMySQL release (pinned < 2) moves it."""
    with contextlib.suppress(Exception):
        fileno = dbapi_connection.fileno() if hasattr(dbapi_connection, "fileno") else \
            dbapi_connection._sock.fileno()  # noqa: SLF001 - PyMySQL keeps its socket there
        return socket.socket(fileno=os.dup(fileno))
    return None


class WriteDeadline:
    """Used from the sink's thread; the timer thread only shuts sockets down."""

    def __init__(self, engine: sa.engine.Engine, kind: str, seconds: float | None) -> None:
        self.engine = engine
        self.seconds = seconds if kind in NETWORK_KINDS else None
        self._connections: weakref.WeakSet = weakref.WeakSet()
        if self.seconds is not None:
            sa.event.listen(engine, "connect", lambda dbapi_connection, _record: self._track(dbapi_connection))

    def _track(self, dbapi_connection: Any) -> None:
        with contextlib.suppress(TypeError):  # a driver object that takes no weak reference
            self._connections.add(dbapi_connection)

    def _expire(self, fired: threading.Event) -> None:
        fired.set()
        for connection in list(self._connections):
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
