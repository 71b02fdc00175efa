"""Binary value formats of the binlog's row images, for the types whose decoding is more than a
``struct`` format: DATE, TIME2/DATETIME2/TIMESTAMP2 (MySQL 5.6 temporal formats, after
``my_*_packed_from_binary`` in mysys/my_time.c), the pre-5.6 TIME/DATETIME/TIMESTAMP, and DECIMAL
(``bin2decimal`` in strings/decimal.c). Each produces the contract's form directly (see types.py).

The generated row decoders (decoder.py) call these, or inline the common cases with the caches
defined here: formatting a date or a time of day is the costly part, and a stream's rows share few
days and at most 86400 seconds of the day, so each is formatted once and then looked up.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from cdc.errors import PrerequisiteError
from sources.mysql.types import format_datetime, format_time, format_timestamp

DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of a DECIMAL group of 0..9 digits
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


def date(data: bytes, p: int) -> str | None:
    v = data[p] | data[p + 1] << 8 | data[p + 2] << 16
    day, month = v & 31, (v >> 5) & 15
    if not month or not day:
        return None
    return "%04d-%02d-%02d" % (v >> 9, month, day)


def fraction_reader(fsp: int) -> tuple[int, int]:
    """(bytes, divisor): DATETIME2/TIMESTAMP2 store 1-3 big-endian fraction bytes in units of
    1/100, 1/10000 or 1/1000000 s; divided by ``divisor`` they are the column's fsp digits."""
    width = (fsp + 1) // 2
    return width, 10 ** (2 * width - fsp)


class DayCache(dict):
    """DATETIME2's year*13+month and day bits -> ``YYYY-MM-DDT`` (None for a zero part), made on
    first use: a stream's rows share few days, so formatting a date becomes one dict lookup."""

    def __missing__(self, ymd: int) -> str | None:
        ym, day = ymd >> 5, ymd & 31
        month = ym % 13
        if len(self) > 100_000:
            self.clear()
        text = self[ymd] = None if not month or not day else "%04d-%02d-%02dT" % (ym // 13, month, day)
        return text


class EpochDayCache(dict):
    """Days since 1970-01-01 -> ``YYYY-MM-DDT`` (TIMESTAMP)."""

    def __missing__(self, number: int) -> str:
        if len(self) > 100_000:
            self.clear()
        text = self[number] = dt.date.fromordinal(_EPOCH_ORDINAL + number).isoformat() + "T"
        return text


class PackedTimeCache(dict):
    """DATETIME2's hour/minute/second bits -> ``HH:MM:SS`` (at most 2^17 entries)."""

    def __missing__(self, hms: int) -> str:
        text = self[hms] = "%02d:%02d:%02d" % (hms >> 12, (hms >> 6) & 63, hms & 63)
        return text


class SecondsCache(dict):
    """Seconds of the day -> ``HH:MM:SS`` (at most 86400 entries)."""

    def __missing__(self, seconds: int) -> str:
        text = self[seconds] = "%02d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)
        return text


def make_time2(fsp: int) -> Callable[[bytes, int], str]:
    """After my_time_packed_from_binary: negative values store the fraction reversed."""
    def time2(data: bytes, p: int) -> str:
        if fsp == 0:
            packed = (int.from_bytes(data[p:p + 3], "big") - 0x800000) << 24
        elif fsp <= 4:
            whole = int.from_bytes(data[p:p + 3], "big") - 0x800000
            if fsp <= 2:
                frac, span, unit = data[p + 3], 0x100, 10000
            else:
                frac, span, unit = int.from_bytes(data[p + 3:p + 5], "big", signed=True), 0x10000, 100
                if frac < 0:
                    frac += 0x10000
            if whole < 0 and frac:
                whole, frac = whole + 1, frac - span
            packed = (whole << 24) + frac * unit
        else:
            packed = int.from_bytes(data[p:p + 6], "big") - 0x800000000000
        negative = packed < 0
        if negative:
            packed = -packed
        hms, micros = packed >> 24, packed & 0xFFFFFF
        return format_time(negative, (hms >> 12) & 0x3FF, (hms >> 6) & 63, hms & 63, micros, fsp)
    return time2


def time(data: bytes, p: int) -> str:
    v = int.from_bytes(data[p:p + 3], "little", signed=True)
    negative, v = v < 0, abs(v)
    return format_time(negative, v // 10000, v // 100 % 100, v % 100, 0, 0)


def datetime(data: bytes, p: int) -> str | None:
    v = int.from_bytes(data[p:p + 8], "little")
    date, time = divmod(v, 1000000)
    return format_datetime(date // 10000, date // 100 % 100, date % 100, time // 10000, time // 100 % 100,
                           time % 100, 0, 0)


def timestamp(data: bytes, p: int) -> str | None:
    return format_timestamp(int.from_bytes(data[p:p + 4], "little"), 0, 0)


def make_decimal(precision: int, scale: int) -> tuple[Callable[[bytes, int], str], int]:
    """The binary DECIMAL format (decimal2bin): base-10^9 groups, big-endian, sign in the top bit,
    negative values bitwise inverted. Returns (decoder, size in bytes)."""
    intg = precision - scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    int_bytes = intg0 * 4 + DIG2BYTES[intg0x]
    frac_bytes = frac0 * 4 + DIG2BYTES[frac0x]
    size = int_bytes + frac_bytes
    if size == 0:
        raise PrerequisiteError(f"DECIMAL({precision},{scale}) has no digits")
    sign = 1 << (size * 8 - 1)
    invert = ((1 << (size * 8)) - 1) ^ sign
    frac_bits = frac_bytes * 8
    frac_mask = (1 << frac_bits) - 1
    tail_bits = DIG2BYTES[frac0x] * 8
    tail_mask = (1 << tail_bits) - 1
    billion = 10 ** 9

    def decimal(data: bytes, p: int) -> str:
        v = int.from_bytes(data[p:p + size], "big")
        if v & sign:
            v ^= sign
            minus = ""
        else:
            v ^= invert
            minus = "-" if v else ""
        whole, frac = v >> frac_bits, v & frac_mask
        if intg0:
            number = whole >> (intg0 * 32)
            for k in range(intg0 - 1, -1, -1):
                number = number * billion + ((whole >> (32 * k)) & 0xFFFFFFFF)
            whole = number
        if not scale:
            return "%s%d" % (minus, whole)
        if not frac0:
            return "%s%d.%0*d" % (minus, whole, frac0x, frac)
        head = frac >> tail_bits
        digits = "".join("%09d" % ((head >> (32 * k)) & 0xFFFFFFFF) for k in range(frac0 - 1, -1, -1))
        if frac0x:
            digits += "%0*d" % (frac0x, frac & tail_mask)
        return "%s%d.%s" % (minus, whole, digits)
    return decimal, size
