"""Decoding the row images of binlog row events, with a decoder compiled once per table map.

Implements the row image format of WRITE/UPDATE/DELETE_ROWS events (v1 and v2 share it):
https://mariadb.com/kb/en/rows_event_v1v2-rows_compressed_event_v1/ and the value formats of
https://dev.mysql.com/doc/dev/mysql-server/latest/classbinary__log_1_1Rows__event.html (MySQL's
``Field::pack`` / ``my_*_packed_from_binary`` for the temporal types).

Why generated code: pymysqlreplication decodes every value through a generic method that
re-dispatches on the column type, reads through three layers of buffer objects and builds
``datetime``/``Decimal`` objects we would only convert again: about 30 us per row. A table's
column types and metadata are fixed by its table map, so we write, once per table map, a Python
function whose body is the straight-line decoding of exactly that row shape: consecutive NOT NULL
fixed-width columns in one ``struct.unpack_from``, the null bitmap read as one integer, each value
produced directly in the contract's JSON form (see ``types.py``), the row dict built from a
literal, and the change event made in the same loop (key, source fields and transaction order
included), so nothing is built per row that the event does not keep. The whole event body (many
rows) goes through one call. Measured on the benchmark's rows (bench/mysql_stream.py): about 4x
pymysqlreplication's own decoding, in CPU time.

A decoder never trusts lengths: on anything malformed (truncated, corrupted) it raises
``DecodeError`` naming the table and the offset of the row; never another exception, never a
silent short read (the last row must end exactly at the end of the event).

The columns the decoders are generated from are in ``columns``; the C decoder's program in
``c_decoder``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from cdc.errors import DecodeError, PrerequisiteError
from cdc.events import ChangeEvent, Op, SnapshotMarker, TableId, TransactionInfo
from sources.mysql import values
from sources.mysql.c_decoder import c_program
from sources.mysql.columns import (
    BIT,
    BLOB,
    DATE,
    DATETIME,
    DATETIME2,
    DOUBLE,
    ENUM,
    FLOAT,
    GEOMETRY,
    INT24,
    JSON,
    LONG,
    LONG_BLOB,
    LONGLONG,
    MEDIUM_BLOB,
    NEWDECIMAL,
    SET,
    SHORT,
    STRING,
    TIME,
    TIME2,
    TIMESTAMP,
    TIMESTAMP2,
    TINY,
    TINY_BLOB,
    TYPE_NAMES,
    VAR_STRING,
    VARCHAR,
    YEAR,
    ColumnSpec,
    string_converter,
)
from sources.mysql.types import shortest_float32
from sources.mysql.values import (
    DIG2BYTES,
    DayCache,
    EpochDayCache,
    PackedTimeCache,
    SecondsCache,
    fraction_reader,
    make_decimal,
    make_time2,
)

_FIXED = {TINY: ("b", "B"), SHORT: ("h", "H"), LONG: ("i", "I"), LONGLONG: ("q", "Q"),
          FLOAT: ("f", "f"), DOUBLE: ("d", "d"), YEAR: ("B", "B")}
WRITE, UPDATE_ROWS, DELETE_ROWS = 1, 2, 3  # the kinds of rows events ``RowDecoder.events`` makes


# --- code generation ------------------------------------------------------------------------------

class _Gen:
    """Writes the straight-line decoding of one row image into ``lines``. Its temporaries are
    ``nb n m x d r f`` and ``v<i>``; the templates around it must not use those names (they keep
    a before image's key values in ``k<i>``)."""

    def __init__(self, specs: Sequence[ColumnSpec]) -> None:
        self.specs = specs
        self.env: dict[str, Any] = {"f32": shortest_float32, "_date": values.date, "_time": values.time,
                                    "_datetime": values.datetime, "_timestamp": values.timestamp,
                                    "DecodeError": DecodeError}

    def name(self, prefix: str, value: Any) -> str:
        key = f"{prefix}{len(self.env)}"
        self.env[key] = value
        return key

    def image(self, out: str, indent: str) -> list[str]:
        specs = self.specs
        nbytes = (len(specs) + 7) // 8
        lines = []
        if any(s.nullable for s in specs):
            read = {1: "data[p]", 2: "data[p] | data[p + 1] << 8"}.get(
                nbytes, f"int.from_bytes(data[p:p + {nbytes}], 'little')")
            lines.append(f"nb = {read}; p += {nbytes}")
        else:
            lines.append(f"p += {nbytes}")
        i = 0
        while i < len(specs):
            spec = specs[i]
            if not spec.nullable and spec.type in _FIXED:
                # A run of NOT NULL fixed-width columns: one unpack.
                j = i
                while j < len(specs) and not specs[j].nullable and specs[j].type in _FIXED:
                    j += 1
                run = specs[i:j]
                fmt = "<" + "".join(_FIXED[s.type][s.unsigned] for s in run)
                unpack = self.name("S", struct.Struct(fmt).unpack_from)
                names = ", ".join(f"v{k}" for k in range(i, j))
                lines.append(f"{names}{',' if j - i == 1 else ''} = {unpack}(data, p); p += {struct.calcsize(fmt)}")
                for k, s in zip(range(i, j), run):
                    lines += self.post_fixed(k, s)
                i = j
                continue
            body = self.value(i, spec)
            if spec.nullable:
                lines.append(f"if nb & {1 << i}: v{i} = None")
                lines.append("else:")
                lines += ["    " + line for line in body]
            else:
                lines += body
            i += 1
        fields = ", ".join(f"{spec.name!r}: v{k}" for k, spec in enumerate(specs))
        lines.append(f"{out} = {{{fields}}}")
        return [indent + line for line in lines]

    @staticmethod
    def post_fixed(k: int, spec: ColumnSpec) -> list[str]:
        if spec.type == FLOAT:
            return [f"v{k} = f32(v{k})"]
        if spec.type == YEAR:
            return [f"v{k} = v{k} + 1900 if v{k} else 0"]
        return []

    def value(self, k: int, s: ColumnSpec) -> list[str]:
        v, t = f"v{k}", s.type
        if t in _FIXED:
            fmt = "<" + _FIXED[t][s.unsigned]
            unpack = self.name("S", struct.Struct(fmt).unpack_from)
            return [f"{v}, = {unpack}(data, p); p += {struct.calcsize(fmt)}"] + self.post_fixed(k, s)
        if t == INT24:
            return [f"{v} = int.from_bytes(data[p:p + 3], 'little', signed={not s.unsigned}); p += 3"]
        if t == NEWDECIMAL:
            decode, size = make_decimal(s.precision, s.scale)
            if s.precision - s.scale >= 9 or s.scale >= 9:
                return [f"{v} = {self.name('DEC', decode)}(data, p); p += {size}"]
            # One base-10^9 group on each side of the point: the digits are the two integers.
            frac_bits = DIG2BYTES[s.scale] * 8
            sign = 1 << (size * 8 - 1)
            invert = ((1 << (size * 8)) - 1) ^ sign
            fmt = f"%d.%0{s.scale}d" if s.scale else "%d"
            parts = f"(x >> {frac_bits}, x & {(1 << frac_bits) - 1})" if s.scale else "(x,)"
            return [f"x = int.from_bytes(data[p:p + {size}], 'big'); p += {size}",
                    f"if x & {sign}:",
                    f"    x ^= {sign}; {v} = {fmt!r} % {parts}",
                    "else:",
                    f"    x ^= {invert}; {v} = ({'-' + fmt!r} if x else {fmt!r}) % {parts}"]
        if t == DATE:
            return [f"{v} = _date(data, p); p += 3"]
        if t == DATETIME2:
            # Inline: the date and time-of-day parts come from caches (see values.DayCache).
            width, divisor = fraction_reader(s.fsp)
            D, T = self.name("D", DayCache()), self.name("TM", PackedTimeCache())
            scaled = f" // {divisor}" if divisor > 1 else ""
            frac = (f" + {self.name('F', f'.%0{s.fsp}d')!s} % (int.from_bytes(data[p + 5:p + {5 + width}], 'big')"
                    f"{scaled})") if width else ""
            return [f"x = int.from_bytes(data[p:p + 5], 'big') - 549755813888; d = {D}[x >> 17]",
                    f"{v} = None if d is None else d + {T}[x & 131071]{frac}",
                    f"p += {5 + width}"]
        if t == TIMESTAMP2:
            width, divisor = fraction_reader(s.fsp)
            D, T = self.name("D", EpochDayCache()), self.name("TM", SecondsCache())
            fraction = self.name("F", f".%0{s.fsp}dZ" if s.fsp else "Z")
            scaled = f" // {divisor}" if divisor > 1 else ""
            frac = f"int.from_bytes(data[p + 4:p + {4 + width}], 'big'){scaled}" if width else "0"
            tail = f"{fraction} % f" if width else fraction
            return [f"x = int.from_bytes(data[p:p + 4], 'big'); f = {frac}; p += {4 + width}",
                    "if x or f:",
                    "    d, r = divmod(x, 86400)",
                    f"    {v} = {D}[d] + {T}[r] + {tail}",
                    "else:",
                    f"    {v} = None"]
        if t == TIME2:
            return [f"{v} = {self.name('T', make_time2(s.fsp))}(data, p); p += {3 + (s.fsp + 1) // 2}"]
        if t == TIME:
            return [f"{v} = _time(data, p); p += 3"]
        if t == DATETIME:
            return [f"{v} = _datetime(data, p); p += 8"]
        if t == TIMESTAMP:
            return [f"{v} = _timestamp(data, p); p += 4"]
        if t == BIT:
            size = (s.length + 7) // 8
            return [f"{v} = int.from_bytes(data[p:p + {size}], 'big'); p += {size}"]
        if t == ENUM:
            labels = self.name("L", ("",) + s.labels)
            index = "data[p]" if s.length == 1 else "(data[p] | data[p + 1] << 8)"
            return [f"{v} = {labels}[{index}]; p += {s.length}"]
        if t == SET:
            labels = self.name("L", tuple(enumerate(s.labels)))
            return [f"m = int.from_bytes(data[p:p + {s.length}], 'little'); p += {s.length}",
                    f"{v} = [label for bit, label in {labels} if m >> bit & 1]"]
        if t in (VARCHAR, VAR_STRING, STRING):
            if s.length > 255:
                lines = ["n = data[p] | data[p + 1] << 8; p += 2"]
            else:
                lines = ["n = data[p]; p += 1"]
            return lines + [f"{v} = {self.convert_bytes(s, 'data[p:p + n]')}; p += n"]
        if t in (BLOB, GEOMETRY, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB):
            width = s.length
            return [f"n = int.from_bytes(data[p:p + {width}], 'little'); p += {width}",
                    f"{v} = {self.convert_bytes(s, 'data[p:p + n]')}; p += n"]
        raise PrerequisiteError(f"column {s.name}: binlog type {TYPE_NAMES.get(t, t)} is not supported by the "
                                "mysql source" + (" (MySQL binary JSON)" if t == JSON else ""))

    def convert_bytes(self, s: ColumnSpec, raw: str) -> str:
        convert = string_converter(s)
        if isinstance(convert, str):
            return f"str({raw}, {convert!r})"
        return f"{self.name('D', convert)}({raw})"


# A WRITE or DELETE rows event: one image a row, the event's op and which side the image stands on.
_ONE_IMAGE_EVENTS = '''def {name}(data, p, end, tid, base, ts_ms, file, pos, gtid, tx_id, order, first):
    out = []
    append = out.append
    i = 0
    while p < end:
        start = p
{image_after}
        i += 1
        append(NEW(EVENT, ({op}, tid, {{{key_after}}}, {before}, {after}, base + start, ts_ms, STREAMED,
                           {{"file": file, "pos": pos, "row": i - 1, "gtid": gtid}},
                           None if tx_id is None else NEW(TX, (tx_id, order + i, first + i)))))
    return out, p, i'''

_TEMPLATE = '''
def rows(data, p, end):
    out = []
    append = out.append
    while p < end:
        start = p
{image_after}
        append((start, row))
    return out, p


def pairs(data, p, end):
    out = []
    append = out.append
    while p < end:
        start = p
{image_before}
{image_after}
        append((start, before, row))
    return out, p


{write_events}


{delete_events}


def update_events(data, p, end, tid, base, ts_ms, file, pos, gtid, tx_id, order, first):
    out = []
    append = out.append
    i = emitted = 0
    while p < end:
        start = p
{image_before}
        {save_key}
{image_after}
        key = {{{key_after}}}
        fields = {{"file": file, "pos": pos, "row": i, "gtid": gtid}}
        i += 1
        emitted += 1
        if {same_key}:
            append(NEW(EVENT, (UPDATE, tid, key, before, row, base + start, ts_ms, STREAMED, fields,
                               None if tx_id is None else NEW(TX, (tx_id, order + emitted, first + emitted)))))
        else:  # the primary key changed: a delete of the old key, a create of the new one
            append(NEW(EVENT, (DELETE, tid, {{{key_before}}}, before, None, base + start, ts_ms, STREAMED, fields,
                               None if tx_id is None else NEW(TX, (tx_id, order + emitted, first + emitted)))))
            emitted += 1
            append(NEW(EVENT, (CREATE, tid, key, None, row, base + start, ts_ms, STREAMED, fields,
                               None if tx_id is None else NEW(TX, (tx_id, order + emitted, first + emitted)))))
    return out, p, emitted
'''


class RowDecoder:
    """The compiled decoder of one table map's row images. Thread-safe (no state but caches).

    ``rows``/``pairs`` return the decoded rows (for tests and tools); ``events`` makes the change
    events directly, which is what the stream uses: per row one dict for the row, one for the key,
    one for the source fields and the event tuple, nothing else.
    """

    def __init__(self, table: str, specs: Sequence[ColumnSpec], key: Sequence[str] = ()) -> None:
        if not specs:
            raise PrerequisiteError(f"table {table}: the table map has no columns")
        self.table = table
        self.specs = tuple(specs)
        self.names = tuple(s.name for s in specs)
        if any(not name for name in self.names) or len(set(self.names)) != len(self.names):
            raise PrerequisiteError(f"table {table}: the binlog carries no column names "
                                    "(SET GLOBAL binlog_row_metadata = FULL)")
        missing = [k for k in key if k not in self.names]
        if missing:
            raise PrerequisiteError(f"table {table}: key columns {missing} are not in the binlog's columns")
        self.key = tuple(key) or self.names[:1]
        gen = _Gen(self.specs)
        index = [self.names.index(k) for k in self.key]
        key_after = ", ".join(f"{k!r}: v{i}" for k, i in zip(self.key, index))
        key_before = ", ".join(f"{k!r}: k{i}" for k, i in zip(self.key, index))
        image_after = "\n".join(gen.image("row", " " * 8))
        write_events, delete_events = (
            _ONE_IMAGE_EVENTS.format(name=name, op=op, before=before, after=after, image_after=image_after,
                                     key_after=key_after)
            for name, op, before, after in (("write_events", "CREATE", "None", "row"),
                                            ("delete_events", "DELETE", "row", "None")))
        self.source = _TEMPLATE.format(image_after=image_after,
                                       image_before="\n".join(gen.image("before", " " * 8)), key_after=key_after,
                                       key_before=key_before, write_events=write_events,
                                       delete_events=delete_events,
                                       save_key="; ".join(f"k{i} = v{i}" for i in index),
                                       same_key=" and ".join(f"v{i} == k{i}" for i in index))
        namespace = dict(gen.env, NEW=tuple.__new__, EVENT=ChangeEvent, TX=TransactionInfo, CREATE=Op.CREATE,
                         DELETE=Op.DELETE, UPDATE=Op.UPDATE, STREAMED=SnapshotMarker.FALSE)
        exec(compile(self.source, f"<row decoder of {table}>", "exec"), namespace)  # noqa: S102 - our own code
        self._rows = namespace["rows"]
        self._pairs = namespace["pairs"]
        self._events = {WRITE: namespace["write_events"], DELETE_ROWS: namespace["delete_events"],
                        UPDATE_ROWS: namespace["update_events"]}
        # The same decoding in C where it was built and the table's types allow (_rowdecode.c).
        self.program = c_program(self.specs, self.names, index)

    def _run(self, fn, data: bytes, start: int, end: int, where: str, *context):
        try:
            out = fn(data, start, end, *context)
        except Exception as err:  # noqa: BLE001 - the decoder's boundary: anything malformed is a DecodeError
            raise DecodeError(f"{where}: a row of {self.table} cannot be decoded at byte offset "
                              f"{self._failing_row(data, start, end)} of the event body "
                              f"({type(err).__name__}: {err})") from err
        if out[1] != end:
            raise DecodeError(f"{where}: the row of {self.table} at byte offset {self._failing_row(data, start, end)} "
                              f"runs past the end of the event body ({end - start} bytes): truncated or corrupted "
                              "row event")
        return out

    def _failing_row(self, data: bytes, start: int, end: int) -> int:
        """The offset of the first row that fails or runs past ``end`` (decoding one row at a time)."""
        p = start
        while p < end:
            try:
                _, after = self._rows(data, p, p + 1)  # one row: the loop stops after it
            except Exception:  # noqa: BLE001
                return p - start
            if after <= p or after > end:
                break
            p = after
        return p - start

    def rows(self, data: bytes, start: int, end: int, where: str = "row event") -> list[tuple[int, dict]]:
        """WRITE/DELETE rows in ``data[start:end]``: ``(offset of the row in data, row)`` each."""
        return self._run(self._rows, data, start, end, where)[0]

    def pairs(self, data: bytes, start: int, end: int,
              where: str = "row event") -> list[tuple[int, dict, dict]]:
        """UPDATE rows: ``(offset, before, after)`` each."""
        return self._run(self._pairs, data, start, end, where)[0]

    def events(self, kind: int, data: bytes, start: int, end: int, where: str, tid: TableId, base: int,
               ts_ms: int, file: str, pos: int, gtid: str | None, tx_id: str | None, order: int,
               first: int) -> tuple[list[ChangeEvent], int]:
        """The change events of a rows event (``kind``: WRITE, UPDATE_ROWS or DELETE_ROWS) and how
        many there are. A row's version is ``base + its offset in data``; transaction orders
        continue from ``order`` (in the transaction) and ``first`` (for this table)."""
        program = self.program
        if program is not None:
            made = program.events(kind, data, start, end, tid, base, ts_ms, file, pos, gtid, tx_id, order, first)
            if made is not None:
                return made[0], made[2]
            # Not taken (malformed, or a value the C code does not print): the Python decoder decides.
        out, _, count = self._run(self._events[kind], data, start, end, where, tid, base, ts_ms, file, pos, gtid,
                                  tx_id, order, first)
        return out, count
