"""The DBLog window of snapshot/incremental.py, as pure logic: a fake source half that records
the watermarks it is asked to write and hands out chunks; batches built by hand stand for the
stream bringing the watermarks back."""

from __future__ import annotations

from cdc.events import Batch, ChangeEvent, Op, SnapshotMarker, TableId
from cdc.positions import Counter, IncrementalProgress
from snapshot.incremental import IncrementalSnapshots

TABLE = TableId("db", "public", "t")
SIGNALS = TableId("db", "public", "cdc_signal")


def event(op: Op, key: int, version: int, table: TableId = TABLE, after: dict | None = None) -> ChangeEvent:
    row = after if after is not None else ({"id": key, "v": version} if op is not Op.DELETE else None)
    return ChangeEvent(op, table, {"id": key}, None, row, version, 0)


class FakeSource:
    signal_table = SIGNALS

    def __init__(self, rows: list[int]) -> None:
        self.rows, self.written = rows, []
        self.readable = True
        self.conditions: list[str | None] = []  # the condition of each chunk read

    def filter_error(self, table, where):
        return None if where in ("even", "odd") else f"no column in {where!r}"

    def estimate_rows(self, table):
        return len(self.rows)

    def chunk_readable(self) -> bool:
        return self.readable

    def write_signal(self, signal_id: str, kind: str, data: dict) -> int:
        self.written.append((signal_id, kind))
        return 100 + len(self.written)

    def read_chunk(self, table, after, size, version, where=None):
        self.conditions.append(where)
        wanted = {None: lambda k: True, "even": lambda k: k % 2 == 0, "odd": lambda k: k % 2 == 1}[where]
        keys = [k for k in self.rows if (after is None or k > after[0]) and wanted(k)][:size]
        return [ChangeEvent(Op.READ, TABLE, {"id": k}, None, {"id": k, "v": 0}, version, 0, SnapshotMarker.TRUE)
                for k in keys]


def watermark(source: FakeSource, index: int) -> ChangeEvent:
    signal_id, kind = source.written[index]
    return event(Op.CREATE, 0, 0, SIGNALS, {"id": signal_id, "type": kind, "data": "{}"})


def test_rows_changed_inside_the_window_are_dropped_and_the_rest_go_out_at_the_high_watermark():
    source = FakeSource([1, 2, 3, 4])
    snapshots = IncrementalSnapshots(source, chunk_size=10, name="s", known=frozenset({"public.t"}))
    snapshots.request(["public.t"])
    snapshots.before_poll()
    assert [k for _, k in source.written] == ["snapshot-window-open", "snapshot-window-close"]
    before_window = event(Op.UPDATE, 1, 50)  # before the low watermark: the chunk still wins for key 1
    batch = snapshots.filter(Batch([before_window, watermark(source, 0), event(Op.UPDATE, 2, 150),
                                    event(Op.DELETE, 3, 151), watermark(source, 1), event(Op.UPDATE, 4, 160)],
                                   Counter(9)))
    assert [(e.op, e.key["id"]) for e in batch.events] == [
        (Op.UPDATE, 1), (Op.UPDATE, 2), (Op.DELETE, 3), (Op.READ, 1), (Op.READ, 4), (Op.UPDATE, 4)]
    assert all(e.version == 101 and e.snapshot is SnapshotMarker.INCREMENTAL for e in batch.events if e.op is Op.READ)
    assert batch.checkpoint == Counter(9)  # four rows < chunk size: the table is done
    assert snapshots.status() is None


def test_the_checkpoint_carries_the_cursor_of_the_last_chunk_emitted():
    source = FakeSource(list(range(1, 8)))
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t"}))
    snapshots.request(["public.t"])
    snapshots.before_poll()
    first = snapshots.filter(Batch([watermark(source, 0)], Counter(1)))
    assert first.checkpoint == IncrementalProgress(Counter(1), ("public.t",), None, 0)  # the chunk is not out
    second = snapshots.filter(Batch([watermark(source, 1)], Counter(2)))
    assert [e.key["id"] for e in second.events] == [1, 2, 3]
    assert second.checkpoint == IncrementalProgress(Counter(2), ("public.t",), (3,), 3)


