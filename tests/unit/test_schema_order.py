"""Schema changes ordered with their rows, on the embedded log (no server): the capture runner
names each row's shape, the schema records are kept per version, the sink runtime looks shapes
up by the version rows name (never "the first one seen"), and a SQL sink on SQLite/DuckDB never
writes a row of a new shape into the old one."""

from __future__ import annotations

import queue
import threading
from decimal import Decimal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc import native, schema_order
from cdc.api import Source, SourceConfig
from cdc.errors import RetriableError, SchemaChangeError
from cdc.events import Batch, ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.log.base import TopicSettings
from cdc.offsets import OffsetStore
from cdc.positions import Counter
from cdc.runtime.runner import SourceRunner
from cdc.runtime.schemas import SchemaBook
from cdc.runtime.sink_runner import SinkRunner
from cdc.schema_order import segments, split_by_schema
from cdc.serde import schema_changes_topic
from cdc.sink_events import SinkEvent, decode_record
from sinks.sql import SqlSink, SqlSinkConfig
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``
from tests.sql import query

ORDERS = TableId("shop", "public", "orders")
ITEMS = TableId("shop", "public", "items")
OLD = (Column("id", "integer", True), Column("amount", "numeric(12,2)"))
NEW = (Column("id", "integer", True), Column("amount", "double precision"))
WIDER = (Column("id", "integer", True), Column("amount", "numeric(14,4)"))


def row(table: TableId, key: int, version: int, amount) -> ChangeEvent:
    return ChangeEvent(Op.CREATE, table, {"id": key}, None, {"id": key, "amount": amount}, version, 0)


class Batches(Source):
    """Hands out the batches it is given, one by one (a database with writes now and then)."""

    connector = "postgresql"

    def __init__(self) -> None:
        super().__init__(SourceConfig(name="src", type="test"), None)
        self.queue: queue.Queue[Batch] = queue.Queue()

    def start(self) -> None: ...

    def poll(self, timeout: float) -> Batch | None:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def commit(self, position) -> None: ...

    def stop(self) -> None: ...


class Capture:
    """One capture runner for the whole test (shapes are known from batch to batch, as in a daemon)."""

    def __init__(self, log) -> None:
        self.source = Batches()
        self.offsets = OffsetStore(log, "p")
        self.runner = SourceRunner(self.source, log, self.offsets, "p", TopicSettings(), offset_interval=0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.runner.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def __call__(self, batches: list[Batch]) -> None:
        """Publish ``batches`` and wait until the last one's checkpoint is stored."""
        for batch in batches:
            self.source.queue.put(batch)
        last = batches[-1].checkpoint
        for _ in range(400):
            if self.offsets.load("src") == last:
                return
            self.stop.wait(0.05)
        raise AssertionError(f"checkpoint {last} was not stored")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def capture(log):
    running = Capture(log)
    yield running
    running.close()


def change(table: TableId, columns, version: int) -> SchemaChange:
    return SchemaChange(table, columns, version, 0)


def shapes_named(log, topic: str) -> list[tuple[int, int | None]]:
    return [(e.version, e.source.get("schema_version")) for e in map(decode_record, log.read_all(topic))]


# --- the capture side ---------------------------------------------------------------------------

def test_rows_name_the_shape_they_were_written_under_even_within_one_batch(log, capture):
    # One batch: orders rows of the old shape, the new shape from version 25, rows of both, and
    # a row of another table in between (its own shape, unchanged).
    batches = [
        Batch([row(ORDERS, 1, 10, "1.00"), row(ITEMS, 1, 11, "2.00")], Counter(1),
              (change(ORDERS, OLD, 10), change(ITEMS, OLD, 11))),
        Batch([row(ORDERS, 2, 20, "3.00"), row(ITEMS, 2, 24, "4.00"), row(ORDERS, 3, 25, 5.125),
               row(ORDERS, 4, 30, 6.5)], Counter(2), (change(ORDERS, NEW, 25),)),
    ]
    capture(batches)
    assert shapes_named(log, ORDERS.topic("p")) == [(10, 10), (20, 10), (25, 25), (30, 25)]
    assert shapes_named(log, ITEMS.topic("p")) == [(11, 11), (24, 11)]
    # Every shape a row names is kept: the records are keyed by table and version.
    kept = [orjson.loads(r.value) for r in log.read_all(schema_changes_topic("p"))]
    assert sorted((r["table"], r["version"]) for r in kept) == [("items", 11), ("orders", 10), ("orders", 25)]
    assert len({r.key for r in log.read_all(schema_changes_topic("p"))}) == 3


def test_segments_take_a_shape_on_at_its_first_row_and_keep_later_shapes_for_later_batches():
    events = [row(ORDERS, 1, 5, "1"), row(ORDERS, 2, 7, "2"), row(ITEMS, 1, 8, "3")]
    parts = list(segments(events, (change(ORDERS, NEW, 7), change(ITEMS, NEW, 9))))
    assert [(shapes, [e.version for e in part]) for shapes, part in parts] == \
        [({}, [5]), ({ORDERS: 7}, [7, 8]), ({ITEMS: 9}, [])]


def test_split_by_schema_cuts_where_a_topic_changes_shape():
    def event(topic: str, offset: int, shape: int | None):
        source = {} if shape is None else {"schema_version": shape}
        return type("E", (), {"topic": topic, "offset": offset, "source": source})()

    events = [event("a", 0, 1), event("b", 0, 1), event("a", 1, None), event("a", 2, 1), event("b", 1, 2),
              event("a", 3, 2)]
    assert [[(e.topic, e.offset) for e in part] for part in split_by_schema(events)] == \
        [[("a", 0), ("b", 0), ("a", 1), ("a", 2)], [("b", 1), ("a", 3)]]


@pytest.mark.skipif(schema_order._decode is None, reason="cdc._decode not built")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                          st.one_of(st.none(), st.just({}), st.just({"table": "t"}),
                                    st.fixed_dictionaries({"schema_version": st.one_of(st.none(), st.integers(1, 3),
                                                                                       st.just(2.0), st.just("2"))}))),
                max_size=15))
