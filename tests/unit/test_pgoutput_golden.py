"""The pgoutput decoder on payloads captured from a real server.

The payloads in ``tests/golden/pgoutput/`` come from ``tests/golden/capture_pgoutput.py``; every
expected value below follows from that script's workload (its docstring lists it), so a wrong
decoder fails here. OIDs and xids differ between captures and are compared with each other, never
with constants. Two-phase messages and the protocol-4 Stream Abort cannot be captured from the
PostgreSQL 15 of the dev stack (no prepared transactions, protocol 3 at most): the last section
builds them byte by byte after ``proto.c``.
"""

from __future__ import annotations

import datetime as dt
import json
import pickle
import struct
import uuid

import pytest

from cdc.errors import DecodeError
from sources.postgres.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputDecoder,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    pg_time_to_unix_ms,
)
from tests.golden.capture_pgoutput import OUT, TOAST_BODY, read_frames

MANIFEST = json.loads((OUT / "manifest.json").read_text())
TEXT_CAPTURES = [name for name in ("v1", "v2", "v3") if name in MANIFEST["captures"]]
STREAMED_CAPTURES = [name for name in TEXT_CAPTURES if name != "v1"]
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def protocol(name: str) -> int:
    return int(MANIFEST["captures"][name]["options"]["proto_version"])


def decode_all(name: str) -> list:
    decoder = PgOutputDecoder(protocol(name))
    messages = [decoder.decode(payload) for payload in read_frames(name)]
    assert decoder.stream_xid is None
    return messages


def relations(messages) -> dict[str, Relation]:
    return {m.name: m for m in messages if isinstance(m, Relation)}


def transactions(messages) -> list[list]:
    """The non-streamed transactions: [Begin, ..., Commit] each."""
    result, current = [], None
    for m in messages:
        if isinstance(m, Begin):
            current = [m]
        elif current is not None:
            current.append(m)
            if isinstance(m, Commit):
                result.append(current)
                current = None
    return result


def rows(transaction, relation: Relation, cls=Insert) -> list:
    return [m for m in transaction if isinstance(m, cls) and m.relation_oid == relation.oid]


def micros(value: dt.datetime | dt.date) -> int:
    if isinstance(value, dt.datetime):
        value = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        delta = value - PG_EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return (value - PG_EPOCH.date()).days


def committed_changes(messages) -> list[tuple]:
    """What a consumer applies: the changes of committed transactions in commit order, relations by
    name, streamed transactions applied at Stream Commit minus their aborted subtransactions."""
    names, changes, open_tx, streams, block = {}, [], None, {}, None

    def change(m):
        if isinstance(m, Insert):
            return ("I", names[m.relation_oid], m.new)
        if isinstance(m, Update):
            return ("U", names[m.relation_oid], m.old_kind, m.old, m.new)
        if isinstance(m, Delete):
            return ("D", names[m.relation_oid], m.old_kind, m.old)
        if isinstance(m, Truncate):
            return ("T", tuple(names[oid] for oid in m.relation_oids), m.cascade, m.restart_identity)
        assert isinstance(m, Message) and m.transactional
        return ("M", m.prefix, m.content)

    for m in messages:
        if isinstance(m, Relation):
            names[m.oid] = m.name
        elif isinstance(m, (Type, Origin)) or (isinstance(m, Message) and not m.transactional):
            continue
        elif isinstance(m, Begin):
            open_tx = []
        elif isinstance(m, Commit):
            changes += open_tx
        elif isinstance(m, StreamStart):
            block = m.xid
            streams.setdefault(m.xid, [])
        elif isinstance(m, StreamStop):
            block = None
        elif isinstance(m, StreamAbort):
            if m.subxid == m.xid:
                del streams[m.xid]
            else:
                streams[m.xid] = [(xid, c) for xid, c in streams[m.xid] if xid != m.subxid]
        elif isinstance(m, StreamCommit):
            changes += [c for _, c in streams.pop(m.xid)]
        elif block is not None:
            streams[block].append((m.xid, change(m)))
        else:
            changes.append(change(m))
    assert not streams, "a streamed transaction neither committed nor aborted"
    return changes


