"""The C encoding loop (cdc/_encode.c) against the Python loop of EnvelopeEncoder.emit.

The Python loop is the reference: for any events, the C loop must hand over the same records in
the same order (bytes for bytes, headers included), count the same bytes, call ``when_room`` for
the same records, and fail at the same record with the same topic.
"""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc import native, serde
from cdc.events import ChangeEvent, Op, SnapshotMarker, TableId, TransactionInfo
from cdc.serde import EmitError, EnvelopeEncoder


def test_the_c_loop_is_built():
    """setup.py builds it wherever a C compiler is (every machine this project sets up has one);
    CDC_ALLOW_NO_SPEEDUPS=1 says a build without it is expected, as CDC_NATIVE=0 does."""
    if os.environ.get("CDC_ALLOW_NO_SPEEDUPS") == "1" or not native.ALLOWED:
        return
    assert serde._encode is not None, "cdc._encode was not built: pip install -e . with a C compiler"


needs_c = pytest.mark.skipif(serde._encode is None, reason="cdc._encode not built (see the test above)")

TABLES = [TableId("shop", "public", "orders"), TableId("shop", None, "items"), TableId("db", "s", "t\"q")]
text = st.text(max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 64 - 1), text,
                    st.floats(allow_nan=False, allow_infinity=False))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(text, inner, max_size=3)), max_leaves=8)
rows = st.dictionaries(text, values, max_size=5)
int64 = st.integers(-(2 ** 63), 2 ** 63 - 1)


@st.composite
def events(draw) -> ChangeEvent:
    op = draw(st.sampled_from(list(Op)))
    after = draw(st.one_of(st.none(), rows, rows.map(lambda r: orjson.Fragment(orjson.dumps(r)))))
    tx = draw(st.one_of(st.none(), st.builds(TransactionInfo, st.sampled_from(["1", "2", "x\"y"]),
                                             st.integers(0, 10 ** 6), st.integers(0, 10 ** 6))))
    return ChangeEvent(op=op, table=draw(st.sampled_from(TABLES)), key=None if op is Op.TRUNCATE else draw(rows),
                       before=draw(st.one_of(st.none(), rows)), after=after, version=draw(int64),
                       ts_ms=draw(int64), snapshot=draw(st.sampled_from(list(SnapshotMarker))),
                       source_fields=draw(st.one_of(st.none(), st.just({}), st.dictionaries(text, scalars, max_size=3))),
                       transaction=tx)


def run(events_: list, use_speedups: bool, full_every: int = 0):
    """(calls made, value bytes, error topic or None) of one emit over ``events_``."""
    encoder = EnvelopeEncoder("postgresql", "src", "p")
    encoder.schema_versions[TABLES[0]] = 2 ** 40 + 7  # one table names its shape, the others none
    calls: list = []
    count = [0]

    def emit(topic, value, key, headers):
        count[0] += 1
        if full_every and count[0] % full_every == 0:
            raise BufferError("full")
        calls.append(("emit", topic, value, key, headers))

    def when_room(topic, value, key, headers):
        calls.append(("room", topic, value, key, headers))

    def everywhere(topic, value, key, headers):
        calls.append(("all", topic, value, key, headers))

    error = None
    try:
        with native.choose(use_speedups):
            encoder.emit(events_, emit, when_room, everywhere, now_ms=1_700_000_000_000)
    except EmitError as exc:
        error = (exc.topic, type(exc.cause).__name__)
    return calls, encoder.value_bytes, error


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), max_size=20), st.sampled_from([0, 2, 3]))
def test_the_c_loop_makes_the_python_loops_records(batch, full_every):
    made = run(batch, True, full_every)
    assert made == run(batch, False, full_every)
    assert made[2] is None  # every record was handed over