def test_split_by_schema_in_c_cuts_where_the_python_loop_cuts(made):
    events = [SinkEvent(topic, 0, n, {"id": n}, Op.CREATE, None, {"id": n}, n, source, None)
              for n, (topic, source) in enumerate(made)]
    in_c = schema_order._decode.split_by_schema(events)
    with native.reference():
        in_python = split_by_schema(events)
    assert in_c is not None
    assert [[e.offset for e in part] for part in in_c] == [[e.offset for e in part] for part in in_python]


# --- the sink side ------------------------------------------------------------------------------

def test_the_schema_book_follows_new_shapes_and_finds_each_version(log, capture):
    capture([Batch([row(ORDERS, 1, 10, "1.00")], Counter(1), (change(ORDERS, OLD, 10),))])
    book = SchemaBook(log, "p")
    topic = ORDERS.topic("p")
    assert [c["type"] for c in book.schema_for(topic)["columns"]] == ["integer", "numeric(12,2)"]
    capture([Batch([row(ORDERS, 2, 20, 2.5)], Counter(2), (change(ORDERS, NEW, 20),))])
    # A row naming the new shape finds it at once; the newest is the new one (not the first seen).
    assert [c["type"] for c in book.schema_for(topic, 20)["columns"]] == ["integer", "double precision"]
    assert book.schema_for(topic)["version"] == 20
    assert book.schema_for(topic, 10)["version"] == 10
    with pytest.raises(RetriableError, match="shape 99"):
        book.schema_for(topic, 99)


def test_the_schema_book_reads_only_what_the_schema_topic_gained(log, capture):
    capture([Batch([row(ORDERS, 1, 10, "1.00")], Counter(1), (change(ORDERS, OLD, 10),))])
    read = []

    class Counting:  # the book's view of the log, counting the records each read returns
        def __getattr__(self, name):
            return getattr(log, name)

        def read_all(self, *args, **kwargs):
            got = log.read_all(*args, **kwargs)
            read.append(len(got))
            return got

    book = SchemaBook(Counting(), "p")
    topic = ORDERS.topic("p")
    assert book.schema_for(topic, 10)["version"] == 10
    book.refresh()
    book.refresh()
    assert read == [1]  # nothing new: the topic is not read again
    capture([Batch([row(ITEMS, 1, 30, "1.00")], Counter(2), (change(ITEMS, OLD, 30),))])
    assert book.schema_for(ITEMS.topic("p"), 30)["version"] == 30
    assert read == [1, 1]  # only the record it gained
    assert book.schema_for(topic, 10)["version"] == 10  # and what it knew stays known


