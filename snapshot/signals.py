"""What incremental snapshots (``incremental``) share with the database sources: the signal table
(its columns and Debezium's signal names), the settings, the reads a source supplies
(``IncrementalReads``), and how a signal row and its conditions are read.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import BaseModel, Field, field_validator

from cdc.events import ChangeEvent, Op, TableId

OPEN = "snapshot-window-open"
CLOSE = "snapshot-window-close"
EXECUTE = "execute-snapshot"
STOP = "stop-snapshot"
PAUSE = "pause-snapshot"    # Debezium's signal names
RESUME = "resume-snapshot"
SIGNALS = {"execute": EXECUTE, "stop": STOP, "pause": PAUSE, "resume": RESUME}  # cdc snapshot's actions
WATERMARKS = (OPEN, CLOSE)

# The signal table, as each source creates it when it is missing (Debezium's columns).
SIGNAL_COLUMNS = "id VARCHAR(64) PRIMARY KEY, type VARCHAR(32) NOT NULL, data VARCHAR(2048)"


class IncrementalSettings(BaseModel):
    """The settings of incremental snapshots, shared by the database sources' configs."""

    signal_table: str | None = Field(default=None, description=(
        "namespace.table of the signal table (created if missing; columns id, type, data): incremental "
        "snapshots write their watermarks there, and a row of type execute-snapshot asks for one. "
        "Unset: no incremental snapshots"))
    incremental_chunk_rows: int = Field(default=1024, ge=1, description=(
        "rows per chunk of an incremental snapshot: streaming waits for one chunk's read at most"))
    incremental_chunk_pause_ms: int = Field(default=0, ge=0, description=(
        "pause after each chunk before the next one is read (streaming goes on meanwhile): bounds the "
        "load an incremental snapshot puts on the source database"))

    @field_validator("signal_table")
    @classmethod
    def _qualified(cls, value: str | None) -> str | None:
        if value is not None and (value.count(".") != 1 or not all(value.split("."))):
            raise ValueError(f"signal_table {value!r}: name it as namespace.table (public.cdc_signal, shop.cdc_signal)")
        return value


class IncrementalReads(Protocol):
    """What a source supplies for incremental snapshots (both calls on the source's thread)."""

    signal_table: TableId | None

    def write_signal(self, signal_id: str, kind: str, data: dict) -> int:
        """Commit a row in the signal table (deleting the watermark rows before it) and return a
        version at or below the one the stream will give the row."""

    def chunk_readable(self) -> bool:
        """Whether a chunk read now sees every change numbered below the last low watermark's
        version (PostgreSQL: once the transactions older than it ended); cheap, called per poll."""

    def read_chunk(self, table: str, after: tuple | None, size: int, version: int,
                   where: str | None = None) -> list[ChangeEvent]:
        """Up to ``size`` rows of ``table`` whose key follows ``after`` (None: from the start) and
        that match the SQL condition ``where`` (None: every row), in key order, as ``r`` events
        carrying ``version``."""

    def filter_error(self, table: str, where: str) -> str | None:
        """Why the database refuses ``where`` as a condition on ``table``; None if it takes it."""

    def estimate_rows(self, table: str) -> int | None:
        """The database's estimate of ``table``'s row count (its statistics, not a count)."""


def signal_of(event: ChangeEvent) -> tuple[str, str, dict] | None:
    """(id, type, data) of an inserted signal row; None for other changes of the table."""
    if event.op not in (Op.CREATE, Op.READ) or not isinstance(event.after, dict):
        return None
    data = event.after.get("data")
    try:
        parsed = json.loads(data) if isinstance(data, str) and data else {}
    except ValueError:
        parsed = None
    return str(event.after.get("id")), str(event.after.get("type")), parsed if isinstance(parsed, dict) else {}


def condition_error(where: str) -> str | None:
    """Why ``where`` cannot stand as one self-contained SQL condition (None if it can), checked
    before any server sees it. The chunk query places it as ``key > last AND (where) ORDER BY key
    LIMIT n``: a ``;`` would add a statement, a comment would cut off the rest, and a parenthesis
    closed too early (``x) OR (1=1``) would take the key range out of the condition, so every
    chunk would read the same first rows again and the snapshot would never end. Quotes are
    followed ('...', "...", `...`; a backslash escapes inside '...', as MySQL reads it)."""
    depth, quote, at = 0, None, 0
    while at < len(where):
        char = where[at]
        if quote is not None:
            if char == "\\" and quote == "'":
                at += 1
            elif char == quote:
                quote = None
        elif char in "'\"`":
            quote = char
        elif char == ";":
            return "a condition is one SQL expression: it has no ';'"
        elif where.startswith(("--", "/*"), at) or char == "#":
            return "a condition has no comments (--, /*, #): they would cut off the chunk's key range"
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                return "a ')' closes more than the condition opened"
        at += 1
    if quote is not None:
        return f"a quote ({quote}) is not closed"
    if depth:
        return "a '(' is not closed"
    return None


def conditions_of(data: dict[str, Any]) -> dict[str, str] | None:
    """Table -> SQL condition from a signal's ``additional-conditions`` (Debezium's shape: a list
    of ``{"data-collection": ..., "filter": ...}``); None when it is malformed."""
    given = data.get("additional-conditions") or []
    if not isinstance(given, list):
        return None
    out: dict[str, str] = {}
    for item in given:
        if not (isinstance(item, dict) and isinstance(item.get("data-collection"), str)
                and isinstance(item.get("filter"), str) and item["filter"].strip()):
            return None
        out[item["data-collection"]] = item["filter"]
    return out