@pytest.fixture(scope="module", params=TEXT_CAPTURES)
def capture(request):
    return request.param, decode_all(request.param)


def test_the_captures_exist():
    assert {"v1", "v2", "v2-binary"} <= set(MANIFEST["captures"])
    for name, info in MANIFEST["captures"].items():
        assert len(read_frames(name)) == info["messages"]


def test_each_capture_ends_with_the_end_marker(capture):
    _, messages = capture
    assert messages[-1] == Message(None, False, messages[-1].lsn, "golden-end", b"")


def test_relation_messages(capture):
    _, messages = capture
    rel = relations(messages)
    assert {r.namespace for r in rel.values()} == {"public"}
    assert rel["customers"].replica_identity == "d"
    assert rel["customers"].columns == (Column(True, "id", 23, -1), Column(False, "name", 25, -1),
                                        Column(False, "email", 25, -1))
    assert [(c.name, c.is_key) for c in rel["order_lines"].columns] == [
        ("order_id", True), ("line_no", True), ("sku", False), ("qty", False)]
    assert rel["audit_log"].replica_identity == "f"
    assert rel["audit_log"].columns == (Column(True, "id", 23, -1), Column(True, "note", 25, -1),
                                        Column(True, "at_ms", 20, -1))
    assert rel["accounts"].replica_identity == "i"
    assert rel["accounts"].columns == (Column(False, "id", 23, -1), Column(True, "code", 25, -1),
                                       Column(False, "balance", 1700, (12 << 16 | 2) + 4))
    assert [(c.name, c.is_key) for c in rel["child"].columns] == [("id", True), ("parent_id", False)]
    assert rel["bulk"].columns == (Column(True, "id", 23, -1), Column(False, "n", 23, -1))


def test_type_message_and_column_types(capture):
    _, messages = capture
    [mood, *_] = [m for m in messages if isinstance(m, Type)]
    assert (mood.namespace, mood.name, mood.xid) == ("public", "mood", None)
    columns = relations(messages)["all_types"].columns
    assert [(c.name, c.type_oid, c.type_modifier) for c in columns] == [
        ("id", 23, -1), ("c_smallint", 21, -1), ("c_bigint", 20, -1), ("c_numeric", 1700, (10 << 16 | 2) + 4),
        ("c_real", 700, -1), ("c_double", 701, -1), ("c_bool", 16, -1), ("c_varchar", 1043, 24),
        ("c_char", 1042, 7), ("c_bytea", 17, -1), ("c_date", 1082, -1), ("c_timestamp", 1114, -1),
        ("c_timestamptz", 1184, -1), ("c_interval", 1186, -1), ("c_uuid", 2950, -1), ("c_json", 114, -1),
        ("c_jsonb", 3802, -1), ("c_int_array", 1007, -1), ("c_text_array", 1009, -1), ("c_inet", 869, -1),
        ("c_mood", mood.oid, -1), ("c_unicode", 25, -1)]
    assert [c.is_key for c in columns] == [True] + [False] * 21


def test_begin_and_commit_agree(capture):
    _, messages = capture
    txs = transactions(messages)
    assert len(txs) >= 7
    for begin, *_, commit in txs:
        assert commit.commit_lsn == begin.final_lsn
        assert commit.end_lsn > commit.commit_lsn
        assert commit.commit_time_us == begin.commit_time_us
        assert commit.flags == 0
    xids = [tx[0].xid for tx in txs]
    assert xids == sorted(xids) and len(set(xids)) == len(xids)
    recent = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert micros(recent) < txs[0][0].commit_time_us


