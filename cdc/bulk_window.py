"""A window of a topic's history reduced to the newest version per key, for bulk loads.

A rebuild (``cdc rebuild``, and ``cdc bootstrap`` of a sink that bootstraps by rebuilding) fills
a generation of the store that no reader sees, from offset 0. Written record by record, nearly
every record of a long history is an update that a later one overrides. Here the records are
reduced before the store sees anything: per (topic, key) only the record with the highest
``source.version`` stays (by version, never by offset: a replay after a crash can put an older
version at a later offset; a delete wins by version like any change). The per-record work runs in
C without the GIL (``cdc/_window.c``); this module hands it the records and decodes, the general
way, those it does not take (Connect JSON, Avro, truncates, odd keys, malformed values).

A window holds at most ``max_bytes`` (keys, the newest rows' JSON and its own tables): a history
with more live keys than that takes several windows. A runner that loads one window while it
fills the next (``cdc.runtime.window_loads``) keeps ``LoadedKeys``, the hashes of the keys loaded
so far, to tell whether the next window may go in without the version guard.

Per key the result is what ``sinks/sql/reduce.py`` makes of one batch as large as the window: an
upsert (the newest is r/c/u), a delete (the newest is d: a sink remembers it; a tombstone whose
headers carry its delete's version counts as that delete), and, separately, a tombstone without a
version (the key's last word is a tombstone: a sink removes the key's row whatever its version).
A truncate is the topic's newest truncate version; what is older than it is dropped.

There is no Python twin: without a compiler, and while ``cdc.native`` is off, ``available()`` is
False and rebuilds write record batches instead.

Threading: one thread at a time.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import orjson

from cdc import native
from cdc.events import Op
from cdc.sink_event import SinkEvent, WindowPart
from cdc.sink_events import _OPS, PoisonRecord, decode_records

if TYPE_CHECKING:
    from cdc.log.base import LogRecord

log = logging.getLogger(__name__)

_window = native.load("cdc._window")


def available() -> bool:
    """Whether windows can be made now (built, and ``cdc.native`` on)."""
    return _window is not None and native.enabled()

_KEY_OPS = {Op.CREATE: "c", Op.UPDATE: "u", Op.READ: "r", Op.DELETE: "d"}


@contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic garbage collection while a bulk load reads and loads its windows: it makes
    hundreds of thousands of short-lived tuples a second (records, events), none in a cycle, and
    Python's collector walked the live ones again and again (in bench/bootstrap.py building a
    window's events took 7x as long with it on). Whatever cycles others make meanwhile are
    collected once it is back on."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class NewestWindow:
    """See the module docstring. ``add`` records; ``full`` once it holds ``max_bytes``;
    ``parts`` to load it; ``clear`` for the next window."""

    def __init__(self, max_bytes: int) -> None:
        if not available():
            raise RuntimeError("cdc._window was not built (no C compiler at install time) or cdc.native is off")
        self.max_bytes = max_bytes
        self._window = _window.Window(SinkEvent, _OPS)
        self._topics: dict[str, int] = {}
        self._sources: dict[str, dict] = {}  # per topic: a source block naming its table
        self.records = 0

    def add(self, records: list, ends: dict) -> list[tuple[LogRecord, PoisonRecord]]:
        """Reduce ``records`` (LogRecords) into the window; the poison ones, with why, are
        returned (not in the window) for the caller to set aside. ``ends[(topic, partition)]`` is
        set to the offset after each partition's last record."""
        records = records if records.__class__ is list else list(records)
        known = len(self._topics)
        poisons: list[tuple[LogRecord, PoisonRecord]] = []
        self.records += len(records)
        self._window.add(records, self._topics, ends, self._resolver(lambda: records, poisons))
        if len(self._topics) > known:
            self._name_new_topics(records)
        return poisons

    def add_packed(self, batch, ends: dict) -> list[tuple[LogRecord, PoisonRecord]]:
        """``add`` for a ``cdc.log.kafka_bulk.PackedBatch``: the records parsed where they lie, a
        LogRecord made only for those the C loop does not take."""
        unpacked: list = []

        def records() -> list:
            if not unpacked:
                unpacked.extend(batch.records())
            return unpacked
        known = len(self._topics)
        poisons: list[tuple[LogRecord, PoisonRecord]] = []
        self.records += batch.count
        self._window.add_packed(batch.data, batch.count, batch.topics, self._topics, ends,
                                self._resolver(records, poisons))
        if len(self._topics) > known:
            self._name_new_topics(records())
        return poisons

    def _resolver(self, records, poisons: list):
        """``resolve(index)`` for the C loop: the record it does not take, decoded the general way
        in its place; ``records()`` gives the batch's LogRecords."""
        topics, dumps = self._topics, orjson.dumps

        def resolve(index: int) -> tuple | None:
            record = records()[index]
            event = decode_records([record], True)[0]
            if isinstance(event, PoisonRecord):
                poisons.append((record, event))
                return None
            tid = topics[record.topic]
            if event.source and record.topic not in self._sources:
                self._sources[record.topic] = event.source
            if event.op is Op.TRUNCATE:
                return tid, b"", "t", event.version, None, None
            key = dumps(event.key)
            if event.op is None:
                if event.version is not None:  # a tombstone with its delete's version: that delete
                    return tid, key, "d", event.version, None, None
                return tid, key, None, 0, None, None
            row = event.before if event.op is Op.DELETE else event.after
            if row is not None and row.__class__ is not bytes:
                row = dumps(row)
            if row is None and event.op is not Op.DELETE:
                row = b"null"  # an upsert without a row: kept as reduce.py keeps it, for the sink to judge
            return tid, key, _KEY_OPS[event.op], event.version, row, event.source.get("schema_version")
        return resolve

    def _name_new_topics(self, records: list) -> None:
        """A source block for each topic first seen here, from its first record that has one."""
        for record in records:
            if record.topic not in self._sources and record.value is not None:
                event = decode_records([record], True)[0]
                if not isinstance(event, PoisonRecord) and event.source:
                    self._sources[record.topic] = event.source

    def stats(self) -> tuple[int, int]:
        """(keys, bytes) held."""
        return self._window.stats()[:2]

    def read_bytes(self) -> int:
        """Bytes of the record values the C loop took since the last ``clear``."""
        return self._window.stats()[2]

    def full(self) -> bool:
        return self._window.stats()[1] >= self.max_bytes

    def empty(self) -> bool:
        return self._window.stats()[0] == 0

    def parts(self, chunk: int, decode_keys: bool = False) -> Iterator[WindowPart]:
        """The window as parts of at most ``chunk`` keys: per topic, per shape (oldest first),
        then the topic's tombstones."""
        window, loads = self._window, orjson.loads  # loads: for the tombstones' keys
        for topic, tid in self._topics.items():
            source = self._sources.get(topic, {})
            truncate = window.truncated(tid)
            shapes = sorted(window.shapes(tid), key=lambda v: (v is not None, v or 0))
            for shape in shapes:  # each key is in one shape: parts of one window have disjoint keys
                named = {k: v for k, v in source.items() if k != "schema_version"}
                if shape is not None:
                    named["schema_version"] = shape
                start = 0
                while start >= 0:
                    upserts, deletes, start = window.take(tid, shape, topic, named, loads if decode_keys else None,
                                                          start, chunk)
                    if upserts or deletes or truncate is not None:
                        yield WindowPart(topic, named, upserts, deletes, {}, truncate)
            if truncate is not None and not shapes:
                yield WindowPart(topic, source, [], [], {}, truncate)
            tombstones = window.tombstones(tid)
            for at in range(0, len(tombstones), chunk):
                keys = tombstones[at:at + chunk]
                yield WindowPart(topic, source, [], [], {k: loads(k) for k in keys}, None)

    def clear(self) -> None:
        self._window.clear()
        self.records = 0

    def following(self) -> NewestWindow:
        """An empty window for the next records of the same load: the same topic ids, so that
        its keys' hashes compare with this one's (``LoadedKeys``), and the source blocks known."""
        nxt = NewestWindow(self.max_bytes)
        nxt._topics = dict(self._topics)
        nxt._sources = dict(self._sources)
        return nxt

    def key_hashes(self) -> bytes:
        """The sorted 64-bit hashes of the (topic, key)s held (native uint64s)."""
        return self._window.key_hashes()

    def truncates(self) -> bool:
        """Whether a topic's truncate is in the window."""
        return any(self._window.truncated(tid) is not None for tid in self._topics.values())


