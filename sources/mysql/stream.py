"""Binlog events -> batches, with checkpoints only at transaction boundaries.

A transaction is a MariaDB GTID event (or BEGIN) ... XID (or COMMIT); a DDL statement is a group
of its own (a standalone GTID, or a query outside BEGIN). The checkpoint is
``MySqlPosition(file, end of the XID/COMMIT/DDL event, GTID position including this transaction)``:
a resume reads from the next transaction on, so a transaction is never split. A batch may end in
the middle of a large transaction (``max_batch_events``); it then carries the last commit inside it
(or none), and the rest of the transaction follows in the next batches.

A batch that publishes schema changes starts with them: the events before a DDL statement go out
in one batch, the DDL's changes (and its checkpoint) open the next one.

Threading: the source's thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from cdc.errors import DecodeError, PermanentError
from cdc.events import Batch, ChangeEvent, SchemaChange, TableId
from cdc.positions import MySqlPosition
from sources.mysql import ddl
from sources.mysql.binlog import EVENT_BODY, UNSUPPORTED_EVENTS, BinlogConnection, event_start, row_body
from sources.mysql.catalog import resolve_key
from sources.mysql.changes import CapturedTable, ChangeBuilder, version_of
from sources.mysql.columns import specs_from_table_map
from sources.mysql.decoder import DELETE_ROWS, UPDATE_ROWS, WRITE, RowDecoder
from sources.mysql.gtid import GtidPosition
from sources.mysql.schema import SchemaTracker

log = logging.getLogger(__name__)

FL_STANDALONE = 1  # MariaDB GTID flag: a statement with no COMMIT/XID after it (DDL)
_DML = ("INSERT", "UPDATE", "DELETE", "REPLACE", "LOAD")
_KINDS = {WriteRowsEvent: WRITE, UpdateRowsEvent: UPDATE_ROWS, DeleteRowsEvent: DELETE_ROWS}


def _all_columns(n: int) -> bytes:
    return bytes([0xFF] * (n // 8) + ([(1 << (n % 8)) - 1] if n % 8 else []))


class BinlogStream:
    def __init__(self, connection: BinlogConnection, position: MySqlPosition, tracker: SchemaTracker,
                 captured: Callable[[str, str], bool], key_columns: dict[str, list[str]], dbms: str,
                 load_json: Callable[[str, str], set[str]], name: str) -> None:
        self.connection = connection
        self.tracker = tracker
        self.captured = captured
        self.key_columns = key_columns
        self.dbms = dbms
        self.load_json = load_json
        self.name = name
        self.builder = ChangeBuilder()
        self.builder.set_file(position.file)
        self.file = position.file
        self.gtid = GtidPosition.parse(position.gtid_set) if position.gtid_set is not None else None
        self.table_ids: dict[int, CapturedTable | None] = {}
        self.map_cache: dict[bytes, CapturedTable | None] = {}
        self.decoders: dict[tuple, RowDecoder] = {}
        self.full_bitmaps: dict[int, bytes] = {}
        self.in_tx = False
        self.tx_gtid: tuple[int, int, int] | None = None
        self.carry: tuple[list, list, MySqlPosition | None] | None = None
        self.last_commit_ms: int | None = None
        self.read_to: tuple[str, int] | None = None  # (file, end position) of the last event read
        self._warned_statements = False

    def close(self) -> None:
        self.connection.close()

    # -- the loop ----------------------------------------------------------------------------------
    def poll(self, max_events: int, timeout: float) -> Batch | None:
        deadline = time.monotonic() + timeout
        if self.carry is not None:
            events, changes, checkpoint = self.carry
            self.carry = None
        else:
            events, changes, checkpoint = [], [], None
        next_event, monotonic = self.connection.next_event, time.monotonic
        while True:
            event = next_event()
            kind = type(event)
            if kind is WriteRowsEvent or kind is UpdateRowsEvent or kind is DeleteRowsEvent:
                events += self._rows(event, kind)
                if len(events) >= max_events:
                    break
                continue
            if kind is XidEvent:
                checkpoint = self._commit(event)
                if len(events) >= max_events or monotonic() >= deadline:
                    break
                continue
            if kind is HeartbeatLogEvent:
                if events or changes or checkpoint is not None or monotonic() >= deadline:
                    break
                continue
            result = self._other(event, kind)
            if result is not None:
                more_events, more_changes, commit = result
                if more_changes and events:
                    # The changes (and what this event completes) open the next batch.
                    self.carry = (more_events, more_changes, commit)
                    break
                events += more_events
                changes += more_changes
                if commit is not None:
                    checkpoint = commit
            if monotonic() >= deadline and (events or changes or checkpoint is not None):
                break
        if event.packet.log_pos:  # how far the server has sent its binlog (a heartbeat says it too)
            self.read_to = (self.file, event.packet.log_pos)
        if events or changes or checkpoint is not None:
            return Batch(events, checkpoint, tuple(changes))
        return None

    # -- transactions --------------------------------------------------------------------------------
    def _commit(self, event) -> MySqlPosition:
        if self.tx_gtid is not None and self.gtid is not None:
            self.gtid.advance(*self.tx_gtid)
        self.tx_gtid = None
        self.in_tx = False
        self.builder.end()
        self.last_commit_ms = event.timestamp * 1000
        return MySqlPosition(self.file, event.packet.log_pos, str(self.gtid) if self.gtid is not None else None)

    def _other(self, event, kind) -> tuple[list, list, MySqlPosition | None] | None:
        if kind is TableMapEvent:
            change = self._table_map(event)
            return ([], [change], None) if change is not None else None
        if kind is MariadbGtidEvent:
            self.tx_gtid = (event.domain_id, event.server_id, event.gtid_seq_no)
            self.builder.begin(event.gtid, event.gtid)
            self.in_tx = not (event.flags & FL_STANDALONE)
            return None
        if kind is GtidEvent:  # MySQL: a BEGIN query follows for DML
            self.builder.begin(event.gtid, event.gtid)
            return None
        if kind is QueryEvent:
            return self._query(event)
        if kind is RotateEvent:
            self.file = event.next_binlog
            self.builder.set_file(self.file)
            return None
        if kind is XAPrepareEvent:  # the rows of an XA transaction are emitted at its prepare
            return [], [], self._commit(event)
        if kind is NotImplementedEvent:
            what = UNSUPPORTED_EVENTS.get(event.event_type)
            if what is not None:
                raise PermanentError(f"binlog {self.file}:{event_start(event)} holds {what}, which this source "
                                     "cannot decode: turn that server setting off")
        return None

    def _query(self, event) -> tuple[list, list, MySqlPosition | None] | None:
        text = event.query.strip()
        head = text[:24].upper()
        if head.startswith("BEGIN") or head.startswith("XA START"):
            if not self.in_tx:
                self.in_tx = True
                if self.builder.tx_id is None:
                    self.builder.begin(f"{self.file}:{event_start(event)}", None)
            return None
        if head.startswith("COMMIT") or head == "ROLLBACK" or head.startswith("XA COMMIT") \
                or head.startswith("XA ROLLBACK"):
            return [], [], self._commit(event)
        if head.startswith("SAVEPOINT") or head.startswith("ROLLBACK TO") or head.startswith("XA END"):
            return None
        db = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) else event.schema
        statement = ddl.parse(text, db)
        pos = event_start(event)
        changes: list[SchemaChange] = []
        events: list[ChangeEvent] = []
        if statement is not None:
            changes, truncated = self.tracker.apply(statement, text, version_of(self.builder.file_index, pos),
                                                    event.timestamp * 1000)
            events = [self.builder.truncate(table, pos, event.timestamp * 1000) for table in truncated]
            self.map_cache.clear()  # a cached table map may now resolve differently
            # Only statements about captured tables are news here; the binlog carries every
            # database's DDL, and the others' are noise at INFO.
            log.log(logging.INFO if changes or events else logging.DEBUG, "DDL at %s:%d: %s", self.file, pos,
                    text[:300], extra={"connector": self.name, "phase": "streaming"})
        elif head.startswith(_DML) and not self._warned_statements:
            self._warned_statements = True
            log.error("statement-based change at %s:%d is not captured (a session set binlog_format=STATEMENT?): "
                      "%s", self.file, pos, text[:300], extra={"connector": self.name, "phase": "streaming"})
        commit = None if self.in_tx else self._commit(event)
        return events, changes, commit

    # -- tables and rows -----------------------------------------------------------------------------
    def _table_map(self, event) -> SchemaChange | None:
        packet = event.packet.packet
        raw = packet.get_all_data()[EVENT_BODY:EVENT_BODY + event.event_size]
        try:
            self.table_ids[event.table_id] = self.map_cache[raw]
            return None
        except KeyError:
            pass
        table, change = self._resolve(event)
        if len(self.map_cache) > 10_000:
            self.map_cache.clear()
        self.map_cache[raw] = self.table_ids[event.table_id] = table
        return change

    def _resolve(self, event) -> tuple[CapturedTable | None, SchemaChange | None]:
        db, name = event.schema, event.table
        if not self.captured(db, name):
            return None, None
        schema = self.tracker.get(db, name)
        json_columns = schema.json_columns() if schema is not None else set()
        specs = specs_from_table_map(event, self.dbms, json_columns)
        names = tuple(s.name for s in specs)
        metadata = event.optional_metadata
        key_index = list(metadata.simple_primary_key_list or []) or list(metadata.primary_keys_with_prefix or {})
        key = tuple(names[i] for i in key_index if i < len(names))
        if not key:
            key = resolve_key(db, name, specs, self.key_columns)  # no primary key: the configured one
        pos = event_start(event)
        change = self.tracker.from_table_map(db, name, specs, key, lambda: self.load_json(db, name),
                                             version_of(self.builder.file_index, pos), event.timestamp * 1000)
        if change is not None:
            tracked = self.tracker.get(db, name)
            assert tracked is not None, "a table map that changed the copy leaves the table in it"
            json_now = tracked.json_columns()
            if json_now != json_columns:
                specs = specs_from_table_map(event, self.dbms, json_now)
            log.info("table %s.%s as of %s:%d: %s", db, name, self.file, pos,
                     ", ".join(f"{c.name} {c.type}" for c in change.columns),
                     extra={"connector": self.name, "phase": "streaming"})
        signature = (tuple(specs), key)
        decoder = self.decoders.get(signature)
        if decoder is None:
            if len(self.decoders) > 1000:
                self.decoders.clear()
            decoder = self.decoders[signature] = RowDecoder(f"{db}.{name}", specs, key)
        return CapturedTable(TableId(db, None, name), decoder), change

    def _rows(self, event, kind) -> list[ChangeEvent]:
        try:
            table = self.table_ids[event.table_id]
        except KeyError:
            raise DecodeError(f"binlog {self.file}:{event_start(event)}: a row event for table id "
                              f"{event.table_id} without its table map") from None
        if table is None:
            return []
        n = len(table.decoder.specs)
        full = self.full_bitmaps.get(n)
        if full is None:
            full = self.full_bitmaps[n] = _all_columns(n)
        if event.number_of_columns != n or event.columns_present_bitmap != full or (
                kind is UpdateRowsEvent and event.columns_present_bitmap2 != full):
            raise PermanentError(f"binlog {self.file}:{event_start(event)}: a row event of {table.id} without "
                                 "every column (a session with binlog_row_image other than FULL?): its rows "
                                 "cannot be captured whole")
        data, start, end = row_body(event)
        return self.builder.rows(_KINDS[kind], table, data, start, end, event_start(event), event.timestamp * 1000)
