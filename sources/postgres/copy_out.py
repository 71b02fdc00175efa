"""COPY ... TO STDOUT read off a psycopg2 connection in blocks of whole lines, not a row at a time.

psycopg2's ``copy_expert`` calls its file's ``write`` once per row (libpq's ``PQgetCopyData``
hands out one row per call; the ``size`` argument only applies to COPY FROM): a GIL round trip, a
bytes object and a Python call per row, before our code has even cut the lines. Where
``_copyjson.c`` was built, ``copy_blocks`` runs that libpq loop in C without the GIL instead and
hands on whole blocks of lines, the snapshot's row JSON already made in the same loop
(``copy_json.py``), so no Python object is made per row. It runs the statement as it is, so it
is used where psycopg2 would send nothing before it: on an autocommit connection or inside an
open transaction (the snapshot readers'); elsewhere ``copy_expert`` runs, with its BEGIN.

The connection stays psycopg2's (it is inside the exported snapshot): the loop drives its
``PGconn`` (``connection.pgconn_ptr``) with the functions of the very libpq psycopg2 loaded. A
psycopg2-binary wheel bundles its own libpq, and calling the system's on that copy's PGconn is
unsafe, so the functions are looked up through the handle of psycopg2's extension module (the
dynamic linker then searches that module's own dependencies: the libpq it is linked to) and each
address is checked to lie in one mapped file named libpq (``/proc/self/maps``). Where any of that
fails (no C build, no /proc, another platform) the readers keep ``copy_expert``, logged once.

Errors come out as psycopg2 would raise them from ``copy_expert``: a server error as the class of
its SQLSTATE with ``pgcode`` set (the message without its severity prefix, as psycopg2 strips
it), a connection lost without a word from the server as ``OperationalError``; callers wrap them
as before (``errors.wrap``). An exception from ``emit`` propagates and leaves the COPY where it
stopped, as ``copy_expert`` does when the file's ``write`` raises.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from cdc import native
from sources.postgres.copy_json import CopyJson, _copyjson

log = logging.getLogger(__name__)

# In the order of the Libpq struct of _copyjson.c.
_FUNCTIONS = ("PQexec", "PQresultStatus", "PQresultErrorField", "PQresultErrorMessage", "PQclear",
              "PQgetCopyData", "PQfreemem", "PQgetResult", "PQerrorMessage", "PQstatus")
_SEVERITIES = ("ERROR:  ", "FATAL:  ", "PANIC:  ")

def _mapped_file(address: int, maps: list[tuple[int, int, str]]) -> str | None:
    for start, end, path in maps:
        if start <= address < end:
            return path
    return None


def _find_libpq() -> tuple[tuple[int, ...] | None, str]:
    """The addresses of ``_FUNCTIONS`` in psycopg2's libpq, or None and why not."""
    if _copyjson is None or not hasattr(_copyjson, "copy_out"):
        return None, "sources.postgres._copyjson was not built"
    try:
        module = ctypes.CDLL(psycopg2._psycopg.__file__)
        addresses = tuple(ctypes.cast(getattr(module, name), ctypes.c_void_p).value for name in _FUNCTIONS)
    except (OSError, AttributeError) as err:
        return None, f"libpq's functions were not found through psycopg2's module ({err})"
    try:
        with open(f"/proc/{os.getpid()}/maps") as file:
            maps = []
            for row in file:
                fields = row.split(maxsplit=5)
                if len(fields) == 6:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    maps.append((start, end, fields[5].strip()))
    except OSError as err:
        return None, f"the process's mappings cannot be read ({err})"
    files = {_mapped_file(address, maps) for address in addresses}
    path = files.pop() if len(files) == 1 else None
    if path is None or not os.path.basename(path).startswith("libpq"):
        return None, f"libpq's functions do not all lie in one mapped libpq ({sorted(map(str, files | {path}))})"
    return addresses, path


_LIBPQ: tuple[tuple[int, ...] | None, str] | None = None