def test_a_resumed_snapshot_reads_after_the_stored_key():
    source = FakeSource(list(range(1, 8)))
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t"}))
    snapshots.resume(IncrementalProgress(Counter(1), ("public.t",), (6,), 6))
    snapshots.before_poll()
    out = snapshots.filter(Batch([watermark(source, 0), watermark(source, 1)], Counter(3)))
    assert [e.key["id"] for e in out.events] == [7]
    assert out.checkpoint == Counter(3)


def test_a_watermark_of_another_chunk_or_a_replayed_one_is_ignored_and_signals_never_go_out():
    source = FakeSource([1])
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t"}))
    stray = event(Op.CREATE, 0, 0, SIGNALS, {"id": "old-close", "type": "snapshot-window-close", "data": "{}"})
    assert snapshots.filter(Batch([stray, event(Op.UPDATE, 1, 5)], Counter(1))).events == [event(Op.UPDATE, 1, 5)]


def test_progress_round_trips_through_json():
    from cdc.positions import MySqlPosition, PgLsn, position_from_json, position_to_json

    for at in (PgLsn(123456789), MySqlPosition("binlog.000003", 1234, "0-1-5")):
        progress = IncrementalProgress(at, ("public.t", "public.u"), (42, "x"), 900)
        assert position_from_json(position_to_json(progress)) == progress


def test_a_stored_progress_counts_as_its_stream_position_for_read_your_writes():
    from cdc.offsets import checkpoint_version
    from cdc.positions import PgLsn

    assert checkpoint_version(IncrementalProgress(PgLsn(77), ("public.t",), (5,), 5)) == 77


def test_status_shows_the_table_the_cursor_and_what_is_queued():
    from cdc.runtime.status_lines import status_line as _status_line

    source = FakeSource(list(range(1, 8)))
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t", "public.u"}))
    snapshots.request(["public.t", "public.u"])
    snapshots.before_poll()
    snapshots.filter(Batch([watermark(source, 0), watermark(source, 1)], Counter(2)))
    line = _status_line({"kind": "source", "name": "s", "phase": "streaming", "position": "2", "lag_seconds": 0.0,
                         "incremental_snapshot": snapshots.status()})
    assert "incremental_snapshot=public.t after=3 chunks=1 rows=3 eta=" in line and "queued=public.u" in line


def test_a_stop_signal_ends_the_snapshot_and_its_window_rows_never_go_out():
    source = FakeSource(list(range(1, 8)))
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t"}))
    snapshots.request(["public.t"])
    snapshots.before_poll()
    stop = event(Op.CREATE, 0, 0, SIGNALS, {"id": "x", "type": "stop-snapshot",
                                             "data": '{"data-collections": ["public.t"]}'})
    out = snapshots.filter(Batch([watermark(source, 0), stop, watermark(source, 1)], Counter(4)))
    assert out.events == [] and out.checkpoint == Counter(4) and snapshots.status() is None


def test_signal_snapshot_refuses_a_source_without_a_signal_table_or_a_table_it_does_not_capture():
    import pytest

    from cdc.errors import ConfigError
    from sources.postgres.config import PostgresConfig
    from sources.postgres.source import PostgresSource

    config = PostgresConfig(name="pg", dsn="postgresql://u@h/db", tables=["public.*"])
    with pytest.raises(ConfigError, match="no signal_table"):
        PostgresSource.signal_snapshot(config, ["public.t"])
    config = PostgresConfig(name="pg", dsn="postgresql://u@h/db", tables=["public.*"], signal_table="public.s")
    with pytest.raises(ConfigError, match="does not capture other.t"):
        PostgresSource.signal_snapshot(config, ["other.t"])