def test_inserts(capture):
    _, messages = capture
    rel = relations(messages)
    first = transactions(messages)[0]
    assert [m.new for m in rows(first, rel["customers"])] == [("1", "Ada", "ada@example.com"), ("2", "Grace", None)]
    assert [m.new for m in rows(first, rel["order_lines"])] == [("10", "1", "SKU-A", "2"), ("10", "2", "SKU-B", "1")]
    assert [m.new for m in rows(first, rel["audit_log"])] == [("1", "created", "1700000000000")]
    assert [m.new for m in rows(first, rel["documents"])] == [("1", "1", TOAST_BODY)]
    assert [m.new for m in rows(first, rel["accounts"])] == [("1", "ACC-1", "100.50")]
    assert [m.new for m in rows(first, rel["counters"])] == [("1", "7"), ("2", "8")]
    assert all(m.xid is None for m in first[1:-1])


def test_all_types_in_text_format(capture):
    _, messages = capture
    full, nulls = rows(transactions(messages)[0], relations(messages)["all_types"])
    assert full.new == (
        "1", "-32768", "9223372036854775807", "12345.67", "1.5", "2.25", "t", "varchar value", "ab ",
        "\\x00ff10", "2024-02-29", "2024-02-29 13:14:15.123456", "2024-02-29 11:14:15.5+00",
        "1 day 02:03:04", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", '{"a": [1, 2]}', '{"b": {"c": null}}',
        "{1,NULL,3}", '{"x y",z}', "192.168.0.1/24", "ok", "żółw 🐢 naïve")
    assert nulls.new == ("2",) + (None,) * 21


def test_updates(capture):
    _, messages = capture
    rel = relations(messages)
    tx = transactions(messages)[1]
    updates = [m for m in tx if isinstance(m, Update)]
    assert len(updates) == 7 and len(tx) == 9
    customers = rows(tx, rel["customers"], Update)
    assert [(u.old_kind, u.old, u.new) for u in customers] == [
        (None, None, ("1", "Ada", "ada@lovelace.dev")),
        ("K", ("2", None, None), ("3", "Grace", None)),          # the primary key changed
    ]
    assert [(u.old_kind, u.old, u.new) for u in rows(tx, rel["order_lines"], Update)] == [
        (None, None, ("10", "1", "SKU-A", "5")),
        ("K", ("10", "2", None, None), ("10", "3", "SKU-B", "1")),  # half of a composite key changed
    ]
    [full] = rows(tx, rel["audit_log"], Update)
    assert (full.old_kind, full.old, full.new) == ("O", ("1", "created", "1700000000000"),
                                                  ("1", "edited", "1700000000000"))
    [toasted] = rows(tx, rel["documents"], Update)
    assert (toasted.old_kind, toasted.old) == (None, None)
    assert toasted.new == ("1", "2", UNCHANGED_TOAST) and toasted.new[2] is UNCHANGED_TOAST
    [by_index] = rows(tx, rel["accounts"], Update)
    assert (by_index.old_kind, by_index.old, by_index.new) == ("K", (None, "ACC-1", None), ("1", "ACC-2", "99.99"))


def test_deletes(capture):
    _, messages = capture
    rel = relations(messages)
    tx = transactions(messages)[2]
    deletes = {m.relation_oid: (m.old_kind, m.old) for m in tx if isinstance(m, Delete)}
    assert deletes == {
        rel["customers"].oid: ("K", ("1", None, None)),
        rel["order_lines"].oid: ("K", ("10", "1", None, None)),
        rel["audit_log"].oid: ("O", ("1", "edited", "1700000000000")),
        rel["documents"].oid: ("K", ("1", None, None)),
        rel["accounts"].oid: ("K", (None, "ACC-2", None)),
    }


