"""cdc.bulk_window (C: cdc/_window.c) against sinks/sql/reduce.py over one batch as large as the
window: random histories with updates, deletes, tombstones, re-inserts and replays of older
versions at later offsets give the same upserts, deletes and tombstones; so do records only the
general decoder takes (keys not in orjson's compact form, truncates, poison) or that the C parser
reads in another layout (indented values). Each also packed as the bulk reader packs a batch
(cdc.log.kafka_bulk, ``add_packed``): the same result."""

from __future__ import annotations

import random

import orjson
import pytest

from cdc import bulk_window
from cdc.events import ChangeEvent, Op, TableId
from cdc.log.base import LogRecord
from cdc.log.kafka_bulk import PackedBatch
from cdc.serde import EnvelopeEncoder
from cdc.sink_events import decode_records
from sinks.sql.reduce import reduce_events

pytestmark = pytest.mark.skipif(not bulk_window.available(), reason="cdc._window not built")

TABLE = TableId("shop", "public", "things")


def _records(seed: int) -> list[LogRecord]:
    rng = random.Random(seed)
    encoder = EnvelopeEncoder("postgresql", "src", "p")
    events = []
    for version in range(1, 3000):
        key = rng.randrange(300)
        if rng.random() < 0.2:
            events.append(ChangeEvent(Op.DELETE, TABLE, {"id": key}, {"id": key, "n": version}, None, version, 0))
        else:
            events.append(ChangeEvent(Op.UPDATE, TABLE, {"id": key}, None,
                                      {"id": key, "n": version, "s": "tab\t\\ é" * (version % 3)}, version, 0))
    events += rng.sample(events, 300)  # replays: older versions at later offsets
    records, offset = [], 0
    for event in events:
        for record in encoder.encode([event]):
            records.append(LogRecord(record.topic, 0, offset, record.key, record.value, 0, record.headers))
            offset += 1
    return records


def packed(records: list[LogRecord]) -> PackedBatch:
    """``records`` as the bulk reader hands them out (cdc/_rdconsume.c's layout)."""
    return PackedBatch.of(records)


def _add(window, records: list[LogRecord], ends: dict, pack: bool) -> list:
    return window.add_packed(packed(records), ends) if pack else window.add(records, ends)


def _window(records: list[LogRecord], size: int = 997, pack: bool = False) -> dict:
    window = bulk_window.NewestWindow(1 << 30)
    ends: dict = {}
    for at in range(0, len(records), size):
        assert _add(window, records[at:at + size], ends, pack) == []
    assert ends == {(records[0].topic, 0): records[-1].offset + 1}
    out = {"upserts": {}, "deletes": {}, "tombstones": {}}
    for part in window.parts(50):
        for key, event in part.upserts:
            out["upserts"][key] = (event.version, orjson.loads(event.after))
        for key, event in part.deletes:
            out["deletes"][key] = (event.version, orjson.loads(event.before))
        out["tombstones"].update(part.tombstones)
    return out


def _reduced(records: list[LogRecord]) -> dict:
    [changes] = reduce_events(decode_records(records, False)).values()
    return {"upserts": {k: (e.version, e.after) for k, e in changes.upserts.items()},
            "deletes": {k: (e.version, e.before) for k, e in changes.deletes.items()},
            "tombstones": changes.tombstones}


