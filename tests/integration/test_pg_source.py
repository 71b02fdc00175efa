"""The PostgreSQL source against a real server: snapshot, streaming, handover, TOAST, schema."""

from __future__ import annotations

import random
import threading
import time

import orjson
import psycopg2
import pytest

from cdc.errors import PrerequisiteError
from tests.integration.pg_capture import (
    capturing,
    drop_released_slot,
    embedded_log,  # noqa: F401 - the fixture ``log``
    execute,
    pg_config,
    slot_name,
    table_rows,
    topic_state,
    wait_until,
    write_accounts,
)

pytestmark = pytest.mark.postgres


def test_snapshot_then_stream_gives_the_table(pg_dsn, tmp_path, log):
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2))",
            "INSERT INTO items SELECT g, 'item ' || g, g * 1.5 FROM generate_series(1, 500) g")
    with capturing(pg_config(pg_dsn, tmp_path), log, "t") as capture:
        wait_until(lambda: len(topic_state(log, "t.public.items")) == 500, what="the snapshot", capture=capture)
        execute(pg_dsn, "UPDATE items SET name = 'renamed' WHERE id <= 10",
                "DELETE FROM items WHERE id > 490",
                "INSERT INTO items VALUES (1000, 'new', 9.99)",
                "UPDATE items SET id = 2000 WHERE id = 20")  # a key change: delete + create
        expected = {k: {**v, "price": f"{float(v['price']):.2f}"} for k, v in
                    table_rows(pg_dsn, "items").items()}
        wait_until(lambda: topic_state(log, "t.public.items") == expected, what="the stream", capture=capture)
    records = [orjson.loads(r.value) for r in log.read_all("t.public.items") if r.value is not None]
    snapshot = [r for r in records if r["op"] == "r"]
    assert len(snapshot) == 500
    assert sum(r["source"]["snapshot"] == "last" for r in snapshot) == 1
    streamed = [r for r in records if r["op"] != "r"]
    assert min(r["source"]["version"] for r in streamed) > max(r["source"]["version"] for r in snapshot)
    assert all(r["transaction"] is not None and r["source"]["txId"] for r in streamed)


def test_handover_under_concurrent_writes(pg_dsn, tmp_path, log):
    execute(pg_dsn, "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, note text)",
            "INSERT INTO accounts SELECT g, 100, 'n' FROM generate_series(1, 2000) g")
    stop = threading.Event()

    thread = threading.Thread(target=write_accounts, args=(lambda: psycopg2.connect(pg_dsn), stop, 5, 10_000))
    thread.start()
    try:
        time.sleep(0.3)
        with capturing(pg_config(pg_dsn, tmp_path, snapshot_chunk_pages=4, snapshot_workers=3), log, "h") as capture:
            time.sleep(3)
            stop.set()
            thread.join()
            expected = table_rows(pg_dsn, "accounts")
            wait_until(lambda: topic_state(log, "h.public.accounts") == expected, what="equality", capture=capture)
    finally:
        stop.set()
        thread.join()


def test_unchanged_toast_values_are_filled(pg_dsn, tmp_path, log):
    big = "".join(random.Random(1).choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(20_000))
    execute(pg_dsn, "CREATE TABLE docs (id int PRIMARY KEY, title text, body text)",
            "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL",  # out of line, uncompressed
            f"INSERT INTO docs VALUES (1, 'before snapshot', '{big}')")
    with capturing(pg_config(pg_dsn, tmp_path), log, "x") as capture:
        wait_until(lambda: len(topic_state(log, "x.public.docs")) == 1, capture=capture)
        execute(pg_dsn, f"INSERT INTO docs VALUES (2, 'streamed', '{big[::-1]}')",
                "UPDATE docs SET title = 'changed' WHERE id IN (1, 2)")
        wait_until(lambda: {r["title"] for r in topic_state(log, "x.public.docs").values()} == {"changed"},
                   capture=capture)
    state = topic_state(log, "x.public.docs")
    assert state['{"id":1}']["body"] == big
    assert state['{"id":2}']["body"] == big[::-1]
    updates = [orjson.loads(r.value) for r in log.read_all("x.public.docs")
               if r.value is not None and orjson.loads(r.value)["op"] == "u"]
    assert len(updates) == 2 and all("unchanged_toast" not in u["source"] for u in updates)


