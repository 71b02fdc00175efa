"""A TCP proxy that injects network faults between a client and a server, on command.

    client ──> FaultProxy(listen port) ──> server (target port)

It forwards bytes both ways and, when told to, breaks the path the way networks and servers break:

    cut()       close every open connection (FIN both ways), as a server restart or a proxy does
    reset()     abort every open connection with a TCP RST (SO_LINGER 0), as a crashed host's
                kernel or a firewall does
    stall()     stop forwarding in both directions but keep the sockets open: a hung server or
                a black-holed route; the client sees nothing but silence until its own timeouts
    slow(latency, bandwidth)   delay each chunk and cap the throughput
    refuse()    stop listening: new connections are refused (ECONNREFUSED) while old ones go on
    heal()      undo stall/slow/refuse; connections cut or reset stay gone (clients reconnect)

The proxy runs its own asyncio loop on a daemon thread; the commands are called from the test's
thread and return once they took effect. ``accepted`` counts connections ever accepted, so a
test can wait for a client to have come back after a fault.

Kafka needs one more step: a client asks the broker for metadata and then connects to the
address the broker *advertises*, bypassing a proxy at the bootstrap address. The local stack's
broker therefore has a ``FAULTS`` listener that advertises the proxy's port (``KAFKA_FAULT_PROXY``
in dev.env; the proxy forwards to ``KAFKA_FAULT_LISTENER``), see ``cdc.dev.brokers.Kafka``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
from concurrent.futures import Future

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
CHUNK = 65536


class _Connection:
    """One client connection and its upstream connection, with a pump each way."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.writers = (client, upstream)
        self.tasks: list[asyncio.Task] = []

    def close(self, *, reset: bool) -> None:
        for writer in self.writers:
            sock = writer.get_extra_info("socket")
            if reset and sock is not None:
                # Linger on with a zero timeout: close() sends RST instead of FIN.
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            if reset:
                writer.transport.abort()
            else:
                writer.close()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    def __init__(self, target: str, *, listen_port: int = 0, name: str = "proxy") -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.name = name
        self.listen_port = listen_port
        self.accepted = 0
        self.connections: set[_Connection] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fault-proxy-{name}",
                                        daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._flowing: asyncio.Event | None = None
        self._latency = 0.0
        self._bandwidth: float | None = None  # bytes per second

    # -- life cycle (test thread) ----------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._init())
        self._call(self._listen())
        return self

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.listen_port}"

    @property
    def open_connections(self) -> int:
        return len(self.connections)

    # -- faults (test thread) --------------------------------------------------------------------
    def cut(self) -> int:
        """Close every open connection; returns how many there were."""
        return self._call(self._close_all(reset=False))

    def reset(self) -> int:
        """Abort every open connection with RST; returns how many there were."""
        return self._call(self._close_all(reset=True))

    def stall(self) -> None:
        self._call(self._set_flowing(False))

    def slow(self, latency: float = 0.05, bandwidth: float | None = None) -> None:
        """Delay every forwarded chunk by ``latency`` s; cap throughput at ``bandwidth`` bytes/s."""
        self._latency, self._bandwidth = latency, bandwidth

    def refuse(self) -> None:
        self._call(self._unlisten())

    def heal(self) -> None:
        self._latency, self._bandwidth = 0.0, None
        self._call(self._set_flowing(True))
        self._call(self._listen())

    # -- the loop's side -------------------------------------------------------------------------
    def _call(self, coroutine):
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(30)

    async def _init(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._accept, LOOPBACK, self.listen_port,
                                                  reuse_address=True)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def _unlisten(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _set_flowing(self, flowing: bool) -> None:
        (self._flowing.set if flowing else self._flowing.clear)()

    async def _close_all(self, *, reset: bool) -> int:
        doomed = list(self.connections)
        for connection in doomed:
            connection.close(reset=reset)
        self.connections.clear()
        return len(doomed)

    async def _shutdown(self) -> None:
        await self._unlisten()
        await self._close_all(reset=False)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError as err:
            log.info("%s: upstream %s:%d refused (%s); closing the client", self.name, *self.target, err)
            client_writer.transport.abort()
            return
        connection = _Connection(client_writer, upstream_writer)
        self.connections.add(connection)
        connection.tasks = [
            asyncio.ensure_future(self._pump(client_reader, upstream_writer, connection)),
            asyncio.ensure_future(self._pump(upstream_reader, client_writer, connection)),
        ]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    connection: _Connection) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                await self._flowing.wait()  # a stall holds the bytes here, sockets stay open
                if self._latency:
                    await asyncio.sleep(self._latency)
                if self._bandwidth:
                    await asyncio.sleep(len(data) / self._bandwidth)
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            return
        try:
            await self._flowing.wait()  # a stalled path does not pass a FIN either
        except asyncio.CancelledError:
            return
        # One side ended: end the other too, as a real path would.
        if connection in self.connections:
            self.connections.discard(connection)
            connection.close(reset=False)
