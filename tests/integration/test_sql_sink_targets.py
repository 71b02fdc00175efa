"""The SQL sink against real PostgreSQL and MariaDB targets: the core behaviours of the unit tests
(tests/unit/test_sql_sink.py, which runs them on SQLite and DuckDB), typed values landing in typed
columns, data errors named by key and column, retriable lock timeouts, and events that went
through the real encoder and decoder."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from cdc.errors import PermanentError, RetriableError, SchemaChangeError
from cdc.events import ChangeEvent, Op, TableId
from cdc.log.base import LogRecord
from cdc.serde import EnvelopeEncoder
from cdc.sink_events import decode_record
from tests.unit import test_sql_sink as core
from tests.unit.test_sql_sink import TOPIC, Sinks, delete, rows, schema_record, table_exists, tombstone, upsert


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("mysql", marks=pytest.mark.mysql)])
def target(request) -> str:
    """The URL of a fresh database on the target under test."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_dsn")
    return f"{request.getfixturevalue('mysql_url')}/{request.getfixturevalue('mysql_db')}"


@pytest.fixture
def make_sink(target):
    sinks = Sinks(target)
    yield sinks
    sinks.stop()


def is_postgres(sink) -> bool:
    return sink.engine.dialect.name == "postgresql"


# --- the core behaviours, as on SQLite and DuckDB -------------------------------------------------

CORE = ["test_replays_and_older_events_never_regress_a_key", "test_newest_version_of_a_key_wins_within_a_batch",
        "test_deletes_are_remembered_so_a_late_older_insert_does_not_resurrect",
        "test_a_delete_before_the_table_exists_is_remembered", "test_delete_and_insert_in_one_batch_keep_the_newest",
        "test_tombstone_removes_the_key_whatever_its_version", "test_truncate_clears_older_rows_and_sets_a_watermark",
        "test_truncate_in_a_batch_applies_in_order", "test_soft_delete_marks_rows_instead_of_removing_them",
        "test_new_column_from_a_schema_record_is_added_and_shown_by_the_view", "test_unknown_column_in_a_value_is_added",
        "test_a_dropped_column_stays_and_is_null_from_then_on", "test_incompatible_change_fails_with_table_column_and_types",
        "test_incompatible_change_asks_for_a_rebuild", "test_incompatible_change_ignored_writes_the_columns_that_fit",
        "test_key_change_is_incompatible", "test_generations_open_switch_drop_behind_the_view",
        "test_open_generation_starts_empty_even_after_an_aborted_rebuild", "test_a_sink_built_for_a_generation_writes_into_it",
        "test_rebuild_after_an_incompatible_change_switches_to_the_new_types", "test_mysql_source_types",
        "test_widening_a_type_is_not_a_change", "test_deletes_are_forgotten_after_delete_memory_hours",
        "test_a_delete_older_than_the_row_leaves_it", "test_table_name_template_and_view",
        "test_creates_table_from_values_when_there_is_no_schema_record", "test_key_change_ignored_keeps_the_table_key",
        "test_a_renamed_column_keeps_its_values_or_stops_by_policy",
        "test_a_rebuild_after_a_rename_keeps_the_values_of_rows_written_before_it"]


@pytest.mark.parametrize("behaviour", CORE)
def test_core_behaviour(make_sink, behaviour):
    getattr(core, behaviour)(make_sink)


# --- types --------------------------------------------------------------------------------------

PG_COLUMNS = [("id", "integer"), ("total", "numeric(10,2)"), ("placed", "timestamp with time zone"),
              ("local_at", "timestamp without time zone"), ("due", "date"), ("meta", "jsonb"), ("tags", "text[]"),
              ("payload", "bytea"), ("ok", "boolean"), ("ratio", "double precision"), ("ref", "uuid"),
              ("name", "character varying(40)"), ("big", "bigint")]
MYSQL_COLUMNS = [("id", "int"), ("total", "decimal(10,2)"), ("placed", "timestamp(6)"), ("local_at", "datetime(6)"),
                 ("due", "date"), ("meta", "json"), ("tags", "json"), ("payload", "blob"), ("ok", "tinyint(1)"),
                 ("ratio", "double"), ("ref", "char(36)"), ("name", "varchar(40)"), ("big", "bigint unsigned")]
VALUES = {"total": "12345678.90", "placed": "2024-01-02T03:04:05.123456Z", "local_at": "2024-01-02T03:04:05.25",
          "due": "2024-02-29", "meta": {"a": [1, 2], "b": None}, "tags": ["x", "y"],
          "payload": base64.b64encode(b"\x00\x01\xfe\xff").decode(), "ratio": 0.125,
          "ref": "7b0f7e0c-4f8a-4c1e-9a57-2f9a2f0e3a11", "name": "Grüße, 'quoted' \\ \t tab", "big": 9007199254740993}