class LoadedKeys:
    """The keys the windows of one bulk load put into the generation so far (their hashes), to
    tell whether the next window may go in without the guard: only if the generation holds none of
    its keys. A key lives in one partition of its topic, so windows of different partitions never
    share one; but a topic whose partition count grew holds a key's older records in another
    partition than its newer ones, and a window cut where it filled up shares keys with the next.
    A shared hash (or a collision, about one in 10^7 at a million keys each side) only sends a
    window the guarded way. A truncate makes every later window guarded, and a window with a
    truncate is guarded once anything was loaded: the truncate drops older rows, which a plain
    COPY would not see. 8 bytes a key (counted in the window's bound by the caller)."""

    def __init__(self) -> None:
        self.hashes = b""
        self.truncated = False
        self.windows = 0

    def nbytes(self) -> int:
        return len(self.hashes)

    def conflict(self, window: NewestWindow, hashes: bytes) -> str | None:
        """Why ``window`` (whose ``key_hashes`` are ``hashes``) must go the guarded way, or None."""
        if self.truncated:
            return "a truncate was loaded before it"
        if self.windows and window.truncates():
            return "it holds a truncate and windows were loaded before it"
        if _window.hashes_meet(self.hashes, hashes):
            return "it holds keys an earlier window loaded"
        return None

    def add(self, window: NewestWindow, hashes: bytes) -> None:
        self.hashes = _window.hashes_union(self.hashes, hashes) if self.hashes else hashes
        self.truncated = self.truncated or window.truncates()
        self.windows += 1
