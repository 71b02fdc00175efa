"""The replication connection, and in-progress transactions buffered to disk past a budget.

``ReplicationStream`` wraps psycopg2's ``LogicalReplicationConnection``: it starts pgoutput at
the stored LSN, reads raw messages without blocking for longer than asked, and sends the flush
LSN only when told (``confirm``), forced, so the server learns of it at once.

A server that stops answering with the connection open (hung, SIGSTOPped, packets dropped) is
noticed by ``Silence``: after ``status_interval`` without a message the stream asks the server for
a keepalive reply, and after ``server_timeout`` without any sign of life ``read`` raises a
``RetriableError`` (the source reconnects) instead of waiting for ever.

psycopg2 answers the server's keepalives by itself; when everything received has been confirmed,
it also moves the flush LSN up to the keepalive's WAL end. That is safe here: the server's WAL end
in a keepalive never passes the commit record of a transaction it has not finished sending, and a
transaction is resent on restart unless its commit record lies before the confirmed LSN.

``TransactionBuffer`` holds the raw messages of one streamed (in-progress) transaction until its
Stream Commit, spilling to a file once all buffers together exceed the memory budget, so a
transaction larger than memory is published only when it commits, and read back in pieces.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import psycopg2
import psycopg2.extras

from sources.postgres.deadline import Silence
from sources.postgres.errors import DEFAULT_SETTING, connect, wrap

log = logging.getLogger(__name__)


class ReplicationStream:
    def __init__(self, dsn: str, options: str, slot: str, publication: str, protocol: int,
                 start_lsn: int, status_interval: float, application_name: str,
                 setting: str = DEFAULT_SETTING, server_timeout: float = 30.0) -> None:
        self.conn = connect(dsn, f"opening the replication connection for slot {slot}", setting=setting,
                            connection_factory=psycopg2.extras.LogicalReplicationConnection,
                            options=options, application_name=application_name)
        try:
            self.cursor = self.conn.cursor()
            plugin_options = {"proto_version": str(protocol), "publication_names": publication,
                              "messages": "true"}
            if protocol >= 2:
                plugin_options["streaming"] = "on"
            self.cursor.start_replication(slot_name=slot, decode=False, start_lsn=start_lsn,
                                          status_interval=status_interval, options=plugin_options)
        except psycopg2.Error as err:
            raise wrap(err, f"starting replication from slot {slot}", on_slot=True) from err
        self.slot = slot
        self.silence = Silence(server_timeout, min(status_interval, server_timeout / 3),
                               f"reading from slot {slot}")

    def read(self, max_messages: int, timeout: float) -> list[tuple[int, bytes]]:
        """Up to ``max_messages`` (data_start LSN, payload) pairs; waits up to ``timeout`` for the first."""
        cursor, silence = self.cursor, self.silence
        out: list[tuple[int, bytes]] = []
        append = out.append
        try:
            # Bytes waiting now are a sign of life even if they are only a keepalive, which
            # read_message consumes without returning anything.
            if select.select([self.conn], [], [], 0)[0]:
                silence.heard()
            while len(out) < max_messages:
                message = cursor.read_message()
                if message is None:
                    if out or timeout <= 0:
                        break
                    if select.select([self.conn], [], [], timeout)[0]:
                        silence.heard()
                    timeout = 0
                    continue
                append((message.data_start, message.payload))
            if out:
                silence.heard()
            elif silence.should_ask():
                cursor.send_feedback(reply=True)  # the server answers with a keepalive at once
        except psycopg2.Error as err:
            raise wrap(err, f"reading from slot {self.slot}", on_slot=True) from err
        silence.check()
        return out

    @property
    def wal_end(self) -> int:
        return self.cursor.wal_end

    def confirm(self, lsn: int) -> None:
        """Tell the server everything up to ``lsn`` is durably handled: it may free that WAL."""
        try:
            self.cursor.send_feedback(write_lsn=lsn, flush_lsn=lsn, force=True)
        except psycopg2.Error as err:
            raise wrap(err, f"confirming {lsn} to slot {self.slot}", on_slot=True) from err

    def close(self) -> None:
        try:
            self.conn.close()
        except psycopg2.Error:
            pass


_HEADER = struct.Struct("!qI")  # data_start, payload length


class TransactionBuffer:
    """The messages of one streamed transaction, in memory or (past the budget) in a file."""

    def __init__(self, xid: int, spill_dir: Path) -> None:
        self.xid = xid
        self.spill_dir = spill_dir
        self.memory: list[tuple[int, bytes]] = []
        self.memory_bytes = 0
        self.spilled = 0
        self.aborted_subxacts: set[int] = set()
        self._file: BinaryIO | None = None  # made at the first spill

    def add(self, data_start: int, payload: bytes) -> None:
        if self._file is not None:
            self._file.write(_HEADER.pack(data_start, len(payload)))
            self._file.write(payload)
            self.spilled += 1
            return
        self.memory.append((data_start, payload))
        self.memory_bytes += len(payload) + 64

    def spill(self) -> int:
        """Move what is in memory to the file; returns the bytes freed."""
        if self._file is None:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=f"tx-{self.xid}-", dir=self.spill_dir)
            os.unlink(path)  # the file lives as long as it is open, even after a crash
            self._file = os.fdopen(fd, "w+b", buffering=1 << 20)
        for data_start, payload in self.memory:
            self._file.write(_HEADER.pack(data_start, len(payload)))
            self._file.write(payload)
        self.spilled += len(self.memory)
        freed, self.memory, self.memory_bytes = self.memory_bytes, [], 0
        return freed

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        if self._file is not None:
            self._file.flush()
            self._file.seek(0)
            read = self._file.read
            while True:
                header = read(_HEADER.size)
                if not header:
                    break
                data_start, length = _HEADER.unpack(header)
                yield data_start, read(length)
        yield from self.memory

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.memory = []
        self.memory_bytes = 0
