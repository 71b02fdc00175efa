"""Range and multirange text (``range_out``, ``multirange_out``) to JSON objects.

    [1,3)                   {"lower": 1, "upper": 3, "lower_inc": true, "upper_inc": false}
    (,5]                    {"lower": null, "upper": 5, "lower_inc": false, "upper_inc": true}
    ["2024-01-01 00:00:00+00",infinity)
                            {"lower": "2024-01-01T00:00:00Z", "upper": "infinity", ...}
    empty                   "empty"
    {[1,3),[5,7)}           [{...}, {...}]    (a multirange: a list of ranges; {} is [])

A missing bound (unbounded side) is ``None``; a bound whose *value* is infinity (timestamps,
dates, floats) goes through the subtype converter like any other value, so ``"infinity"`` and
``None`` stay distinct. ``range_out`` quotes a bound that is empty or contains ``" \\ , ( ) [ ]`` or
white space, doubling ``"`` and ``\\`` inside; ``range_in`` also reads backslash escapes and quotes
in the middle of a bound, and so does this reader.
"""

from __future__ import annotations

import re
from typing import Any

from cdc.errors import DecodeError
from sources.postgres.types.scalars import Converter

_BOUND = r'(?:[^"\\,)\]]|\\.|"(?:[^"\\]|\\.|"")*")*'
# re.A: \s is the server's isspace() (ASCII), not Unicode white space.
_RANGE = re.compile(r"\s*([\[(])(%s),(%s)([\])])\s*" % (_BOUND, _BOUND), re.S | re.A)
_BOUND_PART = re.compile(r'"((?:[^"\\]|\\.|"")*)"|\\(.)', re.S)
_QUOTED_ESCAPE = re.compile(r'\\(.)|""', re.S)
_EMPTY = re.compile(r"\s*empty\s*", re.I | re.A)
_MULTIRANGE_GAP = re.compile(r"\s*(?:,\s*)?", re.A)


def _unquote_part(match: re.Match) -> str:
    quoted = match.group(1)
    if quoted is None:
        return match.group(2)
    return _QUOTED_ESCAPE.sub(lambda m: m.group(1) or '"', quoted)


def _bound(text: str, convert: Converter) -> Any:
    if not text:
        return None  # unbounded
    if text[0] == '"' and text[-1] == '"' and text.count('"') == 2 and "\\" not in text:
        text = text[1:-1]  # range_out's usual quoting: a timestamp's space, nothing to unescape
    elif '"' in text or "\\" in text:
        text = _BOUND_PART.sub(_unquote_part, text)
    return convert(text)


def _range_value(m: re.Match, subtype: Converter) -> dict[str, Any]:
    return {"lower": _bound(m.group(2), subtype), "upper": _bound(m.group(3), subtype),
            "lower_inc": m.group(1) == "[", "upper_inc": m.group(4) == "]"}


def range_converter(subtype: Converter) -> Converter:
    """A converter for ranges whose bounds convert with ``subtype``."""
    full = _RANGE.fullmatch

    def convert_range(text: str) -> dict[str, Any] | str:
        if text == "empty":
            return "empty"
        m = full(text)
        if m is None:
            if _EMPTY.fullmatch(text):
                return "empty"
            raise DecodeError(f"range text {text!r} is not a range")
        return _range_value(m, subtype)

    return convert_range


def multirange_converter(subtype: Converter) -> Converter:
    """A converter for multiranges: a list of ranges as ``range_converter`` gives them."""
    match_range, match_gap, match_empty = _RANGE.match, _MULTIRANGE_GAP.match, _EMPTY.match

    def convert_multirange(text: str) -> list[dict[str, Any]]:
        body = text.strip(" \t\n\r\v\f")
        if body[:1] != "{" or body[-1:] != "}":
            raise DecodeError(f"multirange text {text!r} is not a multirange")
        ranges: list[dict[str, Any]] = []
        pos, end = 1, len(body) - 1
        while True:
            gap = match_gap(body, pos)
            assert gap is not None, "the gap's pattern matches the empty text too"
            pos = gap.end()
            if pos >= end:
                return ranges
            m = match_range(body, pos, end)
            if m is not None:
                ranges.append(_range_value(m, subtype))
            else:
                m = match_empty(body, pos, end)  # multirange_in accepts and drops empty ranges
                if m is None:
                    raise DecodeError(f"multirange text {text!r}: no range at offset {pos}")
            pos = m.end()

    return convert_multirange