def test_every_record_carries_its_version_and_source_a_tombstone_its_deletes():
    table = TABLES[0]
    events_ = [ChangeEvent(op=Op.CREATE, table=table, key={"id": 1}, before=None, after={"id": 1}, version=7,
                           ts_ms=1),
               ChangeEvent(op=Op.DELETE, table=table, key={"id": 1}, before={"id": 1}, after=None,
                           version=-(2 ** 63), ts_ms=1),
               ChangeEvent(op=Op.TRUNCATE, table=table, key=None, before=None, after=None, version=2 ** 63 - 1,
                           ts_ms=1)]
    for use in (True, False) if serde._encode is not None else (False,):
        calls, _, error = run(events_, use)
        assert error is None
        assert [(kind, value is None, headers) for kind, _, value, _, headers in calls] == [
            ("emit", False, [("cdc.version", b"7"), ("cdc.source", b"src")]),
            ("emit", False, [("cdc.version", b"-9223372036854775808"), ("cdc.source", b"src")]),
            ("emit", True, [("cdc.version", b"-9223372036854775808"), ("cdc.source", b"src")]),
            ("all", False, [("cdc.version", b"9223372036854775807"), ("cdc.source", b"src")])]


def test_the_c_header_name_is_the_python_one():
    if serde._encode is not None:
        from cdc.headers import VERSION
        assert serde._encode.VERSION_HEADER == VERSION


@needs_c
@given(st.lists(events(), min_size=1, max_size=6), st.integers(0, 5))
@settings(max_examples=100, deadline=None)
def test_a_row_that_cannot_be_encoded_fails_both_loops_at_the_same_record(batch, at):
    at = min(at, len(batch) - 1)
    broken = list(batch)
    broken[at] = broken[at]._replace(after={"bad": object()})
    c_calls, c_bytes, c_error = run(broken, True)
    py_calls, py_bytes, py_error = run(broken, False)
    assert c_error is not None and c_error == py_error
    assert c_calls == py_calls and c_bytes == py_bytes


@needs_c
def test_a_failing_emit_names_the_topic_in_both_loops():
    event = ChangeEvent(op=Op.CREATE, table=TABLES[0], key={"id": 1}, before=None, after={"id": 1},
                        version=1, ts_ms=1)
    for use in (True, False):
        encoder = EnvelopeEncoder("postgresql", "src", "p")

        def emit(topic, value, key, headers):
            raise RuntimeError("refused")

        with native.choose(use), pytest.raises(EmitError, match="p.public.orders") as raised:
            encoder.emit([event], emit, emit, emit, now_ms=1)
        assert isinstance(raised.value.cause, RuntimeError)


@needs_c
def test_a_thing_that_is_no_event_is_refused():
    encoder = EnvelopeEncoder("postgresql", "src", "p")
    with pytest.raises(EmitError, match="not a ChangeEvent"):
        encoder.emit([("not", "an", "event")], print, print, print, now_ms=1)


@needs_c
def test_events_from_a_generator_that_drops_them_as_it_goes():
    """Tables made per event and freed after it: a cache keyed by identity must not hand one
    table's topic to another that reuses its memory (both loops hold the events for the call)."""
    def made():
        for i in range(2000):
            table = TableId("db", "s", f"t{i % 7}")
            yield ChangeEvent(op=Op.CREATE, table=table, key={"id": i}, before=None, after={"id": i},
                              version=i, ts_ms=1)

    for use in (True, False):
        encoder = EnvelopeEncoder("postgresql", "src", "p")
        records: list = []
        with native.choose(use):
            encoder.emit(made(), lambda t, v, k, headers: records.append((t, k)), print, print, now_ms=1)
        assert records == [(f"p.s.t{i % 7}", b'{"id":%d}' % i) for i in range(2000)]


def test_positional_produce_puts_the_headers_in_their_place_in_both():
    """The Kafka writer's produce (cdc.log.kafka_writer.positional_produce): confluent-kafka's
    Producer.produce(topic, value, key, partition, callback, on_delivery, timestamp, headers),
    every argument before the headers at its default (tests/integration/test_record_headers.py
    checks a real producer: the headers, the key's partition, the time)."""
    from cdc.log import kafka_writer

    calls: list = []

    def produce(*args, **kwargs):
        calls.append((args, kwargs))

    for use_c in (True, False) if serde._encode is not None else (False,):
        with native.choose(use_c):
            positional = kafka_writer.positional_produce(produce)
        positional("t", b"v", b"k", [("cdc.version", b"1")])
        positional("t", None, b"k")
        assert calls == [(("t", b"v", b"k", -1, None, None, 0, [("cdc.version", b"1")]), {}),
                         (("t", None, b"k", -1, None, None, 0, None), {})]
        calls.clear()
