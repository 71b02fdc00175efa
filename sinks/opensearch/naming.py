"""Names: the alias of a table, the index of a generation, the ``_id`` of a row.

* Alias: ``index_name`` rendered with the topic and the source block (default: the topic,
  ``<prefix>.<schema>.<table>``), lowercased. Readers query it.
* Generation index: ``<alias>__g<N>``. Writers write to it; readers never name it.
* ``_id``: one key column: its value as text (``42``, ``ab-cd``; a JSON string's characters
  as they are). Several key columns: the JSON array of their values in the key's column order
  (``[7,"eu"]``), compact, so the same key always gives the same ``_id``. An ``_id`` longer than
  OpenSearch's 512 bytes is ``sha256:<hex of the text>`` instead.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

from cdc.api import ConfigError

GENERATION_SUFFIX = re.compile(r"^(?P<alias>.+)__g(?P<generation>[0-9]+)$")
MAX_ID_BYTES = 512
# OpenSearch refuses these characters in index names (and a leading -, _ or +).
_INVALID = re.compile(r'[\\/*?"<>| ,#:]')


def alias_name(template: str, topic: str, source: dict[str, Any]) -> str:
    parts = topic.split(".")
    name = template.format(topic=topic, schema=source.get("schema") or (parts[-2] if len(parts) > 1 else ""),
                           db=source.get("db") or "", table=source.get("table") or parts[-1]).lower()
    if not name or _INVALID.search(name) or name[0] in "-_+" or name in (".", "..") or len(name.encode()) > 240:
        raise ConfigError(f"index name {name!r} (from index_name {template!r} and topic {topic}) is not a valid "
                          f"OpenSearch index name: no \\ / * ? \" < > | space , # :, not starting with - _ +, "
                          f"at most 240 bytes")
    return name


def generation_index(alias: str, generation: int) -> str:
    return f"{alias}__g{generation}"


def split_generation(index: str) -> tuple[str, int] | None:
    """``orders__g3`` -> ("orders", 3); None for an index that is not a generation."""
    match = GENERATION_SUFFIX.match(index)
    return (match["alias"], int(match["generation"])) if match else None


def document_id(key: dict[str, Any]) -> str:
    if len(key) == 1:
        [value] = key.values()
        if type(value) is int:  # the common case, and str(int) is what JSON prints
            return str(value)
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
    else:
        text = orjson.dumps(list(key.values())).decode()
    if len(text.encode()) > MAX_ID_BYTES:
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text