def test_chunk_rows_are_no_part_of_a_repeated_snapshot_for_the_stale_row_deletes(tmp_path):
    """The stale-row search notes the keys of a snapshot until its end; an incremental snapshot
    has no such end, so noting its rows would only grow (and later mix into a real snapshot's)."""
    from cdc.log.embedded import EmbeddedLog
    from cdc.runtime.stale_rows import StaleRows
    from cdc.serde import Record

    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        log.ensure_topic("p.public.t")
        writer = log.writer()
        writer.publish([Record("p.public.t", b'{"id":1}', b'{"op":"c"}')])
        writer.flush()
        writer.close()
        source = FakeSource([1, 2])
        snapshots = IncrementalSnapshots(source, chunk_size=10, name="s", known=frozenset({"public.t"}))
        snapshots.request(["public.t"])
        snapshots.before_poll()
        batch = snapshots.filter(Batch([watermark(source, 0), watermark(source, 1)], Counter(1)))
        stale = StaleRows(log, lambda table: f"p.{table}")
        assert stale.before_publish(batch) == [] and stale.tracked == {}
    finally:
        log.close()


def test_a_signal_table_must_be_named_with_its_namespace():
    import pytest
    from pydantic import ValidationError

    from sources.mysql.config import MySqlConfig

    with pytest.raises(ValidationError, match="name it as namespace.table"):
        MySqlConfig(name="my", url="mysql://u@h/db", signal_table="cdc_signal")


def test_a_chunk_read_after_changes_of_its_window_still_drops_them():
    """PostgreSQL reads a chunk only once older transactions ended; the stream goes on meanwhile,
    and the window's changes that came before the read still win over the chunk's rows."""
    source = FakeSource([1, 2, 3])
    source.readable = False
    snapshots = IncrementalSnapshots(source, chunk_size=10, name="s", known=frozenset({"public.t"}))
    snapshots.request(["public.t"])
    snapshots.before_poll()
    assert [k for _, k in source.written] == ["snapshot-window-open"] and not snapshots.awaiting_high_watermark
    early = snapshots.filter(Batch([watermark(source, 0), event(Op.UPDATE, 2, 150)], Counter(1)))
    assert [e.key["id"] for e in early.events] == [2]
    source.readable = True
    snapshots.before_poll()
    assert snapshots.awaiting_high_watermark
    out = snapshots.filter(Batch([watermark(source, 1)], Counter(2)))
    assert [(e.op, e.key["id"]) for e in out.events] == [(Op.READ, 1), (Op.READ, 3)]


def test_has_table_finds_a_table_among_runs_of_others():
    from snapshot.incremental import has_table

    other = TableId("db", "public", "u")
    events = [event(Op.UPDATE, 1, 1), event(Op.UPDATE, 2, 2, other), event(Op.UPDATE, 3, 3)]
    assert not has_table(events, SIGNALS)
    assert has_table(events + [event(Op.CREATE, 0, 4, TableId("db", "public", "cdc_signal"), {"id": "x"})], SIGNALS)


def test_the_next_chunk_waits_out_the_pause_while_the_stream_goes_on():
    source = FakeSource(list(range(1, 8)))
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t"}), pause_s=3600)
    snapshots.request(["public.t"])
    snapshots.before_poll()
    snapshots.filter(Batch([watermark(source, 0), watermark(source, 1)], Counter(2)))  # the first chunk is out
    snapshots.before_poll()
    assert len(source.written) == 2  # no third watermark: the pause holds the next chunk
    streamed = snapshots.filter(Batch([event(Op.UPDATE, 5, 300)], Counter(3)))
    assert [e.key["id"] for e in streamed.events] == [5]  # the stream is not held
    snapshots.pause_s, snapshots._next_chunk_at = 0.0, 0.0
    snapshots.before_poll()
    assert len(source.written) == 4  # the next chunk's window opened and its rows were read