def test_logical_messages(capture):
    _, messages = capture
    rel = relations(messages)
    tx = transactions(messages)[3]
    begin, message, insert, commit = tx
    assert (message.xid, message.transactional, message.prefix, message.content) == (
        None, True, "golden-tx", b"inside a transaction")
    assert begin.final_lsn > message.lsn > 0
    assert insert.relation_oid == rel["customers"].oid and insert.new == ("4", "Linus", None)
    after = messages[messages.index(commit) + 1]
    assert (after.xid, after.transactional, after.prefix, after.content) == (None, False, "golden-nontx", b"\x00\x01\xff")
    assert after.lsn > message.lsn


def test_truncates(capture):
    _, messages = capture
    rel = relations(messages)
    truncates = [m for tx in transactions(messages) for m in tx if isinstance(m, Truncate)]
    assert truncates[:2] == [
        Truncate(None, (rel["counters"].oid,), cascade=False, restart_identity=True),
        Truncate(None, (rel["parent"].oid, rel["child"].oid), cascade=True, restart_identity=False),
    ]


def test_origin(capture):
    _, messages = capture
    [origin] = [m for m in messages if isinstance(m, Origin)]
    begin, same, insert, commit = next(tx for tx in transactions(messages) if origin in tx)
    assert same is origin
    assert origin == Origin(0x1234ABCD, "golden_origin")
    origin_time = dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert begin.commit_time_us == commit.commit_time_us == micros(origin_time) == 631_249_445_000_000
    assert pg_time_to_unix_ms(begin.commit_time_us) == int(origin_time.timestamp() * 1000) == 1_577_934_245_000
    assert insert.new == ("100", "from-origin", None)


def test_v1_sends_the_large_transactions_whole():
    messages = decode_all("v1")
    assert not [m for m in messages if isinstance(m, (StreamStart, StreamStop, StreamCommit, StreamAbort))]
    bulk = relations(messages)["bulk"]
    ids = [int(m.new[0]) for m in messages if isinstance(m, Insert) and m.relation_oid == bulk.oid]
    assert ids == list(range(1, 601)) + list(range(2001, 2101))  # no rolled-back savepoint, no aborted tx
    [tx] = [tx for tx in transactions(messages) if rows(tx, bulk)]
    assert ("golden-stream", True) in [(m.prefix, m.transactional) for m in tx if isinstance(m, Message)]
    # the non-transactional message comes when written: before the transaction around it commits
    [between] = [i for i, m in enumerate(messages) if isinstance(m, Message) and m.prefix == "golden-nontx-during-stream"]
    assert between < messages.index(tx[0])


@pytest.mark.parametrize("name", STREAMED_CAPTURES)
def test_stream_blocks(name):
    messages = decode_all(name)
    control = [m for m in messages if isinstance(m, (StreamStart, StreamStop, StreamCommit, StreamAbort))]
    committed, rolled_back = control[0].xid, control[-1].xid
    assert committed != rolled_back
    inside = False  # blocks alternate Start/Stop; Commit and Abort come between blocks
    for m in control:
        if isinstance(m, StreamStart):
            assert not inside
            inside = True
        elif isinstance(m, StreamStop):
            assert inside
            inside = False
        else:
            assert not inside
    starts = [m for m in control if isinstance(m, StreamStart)]
    segments = [s.first_segment for s in starts if s.xid == committed]
    assert len(segments) >= 2 and segments == [True] + [False] * (len(segments) - 1)
    assert [s.first_segment for s in starts if s.xid == rolled_back][0] is True
    ends = [m for m in control if isinstance(m, (StreamCommit, StreamAbort))]
    [sub_abort] = [m for m in ends if isinstance(m, StreamAbort) and m.xid == committed]
    assert sub_abort.subxid != committed and sub_abort.abort_lsn is None
    [commit] = [m for m in ends if isinstance(m, StreamCommit)]
    assert commit.xid == committed and commit.flags == 0 and commit.end_lsn > commit.commit_lsn
    assert ends[-1] == StreamAbort(rolled_back, rolled_back)
    assert control.index(sub_abort) < control.index(commit)


