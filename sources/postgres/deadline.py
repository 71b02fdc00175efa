"""Deadlines for a server that stops answering while its connection stays open.

A hung or SIGSTOPped server, or a route that drops packets silently, leaves TCP content (the
peer's kernel, or a middlebox, keeps acknowledging), and psycopg2's blocking calls have no
client-side timeout: a query on such a connection waits for ever. Two tools bound that wait:

* ``answer_within(conn, seconds, what)`` around a blocking call: if the call has not returned when the
  timer fires, the timer shuts the connection's socket down, the call fails at once, and the error
  raised is a ``RetriableError`` that says what got no answer and for how long.
* ``Silence``: the replication stream's watch over the server's messages (see ``stream.py``).

``with_connect_timeout`` gives every new connection a ``connect_timeout``, so that opening one to
such a server fails too, instead of waiting for ever, unless the DSN sets its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import psycopg2
import psycopg2.extensions

from cdc.errors import RetriableError


def with_connect_timeout(dsn: str, seconds: float) -> str:
    try:
        options = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return dsn  # left as it is, for the connect to report what is wrong with it
    if "connect_timeout" in options:
        return dsn
    return psycopg2.extensions.make_dsn(dsn, connect_timeout=max(1, round(seconds)))


def _shut_down(fileno: int) -> None:
    """Shut the socket behind ``fileno`` down both ways (through a duplicate: libpq owns the fd)."""
    with contextlib.suppress(OSError):
        duplicate = socket.socket(fileno=os.dup(fileno))
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()


@contextlib.contextmanager
def answer_within(conn, seconds: float, what: str) -> Iterator[None]:
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        _shut_down(conn.fileno())

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except psycopg2.Error as err:
        if fired.is_set():
            raise RetriableError(f"{what}: no answer from the server within {seconds:g}s "
                                 "(it hangs, or the network drops packets); reconnecting") from err
        raise
    finally:
        timer.cancel()


class Silence:
    """How long the server has said nothing, for a connection that should hear from it regularly.

    ``heard()`` on every sign of life; ``check()`` raises once the silence exceeds ``limit``. The
    caller asks the server for a sign of life (a keepalive reply) when ``should_ask()`` says so.
    """

    def __init__(self, limit: float, ask_every: float, what: str) -> None:
        self.limit, self.ask_every, self.what = limit, ask_every, what
        self.last_heard = self.last_asked = time.monotonic()
        self.asked = 0  # keepalive requests sent so far

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def should_ask(self) -> bool:
        now = time.monotonic()
        if now - self.last_heard >= self.ask_every and now - self.last_asked >= self.ask_every:
            self.last_asked = now
            self.asked += 1
            return True
        return False

    def check(self) -> None:
        silent = time.monotonic() - self.last_heard
        if silent > self.limit:
            raise RetriableError(f"{self.what}: nothing from the server for {silent:.0f}s, not even a reply to "
                                 "a keepalive request (it hangs, or the network drops packets); reconnecting")