def signal(kind: str, data: str = "{}") -> ChangeEvent:
    return event(Op.CREATE, 0, 0, SIGNALS, {"id": f"user-{kind}", "type": kind, "data": data})


def chunk_out(snapshots: IncrementalSnapshots, source: FakeSource, at: int) -> Batch:
    """The stream brings back the last two watermarks written: the chunk in flight goes out."""
    return snapshots.filter(Batch([watermark(source, -2), watermark(source, -1)], Counter(at)))


def test_a_paused_snapshot_opens_no_chunk_while_the_stream_goes_on_and_a_resume_reads_on():
    source = FakeSource(list(range(1, 10)))
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t"}))
    snapshots.request(["public.t"])
    snapshots.before_poll()
    paused = snapshots.filter(Batch([signal("pause-snapshot"), event(Op.UPDATE, 8, 300)], Counter(2)))
    assert [e.key["id"] for e in paused.events] == [8]
    assert paused.checkpoint == IncrementalProgress(Counter(2), ("public.t",), None, 0, (), True)
    first = chunk_out(snapshots, source, 3)  # the chunk open when the pause came is finished
    assert [e.key["id"] for e in first.events] == [1, 2, 3]
    snapshots.before_poll()
    snapshots.before_poll()
    assert len(source.written) == 2 and snapshots.status()["paused"]
    assert "PAUSED" in _line(snapshots)
    snapshots.filter(Batch([signal("resume-snapshot")], Counter(4)))
    snapshots.before_poll()
    assert [e.key["id"] for e in chunk_out(snapshots, source, 5).events] == [4, 5, 6]


def test_a_pause_is_kept_across_a_restart_and_ends_with_the_snapshot():
    source = FakeSource(list(range(1, 5)))
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t"}))
    snapshots.resume(IncrementalProgress(Counter(1), ("public.t",), (3,), 3, (), True))
    snapshots.before_poll()
    assert source.written == []  # still paused after the restart
    snapshots.filter(Batch([signal("resume-snapshot")], Counter(2)))
    snapshots.before_poll()
    last = chunk_out(snapshots, source, 3)
    assert [e.key["id"] for e in last.events] == [4] and last.checkpoint == Counter(3)
    assert not snapshots.paused  # the next snapshot asked for is not born paused


def test_a_pause_with_no_snapshot_under_way_is_ignored():
    source = FakeSource([1, 2])
    snapshots = IncrementalSnapshots(source, chunk_size=3, name="s", known=frozenset({"public.t"}))
    snapshots.filter(Batch([signal("pause-snapshot")], Counter(1)))
    snapshots.request(["public.t"])
    snapshots.before_poll()
    assert len(source.written) == 2


def test_a_condition_reads_only_matching_rows_and_is_kept_with_the_cursor():
    source = FakeSource(list(range(1, 10)))
    snapshots = IncrementalSnapshots(source, chunk_size=2, name="s", known=frozenset({"public.t"}))
    data = '{"data-collections": ["public.t"], "additional-conditions": [{"data-collection": "public.t", "filter": "even"}]}'
    snapshots.filter(Batch([signal("execute-snapshot", data)], Counter(1)))
    snapshots.before_poll()
    out = chunk_out(snapshots, source, 2)
    assert [e.key["id"] for e in out.events] == [2, 4] and source.conditions == ["even"]
    assert out.checkpoint == IncrementalProgress(Counter(2), ("public.t",), (4,), 2, (("public.t", "even"),))
    assert "where='even'" in _line(snapshots)
    resumed = IncrementalSnapshots(source, chunk_size=2, name="s", known=frozenset({"public.t"}))
    resumed.resume(out.checkpoint)
    resumed.before_poll()
    assert [e.key["id"] for e in chunk_out(resumed, source, 3).events] == [6, 8]
    assert source.conditions == ["even", "even"]