@pytest.mark.parametrize("columns", [PG_COLUMNS, MYSQL_COLUMNS], ids=["postgres-types", "mysql-types"])
def test_types_land_in_typed_columns(make_sink, columns):
    make_sink.records[TOPIC] = schema_record(columns)
    sink = make_sink()
    ok = True if columns is PG_COLUMNS else 1
    sink.write([upsert(1, 10, ok=ok, **VALUES), upsert(2, 11, **{name: None for name in VALUES})])
    types = core.column_types(sink, "orders__g1", full=True)
    row = dict(zip(["id", *VALUES, "ok"], rows(sink, "id, " + ", ".join(VALUES) + ", ok")[0]))
    assert row["total"] == Decimal("12345678.90")
    assert row["due"] == date(2024, 2, 29)
    assert row["ratio"] == 0.125 and str(row["ref"]) == VALUES["ref"] and row["name"] == VALUES["name"]
    assert bytes(row["payload"]) == b"\x00\x01\xfe\xff"
    assert int(row["big"]) == 9007199254740993 and row["ok"] == 1
    if is_postgres(sink):
        assert types["total"] == "NUMERIC" and types["placed"] == "TIMESTAMP WITH TIME ZONE"
        assert types["meta"] == types["tags"] == "JSONB" and types["payload"] == "BYTEA"
        assert row["placed"] == datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
        assert row["local_at"] == datetime(2024, 1, 2, 3, 4, 5, 250000)
        assert row["meta"] == {"a": [1, 2], "b": None} and row["tags"] == ["x", "y"]
    else:
        assert types["total"] == "DECIMAL(10,2)" and types["placed"] == types["local_at"] == "DATETIME(6)"
        assert types["payload"] == "LONGBLOB"
        assert row["placed"] == datetime(2024, 1, 2, 3, 4, 5, 123456)  # UTC
        assert row["local_at"] == datetime(2024, 1, 2, 3, 4, 5, 250000)
        assert json.loads(row["meta"]) == {"a": [1, 2], "b": None} and json.loads(row["tags"]) == ["x", "y"]
    assert rows(sink, "id, " + ", ".join(VALUES))[1] == (2, *([None] * len(VALUES)))


@pytest.mark.postgres
def test_postgres_special_values_and_a_target_schema(pg_dsn):
    sinks = Sinks(pg_dsn)
    sinks.records[TOPIC] = schema_record([("id", "integer"), ("n", "numeric"), ("at", "timestamp with time zone"),
                                          ("f", "double precision")])
    try:
        sink = sinks(schema="analytics")
        sink.write([upsert(1, 10, n="NaN", at="infinity", f="-Infinity"),
                    upsert(2, 11, n="123456789012345678901234567890.123456789", at="2024-01-02T03:04:05Z", f="NaN")])
        (n1, at1, f1), (n2, _, _) = rows(sink, "n::text, at::text, f::text", table="analytics.orders")
        assert (n1, at1, f1) == ("NaN", "infinity", "-Infinity")
        assert n2 == "123456789012345678901234567890.123456789"
        sink.write([delete(1, 20)])
        sink.write([upsert(1, 15, n="1", at=None, f=None)])
        assert rows(sink, "id", table="analytics.orders") == [(2,)]
        assert rows(sink, "tbl, version", table="analytics.cdc_sink_deletes", order="tbl") == [("orders__g1", 20)]
    finally:
        sinks.stop()


def test_string_keys_differing_in_case_or_trailing_blanks_stay_apart(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "character varying(20)"), ("v", "text")])
    sink = make_sink()
    events = [string_key_upsert(key, version) for version, key in enumerate(["a", "A", "a ", "ä"], start=10)]
    sink.write(events)
    assert sorted(r[0] for r in rows(sink, "id", order="__cdc_version")) == sorted(["a", "A", "a ", "ä"])


def string_key_upsert(key: str, version: int):
    event = upsert(0, version, v=key)
    return type(event)(event.topic, 0, version, {"id": key}, Op.CREATE, None, {"id": key, "v": key}, version,
                       event.source)


# --- events through the real encoder and decoder ----------------------------------------------------

