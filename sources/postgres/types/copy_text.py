"""Rows of ``COPY ... TO STDOUT`` in text format, as lists of PostgreSQL text values.

The snapshot reads tables with ``COPY (SELECT ...) TO STDOUT``: each value is the type output
function's text, exactly what pgoutput streams, so one converter serves both. Format
(https://www.postgresql.org/docs/current/sql-copy.html#id-1.9.3.55.9.2): one line per row, values
separated by tab, ``\\N`` for NULL, and backslash escapes ``\\b \\f \\n \\r \\t \\v \\\\``, ``\\ddd``
(octal byte), ``\\xHH`` (hex byte); a backslash before any other character is that character
(so ``\\<tab>`` is a tab inside a value, not a separator). The server writes only the named
escapes, but the reader takes all of them. Text is UTF-8 (the source requires server_encoding
UTF8 and the connection's client_encoding follows).
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Iterator

from cdc.errors import DecodeError

_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPE = re.compile(r"\\(.)", re.S)
_BYTE_ESCAPE = re.compile(r"\\[0-7x]")
_ESCAPE_BYTES = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.S)
_SIMPLE_ESCAPE_BYTES = {k.encode(): v.encode() for k, v in _SIMPLE_ESCAPES.items()}


def _simple_escape(m: re.Match) -> str:
    char = m.group(1)
    return _SIMPLE_ESCAPES.get(char, char)


def _byte_escape(m: re.Match) -> bytes:
    octal, hexa, other = m.groups()
    if octal is not None:
        return bytes((int(octal, 8) & 0xFF,))  # the server keeps the low byte of \777 too
    if hexa is not None:
        return bytes((int(hexa, 16),))
    return _SIMPLE_ESCAPE_BYTES.get(other, other)


def _unescape(field: str) -> str:
    if field[-1] == "\\" and (len(field) - len(field.rstrip("\\"))) % 2:
        raise DecodeError(f"COPY value {field[:200]!r} ends in a lone backslash")
    if _BYTE_ESCAPE.search(field) is None:
        return _ESCAPE.sub(_simple_escape, field)
    # \ddd and \xHH are bytes: several may form one UTF-8 character.
    raw = _ESCAPE_BYTES.sub(_byte_escape, field.encode("utf-8"))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DecodeError(f"COPY value {field[:200]!r}: escapes give invalid UTF-8: {err}") from err


def _ends_in_escape(field: str) -> bool:
    """An odd run of trailing backslashes escapes the tab that followed this piece."""
    return field[-1:] == "\\" and (len(field) - len(field.rstrip("\\"))) % 2 == 1


def parse_copy_text_line(line: bytes) -> list[str | None]:
    """One line of COPY text output (with or without its newline) to its values; ``None`` is NULL."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DecodeError(f"COPY line is not UTF-8: {err}") from err
    if text[-1:] == "\n":  # a value's own newlines are escaped, so this one ends the row
        text = text[:-1]
    if "\\" not in text:  # no NULLs, no escapes: most rows of most tables
        return text.split("\t")  # type: ignore[return-value]  # a list[str] is one: a copy would cost
    pieces = text.split("\t")
    values: list[str | None] = []
    i, count = 0, len(pieces)
    while i < count:
        field = pieces[i]
        i += 1
        if field == "\\N":
            values.append(None)
            continue
        if "\\" not in field:
            values.append(field)
            continue
        while _ends_in_escape(field) and i < count:  # '\<tab>': the tab belongs to the value
            field += "\t" + pieces[i]
            i += 1
        values.append(_unescape(field))
    return values


class _LineSplitter:
    """The file object ``copy_expert`` writes to: cuts the byte stream into rows, in batches.

    libpq hands over one row per write, but nothing in psycopg2's contract promises that, so a
    partial line is kept until its end arrives.
    """

    def __init__(self, out: queue.Queue, batch_rows: int, stop: threading.Event) -> None:
        self._out, self._batch_rows, self._stop = out, batch_rows, stop
        self._batch: list[list[str | None]] = []
        self._partial = b""

    def write(self, data: bytes) -> int:
        if self._stop.is_set():
            raise _Abandoned()
        if self._partial:
            data = self._partial + data
            self._partial = b""
        if data[-1:] == b"\n" and data.count(b"\n") == 1:
            self._batch.append(parse_copy_text_line(data))
        else:
            lines = data.split(b"\n")
            self._partial = lines.pop()
            self._batch.extend(parse_copy_text_line(line) for line in lines)
        if len(self._batch) >= self._batch_rows:
            self._put(self._batch)
            self._batch = []
        return len(data)

    def end_of_data(self) -> None:
        """The COPY ended: a last line without its newline is still a row."""
        if self._partial:
            self._batch.append(parse_copy_text_line(self._partial))
            self._partial = b""

    def flush(self) -> None:
        if self._batch:
            self._put(self._batch)
            self._batch = []

    def _put(self, item: object) -> None:
        while True:
            try:
                self._out.put(item, timeout=0.1)
                return
            except queue.Full:
                if self._stop.is_set():
                    raise _Abandoned() from None


class _Abandoned(Exception):
    """The reader stopped before the end of the COPY."""


_DONE = object()


def iter_copy_batches(cursor, copy_sql: str, *, batch_rows: int = 2000,
                      max_batches: int = 4) -> Iterator[list[list[str | None]]]:
    """Run ``copy_sql`` (``COPY (SELECT ...) TO STDOUT``) on ``cursor`` and yield its rows in batches.

    psycopg2's ``copy_expert`` pushes the whole result into a file object and returns only at the
    end, so it runs in a helper thread that hands batches of at most ``batch_rows`` rows through
    a queue of ``max_batches``: memory stays bounded by those two however large the table.

    Threading: the cursor's connection belongs to the helper thread until the generator is
    exhausted or closed; do not use it meanwhile. Errors (server errors as psycopg2 exceptions,
    ``DecodeError`` for bad text) are raised in the consuming thread, after the rows read before
    them. Closing the generator early cancels the query and abandons the COPY; psycopg2 cannot
    resume a half-read COPY, so the connection must then be closed, not reused.
    """
    batches: queue.Queue = queue.Queue(maxsize=max_batches)
    stop = threading.Event()
    splitter = _LineSplitter(batches, batch_rows, stop)

    def produce() -> None:
        outcome: object = _DONE
        try:
            cursor.copy_expert(copy_sql, splitter)
            splitter.end_of_data()
        except _Abandoned:
            return
        except BaseException as err:  # handed to the consumer, which re-raises it
            outcome = err
        try:
            splitter.flush()  # the rows read before an error come first
            splitter._put(outcome)
        except _Abandoned:
            pass

    worker = threading.Thread(target=produce, name="copy-reader", daemon=True)
    worker.start()
    ended = False  # the COPY ended (completely or with an error) before the consumer stopped
    try:
        while True:
            item = batches.get()
            if item is _DONE:
                ended = True
                return
            if isinstance(item, BaseException):
                ended = True
                raise item
            yield item
    finally:
        stop.set()
        if not ended:
            # Stopped early: a long query may not write again for a while, so cancel it
            # (thread-safe in psycopg2); the helper thread then ends with QueryCanceled. Never
            # after the end: a late cancel could hit the connection's next statement.
            cursor.connection.cancel()
        worker.join()


def iter_copy_rows(cursor, copy_sql: str, **batching) -> Iterator[list[str | None]]:
    """``iter_copy_batches`` one row at a time."""
    for batch in iter_copy_batches(cursor, copy_sql, **batching):
        yield from batch