@pytest.mark.parametrize("pack", [False, True], ids=["records", "packed"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_window_keeps_what_one_batch_as_large_reduces_to(seed, pack):
    records = _records(seed)
    assert _window(records, pack=pack) == _reduced(records)


def test_a_packed_batch_unpacks_to_its_records():
    records = _records(5)[:500] + [LogRecord("other", 3, 9, None, b"v", 7), LogRecord("t", 1, 2, b"k", None, -1)]
    batch = packed(records)
    assert batch.records() == records


@pytest.mark.parametrize("pack", [False, True], ids=["records", "packed"])
def test_odd_keys_and_indented_values_reduce_the_same(pack, seed=4):
    records = _records(seed)
    odd = []
    for record in records:
        if record.offset % 5 == 0 and record.value is not None:  # whitespace everywhere (the C parser's)
            record = record._replace(value=orjson.dumps(orjson.loads(record.value), option=orjson.OPT_INDENT_2))
        elif record.offset % 7 == 0:  # a key orjson writes otherwise (spaces)
            record = record._replace(key=record.key.replace(b":", b": "))
        odd.append(record)
    assert _window(odd, pack=pack) == _reduced(odd)


def test_a_truncate_drops_what_is_older_and_what_comes_later_older():
    encoder = EnvelopeEncoder("postgresql", "src", "p")
    events = [ChangeEvent(Op.CREATE, TABLE, {"id": 1}, None, {"id": 1}, 5, 0),
              ChangeEvent(Op.CREATE, TABLE, {"id": 2}, None, {"id": 2}, 20, 0),
              ChangeEvent(Op.TRUNCATE, TABLE, {}, None, None, 10, 0),
              ChangeEvent(Op.CREATE, TABLE, {"id": 3}, None, {"id": 3}, 7, 0),  # replayed, under the truncate
              ChangeEvent(Op.CREATE, TABLE, {"id": 4}, None, {"id": 4}, 30, 0)]
    records = [LogRecord(r.topic, 0, i, r.key, r.value, 0) for i, r in enumerate(encoder.encode(events))]
    window = bulk_window.NewestWindow(1 << 30)
    assert window.add(records, {}) == []
    parts = list(window.parts(10))
    assert {key for part in parts for key, _ in part.upserts} == {b'{"id":2}', b'{"id":4}'}
    assert {part.truncate for part in parts} == {10}


@pytest.mark.parametrize("pack", [False, True], ids=["records", "packed"])
def test_poison_records_are_returned_not_kept(pack):
    records = [LogRecord("t", 0, 0, b'{"id":1}', b'{"op":"u","after":{"id":1},', 0),
               LogRecord("t", 0, 1, b'{"id":2}', b'{"op":"u","before":null,"after":{"id":2},"source":{"version":3}}', 0),
               LogRecord("t", 1, 5, None, b'not json', 0)]  # no key: the general decoder's
    window = bulk_window.NewestWindow(1 << 30)
    ends: dict = {}
    poisons = _add(window, records, ends, pack)
    assert [record for record, _ in poisons] == [records[0], records[2]]
    assert [(type(err), str(err)) for _, err in poisons] == \
        [(type(err), str(err)) for err in decode_records([records[0], records[2]], True)]
    assert [key for part in window.parts(10) for key, _ in part.upserts] == [b'{"id":2}']
    assert ends == {("t", 0): 2, ("t", 1): 6}


def test_the_window_says_when_it_holds_its_bound():
    window = bulk_window.NewestWindow(200_000)
    records = [LogRecord("t", 0, i, b'{"id":%d}' % i,
                         b'{"op":"c","before":null,"after":{"id":%d,"x":"%s"},"source":{"version":%d}}' % (i, b"y" * 100, i),
                         0) for i in range(3000)]
    added = 0
    while not window.full():
        window.add(records[added:added + 100], {})
        added += 100
    keys, held = window.stats()
    assert 200_000 <= held < 260_000 and keys == added < 3000
    window.clear()
    assert window.stats() == (0, 0) and window.empty()


def _upsert(topic: str, key: int, version: int) -> LogRecord:
    return LogRecord(topic, 0, version, b'{"id":%d}' % key,
                     b'{"op":"c","before":null,"after":{"id":%d},"source":{"version":%d}}' % (key, version), 0)


def test_loaded_keys_tell_a_window_that_shares_a_key_or_follows_a_truncate():
    first = bulk_window.NewestWindow(1 << 30)
    first.add([_upsert("a", k, k + 1) for k in range(100)] + [_upsert("b", 7, 1)], {})
    loaded = bulk_window.LoadedKeys()
    assert loaded.conflict(first, first.key_hashes()) is None  # nothing loaded yet
    loaded.add(first, first.key_hashes())
    assert loaded.nbytes() == 8 * 101

    disjoint = first.following()  # the same keys in another topic, other keys in the same: no conflict
    disjoint.add([_upsert("b", k, 1) for k in range(8, 50)] + [_upsert("a", k, 1) for k in range(100, 150)], {})
    assert loaded.conflict(disjoint, disjoint.key_hashes()) is None
    shared = first.following()
    shared.add([_upsert("a", k, 1) for k in range(100, 150)] + [_upsert("b", 7, 2)], {})
    assert loaded.conflict(shared, shared.key_hashes()) == "it holds keys an earlier window loaded"

    loaded.add(disjoint, disjoint.key_hashes())
    assert loaded.nbytes() == 8 * (101 + 42 + 50)
    encoder = EnvelopeEncoder("postgresql", "src", "p")
    truncate = [LogRecord(r.topic, 0, 0, r.key, r.value, 0)
                for r in encoder.encode([ChangeEvent(Op.TRUNCATE, TABLE, {}, None, None, 10, 0)])]
    truncating = first.following()
    truncating.add(truncate, {})
    assert loaded.conflict(truncating, truncating.key_hashes()) == \
        "it holds a truncate and windows were loaded before it"
    loaded.add(truncating, truncating.key_hashes())
    later = first.following()
    later.add([_upsert("c", 1, 20)], {})
    assert loaded.conflict(later, later.key_hashes()) == "a truncate was loaded before it"


def test_versioned_tombstones_stay_in_the_c_loop(monkeypatch):
    """Every tombstone the capture writes carries its delete's version (cdc/headers.py): the C loop
    reads it from the packed headers, so a batch is never unpacked into LogRecords for them (the
    bulk bootstrap's CPU per record doubled while it was). Only a topic's first batch is, once,
    for its source block."""
    records = _records(6)
    assert any(r.value is None and r.headers for r in records[1:])
    window = bulk_window.NewestWindow(1 << 30)
    assert window.add_packed(packed(records[:1]), {}) == []
    monkeypatch.setattr(PackedBatch, "records", lambda self: pytest.fail("a batch was unpacked"))
    for at in range(1, len(records), 997):
        assert window.add_packed(packed(records[at:at + 997]), {}) == []
    monkeypatch.undo()
    held = {"upserts": {}, "deletes": {}, "tombstones": {}}
    for part in window.parts(50):
        held["upserts"].update((key, (e.version, orjson.loads(e.after))) for key, e in part.upserts)
        held["deletes"].update((key, (e.version, orjson.loads(e.before))) for key, e in part.deletes)
        held["tombstones"].update(part.tombstones)
    assert held == _reduced(records)


@pytest.mark.parametrize("pack", [False, True], ids=["records", "packed"])
def test_tombstone_headers_the_c_loop_does_not_read_go_to_the_general_decoder(pack):
    def tombstone(offset, headers):
        return LogRecord("t", 0, offset, b'{"id":%d}' % offset, None, 0, headers)

    upserts = [LogRecord("t", 0, i, b'{"id":%d}' % i,
                         b'{"op":"c","before":null,"after":{"id":%d},"source":{"version":50}}' % i, 0)
               for i in range(8)]
    odd = [tombstone(10, [("cdc.version", b"x12")]), tombstone(11, [("cdc.version", None)]),
           tombstone(12, [("cdc.version", b"99999999999999999999")]),
           tombstone(13, [("cdc.version", b"9223372036854775808")]),
           tombstone(14, [("cdc.version", b"")])]
    readable = [tombstone(1, [("cdc.source", b"s")]),             # no version: a plain tombstone
                tombstone(2, [("cdc.version", b"40")]),           # older than the upsert: it stays
                tombstone(3, [("cdc.version", b"60"), ("cdc.source", b"s")]),
                tombstone(4, [("cdc.version", b"1"), ("cdc.version", b"70")]),  # the last one counts
                tombstone(5, [("cdc.version", b"-9223372036854775808")])]  # the oldest there is
    records = upserts + [r._replace(offset=r.offset + 100) for r in readable] + odd
    window = bulk_window.NewestWindow(1 << 30)
    poisons = _add(window, records, {}, pack)
    general = [(r, e) for r, e in zip(records, decode_records(records, True), strict=True)
               if type(e).__name__ == "PoisonRecord"]
    assert [(r, str(e)) for r, e in poisons] == [(r, str(e)) for r, e in general]
    assert [r.offset for r, _ in poisons] == [10, 11, 12, 13, 14]
    parts = list(window.parts(50))
    assert {key for part in parts for key, _ in part.upserts} == {b'{"id":0}', b'{"id":2}', b'{"id":5}',
                                                                  b'{"id":6}', b'{"id":7}'}
    assert {key: event.version for part in parts for key, event in part.deletes} == \
        {b'{"id":3}': 60, b'{"id":4}': 70}
    assert {key for part in parts for key in part.tombstones} >= {b'{"id":1}'}