def test_unchanged_toast_values_survive_primary_key_updates(pg_dsn, tmp_path, log):
    # Incompressible values under the default storage: stored out of line, compressed or not.
    rng = random.Random(2)
    big = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12_000)) for _ in range(2)]
    execute(pg_dsn, "CREATE TABLE docs (id int PRIMARY KEY, title text, body text)",
            f"INSERT INTO docs VALUES (101, 'snapshot row', '{big[0]}')")
    with capturing(pg_config(pg_dsn, tmp_path), log, "k") as capture:
        wait_until(lambda: len(topic_state(log, "k.public.docs")) == 1, capture=capture)
        execute(pg_dsn, f"INSERT INTO docs VALUES (201, 'streamed row', '{big[1]}')",
                "UPDATE docs SET id = 102, title = 'touched' WHERE id = 101",
                "UPDATE docs SET id = 202 WHERE id = 201",
                "UPDATE docs SET id = 103 WHERE id = 102",   # a second move of the same row
                "UPDATE docs SET title = 'after the moves' WHERE id = 202")
        wait_until(lambda: set(topic_state(log, "k.public.docs")) == {'{"id":103}', '{"id":202}'}
                   and topic_state(log, "k.public.docs")['{"id":202}']["title"] == "after the moves",
                   capture=capture)
    state = topic_state(log, "k.public.docs")
    assert state['{"id":103}'] == {"id": 103, "title": "touched", "body": big[0]}
    assert state['{"id":202}'] == {"id": 202, "title": "after the moves", "body": big[1]}
    records = [orjson.loads(r.value) for r in log.read_all("k.public.docs") if r.value is not None]
    assert not [r for r in records if "unchanged_toast" in r["source"]]


def test_schema_changes_are_published_and_new_tables_captured(pg_dsn, tmp_path, log):
    execute(pg_dsn, "CREATE TABLE a (id int PRIMARY KEY, v text)", "INSERT INTO a VALUES (1, 'x')")
    with capturing(pg_config(pg_dsn, tmp_path), log, "s") as capture:
        wait_until(lambda: topic_state(log, "s.public.a"), capture=capture)
        execute(pg_dsn, "ALTER TABLE a ADD COLUMN extra int", "INSERT INTO a VALUES (2, 'y', 7)",
                "ALTER TABLE a DROP COLUMN v", "ALTER TABLE a ALTER COLUMN extra TYPE bigint",
                "INSERT INTO a VALUES (3, 8)",
                "CREATE TABLE b (id int PRIMARY KEY, w text)", "INSERT INTO b VALUES (1, 'new table')")
        wait_until(lambda: topic_state(log, "s.public.b"), what="the new table", capture=capture)
        wait_until(lambda: '{"id":3}' in topic_state(log, "s.public.a"), capture=capture)
    a = topic_state(log, "s.public.a")
    assert a['{"id":2}'] == {"id": 2, "v": "y", "extra": 7}
    assert a['{"id":3}'] == {"id": 3, "extra": 8}
    assert topic_state(log, "s.public.b") == {'{"id":1}': {"id": 1, "w": "new table"}}
    shapes = [orjson.loads(r.value) for r in log.read_all("s.schema-changes")]
    a_shapes = [[(c["name"], c["type"]) for c in s["columns"]] for s in shapes if s["table"] == "a"]
    assert a_shapes[-1] == [("id", "integer"), ("extra", "bigint")]
    assert any(s["table"] == "b" for s in shapes)


def test_truncate_is_an_event(pg_dsn, tmp_path, log):
    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    with capturing(pg_config(pg_dsn, tmp_path), log, "tr") as capture:
        wait_until(lambda: len(topic_state(log, "tr.public.t")) == 2, capture=capture)
        execute(pg_dsn, "TRUNCATE t", "INSERT INTO t VALUES (3)")
        wait_until(lambda: topic_state(log, "tr.public.t") == {'{"id":3}': {"id": 3}}, capture=capture)
    ops = [orjson.loads(r.value)["op"] for r in log.read_all("tr.public.t") if r.value is not None]
    assert ops.count("t") == 2  # one per partition


def test_a_table_without_a_key_is_refused_with_the_fix(pg_dsn, tmp_path, log):
    execute(pg_dsn, "CREATE TABLE loose (v text)")
    source_config = pg_config(pg_dsn, tmp_path)
    from sources.postgres.source import PostgresSource

    source = PostgresSource(source_config, None)
    with pytest.raises(PrerequisiteError, match="public.loose has no primary key.*key_columns"):
        source.start()
    source.stop()


def test_heartbeats_advance_the_slot_while_other_tables_change(pg_dsn, tmp_path, log):
    execute(pg_dsn, "CREATE TABLE captured (id int PRIMARY KEY)", "CREATE SCHEMA other",
            "CREATE TABLE other.busy (id serial PRIMARY KEY, pad text)")
    config = pg_config(pg_dsn, tmp_path, heartbeat_interval=0.5)

    def confirmed() -> int:
        conn = psycopg2.connect(pg_dsn)
        with conn.cursor() as cur:
            cur.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                        (slot_name(config, pg_dsn),))
            row = cur.fetchone()
        conn.close()
        return int(row[0]) if row and row[0] is not None else 0

    with capturing(config, log, "hb") as capture:
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        first = wait_until(confirmed, capture=capture)
        execute(pg_dsn, "INSERT INTO other.busy (pad) SELECT repeat('x', 500) FROM generate_series(1, 2000)")
        wait_until(lambda: confirmed() > first + 500 * 2000, what="the slot to move past uncaptured WAL",
                   capture=capture)


