"""A rebuild's window into the new generation in bulk (PostgreSQL): plain COPY, no guard.

The runtime reduces the history to the newest version per key before the database sees anything
(``cdc.bulk_window``) and hands a window whose keys the generation does not hold yet over part by
part (``cdc.api.BulkLoadableSink``). Each key is in one part and the generation holds none of
them, so no row of a part can meet a row already there: its upserts go into the table with one
plain ``COPY`` (no staging, no ``ON CONFLICT``, no version guard, no anti-join on remembered
deletes), its deletes into ``cdc_sink_deletes`` with another (so a later live event older than a
delete never brings the row back, as for any delete), and its truncate raises the table's
watermark. Tombstones need
nothing: the generation never held those keys. One transaction per part: a part either landed
whole or not at all, and then the runtime writes it through the guarded path instead.

The rows stay JSON bytes from the log to the COPY text (``NativeCodecs.copy_rows``, the C loop of
the raw rows, handed over by the context); ``NativeCodecs.columns_first`` moves the key out of and the version to the end of each line,
to match the table's columns.

Not taken here (``load`` returns False, the part is written as events): other dialects, soft
deletes (a deleted key keeps a row there), binary columns (the typed stage decodes their base64),
and a table whose key is not the events' key (two event keys may be one row).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import orjson

import sinks.sql.copy_rows as copy_rows
from cdc.api import NativeCodecs, Op, SinkEvent, WindowPart
from sinks.sql.apply_staged import driver_cursor
from sinks.sql.bookkeeping import DELETES, Bookkeeping
from sinks.sql.plan import VERSION, TablePlan
from sinks.sql.reduce import TopicChanges, version_of
from sinks.sql.tables import TableCatalog
from sinks.sql.target import Target
from sinks.sql.types import Family

log = logging.getLogger(__name__)


class BulkLoader:
    def __init__(self, target: Target, books: Bookkeeping, catalog: TableCatalog, soft_delete: bool,
                 native: NativeCodecs) -> None:
        self.target = target
        self.books = books
        self.catalog = catalog
        self.native = native
        self.able = target.kind == "postgresql" and not soft_delete and native.columns_first is not None
        self._formatters: dict[tuple, Callable[[Iterable[tuple[bytes, SinkEvent]]], bytes]] = {}

    def load(self, part: WindowPart, generation: int) -> bool:
        """``part`` into ``generation``'s table (see the module docstring); False: not taken."""
        if not self.able:
            return False
        pairs = part.upserts or part.deletes
        if not pairs:
            if part.truncate is None:
                return True
            first = SinkEvent(part.topic, -1, -1, {}, Op.TRUNCATE, None, None, part.truncate, part.source)
        else:
            first = pairs[0][1]._replace(key=orjson.loads(pairs[0][0]))
        # The table made (or checked) from one row first: a new table's plan reads every row.
        one = {pairs[0][0]: first} if pairs else {}
        upserts_one, deletes_one = (one, {}) if part.upserts else ({}, one)
        self.catalog.prepare(TopicChanges(part.topic, first, upserts=dict(upserts_one), deletes=dict(deletes_one)),
                             generation)
        upserts = dict(part.upserts)
        deletes = dict(part.deletes)
        (upserts if part.upserts else deletes).update(one)  # the first with its key decoded
        plan = self.catalog.prepare(TopicChanges(part.topic, first, upserts=upserts, deletes=deletes,
                                                 truncate=part.truncate), generation)
        if plan.entry is not None:
            if {c.name for c in plan.key_columns} != set(first.key or ()):
                return False
            if any(c.family is Family.BINARY and not c.skipped for c in plan.columns):
                return False
        now = datetime.now(UTC).replace(tzinfo=None)
        with self.target.engine.begin() as conn:
            plan.watermark = part.truncate
            with driver_cursor(conn) as cursor:
                if part.truncate is not None:
                    cursor.execute(self.books.watermark_sql, (plan.tbl, part.truncate))
                if plan.entry is not None and upserts:
                    self._copy_rows(cursor, plan)
                if deletes:
                    self._copy_deletes(cursor, plan, now)
        return True

    def _copy_rows(self, cursor, plan: TablePlan) -> None:
        shape = tuple((c.name, c.family, c.skipped) for c in plan.columns)
        format_rows = self._formatters.get(shape)
        if format_rows is None:
            format_rows = self._formatters[shape] = copy_rows.formatter(plan.columns, self.native.copy_rows)
        columns_first = self.native.columns_first
        assert columns_first is not None, "the loader is able only with the compiled columns_first"
        text = columns_first(format_rows(plan.live_upserts()))
        q = self.target.quote
        columns = ", ".join(q(c.name) for c in plan.columns) + (", " if plan.columns else "") + q(VERSION)
        cursor.copy_expert(f"COPY {self.target.qualified(plan.tbl)} ({columns}) FROM STDIN", io.BytesIO(text))

    def _copy_deletes(self, cursor, plan: TablePlan, now: datetime) -> None:
        head = plan.tbl.encode().replace(b"\\", b"\\\\") + b"\t"
        at = now.isoformat().encode()
        text = b"".join(b"%b%b\t%d\t%b\n" % (head, key.replace(b"\\", b"\\\\"), version_of(event), at)
                        for key, event in plan.live_deletes())
        cursor.copy_expert(f"COPY {self.target.qualified(DELETES)} (tbl, key_json, version, "
                           f"{self.target.quote('at')}) FROM STDIN", io.BytesIO(text))
