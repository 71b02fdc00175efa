"""RowBlock (cdc/events.py): snapshot rows that go to the log as the lines they were read as.

The json format makes their records straight from the lines (cdc/_encode.c ``emit_rows``); these
tests pin that those are the bytes the rows' events give, that only blocks whose key text is the
record key's digits are taken (``_copyjson.int_key_rows``), that a failing producer stops the block
as it stops events, and that the coordinator still marks the snapshot's very last row ``last``.
"""

from __future__ import annotations

import time
from functools import partial

import orjson
import pytest

from cdc import native
from cdc.events import Batch, ChangeEvent, Op, RowBlock, SnapshotEnd, SnapshotMarker, TableId
from cdc.positions import Counter
from cdc.serde import EmitError, EnvelopeEncoder
from snapshot.coordinator import OpenedSnapshot
from sources.postgres.copy_json import _copyjson
from tests.unit.test_snapshot_coordinator import ListSource, Reader, _config

pytestmark = pytest.mark.skipif(_copyjson is None, reason="sources/postgres/_copyjson.c was not built")

TABLE = TableId("shop", "public", "orders")
SOURCE = {"txId": None, "lsn": 4242}
MIN_CHARS = 2000


def _block(keys, key_name: str = "id") -> bytes:
    """Lines as the snapshot's readers make them: key text, row JSON, an empty TOAST field."""
    rows = []
    for k in keys:
        row = orjson.dumps({key_name: k, "note": f"order {k}, \u00e9t\u00e9", "total": "12.50", "tags": [k % 3]})
        rows.append(b"%d\t%s\t\n" % (k, row))
    return b"".join(rows)


def _materializer(key_name: str = "id"):
    head, tail = (Op.READ, TABLE), (4242, 1764000000000, SnapshotMarker.TRUE, SOURCE, None)
    return lambda block: _copyjson.int_key_events(block, partial(tuple.__new__, ChangeEvent), head, key_name,
                                                  orjson.Fragment, tail, MIN_CHARS)


def _row_block(block: bytes, key_name: str = "id") -> RowBlock:
    count = _copyjson.int_key_rows(block, MIN_CHARS)
    assert count is not None
    return RowBlock(TABLE, key_name, block, count, 4242, 1764000000000, SOURCE, _materializer(key_name))


def _records(encoder: EnvelopeEncoder, events) -> list[tuple]:
    out: list[tuple] = []
    encoder.emit(events, lambda t, v, k, headers: out.append((t, v, k, headers)), None, None, now_ms=1764000000123)
    return out


@pytest.mark.parametrize("key_name", ["id", "cl\u00e9 n\u00b0"])
@pytest.mark.parametrize("speedups", [True, False])
def test_a_blocks_records_are_the_bytes_its_events_give(key_name, speedups):
    keys = [1, 0, -7, 9_223_372_036_854_775_807, -922_337_203_685_477_580, 12345]
    block = _block(keys, key_name)
    encoder = EnvelopeEncoder("postgresql", "src", "pfx")
    encoder.schema_versions[TABLE] = 3  # the source head names the table's shape
    expected = _records(encoder, _materializer(key_name)(block))
    made_before = encoder.value_bytes
    with native.choose(speedups):
        assert _records(encoder, _row_block(block, key_name)) == expected
    assert encoder.value_bytes - made_before == sum(len(v) for _, v, _, _ in expected)
    assert [orjson.loads(k) for _, _, k, _ in expected] == [{key_name: k} for k in keys]
    assert {str(h) for *_, h in expected} == {str([("cdc.version", b"4242"), ("cdc.source", b"src")])}


@pytest.mark.parametrize("line", [b"007\t{}\t\n", b"-0\t{}\t\n", b"+1\t{}\t\n", b"1a\t{}\t\n", b"\t{}\t\n",
                                  b"1\t{\"a\":\"x\\\\y\"}\t\n", b"1\t{}\t\n2\t{}", b"1" + b"0" * 19 + b"\t{}\n"])
def test_only_blocks_whose_key_text_is_the_record_keys_digits_are_taken(line):
    assert _copyjson.int_key_rows(_block([5]) + line, MIN_CHARS) is None
    assert _copyjson.int_key_rows(b"5\t" + b"x" * MIN_CHARS + b"\n", MIN_CHARS) is None  # may hold a TOAST value
    assert _copyjson.int_key_rows(_block([5, 0, -3]), MIN_CHARS) == 3


