"""PostgreSQL's array text format (``array_out``) to nested JSON lists.

    {1,2,NULL}                    [1, 2, None]
    {"a b","NULL",NULL,""}        ["a b", "NULL", None, ""]   (quoted "NULL" is the string)
    {{1,2},{3,4}}                 [[1, 2], [3, 4]]
    [0:2]={1,2,3}                 [1, 2, 3]       (explicit lower bounds are dropped)
    {(1,1),(0,0);(3,3),(2,2)}     box[]: the element type's delimiter is ';'
    {}                            []

``array_out`` double-quotes an element that is empty, spells NULL in any case, or contains the
delimiter, a brace, a double quote, a backslash or white space; inside quotes it escapes ``"`` and
``\\`` with a backslash. The reader also accepts what ``array_in`` accepts around that (white space
between elements, backslash escapes outside quotes). Elements go through the element type's
converter; a multi-dimensional array becomes nested lists.
"""

from __future__ import annotations

import re
from itertools import product
from typing import Any

from cdc.errors import DecodeError
from sources.postgres.types.scalars import Converter

# array_in reads an unquoted NULL in any letter case as SQL NULL.
_NULL_SPELLINGS = frozenset("".join(letters) for letters in product("nN", "uU", "lL", "lL"))
_BACKSLASH_ESCAPE = re.compile(r"\\(.)", re.S)
# array_isspace(): the only white space around elements; str.strip() would also take U+00A0.
_ARRAY_SPACE = " \t\n\r\v\f"


def _token_pattern(delimiter: str) -> re.Pattern:
    d = re.escape(delimiter)
    return re.compile(
        r"(\{)|(\})|(%s)|\"((?:[^\"\\]|\\.)*)\"|((?:[^{}\"\\%s]|\\.)+)" % (d, d), re.S)


_OPEN, _CLOSE, _DELIMITER, _QUOTED, _UNQUOTED = 1, 2, 3, 4, 5


def _parse_nested(text: str, tokens: re.Pattern, element: Converter) -> list[Any]:
    stack: list[list[Any]] = []
    root: list[Any] | None = None
    pos, end = 0, len(text)
    match = tokens.match
    while pos < end:
        m = match(text, pos)
        if m is None:
            raise DecodeError(f"array text {text!r}: unexpected character at offset {pos}")
        pos = m.end()
        kind = m.lastindex
        assert kind is not None, "every alternative of the token pattern is a group"
        if kind == _OPEN:
            inner: list[Any] = []
            if stack:
                stack[-1].append(inner)
            elif root is None:
                root = inner
            else:
                raise DecodeError(f"array text {text!r}: text after the closing brace")
            stack.append(inner)
        elif kind == _CLOSE:
            if not stack:
                raise DecodeError(f"array text {text!r}: unbalanced braces")
            stack.pop()
        elif kind == _DELIMITER:
            continue
        else:
            if not stack:
                if not m.group(kind).strip(_ARRAY_SPACE):
                    continue
                raise DecodeError(f"array text {text!r}: element outside braces")
            if kind == _QUOTED:
                value = m.group(_QUOTED)
                if "\\" in value:
                    value = _BACKSLASH_ESCAPE.sub(r"\1", value)
                stack[-1].append(element(value))
            else:
                value = m.group(_UNQUOTED).strip(_ARRAY_SPACE)
                if not value:  # white space between tokens
                    continue
                if value in _NULL_SPELLINGS:
                    stack[-1].append(None)
                else:
                    if "\\" in value:
                        value = _BACKSLASH_ESCAPE.sub(r"\1", value)
                    stack[-1].append(element(value))
    if stack or root is None:
        raise DecodeError(f"array text {text!r}: unbalanced braces")
    return root


def array_converter(element: Converter, delimiter: str = ",") -> Converter:
    """A converter for arrays whose elements convert with ``element`` and are separated by ``delimiter``."""
    tokens = _token_pattern(delimiter)
    nulls = _NULL_SPELLINGS

    def convert_array(text: str) -> list[Any]:
        if text[:1] == "[":  # '[0:2]={...}': the bounds end at the first '='
            equals = text.find("=")
            if equals < 0:
                raise DecodeError(f"array text {text[:200]!r}: bounds without '='")
            text = text[equals + 1:]
        # Fast path, most arrays: one dimension, nothing quoted or escaped, no white space
        # (array_out quotes elements with white space, so its unquoted text has none).
        last = len(text) - 1
        if (text[:1] == "{" and text[last:] == "}" and text.find("{", 1) < 0 and text.find("}", 0, last) < 0
                and "\"" not in text and "\\" not in text and " " not in text):
            if len(text) == 2:
                return []
            return [None if item in nulls else element(item) for item in text[1:-1].split(delimiter)]
        return _parse_nested(text, tokens, element)

    return convert_array
