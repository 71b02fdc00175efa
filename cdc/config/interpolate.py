"""``${VAR}`` references in config strings, resolved from the environment.

Grammar, inside any string scalar (several references per string are fine):

* ``${NAME}``: the value of ``NAME``; an error when it is not set.
* ``${NAME:-default}``: the value of ``NAME``, or ``default`` when it is unset *or empty* (as in
  the shell). The default is literal text up to the first ``}``: no nesting.
* ``$$``: a literal ``$``. A ``$`` followed by anything else is kept as it is, so a password such
  as ``pa$word`` needs no escaping; ``${`` that does not form a reference is an error.

Substitution is a single pass: a variable's value is never interpolated again. The result is
always a string; a field that wants a number gets it from pydantic's coercion (``"3"`` -> 3), so a
value never changes type because of what an environment variable happens to contain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_TOKEN = re.compile(r"\$\$|\$\{(?P<body>[^}]*)\}|\$\{")
_BODY = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>.*))?", re.DOTALL)


def has_references(text: str) -> bool:
    return "$" in text


def interpolate(text: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """``text`` with its references replaced, and a message per reference that could not be."""
    errors: list[str] = []

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "$$":
            return "$"
        body = match.group("body")
        if body is None:
            errors.append("unterminated '${' (write '$$' for a literal '$')")
            return token
        ref = _BODY.fullmatch(body)
        if ref is None:
            errors.append(f"bad reference {token!r}: expected ${{NAME}} or ${{NAME:-default}}")
            return token
        value = env.get(ref.group("name"))
        default = ref.group("default")
        if default is not None and not value:
            return default
        if value is None:
            errors.append(f"environment variable {ref.group('name')} is not set "
                          f"(give a default with ${{{ref.group('name')}:-value}})")
            return token
        return value

    return _TOKEN.sub(replace, text), errors
