"""The pgoutput decoder against the PostgreSQL server of the day, not only against stored bytes.

A short round trip per protocol version: changes made through SQL, read back from a pgoutput slot
(with the capture script's reader) and decoded; protocol 2 also streams a large transaction.
"""

from __future__ import annotations

import psycopg2
import pytest

from sources.postgres.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    PgOutputDecoder,
    Relation,
    StreamCommit,
    StreamStart,
    StreamStop,
    Update,
)
from tests.golden.capture_pgoutput import read_slot
from tests.integration.pg_capture import drop_slot

END = b"live-end\x00"
OPTIONS = {
    1: {"proto_version": "1", "publication_names": "live_pub", "messages": "true"},
    2: {"proto_version": "2", "publication_names": "live_pub", "messages": "true", "streaming": "on"},
}


@pytest.mark.postgres
@pytest.mark.parametrize("version", [1, 2])
def test_round_trip(pg_dsn, version):
    slot = f"live_v{version}"
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE live (id int PRIMARY KEY, name text NOT NULL, score numeric(5,1), note text)")
            cur.execute("CREATE TABLE live_bulk (id int PRIMARY KEY)")
            cur.execute("CREATE PUBLICATION live_pub FOR TABLE live, live_bulk")
            cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("INSERT INTO live VALUES (1, 'ä', 1.5, NULL), (2, 'b', NULL, 'x')")
            cur.execute("UPDATE live SET name = 'A' WHERE id = 1")
            cur.execute("UPDATE live SET id = 3 WHERE id = 2")
            cur.execute("DELETE FROM live WHERE id = 1")
        conn.commit()
        with conn.cursor() as cur:
            cur.execute("INSERT INTO live_bulk SELECT generate_series(1, 1000)")  # > 64kB: streamed in v2
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_logical_emit_message(false, 'live-end', '')")

        decoder = PgOutputDecoder(version)
        messages = [decoder.decode(payload) for payload in read_slot(pg_dsn, slot, OPTIONS[version], END)]
    finally:
        conn.autocommit = True
        drop_slot(conn, slot)
        conn.close()

    live = next(m for m in messages if isinstance(m, Relation) and m.name == "live")
    assert [(c.name, c.is_key, c.type_oid) for c in live.columns] == [
        ("id", True, 23), ("name", False, 25), ("score", False, 1700), ("note", False, 25)]
    begin = messages[0]
    assert isinstance(begin, Begin)
    first_commit = next(m for m in messages if isinstance(m, Commit))
    assert first_commit.commit_lsn == begin.final_lsn
    changes = [m for m in messages[:messages.index(first_commit)] if isinstance(m, (Insert, Update, Delete))]
    assert changes == [
        Insert(None, live.oid, ("1", "ä", "1.5", None)),
        Insert(None, live.oid, ("2", "b", None, "x")),
        Update(None, live.oid, None, None, ("1", "A", "1.5", None)),
        Update(None, live.oid, "K", ("2", None, None, None), ("3", "b", None, "x")),
        Delete(None, live.oid, "K", ("1", None, None, None)),
    ]

    bulk = next(m for m in messages if isinstance(m, Relation) and m.name == "live_bulk")
    inserts = [m for m in messages if isinstance(m, Insert) and m.relation_oid == bulk.oid]
    assert [int(m.new[0]) for m in inserts] == list(range(1, 1001))
    streams = [m for m in messages if isinstance(m, (StreamStart, StreamStop, StreamCommit))]
    if version == 1:
        assert not streams and {m.xid for m in inserts} == {None}
    else:
        xid = streams[0].xid
        assert streams[0] == StreamStart(xid, True) and streams[-1].xid == xid
        assert isinstance(streams[-1], StreamCommit) and {m.xid for m in inserts} == {xid}
    assert messages[-1] == Message(None, False, messages[-1].lsn, "live-end", b"")
