"""The sink runtime's decoding loop in C (cdc/_decode.c, ``decode_batch``) against the Python
loop of cdc/sink_events.py, the reference: for any records, both must give the same events (field
for field, and the same type), the same poison records with the same reasons, the same ends and
the same byte count. Records carry headers of every kind (a tombstone's version comes from them)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc import native, sink_events
from cdc.log.base import LogRecord
from cdc.sink_events import SinkEvent, decode_batch

needs_c = pytest.mark.skipif(sink_events._decode is None, reason="cdc._decode not built (test_encode.py)")

text = st.text(max_size=8)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), text, st.floats(allow_nan=False))
rows = st.dictionaries(text, scalars, max_size=4)
ops = st.sampled_from(["c", "u", "d", "r", "t", "x", 5, None])
versions = st.one_of(st.integers(-(2 ** 63), 2 ** 64 - 1), st.just(True), st.just("7"), st.none())


@st.composite
def values(draw) -> bytes | None:
    """Envelopes, most of them well formed, and every way one can be wrong or unusual."""
    kind = draw(st.sampled_from(["envelope"] * 6 + ["tombstone", "no-source", "no-version", "not-json",
                                                       "not-object", "connect", "list-source", "empty"]))
    if kind == "tombstone":
        return None
    if kind == "not-json":
        return b"{not json"
    if kind == "empty":
        return b""
    if kind == "not-object":
        return orjson.dumps(draw(st.one_of(st.lists(scalars, max_size=2), scalars)))
    source = {"table": "t", "version": draw(versions)} if kind != "no-version" else {"table": "t"}
    envelope = {"before": draw(st.one_of(st.none(), rows)), "after": draw(st.one_of(st.none(), rows)),
                "op": draw(ops), "ts_ms": draw(st.one_of(st.none(), st.integers(0, 2 ** 50)))}
    if kind == "list-source":
        envelope["source"] = [1]
    elif kind != "no-source":
        envelope["source"] = source
    if draw(st.booleans()):
        del envelope["ts_ms"]
    if kind == "connect":
        return orjson.dumps({"schema": {"type": "struct"}, "payload": envelope})
    return orjson.dumps(envelope)


# Keys the C decoder parses itself (JSON objects) and every other kind it hands to orjson
# or to the general way: names given twice, nested values, blanks, integers at and past 64 bits,
# numbers orjson makes floats, escapes in names and values, trailing bytes.
odd_keys = st.sampled_from([b'{}', b' { "id" : 1 , "id" : "x" } ', b'{"a":[1,{"b":2}],"c":{"d":null}}',
                            b'{"n":18446744073709551615}', b'{"n":-9223372036854775808}', b'{"n":-0}',
                            b'{"f":1e3,"g":1.5,"h":-2E-2}', b'{"s":"caf\\u00e9","t":"\xc3\xa9"}',
                            b'{"i\\"d":1}', b'{"id":1} x', b'{"id":01}', b'{"id":1,}', b'{"id":"\xff"}',
                            b'{"schema":1,"payload":2}', b'{"id":123456789012345678901234567890}'])
keys = st.one_of(rows.map(orjson.dumps), odd_keys, st.just(b'{"schema":{"type":"struct"},"payload":{"id":1}}'),
                 st.just(b"not json"), st.just(b"7"), st.just(b""), st.none())


digits = st.one_of(st.integers(-(2 ** 63), 2 ** 63 - 1).map(lambda n: b"%d" % n),
                  st.sampled_from([b"", b"-", b"+1", b" 1", b"1 ", b"1.0", b"0x1", b"9223372036854775808",
                                   b"-9223372036854775809", b"99999999999999999999", b"007", b"-0", b"\xd9\xa1"]))
# Headers as the logs hand them out (packable: str names, bytes or None values; none is None, never
# an empty list), a version header well formed or not, repeated (the last counts), beside others.
packable_headers = st.one_of(
    st.none(),
    st.lists(st.one_of(st.tuples(st.just("cdc.version"), st.one_of(digits, st.none())),
                       st.tuples(st.sampled_from(["cdc.source", "cdc.versio", "cdc.version ", "x"]),
                                 st.one_of(st.binary(max_size=3), st.none()))), min_size=1, max_size=3))
# And what a LogRecord made by hand may hold: pairs as lists, a str value.
odd_headers = st.sampled_from([[["cdc.version", b"5"]], [("cdc.version", "5")], [("cdc.version", 5)], (("cdc.version", b"5"),)])
any_headers = st.one_of(packable_headers, odd_headers)


@st.composite
def records(draw, headers=any_headers) -> list[LogRecord]:
    out = []
    for offset in range(draw(st.integers(0, 12))):
        out.append(LogRecord(draw(st.sampled_from(["p.s.a", "p.s.b"])), draw(st.integers(0, 2)), offset,
                             draw(keys), draw(values()), 0, draw(headers)))
    return out


def run(batch: list[LogRecord], use_c: bool) -> tuple:
    with native.choose(use_c):
        ends: dict = {}
        events, poisons, nbytes = decode_batch(batch, ends)
    return ([(type(e), tuple(e)) for e in events], [(r, type(err), str(err)) for r, err in poisons], ends, nbytes)


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_the_c_loop_decodes_as_the_python_loop(batch):
    assert run(batch, True) == run(batch, False)


@needs_c
def test_the_c_loop_makes_sink_events_of_plain_envelopes(monkeypatch):
    """The common record is decoded in C (not handed back to Python): its event is a SinkEvent
    with every field, and a record that is no envelope is a poison with the reason."""
    value = orjson.dumps({"before": None, "after": {"id": 1}, "op": "c", "ts_ms": 5,
                          "source": {"table": "t", "version": 42}})
    monkeypatch.setattr(sink_events, "decode_record", lambda record: pytest.fail("handed to Python"))
    ends: dict = {}
    events, poisons, nbytes = sink_events._decode.decode_batch(
        [LogRecord("p.s.t", 1, 9, b'{"id":1}', value, 0), LogRecord("p.s.t", 1, 10, b'{"id":1}', None, 0)], ends)
    assert events[0] == SinkEvent("p.s.t", 1, 9, {"id": 1}, sink_events.Op.CREATE, None, {"id": 1}, 42,
                                  {"table": "t", "version": 42}, 5)
    assert type(events[0]) is SinkEvent and events[0].table == "t"
    assert events[1] == SinkEvent("p.s.t", 1, 10, {"id": 1}, None, None, None, None, {}, None)
    assert (poisons, ends, nbytes) == ([], {("p.s.t", 1): 11}, len(value))
    _, poisons, _ = decode_batch([LogRecord("p.s.t", 0, 3, b'{"id":1}', b'{"op":"c"}', 0)], {})
    assert [(r.offset, str(err)) for r, err in poisons] == [(3, "not a change event envelope: KeyError: 'version'")]


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.one_of(st.none(), st.binary(max_size=4)), st.integers(0, 2 ** 40)),
                max_size=12), st.integers(0, 3))
def test_the_c_loop_reads_kafka_messages_as_the_python_loop(made, start):
    """cdc.log.kafka_reader.log_records: records up to the first message with an error, in C and in
    Python alike (real confluent-kafka Message objects)."""
    from confluent_kafka import KafkaError, Message

    from cdc.log import kafka_reader

    messages = [Message(topic="p.s.t", partition=n % 3, offset=n, key=value, value=value, timestamp=(1, stamp),
                        headers=None if value is None else [("cdc.version", b"%d" % stamp), ("cdc.source", value)],
                        error=KafkaError(KafkaError._PARTITION_EOF) if failed else None)
                for n, (failed, value, stamp) in enumerate(made)]
    results = []
    for use_c in (True, False):
        with native.choose(use_c):
            out: list = []
            at = kafka_reader.log_records(messages, start, out)
        results.append((at, [(type(r), tuple(r)) for r in out]))
    assert results[0] == results[1]
    assert [r[1][6] for r in results[0][1]] == [m.headers() for m in messages[start:start + len(results[0][1])]]
    first_error = next((n for n, (failed, _, _) in enumerate(made) if failed and n >= start), len(made))
    assert results[0][0] == max(first_error, min(start, len(made)))
    assert [r[1][2] for r in results[0][1]] == list(range(start, max(first_error, start)))[:len(made)]


def packed(batch: list[LogRecord]):
    """``batch`` as the bulk reader hands them out (cdc/_rdconsume.c's layout)."""
    from cdc.log.kafka_bulk import PackedBatch

    return PackedBatch.of(batch)


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(packable_headers), st.booleans())
def test_the_c_loop_decodes_packed_batches_as_the_python_loop_decodes_records(batch, raw_rows):
    """decode_packed (the runner's reads through the bulk reader) against decode_batch of the same
    records in Python: the same events, poisons (with the records), ends and byte count."""
    from_packed = sink_events.decode_packed(packed(batch), ends := {}, raw_rows)
    with native.reference():
        reference = decode_batch(batch, reference_ends := {}, raw_rows)
    if raw_rows:  # the C parser leaves an upsert's row as its JSON bytes: compare the decoded row
        from_packed = ([e._replace(after=orjson.loads(e.after)) if type(e.after) is bytes else e
                        for e in from_packed[0]], *from_packed[1:])
    assert [(type(e), tuple(e)) for e in from_packed[0]] == [(type(e), tuple(e)) for e in reference[0]]
    assert [(type(r), tuple(r), type(err), str(err)) for r, err in from_packed[1]] == \
        [(type(r), tuple(r), type(err), str(err)) for r, err in reference[1]]
    assert (ends, from_packed[2]) == (reference_ends, reference[2])


