"""The OpenSearch sink's bulk lines in C (sinks/opensearch/_lines.c) against the Python loop of
sinks/opensearch/lines.py, the reference: for any actions, both make the same items (field for
field) and the same bytes, and hand back the same tombstones; and the lines are what
``Item.encode`` makes of ``{**row, __cdc_version: version}``."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc import native
from sinks.opensearch import lines, tombstones
from sinks.opensearch.bulk import Item
from sinks.opensearch.config import IndexOptions
from sinks.opensearch.documents import Delete, TableLayout, Tombstone, Upsert
from sinks.opensearch.mapping import VERSION_FIELD

needs_c = pytest.mark.skipif(lines._lines is None, reason="sinks.opensearch._lines not built")

text = st.text(max_size=6)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), text, st.floats(allow_nan=False))
keys = st.one_of(text, st.just(VERSION_FIELD), st.integers(0, 3))  # a row may have the field, or int keys
rows = st.dictionaries(keys, st.one_of(scalars, st.dictionaries(st.one_of(text, st.integers(0, 2)), scalars,
                                                                max_size=2)), max_size=4)
ids = st.one_of(st.integers(0, 10 ** 6).map(str), text, st.just('a"b\\c'), st.just("é\x01"))
versions = st.integers(-(2 ** 63), 2 ** 63 - 1)
actions = st.one_of(st.builds(Upsert, ids, versions, rows, st.integers(0, 9)),
                    st.builds(Delete, ids, versions, st.integers(0, 9)),
                    st.builds(Tombstone, ids, st.one_of(st.none(), versions), st.integers(0, 9)))


def rename(row: dict) -> dict:
    return {f"r{k}": v for k, v in row.items()}


def run(batch, floor, body_of, use_c: bool):
    with native.choose(use_c):
        items, made = [], []
        rest = lines.encode(batch, "idx.é", floor, body_of, items, made)
    return [tuple(i) for i in items], made, rest


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions, max_size=10), st.one_of(st.none(), versions), st.sampled_from([None, rename]))
def test_the_c_loop_makes_the_python_loops_items_and_lines(batch, floor, body_of):
    # a delete's tombstone document carries the time: the same for both loops here
    tombstones.time.time, real = (lambda: 1_700_000_000.0), tombstones.time.time
    try:
        assert run(batch, floor, body_of, True) == run(batch, floor, body_of, False)
    finally:
        tombstones.time.time = real


names = st.sampled_from(["a", "b", "é", "0", VERSION_FIELD, 'q"'])
layouts = st.one_of(st.none(), st.builds(
    lambda include, exclude, rename: TableLayout(IndexOptions(include=include, exclude=sorted(exclude - set(include or ())),
                                                              rename=rename)),
    st.one_of(st.none(), st.lists(names, unique=True, max_size=3)), st.sets(names, max_size=2),
    st.dictionaries(names, names, max_size=2)))


def _as_json(batch):
    """The upserts' rows as the runtime's raw_rows hands them over: their JSON bytes."""
    return [Upsert(a.doc_id, a.version, orjson.dumps(a.row, option=orjson.OPT_NON_STR_KEYS), a.event)
            if type(a) is Upsert else a for a in batch]


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions, max_size=10), st.one_of(st.none(), versions), layouts)
def test_rows_as_json_bytes_make_the_documents_their_dicts_make(batch, floor, layout):
    """Rows as JSON bytes (raw_rows): the C loop makes each document from the bytes (the
    layout's picks and renames, the version spliced in; a name with escapes, a name given twice,
    the version field in the row: the dict way) and the lines are the bytes the Python loop
    makes of the decoded rows."""
    tombstones.time.time, real = (lambda: 1_700_000_000.0), tombstones.time.time
    raw = _as_json(batch)
    body_of = None if layout is None or layout.identity else layout.body
    fields = None if layout is None else layout.raw_fields()
    try:
        out = {}
        for use_c in (True, False):
            with native.choose(use_c):
                items, made = [], []
                rest = lines.encode(raw, "idx.é", floor, body_of, items, made, fields)
            out[use_c] = ([(*i[:3], orjson.loads(i.body) if type(i.body) is bytes else i.body, *i[4:]) for i in items],
                          made, rest)
    finally:
        tombstones.time.time = real
    assert out[True] == out[False]


@needs_c
def test_a_row_as_json_bytes_is_its_document_without_a_dict():
    """The common row is not decoded: its document is its bytes with the version spliced in."""
    row = b'{"id":1,"s":"x y"}'
    items, made = [], []
    lines.encode([Upsert("1", 16, row, "e1")], "idx", None, None, items, made)
    assert items[0].body is row
    assert made[0].split(b"\n")[1] == b'{"id":1,"s":"x y","__cdc_version":16}'
    layout = TableLayout(IndexOptions(exclude=["s"], rename={"id": "key"}))
    items, made = [], []
    lines.encode([Upsert("1", 16, row, "e1")], "idx", None, layout.body, items, made, layout.raw_fields())
    assert items[0].body == b'{"key":1}' and made[0].split(b"\n")[1] == b'{"key":1,"__cdc_version":16}'
    # Rows the bytes cannot stand for as they are go the dict way: a name given twice (the last
    # value wins), a name with escapes, the version field in the row (the event's replaces it).
    odd = [b'{"a":1,"b":0,"a":2}', b'{"\\u0061":1}', b'{"__cdc_version":"theirs","a":1}']
    items, made = [], []
    lines.encode([Upsert(str(i), 16, row, "e") for i, row in enumerate(odd)], "idx", None, None, items, made)
    assert [m.split(b"\n")[1] for m in made] == [b'{"a":2,"b":0,"__cdc_version":16}', b'{"a":1,"__cdc_version":16}',
                                                 b'{"__cdc_version":16,"a":1}']


@pytest.mark.parametrize("use_c", [True, False])
def test_lines_are_the_action_and_the_row_with_its_version(use_c):
    if use_c and lines._lines is None:
        pytest.skip("sinks.opensearch._lines not built")
    batch = [Upsert("1", 16, {"id": 1, "s": "x"}, "e1"), Upsert("2", 3, {}, "e2"),
             Upsert("3", 17, {"id": 3, VERSION_FIELD: "theirs"}, "e3"), Upsert("4", 40, {1: "int key"}, "e4"),
             Delete('q"', 18, "e5"), Tombstone("6", None, "e6")]
    items, made, rest = run(batch, 10, None, use_c)
    assert rest == [batch[-1]] and len(items) == len(made) == 4  # the one older than the floor is dropped
    for item, line, action in zip(items, made, [batch[0], batch[2], batch[3], batch[4]]):
        item = Item(*item)
        assert item.encode() == line and line.endswith(b"\n")
        body = {**action.row, VERSION_FIELD: action.version} if type(action) is Upsert else item.body
        expected = Item(item.index, item.doc_id, item.version, body, item.event).encode()
        assert line == expected
        assert (item.doc_id, item.version, item.event) == (action.doc_id, action.version, action[-1])
    assert orjson.loads(made[0].split(b"\n")[1]) == {"id": 1, "s": "x", VERSION_FIELD: 16}
    assert orjson.loads(made[3].split(b"\n")[1])["__cdc_deleted"] is True


def _reduced(events, use_c: bool):
    from sinks.opensearch import documents

    with native.choose(use_c):
        out = documents.reduce(events)
    return {topic: (t.topic, t.first, [(k, type(a), tuple(a)) for k, a in t.actions.items()], t.truncate)
            for topic, t in out.items()}


event_keys = st.one_of(st.integers(0, 5).map(lambda n: {"id": n}), st.sampled_from([{"id": "a"}, {"id": "é" * 300},
                       {"id": True}, {"a": 1, "b": 2}, {"id": 1.5}, {}]))


@st.composite
def sink_events(draw):
    from cdc.events import Op
    from cdc.sink_events import SinkEvent

    out = []
    for offset in range(draw(st.integers(0, 14))):
        op = draw(st.sampled_from([Op.CREATE, Op.UPDATE, Op.READ, Op.DELETE, None, None] +
                                  ([Op.TRUNCATE] if draw(st.integers(0, 9)) == 0 else [])))
        key = {} if op is Op.TRUNCATE else (draw(event_keys) if draw(st.integers(0, 5)) == 0 else
                                            {"id": draw(st.integers(0, 4))})
        after = draw(st.one_of(st.none(), st.just({}), rows)) if op not in (None, Op.DELETE) else None
        # a tombstone with a version (its delete's, from its header) or without (an older record)
        version = draw(st.one_of(st.none(), st.integers(0, 20))) if op is None else draw(st.integers(0, 20))
        out.append(SinkEvent(draw(st.sampled_from(["p.s.a", "p.s.b"])), 0, offset, key, op, None, after, version,
                             {} if op is None else {"table": "a"}))
    return out


@needs_c
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sink_events())
def test_the_c_reduce_keeps_what_the_python_reduce_keeps(events):
    assert _reduced(events, True) == _reduced(events, False)


@needs_c
def test_the_c_reduce_takes_the_common_batch(monkeypatch):
    from cdc.events import Op
    from cdc.sink_events import SinkEvent
    from sinks.opensearch import documents

    monkeypatch.setattr(documents, "_reduce", lambda events: pytest.fail("handed to Python"))
    events = [SinkEvent("p.s.t", 0, 0, {"id": 1}, Op.CREATE, None, {"id": 1}, 5, {}),
              SinkEvent("p.s.t", 0, 1, {"id": 1}, Op.DELETE, {"id": 1}, None, 6, {}),
              SinkEvent("p.s.t", 0, 2, {"id": 1}, None, None, None, None, {}),
              SinkEvent("p.s.t", 0, 3, {"id": "x"}, None, None, None, None, {}),
              SinkEvent("p.s.t", 0, 4, {"id": 2}, Op.CREATE, None, {"id": 2}, 9, {}),
              SinkEvent("p.s.t", 0, 5, {"id": 2}, None, None, None, 8, {}),
              SinkEvent("p.s.t", 0, 6, {"id": 3}, None, None, None, 8, {})]
    actions = documents.reduce(events)["p.s.t"].actions
    # a tombstone with a version is its delete: older than the row after it, it does nothing
    assert actions == {"1": Delete("1", 6, events[1]), "x": Tombstone("x", None, events[3]),
                       "2": actions["2"], "3": Delete("3", 8, events[6])}
    assert type(actions["2"]).__name__ == "Upsert" and actions["2"].version == 9
