"""The SQL sink on SQLite and DuckDB (no server): tables, the version guard, deletes, truncates,
schema evolution and generations. tests/integration/test_sql_sink_targets.py runs the same
behaviours against PostgreSQL and MariaDB, with the helpers defined here."""

from __future__ import annotations

import base64
import json
import sqlite3
from decimal import Decimal
from typing import Any

import pytest

from cdc.errors import PermanentError, RebuildRequired, RetriableError, SchemaChangeError
from cdc.events import Op
from cdc.runtime.contexts import RuntimeSinkContext
from cdc.sink_events import SinkEvent
from sinks.sql import SqlSink, SqlSinkConfig

TOPIC = "shop.public.orders"


# --- helpers (also used by the integration tests) ---------------------------------------------

def source_block(version: int, table: str = "orders") -> dict[str, Any]:
    return {"connector": "postgresql", "name": "shop", "db": "shop", "schema": "public",
            "table": table, "snapshot": "false", "version": version}


def upsert(key: int, version: int, topic: str = TOPIC, op: Op = Op.UPDATE, **columns: Any) -> SinkEvent:
    table = topic.rsplit(".", 1)[-1]
    return SinkEvent(topic, 0, version, {"id": key}, op, None, {"id": key, **columns}, version,
                     source_block(version, table))


def delete(key: int, version: int, topic: str = TOPIC) -> SinkEvent:
    table = topic.rsplit(".", 1)[-1]
    return SinkEvent(topic, 0, version, {"id": key}, Op.DELETE, {"id": key}, None, version,
                     source_block(version, table))


def tombstone(key: int, topic: str = TOPIC) -> SinkEvent:
    return SinkEvent(topic, 0, 0, {"id": key}, None, None, None, None, {})


def truncate(version: int, topic: str = TOPIC) -> SinkEvent:
    table = topic.rsplit(".", 1)[-1]
    return SinkEvent(topic, 0, version, {}, Op.TRUNCATE, None, None, version, source_block(version, table))


def schema_record(columns: list[tuple[str, str]], key: tuple[str, ...] = ("id",), version: int = 1,
                  table: str = "orders") -> dict[str, Any]:
    return {"source": "shop", "db": "shop", "schema": "public", "table": table, "version": version,
            "ts_ms": 0, "ddl": None,
            "columns": [{"name": n, "type": t, "key": n in key, "nullable": n not in key} for n, t in columns]}


def rows(sink: SqlSink, columns: str = "*", table: str = "orders", order: str = "id") -> list[tuple]:
    with sink.engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(f"SELECT {columns} FROM {table} ORDER BY {order}")]


def column_types(sink: SqlSink, table: str, full: bool = False) -> dict[str, str]:
    """Column name -> the database's own type name, uppercased (``full``: MySQL's with length)."""
    with sink.engine.connect() as conn:
        if sink.engine.dialect.name == "sqlite":
            return {r[1]: r[2].upper() for r in conn.exec_driver_sql(f"PRAGMA table_info({table})")}
        schema = "DATABASE()" if sink.engine.dialect.name in ("mysql", "mariadb") else "current_schema()"
        type_column = "column_type" if full and sink.engine.dialect.name in ("mysql", "mariadb") else "data_type"
        result = conn.exec_driver_sql(
            f"SELECT column_name, {type_column} FROM information_schema.columns "
            f"WHERE table_schema = {schema} AND table_name = '{table}'")
        return {r[0]: str(r[1]).upper() for r in result}


def table_exists(sink: SqlSink, name: str) -> bool:
    with sink.engine.connect() as conn:
        if sink.engine.dialect.name == "sqlite":
            return conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).first() is not None
        schema = "DATABASE()" if sink.engine.dialect.name in ("mysql", "mariadb") else "current_schema()"
        return conn.exec_driver_sql(f"SELECT 1 FROM information_schema.tables WHERE table_schema = {schema} "
                                    f"AND table_name = '{name}'").first() is not None