def test_events_from_encoded_records(make_sink):
    table = TableId("shop", "public", "orders")
    encoder = EnvelopeEncoder("postgresql", "shop", "shop")
    changes = [
        ChangeEvent(Op.READ, table, {"id": 1}, None, {"id": 1, "total": "9.99"}, 100, 0).check(),
        ChangeEvent(Op.CREATE, table, {"id": 2}, None, {"id": 2, "total": "5.00"}, 200, 0).check(),
        ChangeEvent(Op.UPDATE, table, {"id": 1}, None, {"id": 1, "total": "10.99"}, 300, 0).check(),
        ChangeEvent(Op.DELETE, table, {"id": 2}, {"id": 2, "total": "5.00"}, None, 400, 0).check(),
    ]
    records = encoder.encode(changes)
    events = [decode_record(LogRecord(r.topic, 0, offset, r.key, r.value, 0)) for offset, r in enumerate(records)]
    assert events[-1].op is None  # the delete's tombstone
    make_sink.records[events[0].topic] = schema_record([("id", "integer"), ("total", "numeric(10,2)")])
    sink = make_sink()
    sink.write(events)
    sink.write(events[:2])  # a replay of the start
    assert rows(sink, "id, total, __cdc_version") == [(1, Decimal("10.99"), 300)]


# --- errors ------------------------------------------------------------------------------------

def test_a_value_that_does_not_fit_names_key_and_column(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text"), ("amount", "numeric(5,2)")])
    sink = make_sink()
    with pytest.raises(PermanentError) as raised:  # a batch: the table, and how to find the row
        sink.write([upsert(1, 10, v="a", amount="1.00"), upsert(2, 11, v="b", amount="12345.67")])
    assert "orders__g1" in str(raised.value) and "one of 2 keys" in str(raised.value)
    with pytest.raises(PermanentError) as raised:  # a batch of one, as the runtime's split makes it
        sink.write([upsert(2, 11, v="b", amount="12345.67")])
    message = str(raised.value)
    assert not raised.value.retriable
    assert 'orders__g1: key {"id":2}: column amount' in message and "12345.67" in message
    assert rows(sink, "id") == []


def test_a_lock_timeout_is_retriable(make_sink, target):
    if target.startswith("postgres"):
        make_sink.url = target + "?options=-c%20lock_timeout%3D300"
    else:
        make_sink.url = target + "?init_command=SET%20SESSION%20innodb_lock_wait_timeout%3D1"
    sink = make_sink()
    sink.write([upsert(1, 10, v="a")])
    with sink.engine.connect() as holder:
        holder.exec_driver_sql("SELECT * FROM orders__g1 WHERE id = 1 FOR UPDATE")
        with pytest.raises(RetriableError):
            sink.write([upsert(1, 11, v="b")])
        holder.rollback()
    sink.write([upsert(1, 11, v="b")])  # the same batch succeeds once the lock is gone
    assert rows(sink, "id, v") == [(1, "b")]


def test_schema_change_error_is_not_retriable(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("n", "integer")])
    sink = make_sink()
    sink.write([upsert(1, 10, n=1)])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("n", "text")], version=2)
    with pytest.raises(SchemaChangeError) as raised:
        sink.write([upsert(1, 11, n="x")])
    assert not raised.value.retriable


# --- generations on a server: readers never see an empty table -------------------------------------

def test_switch_keeps_the_view_readable_and_complete(make_sink):
    live = make_sink()
    live.write([upsert(i, i, v=f"v{i}") for i in range(1, 101)])
    rebuild = make_sink()
    rebuild.open_generation(2)
    rebuild.write([upsert(i, i, v=f"w{i}") for i in range(1, 151)])
    assert len(rows(live, "id")) == 100
    rebuild.switch_generation(2)
    assert len(rows(live, "id")) == 150 and rows(live, "v")[0] == ("w1",)
    live.drop_generation(1)
    assert not table_exists(live, "orders__g1")
    live.write([delete(1, 500), tombstone(2)])
    assert len(rows(live, "id")) == 148


# --- two sink processes on one target ----------------------------------------------------------------

