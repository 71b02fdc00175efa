"""Decoded row images -> change events: keys, versions, source fields and transactions.

Versions (``source.version``, int64, strictly increasing per key within the source)::

    version = file_index << 32 | byte position of the row image in that binlog file

The binlog file index is the numeric suffix of ``binlog.000042``; a row's byte position (the
event's start + the row's offset inside it) is below 2^32 because binlog positions are 32-bit
on the wire. Two changes of the same key are two different row images, so they never share a
position, and a later change is further down the same file or in a later file. This is the
contract's "file index, position and row index", with the row index expressed in bytes, so no
number of rows per event can overflow it. Snapshot rows carry ``file_index << 32 | snapshot
position``: every row streamed after that position lies further down the file, so it is higher.
``source.pos`` is the event's start and ``source.row`` the row's index within the event, as in
Debezium.

An UPDATE whose primary key changed becomes a delete of the old key and a create of the new one
(both at the row's version: they are different keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cdc.events import ChangeEvent, Op, SnapshotMarker, TableId, TransactionInfo
from sources.mysql.decoder import RowDecoder

FILE_SHIFT = 32


def version_of(file_index: int, position: int) -> int:
    return (file_index << FILE_SHIFT) | position


def key_function(names: tuple[str, ...], key: tuple[str, ...]) -> Callable[[dict], dict]:  # snapshot rows
    """A compiled ``row -> {key columns}``: one dict literal, no loop."""
    missing = [k for k in key if k not in names]
    if missing:
        raise KeyError(missing)
    body = ", ".join(f"{k!r}: row[{k!r}]" for k in key)
    return eval(f"lambda row: {{{body}}}")  # noqa: S307 - built from column names via repr()


@dataclass(slots=True)
class CapturedTable:
    """A captured table as of one table map: its decoder (which knows the key)."""

    id: TableId
    decoder: RowDecoder


class ChangeBuilder:
    """Turns row events into change events. Used from the source's thread only.

    ``begin``/``end`` bracket a transaction (a MariaDB GTID event or BEGIN, then XID or COMMIT);
    rows outside one (a non-transactional engine without GTIDs) get no transaction block.
    """

    def __init__(self) -> None:
        self.file = ""
        self.file_index = 0
        self.tx_id: str | None = None
        self.gtid: str | None = None
        self.order = 0
        self.table_order: dict[TableId, int] = {}

    def set_file(self, name: str) -> None:
        self.file = name
        self.file_index = int(name.rsplit(".", 1)[-1])

    def begin(self, tx_id: str, gtid: str | None) -> None:
        self.tx_id, self.gtid = tx_id, gtid
        self.order = 0
        self.table_order = {}

    def end(self) -> None:
        self.tx_id = self.gtid = None

    def _tx(self, table: TableId) -> TransactionInfo | None:
        if self.tx_id is None:
            return None
        self.order += 1
        n = self.table_order[table] = self.table_order.get(table, 0) + 1
        return tuple.__new__(TransactionInfo, (self.tx_id, self.order, n))

    def rows(self, kind: int, table: CapturedTable, data: bytes, start: int, end: int, event_pos: int,
             ts_ms: int) -> list[ChangeEvent]:
        """The events of a rows event (``decoder.WRITE``/``UPDATE_ROWS``/``DELETE_ROWS``) whose row
        images are ``data[start:end]``; ``data[1]`` is the event's first byte, at ``event_pos``."""
        tid = table.id
        tx_id = self.tx_id
        order, first = self.order, self.table_order.get(tid, 0)
        events, count = table.decoder.events(kind, data, start, end, f"{self.file}:{event_pos}", tid,
                                             (self.file_index << FILE_SHIFT) + event_pos - 1, ts_ms, self.file,
                                             event_pos, self.gtid, tx_id, order, first)
        if tx_id is not None:
            self.order = order + count
            self.table_order[tid] = first + count
        return events

    def truncate(self, table: TableId, event_pos: int, ts_ms: int) -> ChangeEvent:
        return ChangeEvent(Op.TRUNCATE, table, None, None, None, version_of(self.file_index, event_pos), ts_ms,
                           SnapshotMarker.FALSE, {"file": self.file, "pos": event_pos, "row": 0, "gtid": self.gtid},
                           self._tx(table))
