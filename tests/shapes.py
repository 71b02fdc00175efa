"""Topics as a capture daemon fills them, for sink tests that need schema changes in order with
rows: a table's shape (a ``<prefix>.schema-changes`` record) published before the rows that name
it in ``source.schema_version``."""

from __future__ import annotations

from collections.abc import Sequence

from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.log.base import Log, TopicSettings
from cdc.positions import Counter
from cdc.serde import EnvelopeEncoder, encode_schema_change, schema_changes_topic


class ShapedTopics:
    """One source (``source``, PostgreSQL-shaped envelopes) publishing under ``prefix``."""

    def __init__(self, log: Log, prefix: str, source: str = "pg", partitions: int = 1) -> None:
        self.log, self.prefix, self.source, self.partitions = log, prefix, source, partitions
        self.encoder = EnvelopeEncoder("postgresql", source, prefix)
        log.ensure_topic(schema_changes_topic(prefix))

    def publish(self, table: TableId, version: int, columns: Sequence[Column] | None, rows: list[dict],
                op: Op = Op.CREATE) -> None:
        """The shape ``columns`` at ``version`` (None: publish no shape, yet name it), then ``rows``
        with versions ``version``, ``version + 1``, ... naming it."""
        self.log.ensure_topic(table.topic(self.prefix), TopicSettings(partitions=self.partitions))
        self.encoder.schema_versions[table] = version
        records = [] if columns is None else [
            encode_schema_change(SchemaChange(table, tuple(columns), version, 0), self.source, self.prefix)]
        records += self.encoder.encode([ChangeEvent(op, table, {"id": row["id"]}, None, row, version + i, 0)
                                        for i, row in enumerate(rows)])
        writer = self.log.writer()
        try:
            writer.publish(records, Counter(1))
            writer.flush(30)
        finally:
            writer.close()