def test_concurrent_writers_converge_on_the_newest_versions(make_sink):
    """A live sink and a rebuild writing the same table at once (as after a switch): whatever
    interleaving, deadlock or lock wait (retried, as the runtime retries RetriableError), every
    key ends at its newest version."""
    import random
    import threading

    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text")])
    writers = [make_sink(), make_sink()]
    newest: dict[int, int] = {}
    batches: list[list[list]] = [[], []]
    rng = random.Random(3)
    for writer in range(2):
        for _ in range(15):
            batch = []
            for key in rng.sample(range(200), 60):
                version = rng.randrange(1, 1_000_000)
                newest[key] = max(newest.get(key, 0), version)
                batch.append(upsert(key, version, v=f"{key}@{version}"))
            batches[writer].append(batch)
    failures: list[BaseException] = []

    def run(writer: int) -> None:
        try:
            for batch in batches[writer]:
                for _attempt in range(20):
                    try:
                        writers[writer].write(batch)
                        break
                    except RetriableError:
                        continue
                else:
                    raise AssertionError("still retriable after 20 attempts")
        except BaseException as err:  # noqa: BLE001 - reported by the test thread below
            failures.append(err)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert rows(writers[0], "id, v, __cdc_version") == [(k, f"{k}@{v}", v) for k, v in sorted(newest.items())]


# --- schema_policy evolve: widenings in place, behind the view -------------------------------------

@pytest.mark.parametrize("old, new, before, after", [
    ("numeric(12,2)", "numeric(14,4)", "1.25", "12345678.1234"),
    ("integer", "text", 5, "five"),
    ("numeric(12,2)", "double precision", "1.01", 1.2345678901234567),
])
def test_evolve_changes_a_column_in_place_and_the_view_shows_it(make_sink, old, new, before, after):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("n", old)], version=1)
    sink = make_sink(schema_policy="evolve")
    sink.write([upsert(1, 10, n=before)])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("n", new)], version=2)
    sink.write([upsert(2, 20, n=after)])
    values = dict(rows(sink, "id, n"))
    if isinstance(before, int):  # the target converted the old value as the source did: 5 -> '5'
        assert values == {1: "5", 2: "five"}
    elif isinstance(after, float):  # the source's cast of the old value: the double nearest to 1.01
        assert values == {1: 1.01, 2: after} and all(isinstance(v, float) for v in values.values())
    else:
        assert {k: Decimal(str(v)) for k, v in values.items()} == {1: Decimal("1.25"), 2: Decimal("12345678.1234")}


def test_evolve_stops_at_a_change_that_would_lose_values(make_sink):
    # A float into a numeric: each database rounds a double's digits its own way.
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("amount", "double precision")], version=1)
    sink = make_sink(schema_policy="evolve")
    sink.write([upsert(1, 10, amount=1.25)])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("amount", "numeric(12,2)")], version=2)
    with pytest.raises(SchemaChangeError, match=r"column amount: double precision -> numeric\(12,2\).*cdc rebuild "
                                                r"CONFIG s1"):
        sink.write([upsert(2, 20, amount="1.23")])
    assert rows(sink, "id") == [(1,)]


@pytest.mark.postgres
def test_readers_of_a_postgres_target_never_fail_while_its_columns_change(pg_dsn):
    """Readers lock a view, then its table. DDL that locked the table first and then replaced the
    view deadlocked with such a reader, and PostgreSQL failed one of the two: at times the
    reader's query. Here columns are added, renamed and retyped while readers keep reading."""
    import threading

    import psycopg2

    sinks = Sinks(pg_dsn)
    columns = [("id", "integer"), ("n", "integer"), ("r0", "text")]
    sinks.records[TOPIC] = schema_record(columns)
    columns_before = list(columns)
    errors: list[str] = []
    reads = [0]
    done = threading.Event()

    def read() -> None:
        conn = psycopg2.connect(pg_dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not done.is_set():
                try:
                    cur.execute("SELECT count(*) FROM orders")
                    reads[0] += 1
                except psycopg2.Error as err:
                    errors.append(f"{type(err).__name__}: {err}".strip())
        conn.close()

    try:
        sink = sinks(schema_policy="evolve")
        sink.write([upsert(1, 10, n=1, r0="a")])
        readers = [threading.Thread(target=read) for _ in range(3)]
        for reader in readers:
            reader.start()
        for i in range(1, 31):
            columns.append((f"c{i}", "integer"))
            if i % 3 == 0:  # a rename and a widening now and then, besides the new columns
                columns[2] = (f"r{i}", "text")
                sinks.records[TOPIC] = core._renamed(columns, {f"r{i}": columns_before[2][0]}, i + 1)
            else:
                sinks.records[TOPIC] = schema_record(columns, version=i + 1)
            columns_before = list(columns)
            sink.write([upsert(1, 10 + i, n=i, **{f"c{i}": i, columns[2][0]: "a"})])
        done.set()
        for reader in readers:
            reader.join()
        assert rows(sink, "id, n, r30, c30") == [(1, 30, "a", 30)]
    finally:
        done.set()
        sinks.stop()
    assert reads[0] > 0 and not errors, errors[:3]