def test_a_slot_held_by_another_process_is_reported_as_retriable(pg_dsn, tmp_path, log):
    import psycopg2.extras

    from cdc.errors import RetriableError
    from sources.postgres.source import PostgresSource

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    config = pg_config(pg_dsn, tmp_path, snapshot="never")
    with capturing(config, log, "sl") as capture:  # creates the slot and publication
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
    other = psycopg2.connect(pg_dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                             application_name="someone-else")
    cur = other.cursor()
    cur.start_replication(slot_name=slot_name(config, pg_dsn), decode=False,
                          options={"proto_version": "1", "publication_names": config.publication_name})
    source = PostgresSource(config, None)
    try:
        with pytest.raises(RetriableError, match="in use by another process.*someone-else"):
            source.start()
    finally:
        source.stop()
        other.close()


def test_a_lost_slot_stops_the_source_or_resnapshots_when_needed(pg_dsn, tmp_path, log):
    from cdc.errors import PositionLostError

    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    config = pg_config(pg_dsn, tmp_path)
    with capturing(config, log, "lost") as capture:
        wait_until(lambda: topic_state(log, "lost.public.t"), capture=capture)
        wait_until(lambda: capture.runner.stored is not None, capture=capture)
    drop_released_slot(pg_dsn, slot_name(config, pg_dsn))
    execute(pg_dsn, "INSERT INTO t VALUES (2)")
    from tests.integration.pg_capture import Capture

    failing = Capture(config, log, "lost").start()
    failing.thread.join(30)
    assert isinstance(failing.error, PositionLostError), f"expected PositionLostError, got {failing.error!r}"
    assert "is missing" in str(failing.error) and "new snapshot" in str(failing.error)
    healing = pg_config(pg_dsn, tmp_path, snapshot="when_needed")
    with capturing(healing, log, "lost") as capture:
        wait_until(lambda: topic_state(log, "lost.public.t") == {'{"id":1}': {"id": 1}, '{"id":2}': {"id": 2}},
                   capture=capture)


def test_a_snapshot_taken_again_deletes_rows_gone_in_between(pg_dsn, tmp_path, log):
    execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 5) g",
            "CREATE TABLE emptied (id int PRIMARY KEY)", "INSERT INTO emptied VALUES (1), (2)")
    config = pg_config(pg_dsn, tmp_path)
    with capturing(config, log, "rs") as capture:
        wait_until(lambda: len(topic_state(log, "rs.public.t")) == 5, capture=capture)
        wait_until(lambda: len(topic_state(log, "rs.public.emptied")) == 2, capture=capture)
    # As if the first run had died before its snapshot's end was stored: no offset, and a row
    # deleted before the next run, which will take the snapshot again with a fresh slot.
    from cdc.offsets import OffsetStore

    OffsetStore(log, "rs").reset(config.name)
    execute(pg_dsn, "DELETE FROM t WHERE id = 3", "DELETE FROM emptied")
    with capturing(config, log, "rs") as capture:
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        wait_until(lambda: set(topic_state(log, "rs.public.t")) == {f'{{"id":{i}}}' for i in (1, 2, 4, 5)},
                   what="key 3 deleted", capture=capture)
        # A table the new snapshot found empty has no snapshot rows to compare: all of it goes.
        wait_until(lambda: topic_state(log, "rs.public.emptied") == {}, what="the emptied table's rows deleted",
                   capture=capture)


def test_the_snapshot_publishes_each_tables_schema_before_its_rows(pg_dsn, tmp_path, log):
    """A table only ever seen through the snapshot still has its schema record (a sink that types
    its columns from them, like the Delta sink, would otherwise guess)."""
    from cdc.serde import schema_changes_topic

    execute(pg_dsn, "CREATE TABLE typed_s (id bigint PRIMARY KEY, price numeric(10,2), seen timestamptz)",
            "INSERT INTO typed_s VALUES (1, 2.50, now())", "CREATE TABLE empty_s (k text PRIMARY KEY)")
    with capturing(pg_config(pg_dsn, tmp_path, snapshot="initial_only"), log, "sch") as capture:
        wait_until(lambda: capture.source.phase == "finished", capture=capture)
    records = log.read_all(schema_changes_topic("sch"))
    by_table = {orjson.loads(r.value)["table"]: orjson.loads(r.value) for r in records}
    assert set(by_table) == {"typed_s", "empty_s"}
    assert [(c["name"], c["type"], c["key"]) for c in by_table["typed_s"]["columns"]] == [
        ("id", "bigint", True), ("price", "numeric(10,2)", False), ("seen", "timestamp with time zone", False)]
    assert [(c["name"], c["type"], c["key"]) for c in by_table["empty_s"]["columns"]] == [("k", "text", True)]
    assert set(topic_state(log, "sch.public.typed_s")) == {'{"id":1}'}
