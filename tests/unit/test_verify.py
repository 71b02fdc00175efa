"""``cdc verify``'s pure logic: canonical values, chunks compared whole, key ranges, the looks that keep a
live writer from raising false alarms, the pacing and the report (cdc/runtime/verify*.py).
The source and the store here are fakes of the two plugin interfaces; tests/integration/
test_verify.py runs the same against real servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from cdc.api import ReadableSink, SourceRead, StoredRow, in_range
from cdc.api.digest import DigestColumn, DigestingReader, DigestingSink, DigestPlan, Kind, SourceDigest, digest_of
from cdc.events import ChangeEvent, Op, TableId
from cdc.positions import IncrementalProgress, PgLsn, SnapshotProgress
from cdc.runtime.verify import Options, Pacer, Verifier, reached
from cdc.runtime.verify_compare import TableReport, by_key, canonical, compare, equal_as_given, same

TABLE = TableId("db", "public", "t")


def test_a_value_compares_equal_whatever_form_a_store_keeps_it_in():
    assert same(canonical("12.30"), canonical(Decimal("12.3"))) and same(canonical(12.3), canonical("12.3"))
    assert canonical(7) == canonical(Decimal("7.00")) == "7" and same(canonical("7"), canonical(7.0))
    assert canonical(True) == canonical(1) == "1" and canonical(False) == "0"
    instant = datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    assert canonical(instant) == canonical(datetime(2026, 1, 1, 0, 0)) == canonical(instant.astimezone(UTC))
    assert canonical({"b": 1, "a": [1]}) == canonical('{"a": [1], "b": 1}')
    assert canonical(b"\x00\x01") == canonical(memoryview(b"\x00\x01"))
    assert canonical("NaN") == "NaN" and canonical("text") == "text" and canonical(None) is None
    assert not same(canonical("12.3"), canonical("12.4"))


def test_infinity_and_nan_are_one_value_whatever_form_a_store_keeps_them_in():
    assert canonical(float("inf")) == canonical(Decimal("Infinity")) == canonical("Infinity")
    assert canonical(float("-inf")) == canonical(Decimal("-Infinity")) != canonical(float("inf"))
    assert canonical(float("nan")) == canonical(Decimal("NaN")) == "NaN"
    # The check without canonical forms agrees with them.
    assert equal_as_given([StoredRow((1,), {"v": float("inf")})], [StoredRow((1,), {"v": Decimal("Infinity")})])
    assert not compare(by_key([StoredRow((1,), {"v": float("inf")})]), by_key([StoredRow((1,), {"v": Decimal("Infinity")})]))


def test_text_stays_text_so_a_changed_spelling_is_a_difference():
    assert not same(canonical("007"), canonical("7")) and not same(canonical("1.0"), canonical("1"))


def test_chunk_sides_compare_whole_ignoring_order_and_null_columns_but_not_values():
    one = by_key([StoredRow((1,), {"id": 1, "v": Decimal("2.50"), "n": None}), StoredRow((2,), {"id": 2, "v": 3})])
    two = by_key([StoredRow((2,), {"v": 3.0, "id": 2}), StoredRow((1,), {"id": 1, "v": 2.5})])
    assert one == two
    three = by_key([StoredRow((1,), {"id": 1, "v": "2.51"}), StoredRow((2,), {"id": 2, "v": 3})])
    assert one != three and compare(one, three).different == [("1",)]
    # Text against numbers (SQLite reads back 2.5 for the "2.50" bound): the sides differ whole,
    # the rows compare equal key by key.
    text = by_key([StoredRow((1,), {"id": "1", "v": "2.50"}), StoredRow((2,), {"id": 2, "v": "3"})])
    assert one != text and not compare(one, text)


def test_sides_equal_as_given_need_no_canonical_forms_but_never_hide_a_difference():
    at = datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    source = [StoredRow((1,), {"id": 1, "v": Decimal("2.50"), "at": at}), StoredRow((2,), {"id": 2, "v": 3})]
    store = [StoredRow((2,), {"id": 2, "v": 3.0}), StoredRow((1,), {"id": 1, "v": Decimal("2.5"), "at": at.astimezone(UTC)})]
    assert equal_as_given(source, store)
    assert not equal_as_given(source, store[:1])
    assert not equal_as_given(source, [store[0], StoredRow((1,), {"id": 1, "v": Decimal("2.51"), "at": at})])
    # Where == says less than the canonical forms, the sides go to them: JSON's true is not 1.
    json_source, json_store = [StoredRow((1,), {"doc": {"a": True}})], [StoredRow((1,), {"doc": {"a": 1}})]
    assert not equal_as_given(json_source, json_store)
    assert compare(by_key(json_source), by_key(json_store)).different == [("1",)]
    # Forms == tells apart that are the same value: not equal as given, equal canonically.
    text_source, text_store = [StoredRow((1,), {"v": 7})], [StoredRow(("1",), {"v": "7"})]
    assert not equal_as_given(text_source, text_store) and not compare(by_key(text_source), by_key(text_store))


def test_compare_names_missing_extra_and_different_keys_in_key_order():
    source = by_key([StoredRow((k,), {"v": k}) for k in (1, 2, 3, 10)])
    store = by_key([StoredRow((1,), {"v": 1}), StoredRow((3,), {"v": 0}), StoredRow((9,), {"v": 9}),
                    StoredRow((10,), {"v": 10})])
    diff = compare(source, store)
    assert (diff.missing, diff.extra, diff.different) == ([("2",)], [("9",)], [("3",)])
    assert diff.keys == [("2",), ("3",), ("9",)]


def test_key_ranges_are_after_the_lower_bound_up_to_and_with_the_upper_one():
    rows = [StoredRow((k,), {}) for k in (10, 2, 9, 1, "x")]
    assert [r.key for r in in_range(rows, (1,), (9,))] == [(2,), (9,)]
    assert [r.key for r in in_range(rows, None, (2,))] == [(1,), (2,)]
    assert [r.key for r in in_range(rows, (9,), None)] == [(10,), ("x",)]


def test_the_pacer_holds_reads_to_the_rate():
    now, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pacer = Pacer(100, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        pacer.took(50)
    assert now[0] == 2.5 and sum(slept) == 2.5  # 250 rows at 100 a second
    unpaced = Pacer(None, clock=lambda: 0.0, sleep=sleep)
    unpaced.took(10_000)
    assert len(slept) == 5


def test_a_stored_offset_reaches_a_position_through_progress_wrappers():
    assert reached(PgLsn(10), PgLsn(10)) and not reached(PgLsn(9), PgLsn(10))
    assert reached(IncrementalProgress(PgLsn(12), ("public.t",)), PgLsn(10))
    assert reached(SnapshotProgress(PgLsn(12)), PgLsn(10)) is False
    assert reached(None, PgLsn(1)) is False


# --- the looks, with a fake source and store -----------------------------------------------------

class FakeSource:
    """A table that a test changes; ``on_read`` runs after every read (a writer)."""

    def __init__(self, rows: dict[int, int]) -> None:
        self.rows, self.lsn, self.on_read = dict(rows), 100, None

    def tables(self) -> list[str]:
        return ["public.t"]

    def _answer(self, keys) -> SourceRead:
        self.lsn += 1
        events = [ChangeEvent(Op.READ, TABLE, {"id": k}, None, {"id": k, "v": self.rows[k]}, self.lsn, 0)
                  for k in sorted(keys) if k in self.rows]
        read = SourceRead(events, PgLsn(self.lsn))
        if self.on_read is not None:
            self.on_read()
        return read

    def read(self, table, after, limit) -> SourceRead:
        return self._answer([k for k in sorted(self.rows) if after is None or k > after[0]][:limit])

    def read_keys(self, table, keys) -> SourceRead:
        return self._answer([key["id"] for key in keys])

    def close(self) -> None:
        pass


class FakeStore(ReadableSink):
    def __init__(self, rows: dict[int, int]) -> None:
        self.rows = dict(rows)

    def read_rows(self, topic, after=None, limit=None):
        from cdc.api import page

        return page([StoredRow((k,), {"id": k, "v": v}) for k, v in self.rows.items()], after, limit)


class Settle:
    """Applies the source to the store when asked to wait (a sink catching up), or never settles."""

    def __init__(self, source: FakeSource, store: FakeStore, catch_up: bool = True, works: bool = True) -> None:
        self.source, self.store, self.catch_up, self.works, self.waits = source, store, catch_up, works, 0
        self.timeouts: list[float | None] = []

    def wait(self, position, topic, timeout=None) -> bool:
        self.waits += 1
        self.timeouts.append(timeout)
        if self.catch_up:
            self.store.rows = {k: v for k, v in self.source.rows.items() if k not in BROKEN} | \
                {k: v for k, v in self.store.rows.items() if k in BROKEN}
        return self.works


BROKEN: set[int] = set()


def run(source: FakeSource, store: FakeStore, settle: Settle | None = None, chunk: int = 4,
        looks: int = 3, digests: bool = True) -> TableReport:
    verifier = Verifier(source, store, "p", settle or Settle(source, store),
                        Options(chunk=chunk, looks=looks, digests=digests))
    return verifier.table("public.t")


def test_equal_chunks_are_not_looked_at_again():
    rows = {k: k for k in range(1, 11)}
    source, store = FakeSource(rows), FakeStore(rows)
    settle = Settle(source, store)
    report = run(source, store, settle)
    assert (report.rows, report.store_rows, report.chunks, report.chunks_differing) == (10, 10, 3, 0)
    assert report.mismatched == 0 and settle.waits == 0


def test_a_store_that_lags_is_not_a_difference_once_it_caught_up():
    rows = {k: k for k in range(1, 11)}
    source, store = FakeSource(rows), FakeStore({**rows, 3: 0, 7: 0})  # not applied yet
    del store.rows[5]
    report = run(source, store)
    assert report.mismatched == 0 and report.chunks_differing == 1  # its wait caught the whole store up


def test_hand_edits_are_reported_by_kind_with_both_sides():
    BROKEN.update({3, 5, 7, 42})
    try:
        rows = {k: k for k in range(1, 11)}
        source, store = FakeSource(rows), FakeStore({**rows, 3: -3, 42: 1})
        del store.rows[5]
        report = run(source, store)
    finally:
        BROKEN.clear()
    assert report.counts == {"missing": 1, "extra": 1, "different": 1, "unsettled": 0}
    assert [f.key for f in report.missing] == [["5"]] and [f.key for f in report.extra] == [["42"]]
    [different] = report.different
    assert (different.key, different.source, different.store) == (["3"], {"id": "3", "v": "3"},
                                                                  {"id": "3", "v": "-3"})
    assert "3 keys differ" in report.lines()[0]


def test_a_key_that_changes_at_every_read_is_unsettled_not_different():
    rows = {k: k for k in range(1, 6)}
    source, store = FakeSource(rows), FakeStore(rows)
    store.rows[2] = 0

    def writer() -> None:
        source.rows[2] += 1

    source.on_read = writer
    report = run(source, store, Settle(source, store, catch_up=False), looks=2)
    assert report.counts == {"missing": 0, "extra": 0, "different": 0, "unsettled": 1}
    assert [f.key for f in report.unsettled] == [["2"]]


def test_a_key_inserted_and_deleted_again_while_the_store_is_read_is_not_reported():
    # bench/verify_soak.py's false mismatch: a key the source had deleted (the store not yet)
    # comes back and goes again between a look's two source reads, and the store is read while
    # it holds the row: both source reads say "no row", the store has one.
    rows = {k: k for k in range(1, 6)}
    source, store = FakeSource(rows), FakeStore({**rows, 9: 9})

    class InsertedAndDeletedAgain(Settle):
        def wait(self, position, topic) -> bool:
            super().wait(position, topic)  # the store applied the delete
            if self.waits == 1:
                source.rows[9] = 90
                self.store.rows[9] = 90  # the insert applied, the delete after it not yet
                del source.rows[9]
            return True

    report = run(source, store, InsertedAndDeletedAgain(source, store))
    assert report.mismatched == 0 and report.counts["unsettled"] == 0, report.lines()


def test_a_key_is_reported_once_two_looks_in_a_row_find_the_same_difference():
    rows = {k: k for k in range(1, 6)}
    source, store = FakeSource(rows), FakeStore({**rows, 3: 0})
    settle = Settle(source, store, catch_up=False)
    report = run(source, store, settle, looks=1)
    assert report.counts["different"] == 1 and settle.waits == 2
    store.rows[3] = 0

    class EditedAgain(Settle):  # the hand edit changes between the looks: not yet a difference
        def wait(self, position, topic) -> bool:
            super().wait(position, topic)
            self.store.rows[3] -= 1
            return True

    report = run(source, store, EditedAgain(source, store, catch_up=False), looks=2)
    assert report.counts == {"missing": 0, "extra": 0, "different": 0, "unsettled": 1}


def test_a_store_that_never_settles_is_unsettled_not_different():
    rows = {k: k for k in range(1, 6)}
    source, store = FakeSource(rows), FakeStore({**rows, 4: 0})
    report = run(source, store, Settle(source, store, catch_up=False, works=False))
    assert not report.settled and report.counts == {"missing": 0, "extra": 0, "different": 0, "unsettled": 1}
    assert report.mismatched == 0 and "did not apply the log" in report.lines()[1]
    assert report.as_json()["equal"] is False and report.as_json()["settled"] is False


def test_a_recheck_waits_for_the_store_no_later_than_its_deadline():
    # ``--repair-timeout 0``: the keys are sent and rechecked as they stand, without waiting for
    # a store that may not even run (the CI failure of a DuckDB repair whose sink was stopped).
    import time

    rows = {k: k for k in range(1, 6)}
    source, store = FakeSource(rows), FakeStore({**rows, 4: 0})
    settle = Settle(source, store, catch_up=False)
    verifier = Verifier(source, store, "p", settle, Options(chunk=4, looks=1))
    assert verifier.table("public.t").repairable == [("4",)]
    settle.works, settle.timeouts = False, []
    report = verifier.recheck("public.t", [("4",)], deadline=time.monotonic() - 1)
    assert settle.timeouts == [0.0] and not report.settled
    assert report.counts == {"missing": 0, "extra": 0, "different": 0, "unsettled": 1}
    verifier.recheck("public.t", [("4",)])
    assert settle.timeouts[1:] == [None]  # no deadline: the settle's own timeout


def test_the_report_lists_the_first_keys_and_counts_them_all():
    report = TableReport("public.t", "p.public.t", shown=2)
    from cdc.runtime.verify_compare import Finding

    for k in range(5):
        report.add("missing", Finding([str(k)], {"id": str(k)}, None))
    assert report.counts["missing"] == 5 and len(report.missing) == 2
    lines = report.lines()
    assert lines[1] == "  missing 5 (the first 2):" and lines[2] == '    key "0": source {"id":"0"}'
    assert report.as_json()["counts"]["missing"] == 5


def test_a_reader_asked_for_a_table_its_source_does_not_capture_names_what_it_does():
    from cdc.api import ConfigError, captured_table

    assert captured_table("pg", {"public.a": 1, "public.b": 2}, "public.b") == 2
    with pytest.raises(ConfigError, match=r"source pg does not capture public\.c; it captures: public\.a, public\.b"):
        captured_table("pg", {"public.b": 2, "public.a": 1}, "public.c")
    with pytest.raises(ConfigError, match="it captures: no tables"):
        captured_table("pg", {}, "public.c")


def test_a_background_pass_logs_the_keys_it_found_with_both_sides(caplog):
    from cdc.runtime.verify_schedule import VerifySchedule, _shown

    found = {"key": ["9"], "source": None, "store": {"id": "9"}}
    schedule = VerifySchedule("cdc.yaml", ["s"])
    schedule._note("s", {"at": 1.0, "tables": {"public.t": 1}, "equal": False, "error": None,
                         "shown": _shown([{"table": "public.t", "extra": [found]}])})
    schedule._note("s", {"at": 2.0, "tables": {"public.t": 0}, "equal": False, "error": None,
                         "shown": _shown([{"table": "public.t", "unsettled": [found]}])})
    first, second = [r.getMessage() for r in caplog.records]
    assert 'keys differ (public.t: 1): public.t extra key ["9"]: source null, store {"id": "9"}' in first
    assert "not decided" in second and 'public.t unsettled key ["9"]' in second
    assert schedule.result("s")["tables"] == {"public.t": 0}


class _OwnPosition(ReadableSink):
    """A store that keeps its own position (as the Delta sink's checkpoint): ``applied`` per partition."""

    def __init__(self, applied: dict[int, int]) -> None:
        self.applied = applied

    def read_rows(self, topic, after=None, limit=None):
        return []

    def applied_offsets(self, topic: str) -> dict[int, int] | None:
        return self.applied


def test_a_sink_that_keeps_its_own_position_settles_on_it_not_on_a_consumer_group(tmp_path):
    """The embedded log, a source offset stored past the read, four records in two partitions
    and no consumer group commit: only the store's own offsets can settle it."""
    from cdc.log.base import TopicSettings
    from cdc.log.embedded import EmbeddedLog
    from cdc.offsets import OffsetStore
    from cdc.runtime.verify import LogSettle
    from cdc.serde import Record

    log = EmbeddedLog(tmp_path / "log", TopicSettings(partitions=2))
    try:
        log.ensure_topic("p.public.t", TopicSettings(partitions=2))
        writer = log.writer()
        writer.publish([Record("p.public.t", b'{"id": %d}' % i, b"{}") for i in range(4)])
        writer.flush(10)
        writer.close()
        offsets = OffsetStore(log, "p")
        offsets.save("src", PgLsn(500))
        offsets.close()
        ends = {partition: end for (_, partition), end in log.end_offsets("p.public.t").items()}
        assert sum(ends.values()) == 4

        def settles(store) -> bool:
            settle = LogSettle(log, "p", "src", "lake", timeout=0.3, poll=0.05, store=store)
            try:
                return settle.wait(PgLsn(400), "p.public.t")
            finally:
                settle.close()

        assert settles(_OwnPosition(ends))
        assert not settles(_OwnPosition({**ends, 0: ends[0] - 1}))
        assert not settles(_OwnPosition({}))  # nothing applied yet
        assert not settles(None)  # the consumer group "lake" committed nothing
    finally:
        log.close()


class DigestSource(FakeSource, DigestingReader):
    """FakeSource whose "database" digests chunks (the reference digest of cdc/api/digest.py)."""

    database = "fake"

    def __init__(self, rows: dict[int, int], can: bool = True) -> None:
        super().__init__(rows)
        self.can, self.row_reads = can, 0

    def read(self, table, after, limit) -> SourceRead:
        self.row_reads += 1
        return super().read(table, after, limit)

    def digest(self, table, plan, after, limit):
        if not self.can:
            return None
        keys = [k for k in sorted(self.rows) if after is None or k > after][:limit]
        self.lsn += 1
        return SourceDigest(digest_of(plan, [{"id": k, "v": self.rows[k]} for k in keys]),
                            keys[-1] if keys else None, PgLsn(self.lsn))


class DigestStore(FakeStore, DigestingSink):
    def digest_plan(self, topic):
        return DigestPlan("id", (DigestColumn("id", Kind.INTEGER), DigestColumn("v", Kind.INTEGER)))

    def digest_range(self, topic, plan, after, upto):
        return digest_of(plan, [{"id": k, "v": v} for k, v in self.rows.items()
                                if (after is None or k > after) and (upto is None or k <= upto)])


def test_ranges_whose_digests_are_equal_read_no_rows():
    rows = {k: k for k in range(1, 101)}
    source, store = DigestSource(rows), DigestStore(rows)
    report = run(source, store)  # a digest covers 10 chunks of 4 rows: 1-40, 41-80, 81-100
    assert (report.rows, report.store_rows, report.chunks, report.chunks_digested) == (100, 100, 3, 3)
    assert source.row_reads == 0 and report.equal


def test_a_range_whose_digests_differ_is_compared_by_its_rows_then_digests_again():
    BROKEN.update({46, 142})
    try:
        rows = {k: k for k in range(1, 101)}
        source, store = DigestSource(rows), DigestStore({**rows, 46: -46, 142: 1})
        report = run(source, store)
    finally:
        BROKEN.clear()
    assert [f.key for f in report.different] == [["46"]] and [f.key for f in report.extra] == [["142"]]
    # 1-40 by digest; 41-80 differs: its 10 chunks by rows, one of them differing; 81-100 digested
    # with the rest of the store, which holds the stray 142: rows to the end (5 chunks and the
    # empty one after 100, which differs)
    assert (report.chunks, report.chunks_digested, report.chunks_differing) == (17, 1, 2)
    assert source.row_reads == 16 and report.rows == 100


def test_a_source_that_cannot_digest_a_table_has_its_rows_compared():
    rows = {k: k for k in range(1, 11)}
    source, store = DigestSource(rows, can=False), DigestStore(rows)
    report = run(source, store)
    assert (report.chunks, report.chunks_digested, source.row_reads) == (3, 0, 3) and report.equal
    assert run(DigestSource(rows), store, chunk=4, digests=False).chunks_digested == 0


def test_a_store_of_another_database_digests_in_canonical_texts_or_not_at_all():
    """A plan whose store is not the reader's database is digested in canonical texts (its
    ``store`` cleared); with a column that has no canonical text, the rows are compared."""
    rows = {k: k for k in range(1, 11)}

    class OtherStore(DigestStore):
        def __init__(self, rows, column_kind):
            super().__init__(rows)
            self.column_kind, self.plans = column_kind, []

        def digest_plan(self, topic):
            return DigestPlan("id", (DigestColumn("id", Kind.INTEGER), DigestColumn("v", self.column_kind)),
                              "postgresql<14")

        def digest_range(self, topic, plan, after, upto):
            self.plans.append(plan)
            return super().digest_range(topic, plan, after, upto)

    canonical_store = OtherStore(rows, Kind.INTEGER)
    report = run(DigestSource(rows), canonical_store)
    assert report.chunks_digested == report.chunks == 1 and {p.store for p in canonical_store.plans} == {""}
    report = run(DigestSource(rows), OtherStore(rows, None))
    assert (report.chunks_digested, report.chunks) == (0, 3) and report.equal
