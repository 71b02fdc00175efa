"""The shapes a source published before this run, read back from ``<prefix>.schema-changes``.

A format whose schemas come from the shapes (``debezium-json``, ``avro``) needs a table's shape
for its first row after a restart. The PostgreSQL and MySQL sources publish every captured table's shape
again when they start (tests/integration/test_debezium_json_restart.py); a source that does not
would otherwise get schemas guessed from values. So the runner reads the source's published
shapes once at start; shapes of this run are handed over as they are published.
"""

from __future__ import annotations

import orjson

from cdc.events import Column, SchemaChange, TableId
from cdc.log.base import Log
from cdc.topics import schema_changes_topic


def known_shapes(log_: Log, prefix: str, source_name: str) -> list[SchemaChange]:
    topic = schema_changes_topic(prefix)
    if topic not in log_.topics():
        return []
    shapes = []
    for record in log_.read_all(topic):
        if record.value is None:
            continue
        value = orjson.loads(record.value)
        if value.get("source") != source_name or not isinstance(value.get("version"), int):
            continue
        shapes.append(SchemaChange(TableId(value["db"], value.get("schema"), value["table"]), columns_of(value),
                                   value["version"], value.get("ts_ms") or 0, value.get("ddl")))
    return shapes


def columns_of(record: dict) -> tuple[Column, ...]:
    """The columns of a ``<prefix>.schema-changes`` record's value (cdc.serde.encode_schema_change)."""
    return tuple(Column(c["name"], c["type"], bool(c.get("key")), c.get("nullable", True), c.get("default"),
                        c.get("renamed_from"))
                 for c in record.get("columns") or [])