def libpq_functions() -> tuple[int, ...] | None:
    """psycopg2's libpq functions for ``_copyjson.copy_out``, or None (logged the first time)."""
    global _LIBPQ
    if _LIBPQ is None:
        _LIBPQ = _find_libpq()
        if _LIBPQ[0] is None:
            log.info("snapshot COPY goes through psycopg2's copy_expert, a row per call: %s", _LIBPQ[1])
    return _LIBPQ[0]


def copy_blocks(conn, sql: str, lines: int, emit: Callable[[bytes], None], rewrite: CopyJson | None = None) -> int:
    """Runs ``sql`` (a COPY ... TO STDOUT) on psycopg2 connection ``conn`` and calls ``emit`` with
    each block of up to ``lines`` whole lines, each made by ``rewrite`` where given. Returns the
    number of rows read; raises ``psycopg2.Error`` as ``copy_expert`` does."""
    functions = libpq_functions() if native.enabled() else None
    if functions is None or not (conn.autocommit or conn.status == psycopg2.extensions.STATUS_BEGIN):
        # Outside a transaction on a connection that is not autocommit, psycopg2 would send BEGIN
        # first (incremental.py's chunk reads): it keeps doing so.
        return _copy_expert(conn, sql, lines, emit, rewrite)
    spec = None
    if rewrite is not None:
        spec = (rewrite.kinds, rewrite.heads, rewrite.keys, rewrite.toast, rewrite.min_chars)

        def emit_block(block: bytes, rewritten: bool) -> None:
            # Not rewritten: a line the C rewrite does not take; the reference raises its error.
            emit(block if rewritten else rewrite(block))
    else:
        def emit_block(block: bytes, rewritten: bool) -> None:
            emit(block)
    rows, _, code, message, broken = _copyjson.copy_out(conn.pgconn_ptr, sql.encode(), functions, emit_block,
                                                        lines, spec)
    if message is not None:
        raise _error(code, message, broken)
    return rows


def _error(code: str | None, message: str, broken: bool) -> psycopg2.Error:
    """The exception psycopg2's ``pq_raise`` makes of this failure."""
    text = message
    for severity in _SEVERITIES:
        if len(text) > len(severity) and text.startswith(severity):
            text = text[len(severity):]
            break
    if code is not None:
        cls = psycopg2.errors.lookup(code) if _known(code) else psycopg2.DatabaseError
    else:
        cls = psycopg2.OperationalError if broken else psycopg2.DatabaseError
    err = cls(text)
    err.__setstate__({"pgerror": message, "pgcode": code, "cursor": None})
    return err


def _known(code: str) -> bool:
    try:
        psycopg2.errors.lookup(code)
    except KeyError:
        return False
    return True


class _LineBlocks:
    """A file for ``copy_expert`` that hands on blocks of whole lines (``lines`` writes each; libpq
    gives COPY data a row at a time): the fallback of ``copy_blocks``."""

    def __init__(self, emit: Callable[[bytes], None], lines: int, rewrite: CopyJson | None) -> None:
        self.emit, self.lines, self.rewrite = emit, lines, rewrite
        self.chunks: list[bytes] = []
        self.rest = b""
        self.rows = 0

    def write(self, data: bytes) -> None:
        chunks = self.chunks
        chunks.append(data)
        if len(chunks) >= self.lines:
            self._send()

    def _send(self) -> None:
        if self.rest:
            self.chunks.insert(0, self.rest)
        joined = b"".join(self.chunks)
        self.chunks = []
        cut = joined.rfind(b"\n") + 1
        self.rest = joined[cut:]
        if cut:
            block = joined[:cut] if cut < len(joined) else joined
            self.rows += block.count(b"\n")
            self.emit(block if self.rewrite is None else self.rewrite(block))

    def close(self) -> None:
        if self.chunks:
            self._send()
        if self.rest:
            raise ValueError("COPY output ended in the middle of a row")


def _copy_expert(conn, sql: str, lines: int, emit: Callable[[bytes], None], rewrite: CopyJson | None) -> int:
    sink = _LineBlocks(emit, lines, rewrite)
    with conn.cursor() as cur:
        cur.copy_expert(sql, sink, size=1 << 20)
    sink.close()
    return sink.rows