def test_the_schema_book_asks_the_log_no_metadata_on_a_write(log, capture):
    """The sink asks the book on every write: a shape it holds costs no request, and a read of
    the schema topic asks for its end offsets, never for the list of topics (on Kafka a cluster
    metadata request: about 25 ms per write on a busy machine, measured in bench/opensearch_sink.py)."""
    asked = []

    class Counting:  # the book's view of the log, recording what it asks
        def __getattr__(self, name):
            asked.append(name)
            return getattr(log, name)

    book = SchemaBook(Counting(), "p")
    topic = ORDERS.topic("p")
    assert book.schema_for(topic) is None  # no schema topic yet: nothing to read, no error
    capture([Batch([row(ORDERS, 1, 10, "1.00")], Counter(1), (change(ORDERS, OLD, 10),))])
    assert book.schema_for(topic, 10)["version"] == 10
    asked.clear()
    for _ in range(3):
        assert book.schema_for(topic, 10)["version"] == 10
    assert asked == []  # a known shape is a lookup
    book.refresh()
    assert "topics" not in asked and asked.count("end_offsets") == 1


def test_the_schema_book_goes_on_with_the_shapes_it_read_while_the_schema_topic_is_unreachable(log, capture):
    """A broker restarting or a leader moving made a Delta batch fail (and its sink process
    restart) on the schema topic's end offsets (the cluster test). The shapes read so far serve;
    a shape not read yet is missing as a late one is (the caller waits); a book that read nothing
    cannot go on and says why."""
    from cdc.errors import LogUnavailableError, ShapeNotYetPublished

    capture([Batch([row(ORDERS, 1, 10, "1.00")], Counter(1), (change(ORDERS, OLD, 10),))])
    down = [False]

    class Flaky:  # the book's view of the log, unreachable while ``down``
        def __getattr__(self, name):
            return getattr(log, name)

        def end_offsets(self, topic):
            if down[0]:
                raise LogUnavailableError(f"reading the end offset of {topic}[0]: _UNKNOWN_PARTITION")
            return log.end_offsets(topic)

    topic = ORDERS.topic("p")
    down[0] = True
    with pytest.raises(LogUnavailableError, match="_UNKNOWN_PARTITION"):
        SchemaBook(Flaky(), "p").refresh()   # nothing read yet
    book = SchemaBook(Flaky(), "p")
    down[0] = False
    assert book.schema_for(topic, 10)["version"] == 10
    capture([Batch([row(ORDERS, 2, 20, 2.5)], Counter(2), (change(ORDERS, NEW, 20),))])
    down[0] = True
    book.refresh()   # no error: as if the topic had gained nothing yet
    assert book.schema_for(topic)["version"] == 10 and book.schema_for(topic, 10)["version"] == 10
    with pytest.raises(ShapeNotYetPublished, match="shape 20"):   # not read: the caller waits, as for a late shape
        book.schema_for(topic, 20)
    down[0] = False
    assert book.schema_for(topic, 20)["version"] == 20 and book.schema_for(topic)["version"] == 20


@pytest.fixture(params=["sqlite", "duckdb"])
def target_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/target.db"
    return f"duckdb:///{tmp_path}/target.duckdb"


class LiveSink:
    """A SQL sink running in a thread for the whole test, as under ``cdc run``."""

    def __init__(self, log, url: str, policy: str) -> None:
        self.url = url
        sink = SqlSink(SqlSinkConfig(name="wh", topics=["p.public.*"], url=url, schema_policy=policy,
                                     batch_wait_ms=10))
        self.runner = SinkRunner(sink, log, "p")
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.runner.run(self.stop)
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            self.error = err

    def wait(self, sql: str, expected) -> None:
        """Until ``sql`` reads ``expected`` (or the sink stopped)."""
        for _ in range(400):
            if self.error is not None or not self.thread.is_alive():
                break
            try:
                if query(self.url, sql) == expected:
                    return
            except Exception:  # noqa: BLE001 - the table is not there yet
                pass
            self.stop.wait(0.05)
        assert query(self.url, sql) == expected, f"sink error: {self.error!r}"

    def stopped_with(self) -> BaseException:
        self.thread.join(20)
        assert not self.thread.is_alive(), "the sink kept running"
        return self.error

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def live(log, target_url):
    sinks: list[LiveSink] = []

    def start(policy: str) -> LiveSink:
        sinks.append(LiveSink(log, target_url, policy))
        return sinks[-1]

    yield start
    for sink in sinks:
        sink.close()


def test_numeric_to_double_stops_before_its_first_row_and_rounds_nothing(capture, live, target_url):
    """The issue's case: amount numeric(12,2) -> double precision while the sink runs. The rows
    of the old shape are written; the first row of the new shape stops the sink with the table,
    column, both types and the fixing command; nothing is rounded into numeric(12,2)."""
    sink = live("fail")
    capture([Batch([row(ORDERS, 1, 10, "1.25")], Counter(1), (change(ORDERS, OLD, 10),))])
    sink.wait("SELECT id FROM orders", [(1,)])
    capture([Batch([row(ORDERS, 2, 15, "2.50"), row(ORDERS, 3, 20, 560.846)], Counter(2),
                   (change(ORDERS, NEW, 20),))])
    error = sink.stopped_with()
    assert isinstance(error, SchemaChangeError)
    for part in ("orders__g1", "column amount", "numeric(12,2) -> double precision", "cdc rebuild CONFIG wh"):
        assert part in str(error)
    stored = {k: Decimal(str(v)) for k, v in query(target_url, "SELECT id, amount FROM orders")}
    assert stored == {1: Decimal("1.25"), 2: Decimal("2.50")}