@pytest.mark.parametrize("name", STREAMED_CAPTURES)
def test_streamed_changes_carry_the_xid_of_their_subtransaction(name):
    messages = decode_all(name)
    bulk = relations(messages)["bulk"]
    committed = next(m.xid for m in messages if isinstance(m, StreamStart))
    [sub_abort] = [m for m in messages if isinstance(m, StreamAbort) and m.xid == committed]
    block, xid_by_row = None, {}
    for m in messages:
        if isinstance(m, StreamStart):
            block = m.xid
        elif isinstance(m, StreamStop):
            block = None
        elif isinstance(m, (Relation, Type, Insert, Update, Delete, Truncate)) or (
                isinstance(m, Message) and m.transactional):
            assert (m.xid is None) == (block is None), m
            if isinstance(m, Insert) and m.relation_oid == bulk.oid:
                xid_by_row[int(m.new[0])] = m.xid
    assert {xid_by_row[i] for i in range(1, 601)} == {committed}
    assert {xid for i, xid in xid_by_row.items() if 1001 <= i <= 1600} == {sub_abort.subxid}
    after_rollback_to = {xid_by_row[i] for i in range(2001, 2101)}
    assert len(after_rollback_to) == 1 and after_rollback_to.isdisjoint({committed, sub_abort.subxid})
    rolled_back = [m for m in messages if isinstance(m, StreamAbort)][-1].xid
    assert {xid for i, xid in xid_by_row.items() if i > 3000} == {rolled_back}
    in_stream = [m for m in messages if isinstance(m, Update) and m.xid == committed]
    assert [(u.old_kind, u.old, u.new) for u in in_stream] == [
        (None, None, ("1", "-1")), (None, None, ("2", "-2")), ("K", ("3", None), ("10000", "3"))]
    [truncate] = [m for m in messages if isinstance(m, Truncate) and m.xid is not None]
    assert (truncate.xid, truncate.relation_oids, truncate.cascade, truncate.restart_identity) == (
        committed, (relations(messages)["scratch"].oid,), False, False)
    [between] = [m for m in messages if isinstance(m, Message) and m.prefix == "golden-nontx-during-stream"]
    assert (between.xid, between.transactional, between.content) == (None, False, b"between blocks")


@pytest.mark.parametrize("name", STREAMED_CAPTURES)
def test_streamed_and_whole_transactions_mean_the_same(name):
    assert committed_changes(decode_all(name)) == committed_changes(decode_all("v1"))


def test_binary_format():
    messages = decode_all("v2-binary")
    rel = relations(messages)
    [insert] = [m for m in messages if isinstance(m, Insert)]
    assert insert.relation_oid == rel["all_types"].oid
    array_header = struct.Struct("!iiiii")  # dimensions, has nulls, element type, length, lower bound
    assert insert.new == (
        struct.pack("!i", 4), struct.pack("!h", -32768), struct.pack("!q", 2**63 - 1),
        struct.pack("!hhHH3H", 3, 1, 0, 2, 1, 2345, 6700),  # numeric: digits base 10000, weight, sign, scale
        struct.pack("!f", 1.5), struct.pack("!d", 2.25), b"\x01", b"varchar value", b"ab ", b"\x00\xff\x10",
        struct.pack("!i", micros(dt.date(2024, 2, 29))),
        struct.pack("!q", micros(dt.datetime(2024, 2, 29, 13, 14, 15, 123456))),
        struct.pack("!q", micros(dt.datetime(2024, 2, 29, 11, 14, 15, 500000))),
        struct.pack("!qii", (2 * 3600 + 3 * 60 + 4) * 1_000_000, 1, 0),
        uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").bytes,
        b'{"a": [1, 2]}', b'\x01{"b": {"c": null}}',
        array_header.pack(1, 1, 23, 3, 1) + struct.pack("!iiiii", 4, 1, -1, 4, 3),
        array_header.pack(1, 0, 25, 2, 1) + struct.pack("!i", 3) + b"x y" + struct.pack("!i", 1) + b"z",
        bytes([2, 24, 0, 4, 192, 168, 0, 1]),  # inet: family, bits, is_cidr, length, address
        b"ok", "żółw 🐢 naïve".encode())
    [update] = [m for m in messages if isinstance(m, Update)]
    assert (update.relation_oid, update.old_kind) == (rel["customers"].oid, "K")
    assert update.old == (struct.pack("!i", 4), None, None)
    assert update.new == (struct.pack("!i", 5), b"Linus T.", None)


