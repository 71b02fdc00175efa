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
``PGconn`` (``connection.pgconn_ptr``, public psycopg2 API) with the libpq ``_copyjson`` is linked
to, the system's. That is safe only when psycopg2 runs on that same libpq, i.e. when it was built
from source (``scripts/setup`` does so: ``pip install --no-binary psycopg2-binary``); a
psycopg2-binary wheel carries its own libpq (and OpenSSL), whose ``PGconn`` the system's libpq must
never touch. So the loop runs only when the distribution that provides psycopg2 ships no libpq of
its own and psycopg2's libpq has the version of ours (``libpq_version()``); otherwise (a wheel, no
C build, no libpq headers at build time) the readers keep ``copy_expert``, logged once with why.

Errors come out as psycopg2 would raise them from ``copy_expert``: a server error as the class of
its SQLSTATE with ``pgcode`` set (the message without its severity prefix, as psycopg2 strips
it), a connection lost without a word from the server as ``OperationalError``; callers wrap them
as before (``errors.wrap``). An exception from ``emit`` propagates and leaves the COPY where it
stopped, as ``copy_expert`` does when the file's ``write`` raises.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from cdc import native
from sources.postgres.copy_json import CopyJson, _copyjson

log = logging.getLogger(__name__)

_SEVERITIES = ("ERROR:  ", "FATAL:  ", "PANIC:  ")

# The distributions that install the psycopg2 package: from source, and as a wheel or from source.
_PSYCOPG2_DISTRIBUTIONS = ("psycopg2", "psycopg2-binary")


def _why_not_c_loop() -> str | None:
    """None when ``_copyjson.copy_out`` may be given psycopg2's connections, else why not."""
    if _copyjson is None or not hasattr(_copyjson, "copy_out"):
        return "sources.postgres._copyjson was built without libpq (no C compiler or no libpq-dev)"
    files = []
    for dist in _PSYCOPG2_DISTRIBUTIONS:  # named, not searched for: a scan of every installed one costs 50 ms
        try:
            files += [str(name) for name in importlib.metadata.files(dist) or []]
        except importlib.metadata.PackageNotFoundError:
            pass
    return refusal(files, _copyjson.libpq_version(), psycopg2.extensions.libpq_version())


def refusal(psycopg2_files: list[str], ours: int, theirs: int) -> str | None:
    """Why the libpq of a psycopg2 installed as ``psycopg2_files`` (its distribution's files), of
    version ``theirs``, may not be driven by ours (version ``ours``); None when it may."""
    bundled = sorted(name for name in psycopg2_files if name.rsplit("/", 1)[-1].startswith("libpq"))
    if bundled:
        return (f"psycopg2 runs on the libpq its wheel bundles ({', '.join(bundled)}), not the system's: "
                "install it from source (scripts/setup; pip install --no-binary psycopg2-binary psycopg2-binary)")
    if ours != theirs:
        return f"psycopg2 runs on libpq {theirs}, sources.postgres._copyjson was linked to libpq {ours}"
    return None


_WHY_NOT: list[str | None] = []


def c_loop_ready() -> bool:
    """Whether ``copy_blocks`` reads with the C loop (the reason it does not is logged the first time)."""
    if not _WHY_NOT:
        _WHY_NOT.append(_why_not_c_loop())
        if _WHY_NOT[0] is not None:
            log.info("snapshot COPY goes through psycopg2's copy_expert, a row per call: %s", _WHY_NOT[0])
    return _WHY_NOT[0] is None


def why_not_c_loop() -> str | None:
    """Why ``copy_blocks`` does not read with the C loop, or None when it does."""
    c_loop_ready()
    return _WHY_NOT[0]


def copy_blocks(conn, sql: str, lines: int, emit: Callable[[bytes], None], rewrite: CopyJson | None = None) -> int:
    """Runs ``sql`` (a COPY ... TO STDOUT) on psycopg2 connection ``conn`` and calls ``emit`` with
    each block of up to ``lines`` whole lines, each made by ``rewrite`` where given. Returns the
    number of rows read; raises ``psycopg2.Error`` as ``copy_expert`` does."""
    as_is = conn.autocommit or conn.status == psycopg2.extensions.STATUS_BEGIN
    if not (native.enabled() and c_loop_ready() and as_is):
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
    rows, _, code, message, broken = _copyjson.copy_out(conn.pgconn_ptr, sql.encode(), emit_block, lines, spec)
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
