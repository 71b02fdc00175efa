"""Source offsets, stored in the log itself: the compacted topic ``<prefix>.offsets``.

One record per source, keyed ``{"source": "<name>"}``, valued with the typed position's JSON; and
per source the tables its topics are complete for (``{"source": "<name>", "record": "tables"}``,
see cdc/runtime/contexts.py, OffsetTableBook), so a table added to the config later is known as new.
Compaction keeps the newest per source. The runtime saves a position only after the log has
acknowledged every event up to it (``LogWriter`` reports it safe), and waits for the offset
record itself to be acknowledged before it tells the source (``Source.commit``). So after any
crash, the stored offset is never ahead of what the log holds.
"""

from __future__ import annotations

import orjson

from cdc.errors import DecodeError
from cdc.log.base import Log, LogReader, internal_settings
from cdc.positions import IncrementalProgress, MySqlPosition, PgLsn, Position, position_from_json, position_to_json
from cdc.serde import Record
from cdc.topics import offsets_topic

MYSQL_FILE_SHIFT = 32  # the MySQL source's versions: binlog file index << 32 | position


class OffsetStore:
    """Threading: one store per thread (it owns a log writer)."""

    def __init__(self, log: Log, prefix: str) -> None:
        self.log = log
        self.topic = offsets_topic(prefix)
        log.ensure_topic(self.topic, internal_settings(log, partitions=1))
        self._writer = log.writer()
        self._on_its_way: tuple[str, Position] | None = None

    @staticmethod
    def _key(source: str) -> bytes:
        return orjson.dumps({"source": source})

    def load_all(self) -> dict[str, Position | None]:
        """The stored position of every source (``None`` where it was reset)."""
        latest: dict[str, Position | None] = {}
        for record in self.log.read_all(self.topic):
            try:
                if record.key is None:
                    raise ValueError("no key")
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
        """Store ``position`` durably; returns only once the log acknowledged it (DeliveryError
        after ``timeout`` seconds)."""
        self._publish(source, position)
        self._writer.flush(timeout)
        self._on_its_way = None

    def offer(self, source: str, position: Position, wait: float) -> Position | None:
        """Store ``position`` without waiting more than ``wait`` seconds for the log: the position
        the log acknowledged meanwhile (``position``, or an earlier one offered before), else None.
        One record at a time: while an earlier one is unacknowledged (too few in-sync replicas, no
        leader) nothing newer is sent, so a slow log still stores every so often. Raises
        DeliveryError for a record that failed."""
        stored = None
        if self._on_its_way is not None:
            if not self._acknowledged(wait):
                return None
            # Another source's record (a store shared by several) is waited for, not taken for ours.
            stored = self._on_its_way[1] if self._on_its_way[0] == source else None
            self._on_its_way = None
        if stored != position:
            self._publish(source, position)
            if self._acknowledged(wait):
                stored, self._on_its_way = position, None
        return stored

    def _publish(self, source: str, position: Position) -> None:
        self._writer.publish([Record(self.topic, self._key(source), position_to_json(position).encode())])
        self._on_its_way = (source, position)

    def _acknowledged(self, wait: float) -> bool:
        self._writer.send_now(wait)
        if self._writer.outstanding:
            return False
        self._writer.flush(0)   # nothing left: raises for a record that failed
        return True

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


def checkpoint_version(position: Position | None) -> int | None:
    """A stored position as its source's ``source.version`` at that transaction boundary: a
    PostgreSQL LSN as it is; a MySQL (file, pos) as the MySQL source encodes versions
    (``file index << 32 | pos``, sources/mysql/changes.py). None for a snapshot in progress (not
    everything before it is in the log yet) and for positions without versions. An incremental
    snapshot's progress is the stream's position inside it (its chunks so far are before it)."""
    if isinstance(position, IncrementalProgress):
        position = position.at
    if isinstance(position, PgLsn):
        return position.lsn
    if isinstance(position, MySqlPosition):
        return (position.file_index << MYSQL_FILE_SHIFT) | position.pos
    return None


class CheckpointFeed:
    """The sources' stored checkpoints as they move, for a sink that must know how far each source
    is durably in the log (read-your-writes). Each ``poll`` reads only the offset records new
    since the last one (a reader kept open) and returns ``{source: version}`` for each source whose
    stored checkpoint rose. A stored checkpoint is a transaction boundary whose events, and all
    before them, the log acknowledged before it was stored (see the module docstring).

    Threading: one thread at a time; ``close`` when done."""

    def __init__(self, log: Log, prefix: str) -> None:
        self.log = log
        self.topic = offsets_topic(prefix)
        self._reader: LogReader | None = None
        self._versions: dict[str, int] = {}

    def poll(self, timeout: float = 0.05) -> dict[str, int]:
        if self._reader is None:
            if self.topic not in self.log.topics():
                return {}
            self._reader = self.log.reader()
            self._reader.assign({tp: 0 for tp in self.log.end_offsets(self.topic)})
        moved: dict[str, int] = {}
        while True:
            records = self._reader.poll(10_000, timeout)
            if not records:
                return moved
            for record in records:
                if record.value is None or record.key is None:
                    continue  # a reset: the source starts afresh; its versions only rise again
                try:
                    source = orjson.loads(record.key)["source"]
                    version = checkpoint_version(position_from_json(record.value))
                except (ValueError, KeyError, TypeError):
                    continue  # not an offset record this framework wrote; nothing to learn
                if version is not None and version > self._versions.get(source, -(1 << 63)):
                    self._versions[source] = moved[source] = version

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