# --- built after proto.c: not capturable from the dev stack's PostgreSQL 15 -----------------

GID = b"gid-\xc3\xa9\0"  # "gid-é"


@pytest.mark.parametrize("payload, expected", [
    (b"b" + struct.pack("!QQqI", 0x100, 0x200, 123, 42) + GID, BeginPrepare(0x100, 0x200, 123, 42, "gid-é")),
    (b"P" + struct.pack("!BQQqI", 0, 0x100, 0x200, 123, 42) + GID, Prepare(0, 0x100, 0x200, 123, 42, "gid-é")),
    (b"K" + struct.pack("!BQQqI", 0, 0x300, 0x400, 456, 42) + GID, CommitPrepared(0, 0x300, 0x400, 456, 42, "gid-é")),
    (b"r" + struct.pack("!BQQqqI", 0, 0x200, 0x500, 123, 789, 42) + GID,
     RollbackPrepared(0, 0x200, 0x500, 123, 789, 42, "gid-é")),
    (b"p" + struct.pack("!BQQqI", 0, 0x100, 0x200, -5, 42) + GID, StreamPrepare(0, 0x100, 0x200, -5, 42, "gid-é")),
], ids=["begin-prepare", "prepare", "commit-prepared", "rollback-prepared", "stream-prepare"])
def test_two_phase_messages(payload, expected):
    for version in (3, 4):
        assert PgOutputDecoder(version).decode(payload) == expected
    with pytest.raises(DecodeError, match=r"offset 0: expected a message type of protocol version 2, but .* needs version 3"):
        PgOutputDecoder(2).decode(payload)


def test_protocol_4_stream_abort_with_abort_lsn_and_time():
    parallel = b"A" + struct.pack("!IIQq", 42, 43, 0x600, 999)
    assert PgOutputDecoder(4).decode(parallel) == StreamAbort(42, 43, 0x600, 999)
    assert PgOutputDecoder(4).decode(parallel[:9]) == StreamAbort(42, 43, None, None)
    with pytest.raises(DecodeError, match=r"Stream Abort .* offset 9: expected the end of the message"):
        PgOutputDecoder(3).decode(parallel)


def test_stream_state_and_reset():
    decoder = PgOutputDecoder(2)
    assert decoder.decode(b"S" + struct.pack("!IB", 7, 1)) == StreamStart(7, True)
    assert decoder.stream_xid == 7
    assert decoder.decode(b"I" + struct.pack("!II", 9, 100) + b"N\x00\x01n") == Insert(9, 100, (None,))
    decoder.reset()
    assert decoder.stream_xid is None
    assert decoder.decode(b"I" + struct.pack("!I", 100) + b"N\x00\x01n") == Insert(None, 100, (None,))
    assert decoder.decode(b"S" + struct.pack("!IB", 7, 0)) == StreamStart(7, False)
    assert decoder.decode(b"E") == StreamStop()
    with pytest.raises(ValueError):
        PgOutputDecoder(5)


def test_unchanged_toast_is_a_singleton_that_survives_pickling():
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert pickle.loads(pickle.dumps(Update(None, 1, None, None, ("1", UNCHANGED_TOAST)))).new[1] is UNCHANGED_TOAST
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"


def test_time_conversion():
    assert pg_time_to_unix_ms(0) == 946_684_800_000
    assert pg_time_to_unix_ms(-946_684_800_000_000) == 0
    assert pg_time_to_unix_ms(1_999) == 946_684_800_001