def test_a_condition_the_database_refuses_drops_the_request_instead_of_failing_the_stream():
    source = FakeSource([1, 2])
    snapshots = IncrementalSnapshots(source, chunk_size=2, name="s", known=frozenset({"public.t"}))
    snapshots.request(["public.t"], where="no_such_column = 1")
    snapshots.before_poll()
    assert source.written == [] and snapshots.status() is None


def test_a_request_with_another_condition_reads_the_table_again_from_its_start():
    source = FakeSource(list(range(1, 10)))
    snapshots = IncrementalSnapshots(source, chunk_size=2, name="s", known=frozenset({"public.t"}))
    snapshots.request(["public.t"], where="even")
    snapshots.before_poll()
    chunk_out(snapshots, source, 2)
    snapshots.request(["public.t"], where="odd")
    snapshots.before_poll()
    assert [e.key["id"] for e in chunk_out(snapshots, source, 3).events] == [1, 3]


def test_malformed_additional_conditions_are_refused_whole():
    from snapshot.signals import conditions_of

    assert conditions_of({"additional-conditions": [{"data-collection": "public.t", "filter": "a = 1"}]}) == {
        "public.t": "a = 1"}
    assert conditions_of({}) == {}
    assert conditions_of({"additional-conditions": [{"data-collection": "public.t"}]}) is None
    assert conditions_of({"additional-conditions": {"public.t": "a = 1"}}) is None


def test_status_counts_chunks_and_estimates_the_time_left_from_the_rate_so_far():
    source = FakeSource(list(range(1, 101)))
    snapshots = IncrementalSnapshots(source, chunk_size=10, name="s", known=frozenset({"public.t"}))
    snapshots.request(["public.t"])
    snapshots.before_poll()
    assert snapshots.status()["eta_seconds"] is None  # nothing read yet: no rate
    snapshots._pace.reading = 0.0
    snapshots._pace._since -= 2.0  # the first chunk took two seconds
    chunk_out(snapshots, source, 2)
    status = snapshots.status()
    assert status["chunks_done"] == 1 and status["rows"] == 10
    assert 17.0 <= status["eta_seconds"] <= 19.0  # 90 rows left at 10 rows per ~2 s
    assert "chunks=1 rows=10 eta=1" in _line(snapshots)


def test_progress_with_conditions_and_a_pause_round_trips_and_old_records_still_load():
    from cdc.positions import PgLsn, position_from_json, position_to_json

    progress = IncrementalProgress(PgLsn(9), ("public.t",), (4,), 2, (("public.t", "region = 'eu'"),), True)
    assert position_from_json(position_to_json(progress)) == progress
    import json

    stored = json.loads(position_to_json(IncrementalProgress(PgLsn(9), ("public.t",), (4,), 2)))
    del stored["filters"], stored["paused"]  # as stored before conditions and pauses existed
    assert position_from_json(json.dumps(stored)) == IncrementalProgress(PgLsn(9), ("public.t",), (4,), 2)


def _line(snapshots: IncrementalSnapshots) -> str:
    from cdc.runtime.status_lines import status_line

    return status_line({"kind": "source", "name": "s", "phase": "streaming", "position": "2", "lag_seconds": 0.0,
                        "incremental_snapshot": snapshots.status()})


def test_a_condition_that_would_escape_its_place_in_the_chunk_query_is_refused():
    from snapshot.signals import condition_error

    for fine in ("id % 2 = 0", "region = 'eu' AND (a > 1 OR b < 2)", "note = 'a) OR (1=1'",
                 "name = 'it''s'", "\"odd)name\" = 1", "`odd(name` = 1", "note = 'a\\' OR ('"):
        assert condition_error(fine) is None, fine
    for bad, why in (("x) OR (1=1", "closes more"), ("(x = 1", "not closed"), ("x = 1; DROP TABLE t", "';'"),
                     ("x = 1 -- rest", "comments"), ("x = 1 /* rest */", "comments"), ("x = 1 # rest", "comments"),
                     ("note = 'open", "quote")):
        refused = condition_error(bad)
        assert refused is not None and why in refused, (bad, refused)
