"""What a sink receives: one record of the log, decoded once by the sink runtime.

The type alone, a leaf module that plugins reach through ``cdc.api``; the decoding is the
runtime's (cdc/sink_events.py).

``SinkEvent`` is the envelope of one record, or a tombstone (``op is None``). Sinks write
idempotently and never regress a key (see ARCHITECTURE.md, "Version"):

* an upsert (``r c u``) applies only if the store holds no newer ``version`` for the key, and no
  delete of the key with a newer version (deletes are remembered, so a late older insert cannot
  resurrect a key);
* a delete (``d``) removes the row if its version is older, and remembers the delete's version;
* a truncate (``t``) clears the table of rows older than its version and sets a table-wide
  watermark: anything older than it is ignored afterwards;
* a tombstone says the key's latest record is a delete. Its ``version`` is that delete's, from
  the record's ``cdc.version`` header (cdc/headers.py), and a sink applies it as that delete: a
  version-guarded delete, remembered like one, so nothing newer the store holds for the key is
  touched (a row inserted again after the delete, whatever was replayed or compacted away).

  A tombstone written before records had headers has no version (``None``). Its delete is the
  record just before it in its partition (the capture emits the two consecutively). When
  the runtime read that delete (``SinkContext.delete_read``: in the same batch, an earlier one,
  or the run whose commit this one resumed from), the tombstone adds nothing and a sink drops it:
  the delete is written with its own version, and whatever the store holds live for the key comes
  from a later record (a replay after a crash between a write and its commit, with the batches
  cut elsewhere). Deleting that row at its own version would lose it: its replay, at an equal
  version, is refused. Only when the delete was never read (compacted away while the sink lagged,
  or set aside as poison) does a sink delete the key if it still has it; such a tombstone,
  replayed alone after a crash that came after a re-insert of the key was written, deletes that
  row too: nothing tells it from an older one without a version.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from cdc.events import Op


class SinkEvent(NamedTuple):
    """One decoded record. Immutable and cheap: a tuple, like ``cdc.events.ChangeEvent``. The
    runtime makes one per record read, on the sinks' hot path: a frozen dataclass cost about 2 µs
    per event there (a tenth of a record's whole decoding), a tuple about 0.1 µs. A copy with
    other fields is ``event._replace(after=...)``."""

    topic: str
    partition: int
    offset: int
    key: dict[str, Any]
    op: Op | None                 # None: a tombstone
    before: dict[str, Any] | None
    after: dict[str, Any] | bytes | None  # bytes: the row's JSON, for a sink with raw_rows
    version: int | None           # a tombstone's: its delete's (its cdc.version header); None without one
    source: dict[str, Any]        # the envelope's source block ({} for tombstones)
    ts_ms: int | None = None

    @property
    def table(self) -> str:
        """The source table's name (the last part of the topic)."""
        return self.source.get("table") or self.topic.rsplit(".", 1)[-1]

    @property
    def key_json(self) -> bytes:
        return orjson.dumps(self.key)


class WindowPart(NamedTuple):
    """A piece of a window for a sink: one topic's keys of one shape (``source`` names the table
    and its ``schema_version``), at most ``chunk`` of them.

    ``upserts``: (key JSON, SinkEvent) whose ``after`` is the row's JSON bytes; ``deletes``:
    (key JSON, SinkEvent) whose ``before`` is JSON bytes or None; ``tombstones``: key JSON ->
    key; ``truncate``: the topic's newest truncate version (what is older is already dropped).
    Keys are decoded (``SinkEvent.key``) only where asked (``decode_keys``)."""

    topic: str
    source: dict
    upserts: list[tuple[bytes, SinkEvent]]
    deletes: list[tuple[bytes, SinkEvent]]
    tombstones: dict[bytes, dict]
    truncate: int | None

    def events(self) -> list[SinkEvent]:
        """The part as events for ``Sink.write`` (truncate first, tombstones last), keys and
        deletes' rows decoded."""
        loads = orjson.loads
        out: list[SinkEvent] = []
        pairs = self.upserts or self.deletes
        first = pairs[0][1] if pairs else None
        if self.truncate is not None:
            out.append(SinkEvent(self.topic, -1, -1, {}, Op.TRUNCATE, None, None, self.truncate, self.source))
        for key, event in self.upserts:
            out.append(event if event.key is not None else event._replace(key=loads(key)))
        for key, event in self.deletes:
            before: Any = event.before  # bytes too: a delete's row as JSON, for a sink with raw_rows
            if before.__class__ is bytes:
                before = loads(before)
            out.append(event._replace(key=loads(key) if event.key is None else event.key, before=before))
        partition, offset = (first.partition, first.offset) if first is not None else (-1, -1)
        for tombstone_key in self.tombstones.values():
            out.append(SinkEvent(self.topic, partition, offset, tombstone_key, None, None, None, None, {}))
        return out