def test_evolve_widens_in_place_where_the_target_can(capture, live, target_url):
    sink = live("evolve")
    capture([Batch([row(ORDERS, 1, 10, "1.25")], Counter(1), (change(ORDERS, OLD, 10),))])
    sink.wait("SELECT id FROM orders", [(1,)])
    capture([Batch([row(ORDERS, 2, 20, "12345678.1234")], Counter(2), (change(ORDERS, WIDER, 20),))])
    if target_url.startswith("sqlite"):  # SQLite cannot change a column's type: evolve stops
        error = sink.stopped_with()
        assert isinstance(error, SchemaChangeError) and "numeric(12,2) -> numeric(14,4)" in str(error)
        assert query(target_url, "SELECT id FROM orders") == [(1,)]
        return
    sink.wait("SELECT id FROM orders ORDER BY id", [(1,), (2,)])
    stored = {k: Decimal(str(v)) for k, v in query(target_url, "SELECT id, amount FROM orders")}
    assert stored == {1: Decimal("1.25"), 2: Decimal("12345678.1234")}


def test_a_new_column_takes_the_type_the_source_published(capture, live, target_url):
    sink = live("fail")
    capture([Batch([row(ORDERS, 1, 10, "1.25")], Counter(1), (change(ORDERS, OLD, 10),))])
    sink.wait("SELECT id FROM orders", [(1,)])
    added = OLD + (Column("discount", "numeric(5,2)"),)
    event = ChangeEvent(Op.CREATE, ORDERS, {"id": 2}, None, {"id": 2, "amount": "2.00", "discount": "0.15"}, 20, 0)
    capture([Batch([event], Counter(2), (change(ORDERS, added, 20),))])
    sink.wait("SELECT id FROM orders ORDER BY id", [(1,), (2,)])
    types = {r[1]: r[2].upper() for r in query(target_url, "PRAGMA table_info(orders__g1)")} \
        if target_url.startswith("sqlite") else \
        {r[0]: r[1].upper() for r in query(target_url, "SELECT column_name, data_type FROM information_schema.columns "
                                                      "WHERE table_name = 'orders__g1'")}
    assert types["discount"].startswith(("NUMERIC(5", "DECIMAL(5")), types


def test_a_rebuild_makes_tables_in_the_newest_shape_and_writes_older_rows_into_it(capture, live, target_url):
    sink = live("rebuild")
    capture([Batch([row(ORDERS, 1, 10, "1.25")], Counter(1), (change(ORDERS, OLD, 10),))])
    sink.wait("SELECT id FROM orders", [(1,)])
    capture([Batch([row(ORDERS, 2, 20, 560.846)], Counter(2), (change(ORDERS, NEW, 20),))])
    sink.wait("SELECT id, amount FROM orders ORDER BY id", [(1, 1.25), (2, 560.846)])
    assert query(target_url, "SELECT id FROM orders__g2 ORDER BY id") == [(1,), (2,)]


def test_rows_older_than_a_shape_get_the_value_its_new_column_gave_existing_rows(capture, live, target_url):
    """ADD COLUMN c2 integer DEFAULT 0 gives existing rows 0 without logging them: the shape says
    so ("default"), and the sink sets it on the rows written before the shape."""
    sink = live("fail")
    capture([Batch([row(ORDERS, 1, 10, "1.25"), row(ORDERS, 2, 11, "2.50")], Counter(1),
                   (change(ORDERS, OLD, 10),))])
    sink.wait("SELECT id FROM orders ORDER BY id", [(1,), (2,)])
    added = OLD + (Column("c2", "integer", default=0), Column("c3", "text"))
    event = ChangeEvent(Op.CREATE, ORDERS, {"id": 3}, None, {"id": 3, "amount": "3.00", "c2": 5, "c3": "x"}, 20, 0)
    capture([Batch([event], Counter(2), (change(ORDERS, added, 20),))])
    sink.wait("SELECT id, c2, c3 FROM orders ORDER BY id", [(1, 0, None), (2, 0, None), (3, 5, "x")])