@needs_c
def test_a_tombstone_reads_its_version_from_its_headers_in_both_loops():
    """The version header of a tombstone is its event's version (the last one counts); without one
    the version is None, and a header that is no decimal int64 makes the record poison, naming why."""
    def decoded(headers, use_c: bool):
        with native.choose(use_c):
            records_ = [LogRecord("p.s.t", 0, 4, b'{"id":1}', None, 0, headers)]
            plain = decode_batch(records_, {})
            from_packed = sink_events.decode_packed(packed(records_), {})
        assert [tuple(e) for e in plain[0]] == [tuple(e) for e in from_packed[0]]
        return [e.version for e in plain[0]], [str(err) for _, err in plain[1]]

    for use_c in (True, False):
        assert decoded(None, use_c) == ([None], [])
        assert decoded([("cdc.source", b"pg")], use_c) == ([None], [])
        assert decoded([("cdc.version", b"-12"), ("cdc.source", b"pg")], use_c) == ([-12], [])
        assert decoded([("cdc.version", b"1"), ("cdc.version", b"9223372036854775807")], use_c) == \
            ([9223372036854775807], [])
        assert decoded([("cdc.version", b"12a")], use_c) == \
            ([], ["a tombstone whose version is unreadable: the cdc.version header is not a decimal integer: b'12a'"])


@needs_c
def test_a_packed_batch_cut_short_is_an_error_not_a_read_past_its_end():
    batch = packed([LogRecord("p.s.t", 0, 1, b'{"id":1}', b'{"op":"c"}', 0)])
    with pytest.raises(ValueError, match="ends inside a record"):
        sink_events._decode.decode_packed(batch.data[:-3], 1, batch.topics, {}, False, LogRecord)
