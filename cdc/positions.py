"""Typed source positions: where a source is in its database's log.

A position is a small immutable value with a JSON round trip (``to_json`` / ``position_from_json``),
never a loose dict. The runtime stores one per source, and only after the log has acknowledged
every event up to it; the source resumes *after* it, at a transaction boundary:

* ``PgLsn``: the commit LSN of the last transaction whose events were all delivered; the
  replication slot's confirmed flush LSN is set to it, and the server resends every transaction
  that commits after it.
* ``MySqlPosition``: the binlog file and the position just past the last delivered transaction
  (its XID/COMMIT event), plus the executed GTID set where the server has GTIDs. Resume reads from
  there (or from the GTID set, which survives a failover to a replica).
* ``SnapshotProgress``: an unfinished snapshot's resume point (which tables are done, and the last
  primary key read of the table in progress), wrapped around the log position it is consistent with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable


@runtime_checkable
class Position(Protocol):
    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]: ...


class _Kind(Protocol):
    def from_dict(self, data: dict[str, Any]) -> Position: ...


_KINDS: dict[str, _Kind] = {}


def _register(cls):
    _KINDS[cls.kind] = cls
    return cls


def position_to_json(position: Position) -> str:
    return json.dumps({"kind": position.kind, **position.to_dict()}, sort_keys=True, separators=(",", ":"))


def position_from_json(text: str | bytes) -> Position:
    data = json.loads(text)
    kind = data.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown position kind {kind!r}; known: {', '.join(sorted(_KINDS))}")
    return _KINDS[kind].from_dict(data)


def _format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@_register
@dataclass(frozen=True, slots=True, order=True)
class PgLsn:
    """A PostgreSQL log sequence number (a 64-bit WAL byte offset)."""

    kind: ClassVar[str] = "pg_lsn"
    lsn: int

    def __post_init__(self) -> None:
        if not 0 <= self.lsn < 1 << 64:
            raise ValueError(f"LSN {self.lsn} is outside 0..2^64-1")

    @classmethod
    def parse(cls, text: str) -> PgLsn:
        """From PostgreSQL's ``XXXXXXXX/XXXXXXXX`` notation."""
        high, _, low = text.partition("/")
        if not _:
            raise ValueError(f"not an LSN: {text!r} (expected 'X/X')")
        return cls((int(high, 16) << 32) | int(low, 16))

    def __str__(self) -> str:
        return _format_lsn(self.lsn)

    def to_dict(self) -> dict[str, Any]:
        return {"lsn": str(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PgLsn:
        return cls.parse(data["lsn"])


@_register
@dataclass(frozen=True, slots=True)
class MySqlPosition:
    """A binlog coordinate; ``gtid_set`` (MySQL ``uuid:1-N,...`` or MariaDB ``d-s-n,...``) when known."""

    kind: ClassVar[str] = "mysql"
    file: str
    pos: int
    gtid_set: str | None = None

    def __post_init__(self) -> None:
        if self.pos < 4:
            raise ValueError(f"binlog position {self.pos} is before the first event (4)")

    @property
    def file_index(self) -> int:
        """The numeric suffix of ``binlog.000042``: binlog files sort by it."""
        return int(self.file.rsplit(".", 1)[-1])

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}" + (f" gtid={self.gtid_set}" if self.gtid_set else "")

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "pos": self.pos, "gtid_set": self.gtid_set}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MySqlPosition:
        return cls(data["file"], int(data["pos"]), data.get("gtid_set"))


@_register
@dataclass(frozen=True, slots=True)
class SnapshotProgress:
    """A snapshot in progress: consistent with ``at``; ``done`` tables finished; ``table`` read up to ``last_key``."""

    kind: ClassVar[str] = "snapshot"
    at: Position
    done: tuple[str, ...] = ()
    table: str | None = None
    last_key: tuple | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"at": {"kind": self.at.kind, **self.at.to_dict()}, "done": list(self.done),
                "table": self.table, "last_key": list(self.last_key) if self.last_key is not None else None,
                "extra": self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SnapshotProgress:
        at = dict(data["at"])
        kind = at.pop("kind")
        last_key = data.get("last_key")
        return cls(_KINDS[kind].from_dict(at), tuple(data.get("done", ())), data.get("table"),
                   tuple(last_key) if last_key is not None else None, data.get("extra") or {})


@_register
@dataclass(frozen=True, slots=True, order=True)
class Counter:
    """A plain sequence number, for sources whose log is a counter (the generator source)."""

    kind: ClassVar[str] = "counter"
    seq: int

    def __str__(self) -> str:
        return str(self.seq)

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Counter:
        return cls(int(data["seq"]))


@_register
@dataclass(frozen=True, slots=True)
class IncrementalProgress:
    """An incremental snapshot (snapshot/incremental.py) running while the stream is at ``at``:
    ``tables`` still to read, the first of them read up to ``last_key`` (None: not begun), and
    ``rows`` read so far, the SQL conditions some tables are read with (``filters``: (table,
    condition) pairs) and whether a user ``paused`` it. Stored as the position while it runs, so
    the chunk cursor is durable with the offsets: a restart resumes streaming at ``at`` and
    reading after ``last_key``, under the same conditions, still paused if it was."""

    kind: ClassVar[str] = "incremental"
    at: Position
    tables: tuple[str, ...]
    last_key: tuple | None = None
    rows: int = 0
    filters: tuple[tuple[str, str], ...] = ()
    paused: bool = False

    def __str__(self) -> str:
        return f"{self.at} (incremental snapshot of {', '.join(self.tables)} after {self.last_key})"

    def to_dict(self) -> dict[str, Any]:
        return {"at": {"kind": self.at.kind, **self.at.to_dict()}, "tables": list(self.tables),
                "last_key": list(self.last_key) if self.last_key is not None else None, "rows": self.rows,
                "filters": [list(f) for f in self.filters], "paused": self.paused}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IncrementalProgress:
        at = dict(data["at"])
        kind = at.pop("kind")
        last_key = data.get("last_key")
        return cls(_KINDS[kind].from_dict(at), tuple(data.get("tables", ())),
                   tuple(last_key) if last_key is not None else None, int(data.get("rows", 0)),
                   tuple((str(t), str(c)) for t, c in data.get("filters", ())), bool(data.get("paused", False)))