class Sinks:
    """Makes started sinks on one target URL and stops them at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.started: list[SqlSink] = []
        self.records: dict[str, dict] = {}  # topic -> schema record, shared by every sink made here
        self.shapes: dict[tuple[str, int], dict] = {}  # (topic, version) -> the record rows name

    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        if version is not None and (topic, version) in self.shapes:
            return self.shapes[(topic, version)]
        return self.records.get(topic)

    def shapes_between(self, topic: str, after: int, before: int) -> list[dict]:
        return [self.shapes[(t, v)] for t, v in sorted(self.shapes) if t == topic and after < v < before]

    def __call__(self, generation: int | None = None, **config: Any) -> SqlSink:
        config.setdefault("name", "s1")
        sink = SqlSink(SqlSinkConfig(topics=["*"], url=self.url, **config), generation)
        sink.attach(RuntimeSinkContext(sink.config.name, schema_for=self.schema_for,
                                       shapes_between=self.shapes_between))
        sink.start()
        self.started.append(sink)
        return sink

    def stop(self) -> None:
        for sink in self.started:
            sink.stop()


@pytest.fixture(params=["sqlite", "duckdb"])
def make_sink(request, tmp_path):
    url = f"sqlite:///{tmp_path}/target.db" if request.param == "sqlite" else f"duckdb:///{tmp_path}/target.duckdb"
    sinks = Sinks(url)
    yield sinks
    sinks.stop()


# --- creating tables ----------------------------------------------------------------------------

def test_creates_table_from_schema_record_with_typed_columns(make_sink):
    make_sink.records[TOPIC] = schema_record([
        ("id", "integer"), ("total", "numeric(10,2)"), ("paid", "boolean"), ("placed", "timestamp with time zone"),
        ("due", "date"), ("note", "character varying(20)"), ("meta", "jsonb"), ("tags", "text[]"),
        ("blob", "bytea"), ("ratio", "double precision"), ("ref", "uuid")])
    sink = make_sink()
    sink.write([upsert(1, 10, total="12.50", paid=True, placed="2024-01-02T03:04:05.5Z", due="2024-02-29",
                       note="hi", meta={"a": [1, 2]}, tags=["x", "y"], blob=base64.b64encode(b"\x00\xff").decode(),
                       ratio=0.25, ref="7b0f7e0c-4f8a-4c1e-9a57-2f9a2f0e3a11")])
    types = column_types(sink, "orders__g1")
    assert types["id"] == "BIGINT" and types["__cdc_version"] == "BIGINT"
    assert types["total"].startswith(("NUMERIC(10", "DECIMAL(10"))
    assert types["paid"] == "BOOLEAN" and types["due"] == "DATE"
    assert types["blob"] in ("BLOB", "BYTEA")
    assert "JSON" in types["meta"] and "JSON" in types["tags"]
    total, paid, due, note, blob, ratio, ref, version = rows(
        sink, "total, paid, due, note, blob, ratio, ref, __cdc_version")[0]
    assert Decimal(str(total)) == Decimal("12.50") and bool(paid) is True
    assert str(due) == "2024-02-29" and note == "hi" and bytes(blob) == b"\x00\xff"
    assert ratio == 0.25 and ref == "7b0f7e0c-4f8a-4c1e-9a57-2f9a2f0e3a11" and version == 10
    if sink.engine.dialect.name == "duckdb":  # reading TIMESTAMPTZ into Python needs pytz
        (placed,) = rows(sink, "CAST(timezone('UTC', placed) AS VARCHAR)")[0]
        assert placed == "2024-01-02 03:04:05.5"
    else:
        (placed,) = rows(sink, "placed")[0]
        assert placed == "2024-01-02 03:04:05.500000"


def test_creates_table_from_values_when_there_is_no_schema_record(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, n=5, f=1.5, ok=True, s="text", j={"a": 1}, blank=None)])
    types = column_types(sink, "orders__g1")
    assert types["id"] == "BIGINT" and types["n"] == "BIGINT"
    assert types["f"] in ("DOUBLE", "DOUBLE PRECISION") and types["ok"] in ("BOOLEAN", "TINYINT")
    assert types["s"] in ("TEXT", "VARCHAR", "LONGTEXT") and types["blank"] in ("TEXT", "VARCHAR", "LONGTEXT")
    assert types["j"] in ("JSON", "JSONB", "LONGTEXT")  # MariaDB: JSON is LONGTEXT
    assert rows(sink, "id, n, f, s, blank, __cdc_version") == [(1, 5, 1.5, "text", None, 10)]


def test_table_name_template_and_view(make_sink):
    sink = make_sink(table_name="{db}_{schema}_{table}")
    sink.write([upsert(1, 10, v="a")])
    assert rows(sink, "id, v", table="shop_public_orders") == [(1, "a")]
    assert table_exists(sink, "shop_public_orders__g1")


# --- the version guard ------------------------------------------------------------------------

def test_replays_and_older_events_never_regress_a_key(make_sink):
    sink = make_sink()
    batch = [upsert(1, 10, v="a"), upsert(2, 11, v="b"), upsert(1, 12, v="a2")]
    sink.write(batch)
    sink.write(batch)  # a replay
    sink.write([upsert(1, 5, v="old"), upsert(2, 3, v="older")])  # older than what is stored
    sink.write([upsert(2, 11, v="same version, other value")])
    assert rows(sink, "id, v, __cdc_version") == [(1, "a2", 12), (2, "b", 11)]
    sink.write([upsert(2, 20, v="b2")])
    assert rows(sink, "id, v, __cdc_version") == [(1, "a2", 12), (2, "b2", 20)]


def test_newest_version_of_a_key_wins_within_a_batch(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 12, v="newest"), upsert(1, 10, v="older"), upsert(2, 1, v="x"), upsert(2, 2, v="y")])
    assert rows(sink, "id, v, __cdc_version") == [(1, "newest", 12), (2, "y", 2)]


# --- deletes, tombstones, truncates -----------------------------------------------------------------

def test_deletes_are_remembered_so_a_late_older_insert_does_not_resurrect(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, v="a"), upsert(2, 11, v="b")])
    sink.write([delete(1, 20)])
    assert rows(sink, "id, v") == [(2, "b")]
    sink.write([upsert(1, 15, v="late and older")])  # e.g. a replay of a snapshot row
    sink.write([upsert(1, 20, v="same version as the delete")])
    assert rows(sink, "id, v") == [(2, "b")]
    sink.write([upsert(1, 21, v="created again")])
    assert rows(sink, "id, v, __cdc_version") == [(1, "created again", 21), (2, "b", 11)]


def test_a_delete_older_than_the_row_leaves_it(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 30, v="a")])
    sink.write([delete(1, 20)])
    assert rows(sink, "id, v, __cdc_version") == [(1, "a", 30)]


def test_a_delete_before_the_table_exists_is_remembered(make_sink):
    sink = make_sink()
    sink.write([delete(1, 20)])
    sink.write([upsert(1, 10, v="old"), upsert(2, 11, v="b")])
    assert rows(sink, "id, v") == [(2, "b")]


def test_delete_and_insert_in_one_batch_keep_the_newest(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, v="a"), delete(1, 11), tombstone(1), upsert(1, 12, v="again"),
                upsert(2, 10, v="b"), delete(2, 11), tombstone(2)])
    assert rows(sink, "id, v, __cdc_version") == [(1, "again", 12)]


def test_tombstone_removes_the_key_whatever_its_version(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, v="a"), upsert(2, 11, v="b")])
    sink.write([tombstone(1), tombstone(3)])
    assert rows(sink, "id, v") == [(2, "b")]
    sink.write([upsert(1, 5, v="after the tombstone")])  # a tombstone remembers nothing
    assert rows(sink, "id, v") == [(1, "after the tombstone"), (2, "b")]


def test_truncate_clears_older_rows_and_sets_a_watermark(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, v="a"), upsert(2, 30, v="b")])
    sink.write([truncate(20)])
    assert rows(sink, "id, v") == [(2, "b")]  # 30 is after the truncate
    sink.write([upsert(3, 15, v="older than the truncate"), upsert(4, 25, v="newer")])
    assert rows(sink, "id, v") == [(2, "b"), (4, "newer")]
    sink.write([truncate(10)])  # an older truncate does not lower the watermark
    sink.write([upsert(5, 19, v="still older")])
    assert rows(sink, "id, v") == [(2, "b"), (4, "newer")]
    with sink.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT tbl, truncated_before FROM cdc_sink_state").all() == [("orders__g1", 20)]


def test_truncate_in_a_batch_applies_in_order(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, v="a"), truncate(20), upsert(2, 30, v="b"), upsert(1, 40, v="a again")])
    assert rows(sink, "id, v, __cdc_version") == [(1, "a again", 40), (2, "b", 30)]


def test_soft_delete_marks_rows_instead_of_removing_them(make_sink):
    sink = make_sink(soft_delete=True)
    sink.write([upsert(1, 10, v="a"), upsert(2, 11, v="b"), upsert(3, 12, v="c")])
    sink.write([delete(1, 20), tombstone(2)])
    assert [(i, v, bool(d), ver) for i, v, d, ver in rows(sink, "id, v, __cdc_deleted, __cdc_version")] == [
        (1, "a", True, 20), (2, "b", True, 11), (3, "c", False, 12)]
    sink.write([upsert(1, 15, v="older")])
    assert bool(rows(sink, "__cdc_deleted")[0][0]) is True
    sink.write([upsert(1, 21, v="revived"), truncate(19)])
    assert [(i, v, bool(d)) for i, v, d in rows(sink, "id, v, __cdc_deleted")] == [
        (1, "revived", False), (2, "b", True), (3, "c", True)]


# --- schema evolution ----------------------------------------------------------------------------

def test_new_column_from_a_schema_record_is_added_and_shown_by_the_view(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text")])
    sink = make_sink()
    sink.write([upsert(1, 10, v="a")])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text"), ("qty", "integer")], version=2)
    sink.write([upsert(2, 11, v="b", qty=3)])
    assert column_types(sink, "orders__g1")["qty"] == "BIGINT"
    assert rows(sink, "id, v, qty") == [(1, "a", None), (2, "b", 3)]


def test_unknown_column_in_a_value_is_added(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, v="a")])
    sink.write([upsert(2, 11, v="b", extra={"k": 1})])
    assert rows(sink, "id, v") == [(1, "a"), (2, "b")]
    assert column_types(sink, "orders__g1")["extra"] in ("JSON", "JSONB", "LONGTEXT")  # MariaDB: JSON is LONGTEXT


def test_a_dropped_column_stays_and_is_null_from_then_on(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text"), ("gone", "text")])
    sink = make_sink()
    sink.write([upsert(1, 10, v="a", gone="x")])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text")], version=2)
    sink.write([upsert(2, 11, v="b"), upsert(1, 12, v="a2")])
    assert rows(sink, "id, v, gone") == [(1, "a2", None), (2, "b", None)]


def _renamed(columns: list[tuple[str, str]], renamed_from: dict[str, str], version: int,
             table: str = "orders") -> dict[str, Any]:
    record = schema_record(columns, version=version, table=table)
    for column in record["columns"]:
        if column["name"] in renamed_from:
            column["renamed_from"] = renamed_from[column["name"]]
    return record


def test_a_renamed_column_keeps_its_values_or_stops_by_policy(make_sink):
    """A rename the source names (``renamed_from``): the rows written before it keep their values
    under the new name (evolve, ignore, rebuild: renamed in place), or the sink stops (fail)
    before writing a row of the new shape. A replayed row of the older shape lands under the new
    name without bringing the old column back, and a sink that starts afresh ends the same."""
    for policy in ("evolve", "ignore", "rebuild", "fail"):
        table = f"r_{policy}"
        topic = f"shop.public.{table}"
        make_sink.records[topic] = schema_record([("id", "integer"), ("c1", "text")], table=table)
        sink = make_sink(name=f"s_{policy}", schema_policy=policy)
        older = [upsert(1, 10, topic, c1="a"), upsert(2, 11, topic, c1="b")]
        sink.write(older)
        make_sink.records[topic] = _renamed([("id", "integer"), ("c1r", "text")], {"c1r": "c1"}, 2, table)
        newer = [upsert(3, 12, topic, c1r="c"), upsert(2, 13, topic, c1r="B")]
        if policy == "fail":
            with pytest.raises(SchemaChangeError, match="column c1 renamed to c1r.*schema_policy: evolve") as raised:
                sink.write(newer)
            assert not raised.value.retriable and not isinstance(raised.value, RebuildRequired)
            assert rows(sink, "id, c1", table=table) == [(1, "a"), (2, "b")]
            continue
        sink.write(newer)
        assert rows(sink, "id, c1r", table=table) == [(1, "a"), (2, "B"), (3, "c")]
        sink.write(older[:1])  # delivered again after a crash: older, so ignored, and no column c1 again
        assert "C1" not in column_types(sink, f"{table}__g1") and "c1" not in column_types(sink, f"{table}__g1")
        fresh = make_sink(name=f"f_{policy}", table_name="fresh_{table}", schema_policy=policy)
        fresh.write(older + newer)  # a bootstrap: made in the newest shape, older rows under the new name
        assert rows(fresh, "id, c1r", table=f"fresh_{table}") == [(1, "a"), (2, "B"), (3, "c")]


def test_a_table_that_skips_a_shape_follows_its_renames_first(make_sink):
    """Rows of one partition need not name every shape: the rows of shape 2 may all be in another
    partition, read after rows of shape 3. A table that follows shape 1 and gets rows of shape 3
    follows shape 2 first: its rename (c1 -> c2) keeps the values, and shape 3's (c2 -> c3) then
    applies; taken directly, shape 3 looks like a dropped c1 and a new, empty c3."""
    def named(event: SinkEvent, shape: int) -> SinkEvent:
        return event._replace(source={**event.source, "schema_version": shape})

    make_sink.shapes[(TOPIC, 100)] = schema_record([("id", "integer"), ("c1", "text")], version=100)
    make_sink.shapes[(TOPIC, 200)] = _renamed([("id", "integer"), ("c2", "text")], {"c2": "c1"}, 200)
    make_sink.records[TOPIC] = make_sink.shapes[(TOPIC, 100)]  # the newest shape when the table is made
    sink = make_sink(schema_policy="evolve")
    first, middle, last = (named(upsert(1, 100, c1="a"), 100), named(upsert(3, 200, c2="y"), 200),
                           named(upsert(2, 300, c3="x", n=1), 300))
    sink.write([first])
    make_sink.shapes[(TOPIC, 300)] = make_sink.records[TOPIC] = _renamed(
        [("id", "integer"), ("c3", "text"), ("n", "integer")], {"c3": "c2"}, 300)
    sink.write([last])  # shape 200's rows come later (another partition)
    assert rows(sink, "id, c3, n") == [(1, "a", None), (2, "x", 1)]
    sink.write([middle])
    assert rows(sink, "id, c3, n") == [(1, "a", None), (2, "x", 1), (3, "y", None)]
    assert not {"c1", "c2"} & {name.lower() for name in column_types(sink, "orders__g1")}
    # A table made in shape 3 (a bootstrap of the same topic) takes the rows of shapes 1 and 2
    # under c3 too: each column knows every name it had, not only the one just before.
    fresh = make_sink(name="fresh", table_name="fresh_{table}", schema_policy="evolve")
    fresh.write([first, middle, last])
    assert rows(fresh, "id, c3, n", table="fresh_orders") == [(1, "a", None), (2, "x", 1), (3, "y", None)]
    assert not {"c1", "c2"} & {name.lower() for name in column_types(fresh, "fresh_orders__g1")}


def test_the_renames_of_skipped_shapes_chain_but_their_columns_are_not_taken(make_sink):
    """A shape in between may list columns only a later shape has (a MySQL source resuming past
    DDL publishes the catalog's columns at the first statement): the table takes the renames of
    the shapes it skips, chained (d1 -> d2 -> d3), and the columns of the shape its rows name."""
    def named(event: SinkEvent, shape: int) -> SinkEvent:
        return event._replace(source={**event.source, "schema_version": shape})

    make_sink.shapes[(TOPIC, 100)] = make_sink.records[TOPIC] = schema_record(
        [("id", "integer"), ("c1", "text"), ("d1", "text")], version=100)
    sink = make_sink(schema_policy="evolve")
    sink.write([named(upsert(1, 100, c1="a", d1="p"), 100)])
    make_sink.shapes[(TOPIC, 150)] = _renamed([("id", "integer"), ("c2", "text"), ("d3", "text"), ("n", "integer")],
                                              {"c2": "c1"}, 150)
    make_sink.shapes[(TOPIC, 200)] = _renamed([("id", "integer"), ("c2", "text"), ("d2", "text")], {"d2": "d1"}, 200)
    make_sink.shapes[(TOPIC, 300)] = make_sink.records[TOPIC] = _renamed(
        [("id", "integer"), ("c2", "text"), ("d3", "text"), ("n", "integer")], {"d3": "d2"}, 300)
    sink.write([named(upsert(2, 300, c2="b", d3="q", n=1), 300)])
    assert rows(sink, "id, c2, d3, n") == [(1, "a", "p", None), (2, "b", "q", 1)]
    assert not {"c1", "d1", "d2"} & {name.lower() for name in column_types(sink, "orders__g1")}


def test_a_rebuild_after_a_rename_keeps_the_values_of_rows_written_before_it(make_sink):
    """The topic holds rows written before a rename under the old name: a later rebuild writes
    them under the name the live table took."""
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("c1", "text"), ("n", "integer")])
    sink = make_sink(schema_policy="rebuild")
    history = [upsert(1, 10, c1="a", n=1)]
    sink.write(history)
    make_sink.records[TOPIC] = _renamed([("id", "integer"), ("c1r", "text"), ("n", "integer")], {"c1r": "c1"}, 2)
    history.append(upsert(2, 11, c1r="b", n=2))
    sink.write(history[1:])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("c1r", "text"), ("n", "jsonb")], version=3)
    history.append(upsert(3, 12, c1r="c", n={"x": 1}))
    with pytest.raises(RebuildRequired):
        sink.write(history[2:])
    rebuild = make_sink(schema_policy="rebuild")
    rebuild.open_generation(rebuild.current_generation() + 1)
    rebuild.write(history)
    rebuild.switch_generation(2)
    assert rows(sink, "id, c1r") == [(1, "a"), (2, "b"), (3, "c")]


def test_widening_a_type_is_not_a_change(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "character varying(10)")])
    sink = make_sink()
    sink.write([upsert(1, 10, v="a")])
    make_sink.records[TOPIC] = schema_record([("id", "bigint"), ("v", "character varying(99)")], version=2)
    sink.write([upsert(2, 11, v="b")])
    assert rows(sink, "id, v") == [(1, "a"), (2, "b")]


def _change_type(make_sink, policy: str) -> SqlSink:
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text"), ("n", "integer")])
    sink = make_sink(schema_policy=policy)
    sink.write([upsert(1, 10, v="a", n=1)])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text"), ("n", "jsonb")], version=2)
    return sink


def test_incompatible_change_fails_with_table_column_and_types(make_sink):
    sink = _change_type(make_sink, "fail")
    with pytest.raises(SchemaChangeError) as raised:
        sink.write([upsert(2, 11, v="b", n={"x": 1})])
    assert not isinstance(raised.value, RebuildRequired)
    assert "orders__g1" in str(raised.value) and "column n: integer -> jsonb" in str(raised.value)
    assert rows(sink, "id") == [(1,)]  # nothing of the batch was written


def test_incompatible_change_asks_for_a_rebuild(make_sink):
    sink = _change_type(make_sink, "rebuild")
    with pytest.raises(RebuildRequired, match="column n: integer -> jsonb"):
        sink.write([upsert(2, 11, v="b", n={"x": 1})])


def test_incompatible_change_ignored_writes_the_columns_that_fit(make_sink):
    sink = _change_type(make_sink, "ignore")
    sink.write([upsert(2, 11, v="b", n={"x": 1}), upsert(1, 12, v="a2", n={"y": 2})])
    assert rows(sink, "id, v, n") == [(1, "a2", None), (2, "b", None)]


def test_key_change_is_incompatible(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text")])
    sink = make_sink()
    sink.write([upsert(1, 10, v="a")])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text")], key=("id", "v"), version=2)
    with pytest.raises(SchemaChangeError, match=r"\(primary key\): id -> id, v"):
        sink.write([upsert(2, 11, v="b")])


def test_key_change_ignored_keeps_the_table_key(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text")])
    sink = make_sink(schema_policy="ignore")
    sink.write([upsert(1, 10, v="a")])
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("v", "text")], key=("id", "v"), version=2)

    def keyed(version: int, v: str, op: Op = Op.CREATE) -> SinkEvent:
        after = None if op is Op.DELETE else {"id": 1, "v": v}
        return SinkEvent(TOPIC, 0, version, {"id": 1, "v": v}, op, {"id": 1, "v": v}, after, version,
                         source_block(version))

    sink.write([keyed(12, "c"), keyed(11, "b")])  # two event keys, one table row: the newest wins
    assert rows(sink, "id, v, __cdc_version") == [(1, "c", 12)]
    sink.write([keyed(13, "c", Op.DELETE)])
    assert rows(sink, "id") == []


def test_rebuild_after_an_incompatible_change_switches_to_the_new_types(make_sink):
    """What the runtime does on RebuildRequired: a new generation from the newest schema, the
    topic replayed into it, then the switch; readers see the new column type."""
    sink = _change_type(make_sink, "rebuild")
    history = [upsert(1, 10, v="a", n=1), upsert(2, 11, v="b", n={"x": 1})]
    with pytest.raises(RebuildRequired):
        sink.write(history[1:])
    rebuild = make_sink(schema_policy="rebuild")
    rebuild.open_generation(rebuild.current_generation() + 1)
    rebuild.write(history)
    rebuild.switch_generation(2)
    sink.write([upsert(3, 12, v="c", n=[3])])  # the live sink follows, and its table fits now
    sink.drop_generation(1)
    got = rows(sink, "id, v, n")
    assert [(i, v) for i, v, _ in got] == [(1, "a"), (2, "b"), (3, "c")]
    assert [n if isinstance(n, (dict, list, int)) else json.loads(n) for _, _, n in got] == [
        1, {"x": 1}, [3]]
    assert "JSON" in column_types(sink, "orders__g2")["n"] or column_types(sink, "orders__g2")["n"] == "LONGTEXT"


# --- errors ------------------------------------------------------------------------------------

def test_a_value_that_does_not_fit_names_table_key_and_column(make_sink):
    make_sink.records[TOPIC] = schema_record([("id", "integer"), ("blob", "bytea")])
    sink = make_sink()
    with pytest.raises(PermanentError) as raised:  # a batch: at least the table
        sink.write([upsert(1, 10, blob="AP8="), upsert(7, 11, blob="not base64!")])
    assert not raised.value.retriable and "orders__g1" in str(raised.value)
    with pytest.raises(PermanentError) as raised:  # a batch of one, as the runtime's split makes it
        sink.write([upsert(7, 11, blob="not base64!")])
    assert 'orders__g1: key {"id":7}: column blob' in str(raised.value)
    assert rows(sink, "id") == []


def test_a_busy_sqlite_database_is_retriable(tmp_path):
    from sinks.sql.errors import is_retriable

    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0)
    with pytest.raises(sqlite3.OperationalError) as raised:
        other.execute("CREATE TABLE t (a)")
    holder.rollback()
    assert is_retriable(raised.value)


def test_an_unreachable_server_is_retriable():
    sink = SqlSink(SqlSinkConfig(name="s", topics=["*"], url="postgresql://nobody@127.0.0.1:9/none"))
    with pytest.raises(RetriableError):
        sink.start()


# --- generations -----------------------------------------------------------------------------

def test_generations_open_switch_drop_behind_the_view(make_sink):
    live = make_sink()
    assert live.current_generation() == 1
    live.write([upsert(1, 10, v="a"), upsert(2, 11, v="b")])
    other = "shop.public.customers"
    live.write([upsert(5, 12, topic=other, name="c")])

    rebuild = make_sink()
    rebuild.open_generation(2)
    assert rebuild.current_generation() == 1  # readers stay on 1
    rebuild.write([upsert(1, 10, v="a"), upsert(2, 11, v="b"), upsert(2, 13, v="b2")])
    assert rows(live, "id, v") == [(1, "a"), (2, "b")]
    assert rows(rebuild, "id, v", table="orders__g2") == [(1, "a"), (2, "b2")]

    rebuild.switch_generation(2)
    assert live.current_generation() == rebuild.current_generation() == 2
    assert rows(live, "id, v") == [(1, "a"), (2, "b2")]
    # customers had no rows in the rebuild: it got an empty table, and its view follows
    assert table_exists(live, "customers__g2") and rows(live, table="customers") == []

    live.write([upsert(3, 14, v="c")])  # a sink following the current generation moves along
    assert rows(live, "id, v") == [(1, "a"), (2, "b2"), (3, "c")]
    with pytest.raises(PermanentError, match="readers see"):
        live.drop_generation(2)
    live.drop_generation(1)
    assert not table_exists(live, "orders__g1") and not table_exists(live, "customers__g1")
    assert table_exists(live, "orders__g2")
    with pytest.raises(PermanentError, match="current"):
        live.open_generation(2)


def test_open_generation_starts_empty_even_after_an_aborted_rebuild(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, v="a")])
    sink.open_generation(2)
    sink.write([upsert(9, 10, v="half a rebuild")])
    sink.open_generation(2)  # again, from scratch
    sink.write([upsert(1, 10, v="a")])
    assert rows(sink, "id, v", table="orders__g2") == [(1, "a")]
    with sink.engine.connect() as conn:
        states = dict(conn.exec_driver_sql("SELECT generation, state FROM cdc_sink_generations").all())
    assert states == {1: "current", 2: "open"}


def test_a_sink_built_for_a_generation_writes_into_it(make_sink):
    make_sink().write([upsert(1, 10, v="a")])
    pinned = make_sink(generation=3)
    pinned.write([upsert(2, 10, v="b")])
    assert rows(pinned, "id, v", table="orders__g3") == [(2, "b")]
    assert rows(pinned, "id, v") == [(1, "a")]


def test_generation_methods_need_start():
    sink = SqlSink(SqlSinkConfig(name="s", topics=["*"], url="sqlite://"))
    with pytest.raises(PermanentError, match="start"):
        sink.current_generation()
    with pytest.raises(PermanentError, match="start"):
        sink.write([upsert(1, 1)])


# --- deletes are remembered for delete_memory_hours -----------------------------------------------

def test_deletes_are_forgotten_after_delete_memory_hours(make_sink):
    import time

    forgetful = make_sink(delete_memory_hours=0.0002)  # 0.72 s
    forgetful.write([upsert(1, 10, v="a"), delete(1, 20)])
    with forgetful.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM cdc_sink_deletes").scalar() == 1
    time.sleep(1.0)
    forgetful.write([upsert(2, 30, v="b")])  # prunes before the next write
    forgetful.write([upsert(1, 15, v="older than the forgotten delete")])
    assert rows(forgetful, "id, v") == [(1, "older than the forgotten delete"), (2, "b")]
    with forgetful.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM cdc_sink_deletes").scalar() == 0


# --- targets -----------------------------------------------------------------------------------

def test_target_schema(tmp_path):
    sink = SqlSink(SqlSinkConfig(name="s", topics=["*"], url=f"duckdb:///{tmp_path}/s.duckdb", schema="analytics"))
    sink.start()
    try:
        sink.write([upsert(1, 10, v="a")])
        with sink.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT id, v FROM analytics.orders").all() == [(1, "a")]
            assert conn.exec_driver_sql("SELECT count(*) FROM analytics.cdc_sink_generations").scalar() == 1
    finally:
        sink.stop()
    from cdc.errors import ConfigError

    with pytest.raises(ConfigError, match="SQLite has no schemas"):
        SqlSink(SqlSinkConfig(name="s", topics=["*"], url=f"sqlite:///{tmp_path}/s.db", schema="x")).start()


def test_mysql_source_types(make_sink):
    make_sink.records[TOPIC] = schema_record([
        ("id", "int unsigned"), ("amount", "decimal(12,3)"), ("at", "timestamp(6)"), ("local_at", "datetime(3)"),
        ("span", "time(2)"), ("state", "enum('new','paid')"), ("flags", "set('a','b')"), ("bits", "bit(8)"),
        ("year", "year"), ("huge", "bigint unsigned")])
    sink = make_sink()
    sink.write([upsert(1, 10, amount="-12.500", at="2024-01-02T03:04:05.5Z", local_at="2024-01-02T03:04:05.120",
                       span="-838:59:59.00", state="paid", flags=["a", "b"], bits=5, year=2024,
                       huge=18446744073709551615)])
    amount, span, state, flags, bits, year, huge = rows(sink, "amount, span, state, flags, bits, year, huge")[0]
    assert Decimal(str(amount)) == Decimal("-12.5") and span == "-838:59:59.00" and state == "paid"
    assert json.loads(flags) == ["a", "b"] and bits == "5" and year == 2024
    if sink.engine.dialect.name == "sqlite":  # beyond int64, SQLite's NUMERIC affinity keeps a REAL
        assert huge == float(18446744073709551615)
    else:
        assert huge == Decimal(18446744073709551615)


@pytest.mark.parametrize(("name", "family"), [
    ("integer", "integer"), ("bigint", "integer"), ("int unsigned", "integer"), ("bigint unsigned", "numeric"),
    ("numeric(10,2)", "numeric"), ("decimal(10,2) unsigned", "numeric"), ("double precision", "float"),
    ("real", "float"), ("boolean", "boolean"), ("date", "date"), ("time without time zone", "time"),
    ("time(6)", "text"), ("time with time zone", "text"), ("timestamp(3) without time zone", "timestamp"),
    ("datetime(6)", "timestamp"), ("timestamp with time zone", "timestamptz"), ("timestamp(6)", "timestamptz"),
    ("jsonb", "json"), ("text[]", "json"), ("_int4", "json"), ("tstzrange", "json"), ("hstore", "json"),
    ("bytea", "binary"), ("longblob", "binary"), ("varbinary(16)", "binary"), ("uuid", "uuid"),
    ("character varying(20)", "text"), ("enum('a','b')", "text"), ("money", "text"), ("mood", "text")])
def test_source_type_families(name, family):
    from sinks.sql.types import parse_type

    assert parse_type(name)[0].value == family


# The changes into a float that ``evolve`` makes in place (the target's cast is the source's, see
# evolve.casts_alike; tests/integration/test_sql_evolve_cast.py runs them end to end), per target.
@pytest.mark.parametrize(("old", "new", "postgresql", "mysql", "duckdb"), [
    ("numeric(12,2)", "double precision", True, True, True),
    ("decimal(15,4)", "double", True, True, True),
    ("numeric(16,2)", "double precision", True, True, False),   # DuckDB would round twice
    ("numeric", "double precision", True, True, False),
    ("integer", "double precision", True, True, True),
    ("bigint unsigned", "double", True, True, False),            # DECIMAL(20,0) there
    ("numeric(12,2)", "real", False, False, False),              # a 4-byte float
    ("decimal(12,2)", "float", False, False, False),             # MySQL's float: 4 bytes
    ("decimal(12,2)", "double(10,2)", False, False, False),      # rounds to its scale
    ("double precision", "numeric(12,2)", False, False, False),
    ("text", "double precision", False, False, False),
    ("date", "double precision", False, False, False)])
def test_evolve_casts_into_a_double_as_the_source_did(old, new, postgresql, mysql, duckdb):
    from sinks.sql.evolve import widens

    assert [widens(old, new, kind) for kind in ("postgresql", "mysql", "duckdb", "sqlite")] == [
        postgresql, mysql, duckdb, False]


# --- config -----------------------------------------------------------------------------------

def test_config_accepts_schema_and_checks_the_template():
    config = SqlSinkConfig.model_validate({"name": "w", "type": "sql", "topics": ["x"], "url": "sqlite://",
                                           "schema": "analytics"})
    assert config.target_schema == "analytics"
    with pytest.raises(ValueError, match="unknown placeholder"):
        SqlSinkConfig(name="w", topics=["x"], url="sqlite://", table_name="{tabel}")
    with pytest.raises(ValueError, match="extra"):
        SqlSinkConfig.model_validate({"name": "w", "topics": ["x"], "url": "sqlite://", "soft": True})


def test_registered_as_the_sql_sink_plugin():
    from cdc import plugins

    plugins.clear_cache()
    assert plugins.sink_plugin("sql") is SqlSink


def test_switching_to_a_generation_never_opened_is_refused(make_sink):
    sink = make_sink()
    sink.write([upsert(1, 10, v="a")])
    with pytest.raises(PermanentError, match="never opened"):
        sink.switch_generation(7)
    sink.switch_generation(1)  # the current one: nothing to do
    assert rows(sink, "id, v") == [(1, "a")]


# --- reading back (cdc.api.ReadableSink) ---------------------------------------------------------

def test_read_rows_gives_back_the_live_rows_of_the_current_generation_in_key_order(make_sink):
    sink = make_sink(soft_delete=True)
    sink.write([upsert(k, 10 + k, op=Op.CREATE, note=f"n{k}") for k in (10, 2, 9, 1)] + [delete(2, 30)])
    read = sink.read_rows(TOPIC)
    assert [r.key for r in read] == [(1,), (9,), (10,)]  # soft-deleted 2 left out; 10 after 9
    assert [r.row for r in read][0] == {"id": 1, "note": "n1"}  # no bookkeeping columns
    assert [r.key for r in sink.read_rows(TOPIC, after=(1,), limit=1)] == [(9,)]
    assert sink.read_rows("shop.public.nothing") == []
    sink.open_generation(2)  # readers still see generation 1
    sink.write([upsert(5, 50, op=Op.CREATE, note="n5")])
    assert [r.key for r in sink.read_rows(TOPIC)] == [(1,), (9,), (10,)]
    sink.switch_generation(2)
    assert [r.key for r in sink.read_rows(TOPIC)] == [(5,)]
