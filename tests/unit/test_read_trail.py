"""ReadTrail: which tombstones' deletes the runner read (cdc.api.SinkContext.delete_read)."""

from __future__ import annotations

import orjson

from cdc.events import Op
from cdc.log.base import LogRecord
from cdc.runtime.read_trail import ReadTrail
from cdc.sink_events import SinkEvent

T = "p.public.items"


def ev(offset: int, key: int, op: Op | None, partition: int = 0) -> SinkEvent:
    return SinkEvent(T, partition, offset, {"id": key}, op, None, None, None if op is None else offset, {})


def record(offset: int, key: int, op: str | None) -> LogRecord:
    value = None if op is None else orjson.dumps({"before": None, "after": None, "op": op,
                                                  "source": {"version": offset}})
    return LogRecord(T, 0, offset, orjson.dumps({"id": key}), value, 0)


def note(reads: ReadTrail, events: list[SinkEvent], start: dict) -> None:
    ends = dict(start)
    for event in events:
        ends[(event.topic, event.partition)] = event.offset + 1
    reads.note(events, start, ends)


def trail(log: dict[int, LogRecord] | None = None) -> tuple[ReadTrail, list]:
    fetched = []

    def fetch(topic, partition, offset):
        fetched.append(offset)
        return (log or {}).get(offset)
    return ReadTrail(fetch), fetched


def test_a_delete_just_before_in_the_batch_or_the_batch_before():
    reads, fetched = trail()
    note(reads, [ev(5, 1, Op.CREATE), ev(6, 1, Op.DELETE), ev(7, 2, Op.DELETE, partition=1), ev(7, 1, None)],
               {(T, 0): 5, (T, 1): 7})
    assert reads.delete_read(T, 0, 7)
    note(reads, [ev(8, 2, None, partition=1), ev(8, 3, Op.DELETE)], {(T, 0): 8, (T, 1): 8})
    assert reads.delete_read(T, 1, 8)  # its delete ended the partition's part of the batch before
    assert fetched == []


def test_a_gap_another_key_or_another_op_before_it_is_not_its_delete():
    reads, fetched = trail()
    note(reads, [ev(3, 1, Op.DELETE), ev(5, 1, None), ev(6, 2, Op.DELETE), ev(7, 3, None), ev(8, 3, Op.UPDATE),
                ev(9, 3, None)], {(T, 0): 3})
    assert not any(reads.delete_read(T, 0, offset) for offset in (5, 7, 9))
    note(reads, [ev(12, 4, None)], {(T, 0): 10})  # the reader was at 10: 10 and 11 are gone
    assert not reads.delete_read(T, 0, 12)
    assert not reads.delete_read(T, 0, 0)
    assert fetched == []


def test_a_pass_resumed_at_the_tombstone_asks_the_log_for_the_record_before():
    reads, fetched = trail({3: record(3, 1, "d"), 5: record(5, 9, "c")})
    note(reads, [ev(4, 1, None)], {(T, 0): 4})
    note(reads, [ev(6, 1, None, partition=1)], {(T, 1): 6})
    assert reads.delete_read(T, 0, 4) and fetched == [3]
    assert reads.delete_read(T, 0, 4) and fetched == [3]  # asked once
    assert not reads.delete_read(T, 1, 6)  # the record before it is an insert


def test_a_record_before_of_another_key_or_poison_is_not_its_delete():
    poison = LogRecord(T, 0, 3, orjson.dumps({"id": 1}), b"not json", 0)
    reads, _ = trail({3: poison, 7: record(7, 2, "d")})
    note(reads, [ev(4, 1, None), ev(8, 1, None)], {(T, 0): 4})
    assert not reads.delete_read(T, 0, 4)
    reads2, _ = trail({7: record(7, 2, "d")})
    note(reads2, [ev(8, 1, None)], {(T, 0): 8})
    assert not reads2.delete_read(T, 0, 8)


def test_committed_batches_are_let_go_but_the_newest_of_them():
    reads, fetched = trail()
    note(reads, [ev(1, 1, Op.DELETE), ev(2, 1, None)], {(T, 0): 1})
    note(reads, [ev(3, 2, Op.DELETE)], {(T, 0): 3})
    note(reads, [ev(4, 2, None)], {(T, 0): 4})
    reads.committed({(T, 0): 3})
    reads.committed({(T, 0): 4})
    assert not reads.delete_read(T, 0, 2)  # its batch is let go: nothing known (resolved as before)
    assert reads.delete_read(T, 0, 4) and fetched == []  # the delete ends the newest committed batch


def test_a_delete_sent_to_the_dead_letters_is_not_read():
    reads, _ = trail()
    note(reads, [ev(1, 1, Op.DELETE), ev(2, 1, None)], {(T, 0): 1})
    reads.set_aside(T, 0, 1)
    assert not reads.delete_read(T, 0, 2)
def test_after_a_hand_over_the_batches_go_and_the_log_answers():
    # A partition that left this member is never committed here again: its batches must not stay.
    reads, fetched = trail({4: record(4, 7, "d")})
    note(reads, [ev(3, 1, Op.CREATE), ev(4, 7, Op.DELETE)], {(T, 0): 3})
    reads.let_go()
    assert reads._batches == []
    note(reads, [ev(5, 7, None)], {(T, 0): 5})
    assert reads.delete_read(T, 0, 5) is True and fetched == [4]
