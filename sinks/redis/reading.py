"""What ``cdc verify`` reads of a Redis sink's store (cdc.api.ReadableSink), and a source row in
the form a reader gets it back.

Cost: row keys are hashed, not ordered, so a range is found by a SCAN of the table's key names
(``COUNT`` 1000 a call, names only: no values), filtered by ``key_order``; only the rows in the
range are then read, one pipelined round trip per ``pipeline_size`` keys. A pass over N rows in
C chunks SCANs N x C names and reads each row once; a second look reads its keys directly (the
key name is made from the key). In a Redis Cluster the SCAN visits every master.

``stored_forms`` applies the sink's own column choice and value text (values.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from cdc.api import PermanentError, RetriableError, StoredRow, key_order, page
from sinks.redis.client import translate
from sinks.redis.config import RedisSinkConfig
from sinks.redis.keys import KeySpace, decode_key, encode_component, encode_key
from sinks.redis.values import column_chooser, hash_fields, json_value, stored_row
from sinks.redis.wait import current_namespace


class RedisSink(Protocol):
    """What these reads use of the sink (sink.py)."""

    config: RedisSinkConfig
    client: Any

SCAN_COUNT = 1000


def read_range(sink: RedisSink, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
    keyspace, schema, table = _table(sink, topic)
    head, tail = keyspace.parts(schema, table)
    low = key_order(after) if after is not None else None
    high = key_order(upto) if upto is not None else None
    names = []
    try:
        for found in _client(sink).scan_iter(match=keyspace.table_pattern(schema, table), count=SCAN_COUNT):
            name = found.decode() if isinstance(found, bytes) else found
            if "{" in name:
                continue  # a version companion, not a row (row keys never hold a brace)
            order = key_order(decode_key(name[len(head):len(name) - len(tail)]))
            if (low is None or order > low) and (high is None or order <= high):
                names.append(name)
    except (RetriableError, PermanentError):
        raise
    except Exception as err:  # noqa: BLE001
        raise translate(err, f"redis sink {sink.config.name}: scanning the keys of {topic}") from err
    return page(_rows(sink, topic, names, head, tail), None, None)


def read_keys(sink: RedisSink, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
    keyspace, schema, table = _table(sink, topic)
    head, tail = keyspace.parts(schema, table)
    names = [head + ":".join(encode_component(v) for v in key) + tail for key in keys]
    return page(_rows(sink, topic, names, head, tail), None, None)


def stored_forms(sink: RedisSink, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
    choose = column_chooser(sink.config)
    out = []
    for key, row in rows:
        chosen = choose(row)
        if sink.config.format == "hash":
            flat = hash_fields(chosen)
            stored: Any = dict(zip(flat[::2], flat[1::2]))
        else:
            stored = json_value(chosen)
        out.append(StoredRow(decode_key(encode_key(key)), stored_row(sink.config.format, stored) or {}))
    return out


def _table(sink: RedisSink, topic: str) -> tuple[KeySpace, str, str]:
    if sink.config.format == "invalidate":
        raise PermanentError(f"redis sink {sink.config.name}: format invalidate stores no rows to read back")
    parts = topic.split(".")
    schema, table = parts[-2] if len(parts) > 2 else "", parts[-1]  # <prefix>.<schema or db>.<table>
    return KeySpace(sink.config.key_template, current_namespace(_client(sink), sink.config.prefix)), schema, table


def _client(sink: RedisSink) -> Any:
    if sink.client is None:
        raise PermanentError(f"redis sink {sink.config.name}: call start() first")
    return sink.client


def _rows(sink: RedisSink, topic: str, names: Iterable[str], head: str, tail: str) -> list[StoredRow]:
    names = list(names)
    out: list[StoredRow] = []
    step = sink.config.pipeline_size
    try:
        for start in range(0, len(names), step):
            batch = names[start:start + step]
            pipe = _client(sink).pipeline(transaction=False)
            for name in batch:
                if sink.config.format == "hash":
                    pipe.hgetall(name)
                elif sink.config.format == "redisjson":
                    pipe.execute_command("JSON.GET", name)
                else:
                    pipe.get(name)
            for name, stored in zip(batch, pipe.execute()):
                row = stored_row(sink.config.format, stored or None)
                if row is not None:  # gone between the SCAN and the read
                    out.append(StoredRow(decode_key(name[len(head):len(name) - len(tail)]), row))
    except (RetriableError, PermanentError):
        raise
    except Exception as err:  # noqa: BLE001
        raise translate(err, f"redis sink {sink.config.name}: reading rows of {topic}") from err
    return out



