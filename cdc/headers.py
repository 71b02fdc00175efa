"""Record headers: every data record's ``source.version`` and source name, tombstones included.

A tombstone (a null value after a delete) has no envelope, so without a header it carries no
version: a sink that met one alone had to guess what it deletes (see cdc/sink_events.py). Every
record the capture publishes into a table's topic, and every schema record, carries:

* ``cdc.version``: the event's ``source.version`` as ASCII decimal (``b"23456789"``), so any
  consumer reads it as text (kcat, Spark SQL ``CAST(CAST(value AS STRING) AS BIGINT)``); a
  tombstone carries its delete's version, a truncate and a schema record their own;
* ``cdc.source``: the source connector's name (versions compare only within one source).

Headers are a list of ``(name, value bytes or None)`` pairs, confluent-kafka's own form, in the
order they were written; a name may repeat, and the last one counts (Kafka's rule for a lookup).
A record written before headers existed has none (``None``), and reads as before.

The bytes the embedded log stores headers as are the log's business (cdc/log/packed_headers.py).
This module is a leaf: plugins read the names through ``cdc.api``.
"""

from __future__ import annotations

VERSION = "cdc.version"
SOURCE = "cdc.source"

Headers = list[tuple[str, bytes | None]]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def source_header(name: str) -> tuple[str, bytes]:
    """The ``cdc.source`` header of a source named ``name`` (made once per encoder)."""
    return (SOURCE, name.encode())


def record_headers(version: int, source: tuple[str, bytes]) -> Headers:
    """The headers of a record of version ``version`` from ``source`` (``source_header``)."""
    return [(VERSION, b"%d" % version), source]


def version_of(headers: Headers | None) -> int | None:
    """The ``cdc.version`` header as an int, None when there is none; ``ValueError`` when it is not
    a decimal int64 (``-``, then 1 to 19 ASCII digits). cdc/_decode.c reads it by the same rule."""
    if not headers:
        return None
    found = None
    for name, value in headers:
        if name == VERSION:
            found = value if value is not None else b""
    if found is None:
        return None
    if type(found) is not bytes:
        raise ValueError(f"the {VERSION} header is not bytes but {type(found).__name__}")
    digits = found[1:] if found[:1] == b"-" else found
    if not 0 < len(digits) <= 19 or not digits.isdigit():
        raise ValueError(f"the {VERSION} header is not a decimal integer: {found[:40]!r}")
    version = int(found)
    if not _INT64_MIN <= version <= _INT64_MAX:
        raise ValueError(f"the {VERSION} header does not fit in 64 bits: {found!r}")
    return version
