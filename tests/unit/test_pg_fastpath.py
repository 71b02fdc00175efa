"""The compiled row paths (sources/postgres/fastpath.py) against the generic path.

Every captured pgoutput payload of ``tests/golden/pgoutput/`` (real PostgreSQL 15 output: every
type, updates with old keys and old rows, unchanged TOAST, deletes, truncates, streamed
transactions) goes through two ChangeBuilders as the source feeds them: one that tries the
compiled path first, one that only decodes. Their events must be equal, field for field. Then
damaged payloads: the compiled path either makes the generic path's events or hands the payload
back; it never makes events the generic path would refuse.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.errors import DecodeError
from cdc.events import TableId
from sources.postgres import pgoutput as pg
from sources.postgres.catalog import TableMeta
from sources.postgres.changes import ChangeBuilder
from sources.postgres.toast import ToastStore
from sources.postgres.types.converters import converter_for
from tests.damage import damage
from tests.golden.capture_pgoutput import read_frames

CAPTURES = ["v1", "v2", "v3"]
PROTOCOL = {"v1": 1, "v2": 2, "v3": 3}


def builder(tmp_path, relations: dict[int, pg.Relation], compiled: bool) -> ChangeBuilder:
    def lookup(oid: int) -> TableMeta | None:
        rel = relations[oid]
        # The first column as the key, and the second too where there is one: keys of two columns.
        key = tuple(c.name for c in rel.columns[:2])
        return TableMeta(oid, TableId("golden", rel.namespace, rel.name), (), key, "d")

    made = ChangeBuilder("golden", lookup, lambda oids: [converter_for(o, {}) for o in oids],
                         ToastStore(tmp_path / f"toast-{compiled}.db"), lambda oid, mod: f"{oid}({mod})")
    if not compiled:
        made.row_message = lambda payload, lsn: None  # type: ignore[method-assign]
    return made


def run(builder: ChangeBuilder, name: str, payloads: list[bytes]) -> tuple[list, int]:
    """The events of ``payloads`` as the source's stream loop makes them (outside stream blocks;
    streamed blocks decoded as they come), and how many the compiled path made."""
    decoder = pg.PgOutputDecoder(PROTOCOL[name])
    events, compiled = [], 0
    for lsn, payload in enumerate(payloads, 1):
        if decoder.stream_xid is None:
            changes = builder.row_message(payload, lsn)
            if changes is not None:
                events.append(changes)
                compiled += 1
                continue
        message = decoder.decode(payload)
        kind = type(message)
        if kind is pg.Relation:
            builder.on_relation(message, lsn)
        elif kind is pg.Begin:
            builder.begin(message.xid, message.commit_time_us)
        elif kind is pg.Commit:
            builder.end()
        elif kind is pg.Insert:
            events.append(builder.insert(message, lsn))
        elif kind is pg.Update:
            events.append(builder.update(message, lsn))
        elif kind is pg.Delete:
            events.append(builder.delete(message, lsn))
        elif kind is pg.Truncate:
            events.append(builder.truncate(message, lsn))
    return events, compiled


def all_relations(name: str) -> dict[int, pg.Relation]:
    decoder = pg.PgOutputDecoder(PROTOCOL[name])
    return {m.oid: m for m in map(decoder.decode, read_frames(name)) if isinstance(m, pg.Relation)}


@pytest.mark.parametrize("name", CAPTURES)
def test_the_compiled_path_makes_the_generic_paths_events(tmp_path, name):
    payloads = list(read_frames(name))
    relations = all_relations(name)
    fast, compiled = run(builder(tmp_path, relations, True), name, payloads)
    slow, none = run(builder(tmp_path, relations, False), name, payloads)
    assert none == 0
    assert fast == slow
    for changes in fast:
        for event in changes:
            event.check()
    # Not vacuous: the plain inserts, updates and deletes went the compiled way, the rest did not.
    row_messages = sum(1 for p in payloads if p[:1] in (b"I", b"U", b"D"))
    assert 20 <= compiled < row_messages


def test_a_relation_message_recompiles_and_an_uncaptured_table_has_no_path(tmp_path):
    relations = all_relations("v1")
    made = builder(tmp_path, relations, True)
    first = next(iter(relations.values()))
    made.on_relation(first, 1)
    key = b"I" + struct.pack("!I", first.oid)
    path = made.row_paths[key]
    made.on_relation(first, 2)
    assert made.row_paths[key] is not path
    made.lookup_table = lambda oid: None
    made.on_relation(first, 3)
    assert key not in made.row_paths


def _row_samples() -> list[tuple[str, bytes]]:
    samples: dict[tuple, bytes] = {}
    for name in CAPTURES:
        decoder = pg.PgOutputDecoder(PROTOCOL[name])
        for payload in read_frames(name):
            state = decoder.stream_xid
            decoder.decode(payload)
            if state is None and payload[:1] in (b"I", b"U", b"D"):
                samples.setdefault((name, payload[:6], len(payload) > 400), payload)
    return [(name, payload) for (name, *_), payload in samples.items()]


SAMPLES = _row_samples()
RELATIONS = {name: all_relations(name) for name in CAPTURES}


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.sampled_from(SAMPLES), st.data())
def test_a_damaged_row_message_is_never_taken_unless_the_generic_path_agrees(tmp_path, sample, data):
    name, payload = sample
    damaged = damage(data, payload, keep=5)  # the type byte and relation OID pick the path
    relations = RELATIONS[name]
    fast, slow = builder(tmp_path, relations, True), builder(tmp_path, relations, False)
    for made in (fast, slow):
        for relation in relations.values():
            made.on_relation(relation, 0)
        made.begin(7, 0)
    taken = fast.row_message(damaged, 9)
    if taken is None:
        return
    message = pg.PgOutputDecoder(PROTOCOL[name]).decode(damaged)  # must not raise
    generic = {pg.Insert: slow.insert, pg.Update: slow.update, pg.Delete: slow.delete}[type(message)]
    assert taken == generic(message, 9)


def test_the_row_samples_cover_each_row_message_kind():
    assert {p[:1] for _, p in SAMPLES} == {b"I", b"U", b"D"}


def test_a_value_the_generic_path_refuses_goes_back_to_it(tmp_path):
    """A timestamptz not in UTC: the compiled path hands the payload back, the generic path
    raises its error (here the converter's)."""
    relation = pg.Relation(None, 1, "public", "t", "d", (pg.Column(True, "id", 20, -1),
                                                         pg.Column(False, "at", 1184, -1)))
    made = builder(tmp_path, {1: relation}, True)
    made.on_relation(relation, 0)

    def insert(at: bytes) -> bytes:
        return (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!H", 2) + b"t" + struct.pack("!I", 1) + b"5"
                + b"t" + struct.pack("!I", len(at)) + at)

    [event] = made.row_message(insert(b"2024-01-02 03:04:05+00"), 1)
    assert event.after == event.key == {"id": 5, "at": "2024-01-02T03:04:05Z"}  # the test key: two columns
    bad = insert(b"2024-01-02 03:04:05+02")
    assert made.row_message(bad, 2) is None
    with pytest.raises((ValueError, DecodeError), match="UTC"):
        made.insert(pg.PgOutputDecoder(1).decode(bad), 2)


def _tuple(*values: bytes | None | str) -> bytes:
    out = struct.pack("!H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == "u":
            out += b"u"
        else:
            out += b"t" + struct.pack("!I", len(value)) + value
    return out


def test_a_value_the_toast_store_must_remember_is_remembered(tmp_path):
    """A large text goes the generic way, which remembers it: a later update that leaves it
    unchanged (``u``) gets it back."""
    relation = pg.Relation(None, 2, "public", "docs", "d", (pg.Column(True, "id", 20, -1),
                                                            pg.Column(False, "body", 25, -1)))
    made = builder(tmp_path, {2: relation}, True)
    made.lookup_table = lambda oid: TableMeta(oid, TableId("golden", "public", "docs"), (), ("id",), "d")
    made.on_relation(relation, 0)
    body = b"x" * 600
    made.begin(5, 0)
    assert made.row_message(b"I" + struct.pack("!I", 2) + b"N" + _tuple(b"1", body), 1) is None
    [created] = made.insert(pg.PgOutputDecoder(1).decode(b"I" + struct.pack("!I", 2) + b"N" + _tuple(b"1", body)), 1)
    short = b"U" + struct.pack("!I", 2) + b"N" + _tuple(b"1", b"short")
    [short_update] = made.row_message(short, 2)  # small values stay on the compiled path
    assert short_update.after == {"id": 1, "body": "short"}
    made.row_message(b"U" + struct.pack("!I", 2) + b"N" + _tuple(b"1", body), 3) or made.update(
        pg.PgOutputDecoder(1).decode(b"U" + struct.pack("!I", 2) + b"N" + _tuple(b"1", body)), 3)
    unchanged = b"U" + struct.pack("!I", 2) + b"N" + _tuple(b"1", "u")
    assert made.row_message(unchanged, 4) is None
    [update] = made.update(pg.PgOutputDecoder(1).decode(unchanged), 4)
    assert created.after["body"] == update.after["body"] == body.decode()
    assert "unchanged_toast" not in update.source_fields
