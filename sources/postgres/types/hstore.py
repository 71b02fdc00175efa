"""hstore text (``hstore_out``) to a dict of str to str | None.

    "a"=>"1", "b c"=>NULL, "q\\"x"=>"NULL"      {"a": "1", "b c": None, 'q"x': "NULL"}
    (empty text)                                {}

``hstore_out`` always double-quotes keys and values, escapes ``"`` and ``\\`` with a backslash,
writes a SQL NULL value as unquoted ``NULL`` and separates pairs with ``", "``. The reader also
takes hstore's input forms: unquoted keys and values (with backslash escapes), NULL in any case,
free white space. hstore is an extension type with a server-assigned OID, so ``converter_for``
recognises it by name.
"""

from __future__ import annotations

import re

from cdc.errors import DecodeError

_PAIR = re.compile(r"""
    \s*(?: "((?:[^"\\]|\\.)*)" | ((?:[^\s"\\=,]|\\.)+) )     # key: quoted or bare
    \s*=>\s*
    (?: "((?:[^"\\]|\\.)*)" | ((?:[^\s"\\,]|\\.)+) )         # value: quoted or bare (NULL)
    \s*(?:,|\Z)
""", re.S | re.X | re.A)  # re.A: \s is the server's isspace(), not Unicode white space
_BACKSLASH_ESCAPE = re.compile(r"\\(.)", re.S)


def _unescape(text: str) -> str:
    return _BACKSLASH_ESCAPE.sub(r"\1", text) if "\\" in text else text


def hstore_to_dict(text: str) -> dict[str, str | None]:
    result: dict[str, str | None] = {}
    pos, end = 0, len(text)
    match = _PAIR.match
    while pos < end:
        m = match(text, pos)
        if m is None:
            if not text[pos:].strip(" \t\n\r\v\f"):
                break
            raise DecodeError(f"hstore text {text!r}: no key=>value pair at offset {pos}")
        pos = m.end()
        quoted_key, bare_key, quoted_value, bare_value = m.groups()
        key = _unescape(quoted_key if quoted_key is not None else bare_key)
        if quoted_value is not None:
            result[key] = _unescape(quoted_value)
        elif bare_value.upper() == "NULL":
            result[key] = None
        else:
            result[key] = _unescape(bare_value)
    return result