def test_the_events_of_a_block_are_its_rows():
    block = _block(range(1, 6))
    rows = _row_block(block)
    events = _materializer()(block)
    encoder = EnvelopeEncoder("postgresql", "src", "pfx")

    def same(a, b) -> bool:
        return _records(encoder, [a]) == _records(encoder, [b])

    assert len(rows) == 5 and same(rows[0], events[0]) and same(rows[-1], events[-1]) and same(rows[4], events[4])
    rest, last = rows.split_last()
    assert same(last, events[-1]) and len(rest) == 4
    assert _records(encoder, rest) == _records(encoder, events[:-1])
    assert _records(encoder, list(rows)) == _records(encoder, events)
    single, only = _row_block(_block([9])).split_last()
    assert single is None and same(only, _materializer()(_block([9]))[0])


def test_a_failing_producer_stops_the_block_and_a_full_one_waits():
    encoder = EnvelopeEncoder("postgresql", "src", "pfx")
    made, waited = [], []

    def full_at_second(topic, value, key, headers):
        if len(made) == 1 and not waited:
            raise BufferError("queue full")
        made.append(key)

    encoder.emit(_row_block(_block([1, 2, 3])), full_at_second, lambda t, v, k, headers: waited.append(k) or made.append(k),
                 None)
    assert made == [b'{"id":1}', b'{"id":2}', b'{"id":3}'] and waited == [b'{"id":2}']

    def refuse_second(topic, value, key, headers):
        if key == b'{"id":2}':
            raise ValueError("refused")
        made.append(key)

    made.clear()
    with pytest.raises(EmitError) as caught:
        encoder.emit(_row_block(_block([1, 2, 3])), refuse_second, None, None)
    assert caught.value.topic == "pfx.public.orders" and isinstance(caught.value.cause, ValueError)
    assert made == [b'{"id":1}']  # nothing after the refused record


class BlockSource(ListSource):
    """ListSource whose snapshot hands over RowBlocks of three rows, two per table."""

    def open_snapshot(self, only=None) -> OpenedSnapshot:
        read = sorted(only if only is not None else self.tables)

        def rows(reader, name, emit) -> None:
            emit(_row_block(_block([1, 2, 3])))
            emit(_row_block(_block([4, 5, 6])))

        return OpenedSnapshot([Reader()], read, rows, Counter(10), (), SnapshotEnd((TABLE,), 10))


def test_the_last_row_of_a_snapshot_of_blocks_is_marked_last():
    source = BlockSource(_config(), None)
    source.start()
    marker = source.poll(0.1)
    source.commit(marker.checkpoint)
    batches, deadline = [], time.monotonic() + 10
    while not (batches and batches[-1].snapshot_end is not None) and time.monotonic() < deadline:
        batch = source.poll(0.1)
        if batch is not None:
            batches.append(batch)
    assert isinstance(batches[0].events, RowBlock)  # handed on as it came
    events = [e for b in batches for e in b.events]
    assert [e.key["id"] for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[-1].snapshot is SnapshotMarker.LAST and all(e.snapshot is SnapshotMarker.TRUE for e in events[:-1])
    assert batches[-1].checkpoint == Counter(10) and isinstance(batches[-1], Batch)


def test_a_snapshot_of_blocks_taken_again_deletes_the_rows_it_no_longer_has(tmp_path):
    """A repeated snapshot into a topic that already had records notes the keys of its RowBlocks
    (made into events for that alone) and deletes what it did not read; into an empty topic it
    notes nothing."""
    from cdc.log.embedded import EmbeddedLog
    from cdc.runtime.stale_rows import StaleRows
    from cdc.serde import Record

    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        topic = "p.public.orders"
        log.ensure_topic(topic)
        writer = log.writer()
        writer.publish([Record(topic, b'{"id":%d}' % k, b'{"op":"c"}') for k in (1, 2, 7)])
        writer.flush()
        writer.close()
        encoder = EnvelopeEncoder("postgresql", "src", "p")
        stale = StaleRows(log, encoder.topic, encoder.record_key)
        rows = _row_block(_block([1, 2, 3]))
        assert stale.before_publish(Batch(rows)) == []
        assert rows._events is not None  # tracked: its keys were noted from its events
        last = _materializer()(_block([4]))[0]._replace(snapshot=SnapshotMarker.LAST)
        deletes = stale.before_publish(Batch([last], Counter(10), snapshot_end=SnapshotEnd((TABLE,), 4242)))
        assert [(e.op, e.key) for e in deletes] == [(Op.DELETE, {"id": 7})]

        empty = StaleRows(log, lambda table: "p.public.nothing", encoder.record_key)
        untouched = _row_block(_block([1, 2]))
        assert empty.before_publish(Batch(untouched)) == [] and untouched._events is None
    finally:
        log.close()
