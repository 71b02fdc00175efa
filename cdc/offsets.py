"""Source offsets, stored in the log itself: the compacted topic ``<prefix>.offsets``.

One record per source, keyed ``{"source": "<name>"}``, valued with the typed position's JSON; and
per source the tables its topics are complete for (``{"source": "<name>", "record": "tables"}``,
see snapshot/tables.py), so a table added to the config later is known as new.
Compaction keeps the newest per source. The runtime saves a position only after the log has
acknowledged every event up to it (``LogWriter`` reports it safe), and waits for the offset
record itself to be acknowledged before it tells the source (``Source.commit``). So after any
crash, the stored offset is never ahead of what the log holds.
"""

from __future__ import annotations

import orjson

from cdc.errors import DecodeError
from cdc.log.base import Log, TopicSettings
from cdc.positions import Position, position_from_json, position_to_json
from cdc.serde import Record


def offsets_topic(prefix: str) -> str:
    return f"{prefix}.offsets"


class OffsetStore:
    """Threading: one store per thread (it owns a log writer)."""

    def __init__(self, log: Log, prefix: str, replication_factor: int = 1) -> None:
        self.log = log
        self.topic = offsets_topic(prefix)
        log.ensure_topic(self.topic, TopicSettings(partitions=1, replication_factor=replication_factor))
        self._writer = log.writer()

    @staticmethod
    def _key(source: str) -> bytes:
        return orjson.dumps({"source": source})

    def load_all(self) -> dict[str, Position | None]:
        """The stored position of every source (``None`` where it was reset)."""
        latest: dict[str, Position | None] = {}
        for record in self.log.read_all(self.topic):
            try:
                key = orjson.loads(record.key)
                if "record" in key:  # not a position: the source's tables (load_tables)
                    continue
                name = key["source"]
                latest[name] = None if record.value is None else position_from_json(record.value)
            except (ValueError, KeyError, TypeError) as err:
                raise DecodeError(f"{self.topic} partition {record.partition} offset {record.offset}: "
                                  f"not an offset record ({err}): {record.value!r:.200}") from err
        return latest

    def load(self, source: str) -> Position | None:
        return self.load_all().get(source)

    def save(self, source: str, position: Position, timeout: float = 30.0) -> None:
        """Store ``position`` durably; returns only once the log acknowledged it."""
        self._writer.publish([Record(self.topic, self._key(source), position_to_json(position).encode())])
        self._writer.flush(timeout)

    def reset(self, source: str, timeout: float = 30.0) -> None:
        """Forget ``source``'s position (a tombstone): its next start begins afresh."""
        self._writer.publish([Record(self.topic, self._key(source), None)])
        self._writer.flush(timeout)

    @staticmethod
    def _tables_key(source: str) -> bytes:
        return orjson.dumps({"source": source, "record": "tables"})

    def load_tables(self, source: str) -> frozenset[str] | None:
        """The tables stored by ``save_tables`` for ``source``; None when none were stored."""
        key, tables = self._tables_key(source), None
        for record in self.log.read_all(self.topic):
            if record.key == key:
                tables = None if record.value is None else frozenset(orjson.loads(record.value)["tables"])
        return tables

    def save_tables(self, source: str, tables: frozenset[str], timeout: float = 30.0) -> None:
        """Store the tables ``source``'s topics are complete for; returns once acknowledged."""
        value = orjson.dumps({"tables": sorted(tables)})
        self._writer.publish([Record(self.topic, self._tables_key(source), value)])
        self._writer.flush(timeout)

    def close(self) -> None:
        self._writer.close()
