"""The coordinator's contract (snapshot/coordinator.py) with a source made of lists: the marker
before any row, the held-back last row, the handover position, and when the tables are recorded.
The servers' halves are tested against real servers in tests/integration/test_snapshot_coordinator.py
and test_backfill.py; this pins the order of effects that both sources rely on."""

from __future__ import annotations

import time

import pytest

from cdc.api import SourceConfig, StandaloneSourceContext
from cdc.errors import PositionLostError
from cdc.events import Batch, ChangeEvent, Op, SnapshotEnd, SnapshotMarker, TableId
from cdc.positions import Counter, SnapshotProgress
from snapshot.coordinator import CoordinatedSource, OpenedSnapshot, SnapshotCoordinator

TABLES = {"s.a": TableId("d", "s", "a"), "s.b": TableId("d", "s", "b")}


class ListStream:
    def __init__(self, position, after_snapshot: bool) -> None:
        self.position, self.after_snapshot, self.committed = position, after_snapshot, []

    def poll(self, timeout: float) -> Batch | None:
        return None

    def commit(self, position) -> None:
        self.committed.append(position)

    def close(self) -> None:
        pass


class Reader:
    def close(self) -> None:
        pass


class ListSource(CoordinatedSource):
    """Tables of three rows each; a snapshot is consistent at Counter(10). It is its own halves."""

    config_model = SourceConfig
    connector = "test"

    def __init__(self, config, position, tables=("s.a",)) -> None:
        super().__init__(config, position)
        self.coordinator = SnapshotCoordinator(self, config, position, position_types=(Counter,),
                                               position_kind="a counter")
        self.tables, self.snapshots = frozenset(tables), []

    @property
    def stream(self):
        return self.coordinator.stream

    def prepare(self) -> None:
        pass

    def resume_point(self, position):
        return position

    def captured_names(self) -> frozenset[str]:
        return self.tables

    def open_snapshot(self, only=None) -> OpenedSnapshot:
        read = sorted(only if only is not None else self.tables)
        self.snapshots.append(read)

        def rows(reader, name, emit) -> None:
            emit([ChangeEvent(Op.READ, TABLES[name], {"id": i}, None, {"id": i}, 10, 0, SnapshotMarker.TRUE, {})
                  for i in range(3)])

        return OpenedSnapshot([Reader()], read, rows, Counter(10), (), SnapshotEnd(tuple(TABLES[n] for n in read), 10))

    def open_stream(self, position, after_snapshot: bool) -> ListStream:
        return ListStream(position, after_snapshot)

    def release(self) -> None:
        pass


class Book:
    def __init__(self, tables) -> None:
        self.tables, self.saved = tables, []

    def load(self):
        return self.tables

    def save(self, tables) -> None:
        self.saved.append(tables)


def _config(mode: str = "initial") -> SourceConfig:
    return SourceConfig(name="t", type="test", snapshot=mode)


def _drain(source: ListSource) -> list[Batch]:
    """Poll until the snapshot's end batch (the one with snapshot_end)."""
    out, deadline = [], time.monotonic() + 10
    while time.monotonic() < deadline:
        batch = source.poll(0.1)
        if batch is not None:
            out.append(batch)
            if batch.snapshot_end is not None:
                return out
    raise AssertionError("the snapshot did not end")


def test_no_row_goes_out_before_the_marker_is_stored():
    source, book = ListSource(_config(), None), Book(None)
    source.attach(StandaloneSourceContext("t", book))
    source.start()
    marker = source.poll(0.1)
    assert marker.events == [] and marker.checkpoint == SnapshotProgress(Counter(10))
    assert all(source.poll(0.05) is None for _ in range(5))  # waits for the runtime to store it
    source.commit(marker.checkpoint)
    batches = _drain(source)
    events = [e for b in batches for e in b.events]
    assert len(events) == 3 and events[-1].snapshot is SnapshotMarker.LAST
    assert all(e.snapshot is SnapshotMarker.TRUE for e in events[:-1])
    end = batches[-1]
    assert end.checkpoint == Counter(10) and all(b.checkpoint is None for b in batches[:-1])
    assert source.phase == "streaming" and source.stream.after_snapshot
    assert book.saved == []  # not before the end is stored
    source.commit(end.checkpoint)
    assert book.saved == [frozenset({"s.a"})] and source.stream.committed == [Counter(10)]


def test_a_new_table_is_backfilled_alone_and_the_stream_resumes_where_it_was():
    source, book = ListSource(_config(), Counter(5), tables=("s.a", "s.b")), Book(frozenset({"s.a"}))
    source.attach(StandaloneSourceContext("t", book))
    source.start()
    marker = source.poll(0.1)
    assert marker.checkpoint == SnapshotProgress(Counter(5)) and marker.checkpoint.extra == {"backfill": ["s.b"]}
    source.commit(marker.checkpoint)
    end = _drain(source)[-1]
    assert source.snapshots == [["s.b"]] and end.snapshot_end.tables == (TABLES["s.b"],)
    assert end.checkpoint == Counter(5) and source.stream.position == Counter(5)
    assert not source.stream.after_snapshot  # the stream announces every table's shape
    source.commit(end.checkpoint)
    assert book.saved == [frozenset({"s.a", "s.b"})]


def test_without_a_record_the_tables_captured_now_count_as_complete():
    source, book = ListSource(_config(), Counter(5), tables=("s.a", "s.b")), Book(None)
    source.attach(StandaloneSourceContext("t", book))
    source.start()
    assert source.snapshots == [] and source.phase == "streaming" and source.stream.position == Counter(5)
    source.commit(Counter(6))
    source.commit(Counter(7))
    assert book.saved == [frozenset({"s.a", "s.b"})]  # once


class LosingStream(ListStream):
    """A stream whose position is lost at its first poll (a slot dropped over its budget, or
    invalidated by the server while streaming)."""

    closed = False

    def poll(self, timeout: float) -> Batch | None:
        raise PositionLostError("slot s dropped")

    def close(self) -> None:
        self.closed = True


class LosingSource(ListSource):
    def open_stream(self, position, after_snapshot: bool) -> ListStream:
        return LosingStream(position, after_snapshot) if not after_snapshot else ListStream(position, after_snapshot)


def test_a_position_lost_while_streaming_snapshots_again_under_when_needed():
    source = LosingSource(_config("when_needed"), Counter(5))
    source.start()
    lost = source.stream
    assert source.phase == "streaming" and source.snapshots == []
    assert source.poll(0.1) is None
    assert lost.closed and source.phase == "snapshot" and source.snapshots == [["s.a"]]
    marker = source.poll(0.1)
    assert marker.checkpoint == SnapshotProgress(Counter(10))  # nothing older to stream from
    source.commit(marker.checkpoint)
    assert len([e for b in _drain(source) for e in b.events]) == 3 and source.phase == "streaming"


def test_a_position_lost_while_streaming_stops_the_source_under_other_modes():
    source = LosingSource(_config("initial"), Counter(5))
    source.start()
    with pytest.raises(PositionLostError, match="slot s dropped"):
        source.poll(0.1)
    assert source.snapshots == []
