"""Row values -> what is stored under a row's key, for each ``format``.

Columns are chosen first (``include``, then ``exclude``, then ``rename``), the same way for every
format, so a reader sees the same names in a hash and in a JSON document:

* ``hash``: one field per column. Text as it is; numbers in decimal (exact numerics are strings in
  the change event and stay so); ``true``/``false``; JSON values and arrays as compact JSON. A NULL
  column has no field (``HGET`` answers nil). A new column is a new field from the next write.
* ``json`` (a string) and ``redisjson`` (a RedisJSON document): the row as a JSON object, exactly
  the event's ``after`` after the column choice (NULL stays null).
* ``invalidate``: nothing is stored; the key is deleted on every change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from sinks.redis.config import RedisSinkConfig


def column_chooser(config: RedisSinkConfig) -> Callable[[dict[str, Any]], dict[str, Any]]:
    include = None if config.include is None else frozenset(config.include)
    exclude = frozenset(config.exclude)
    rename = dict(config.rename)
    if include is None and not exclude and not rename:
        return lambda row: row

    def choose(row: dict[str, Any]) -> dict[str, Any]:
        return {rename.get(name, name): value for name, value in row.items()
                if (include is None or name in include) and name not in exclude}

    return choose


def _field_text(value: Any) -> bytes | str:
    if isinstance(value, str):
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    return orjson.dumps(value)


def hash_fields(row: dict[str, Any]) -> list:
    """``[field, value, field, value, ...]`` for HSET; NULL columns have no field."""
    flat: list = []
    for name, value in row.items():
        if value is not None:
            flat.append(name)
            flat.append(_field_text(value))
    return flat


def json_value(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row)


def stored_row(config_format: str, stored) -> dict[str, Any] | None:
    """What a reader gets back, as a dict of text (tests and tools): HGETALL or the JSON string."""
    if stored is None:
        return None
    if isinstance(stored, dict):
        return {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
                for k, v in stored.items()}
    return orjson.loads(stored)
