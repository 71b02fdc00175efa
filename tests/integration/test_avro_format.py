"""The avro format against the stack's schema registry: Confluent's wire format, Debezium's Avro
schema names and logical types, subjects per TopicNameStrategy, schemas that evolve with the
table, and the sink runtime reading it back to the json format's envelope."""

from __future__ import annotations

import uuid
from io import BytesIO

import fastavro
import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc.errors import FormatError
from cdc.events import ChangeEvent, Column, Op, SchemaChange
from cdc.formats import avro, make_encoder
from cdc.serde import EnvelopeEncoder, Record
from cdc.sink_events import decode_record
from tests.unit.test_debezium_json import (
    MY,
    MY_COLUMNS,
    MY_ROW,
    PG,
    PG_COLUMNS,
    PG_ROW,
    _event,
    _record,
    _same_instants,
)

pytestmark = pytest.mark.registry


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"  # subjects are per topic: a fresh prefix per test


@pytest.fixture(autouse=True)
def reading_registry(registry_url):
    avro.use_registry(registry_url)
    yield
    avro.use_registry(None)


def _encoder(registry_url, prefix, connector, table, columns, version=100):
    encoder = make_encoder("avro", connector, "src", prefix, registry_url=registry_url)
    encoder.learn([SchemaChange(table, columns, version, 0)])
    encoder.schema_versions[table] = version
    return encoder


def _framed(data: bytes, client: SchemaRegistryClient) -> tuple[dict, dict]:
    """(writer schema, datum) of a Confluent-framed record, read with fastavro alone."""
    assert data[0] == 0
    schema = orjson.loads(client.get_schema(int.from_bytes(data[1:5], "big")).schema_str)
    return schema, fastavro.schemaless_reader(BytesIO(data[5:]), fastavro.parse_schema(schema), None)


def _fields(record_schema: dict) -> dict:
    return {f["name"]: f for f in record_schema["fields"]}


def test_postgres_records_are_confluent_framed_avro_with_debeziums_schema(registry_url, prefix):
    client = SchemaRegistryClient({"url": registry_url})
    [record] = _encoder(registry_url, prefix, "postgresql", PG, PG_COLUMNS).encode(
        [_event(PG, PG_ROW, fields={"txId": 5, "lsn": 99})], now_ms=5)
    topic = f"{prefix}.public.items"
    assert record.topic == topic
    value_schema, value = _framed(record.value, client)
    key_schema, key = _framed(record.key, client)
    # TopicNameStrategy: the ids in the records are the latest of <topic>-key / <topic>-value
    assert client.get_latest_version(f"{topic}-value").schema_id == int.from_bytes(record.value[1:5], "big")
    assert client.get_latest_version(f"{topic}-key").schema_id == int.from_bytes(record.key[1:5], "big")
    assert (value_schema["namespace"], value_schema["name"]) == (topic, "Envelope")
    assert (key_schema["namespace"], key_schema["name"]) == (topic, "Key") and key == {"id": 7}
    before_type = _fields(value_schema)["before"]["type"]
    assert before_type[0] == "null" and before_type[1]["name"] == "Value"
    assert _fields(value_schema)["after"]["type"] == ["null", f"{topic}.Value"]  # defined once, then named
    columns = _fields(before_type[1])
    price = columns["price"]["type"][1]
    assert (price["type"], price["logicalType"], price["precision"], price["scale"]) == ("bytes", "decimal", 10, 2)
    assert price["connect.name"] == "org.apache.kafka.connect.data.Decimal"
    assert columns["ts"]["type"][1] == {"type": "long", "connect.version": 1,
                                        "connect.name": "io.debezium.time.MicroTimestamp"}
    assert columns["d"]["type"][1]["connect.name"] == "io.debezium.time.Date"
    assert columns["id"]["type"] == "int"  # a key column: not optional
    assert value["after"]["price"] == value["after"]["price"].__class__("-12.50")  # fastavro: a Decimal
    assert value["after"]["ts"] == 1_704_164_645_500_000 and value["after"]["d"] == -4230
    assert value["after"]["b"] == b"\x00\xff"
    assert value["source"]["txId"] == 5 and value["source"]["cdc_version"] == 123
    assert value["op"] == "c"


@pytest.mark.parametrize("connector, table, columns, row", [
    ("postgresql", PG, PG_COLUMNS, {k: v for k, v in PG_ROW.items() if k not in ("iv", "m")}),
    ("mysql", MY, MY_COLUMNS, {k: v for k, v in MY_ROW.items() if k not in ("b1",)}),
])
def test_sinks_see_the_same_event_as_in_the_json_format(registry_url, prefix, connector, table, columns, row):
    events = [_event(table, row, fields={"txId": 1, "lsn": 2} if connector == "postgresql" else
                     {"file": "f", "pos": 1, "row": 0}),
              _event(table, {"id": row["id"]}, Op.DELETE, before={"id": row["id"]})]
    plain = EnvelopeEncoder(connector, "src", prefix)
    plain.schema_versions[table] = 100
    as_json = [decode_record(_record(r, i)) for i, r in enumerate(plain.encode(events, now_ms=5))]
    encoded = _encoder(registry_url, prefix, connector, table, columns).encode(events, now_ms=5)
    assert encoded[-1].value is None  # the delete's tombstone
    as_avro = [decode_record(_record(r, i)) for i, r in enumerate(encoded)]
    for a, b in zip(as_json, as_avro, strict=True):
        assert (a.topic, a.key, a.op, a.version, a.ts_ms) == (b.topic, b.key, b.op, b.version, b.ts_ms)
        assert b.source.get("schema_version") == a.source.get("schema_version")
        if a.after is not None:  # an Avro record has every field: a column the row lacks reads as null
            assert b.after == _same_instants(dict.fromkeys(c.name for c in columns) | a.after)
        if a.before is not None:
            assert {k: v for k, v in b.before.items() if v is not None} == a.before


def test_a_new_shape_registers_a_new_version_and_old_records_still_read(registry_url, prefix):
    client = SchemaRegistryClient({"url": registry_url})
    columns = (Column("id", "integer", True, False), Column("name", "text"))
    encoder = _encoder(registry_url, prefix, "postgresql", PG, columns)
    [first] = encoder.encode([_event(PG, {"id": 1, "name": "a"})], now_ms=5)
    wider = (*columns, Column("price", "numeric(10,2)"))
    encoder.learn([SchemaChange(PG, wider, 101, 0)])
    encoder.schema_versions[PG] = 101
    [second] = encoder.encode([_event(PG, {"id": 2, "name": "b", "price": "1.50"})], now_ms=5)
    subject = f"{prefix}.public.items-value"
    assert client.get_versions(subject) == [1, 2]
    assert first.value[1:5] != second.value[1:5]
    assert decode_record(_record(first)).after == {"id": 1, "name": "a"}
    assert decode_record(_record(second, 1)).after == {"id": 2, "name": "b", "price": "1.50"}
    assert decode_record(_record(second, 1)).source["schema_version"] == 101


def test_a_change_the_registry_refuses_stops_the_encoder_with_the_subject_named(registry_url, prefix):
    from cdc.errors import SchemaRegistryError
    from cdc.serde import EmitError

    encoder = _encoder(registry_url, prefix, "postgresql", PG, (Column("id", "integer", True, False),
                                                                Column("n", "text")))
    encoder.encode([_event(PG, {"id": 1, "n": "a"})], now_ms=5)
    # n text -> n integer: an old record cannot be read with the new schema (BACKWARD)
    encoder.learn([SchemaChange(PG, (Column("id", "integer", True, False), Column("n", "integer")), 101, 0)])
    encoder.schema_versions[PG] = 101
    with pytest.raises(EmitError) as failed:
        encoder.encode([_event(PG, {"id": 2, "n": 5})], now_ms=5)
    cause = failed.value.cause
    assert failed.value.topic == f"{prefix}.public.items"
    assert isinstance(cause, SchemaRegistryError) and not cause.retriable
    assert f"{prefix}.public.items-value" in str(cause)


def test_a_column_avro_cannot_name_is_a_typed_error(registry_url, prefix):
    from cdc.serde import EmitError

    encoder = _encoder(registry_url, prefix, "postgresql", PG, (Column("id", "integer", True, False),
                                                                Column("unit price", "text")))
    with pytest.raises(EmitError) as failed:
        encoder.encode([_event(PG, {"id": 1, "unit price": "a"})], now_ms=5)
    assert isinstance(failed.value.cause, FormatError) and "'unit price'" in str(failed.value.cause)


def test_an_avro_record_with_no_registry_configured_is_a_typed_error(registry_url, prefix):
    [record] = _encoder(registry_url, prefix, "postgresql", PG, PG_COLUMNS).encode([_event(PG, PG_ROW)], now_ms=5)
    avro.use_registry(None)
    with pytest.raises(FormatError, match="schema_registry"):
        decode_record(_record(record))


def test_cdc_tail_prints_avro_records_as_their_json_envelopes(registry_url, prefix):
    from cdc.runtime.cli import format_record

    row = {k: v for k, v in PG_ROW.items() if k not in ("iv", "m")}
    events = [_event(PG, row), _event(PG, {"id": 7}, Op.DELETE, before={"id": 7})]
    plain = EnvelopeEncoder("postgresql", "src", prefix)
    as_json = [format_record(_record(r, i)) for i, r in enumerate(plain.encode(events, now_ms=5))]
    as_avro = [format_record(_record(r, i)) for i, r in
               enumerate(_encoder(registry_url, prefix, "postgresql", PG, PG_COLUMNS).encode(events, now_ms=5))]
    assert as_avro[0].splitlines()[0] == f'{prefix}.public.items[0]@0 c {{"id":7}} version=123'
    assert [a.splitlines()[0] for a in as_avro] == [j.splitlines()[0] for j in as_json]
    after = orjson.loads(as_avro[0].splitlines()[1].split(": ", 1)[1])
    assert after == dict.fromkeys(c.name for c in PG_COLUMNS) | _same_instants(row)


def test_a_not_null_column_added_with_a_default_is_a_compatible_new_version(registry_url, prefix):
    """ALTER TABLE ... ADD COLUMN c ... NOT NULL DEFAULT ...: the default goes into the Avro
    schema (as Debezium's does), so the BACKWARD registry accepts the new version."""
    client = SchemaRegistryClient({"url": registry_url})
    columns = (Column("id", "integer", True, False), Column("name", "text"))
    encoder = _encoder(registry_url, prefix, "postgresql", PG, columns)
    encoder.encode([_event(PG, {"id": 1, "name": "a"})], now_ms=5)
    wider = (*columns, Column("qty", "integer", False, False, 0), Column("price", "numeric(10,2)", False, False, "1.50"),
             Column("d", "date", False, False, "2024-01-02"))
    encoder.learn([SchemaChange(PG, wider, 101, 0)])
    encoder.schema_versions[PG] = 101
    [record] = encoder.encode([_event(PG, {"id": 2, "name": "b", "qty": 3, "price": "2.00", "d": "2024-05-06"})],
                              now_ms=5)
    schema, _ = _framed(record.value, client)
    row = _fields(_fields(schema)["before"]["type"][1])
    assert row["qty"]["default"] == 0 and row["d"]["default"] == 19724
    assert row["price"]["default"] == "\x00\x96"  # 150 unscaled, as Avro JSON bytes
    assert client.get_versions(f"{prefix}.public.items-value") == [1, 2]
    assert decode_record(_record(record)).after == {"id": 2, "name": "b", "qty": 3, "price": "2.00", "d": "2024-05-06"}


@pytest.mark.kafka
@pytest.mark.postgres
def test_a_table_change_registers_a_new_version_and_the_sql_sink_follows(tmp_path, pg_dsn, pg_admin_dsn,
                                                                         kafka_bootstrap, registry_url):
    """End to end: `cdc run` with format avro, a PostgreSQL table altered while it streams
    (ADD COLUMN ... NOT NULL DEFAULT), our SQL sink keeping a target equal to it; the value
    subject gets a second version. (The PostgreSQL source's shapes mark non-key columns
    nullable, so the new field is optional here; the default's own path is the test above.)"""
    import time

    import psycopg2

    from tests.daemon import cdc_process, stop_daemon
    from tests.integration.pg_capture import execute

    target = f"target_{uuid.uuid4().hex[:8]}"
    execute(pg_admin_dsn, f'CREATE DATABASE "{target}"')
    target_dsn = pg_admin_dsn.rsplit("/", 1)[0] + "/" + target
    execute(pg_dsn, "CREATE TABLE items (id integer PRIMARY KEY, name text, price numeric(10,2))")
    execute(pg_dsn, "INSERT INTO items SELECT g, 'n' || g, g * 1.25 FROM generate_series(1, 5) g")
    prefix = f"av_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {prefix}}}\n  format: avro\n"
        f"  schema_registry: {{url: '{registry_url}'}}\n"
        f"sources:\n  - {{name: pg, type: postgres, dsn: '{pg_dsn}', tables: ['public.items'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1}}\n"
        f"sinks:\n  - {{name: wh, type: sql, url: '{target_dsn.replace('postgresql://', 'postgresql+psycopg2://', 1)}', "
        f"topics: ['{prefix}.public.*'], batch_wait_ms: 50}}\n"
        f"http: null\n")
    daemon = cdc_process(config, "run", log="cdc.log")

    def rows(dsn, columns):
        conn = psycopg2.connect(dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT {columns} FROM items ORDER BY id")
                return cur.fetchall()
        except psycopg2.errors.Error:
            return None
        finally:
            conn.close()

    def wait_equal(columns):
        deadline = time.monotonic() + 120
        while (actual := rows(target_dsn, columns)) != (expected := rows(pg_dsn, columns)):
            assert daemon.poll() is None, (tmp_path / "cdc.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{expected} != {actual}\n{(tmp_path / 'cdc.log').read_text()[-3000:]}"
            time.sleep(0.5)

    try:
        wait_equal("id, name, price")
        execute(pg_dsn, "ALTER TABLE items ADD COLUMN qty integer NOT NULL DEFAULT 7")
        execute(pg_dsn, "INSERT INTO items VALUES (6, 'six', 6.00, 3)")
        execute(pg_dsn, "UPDATE items SET qty = 9, price = 0.50 WHERE id = 2")
        execute(pg_dsn, "DELETE FROM items WHERE id = 3")
        wait_equal("id, name, price, qty")
        client = SchemaRegistryClient({"url": registry_url})
        assert client.get_versions(f"{prefix}.public.items-value") == [1, 2]
    finally:
        stop_daemon(daemon)
        execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{target}" WITH (FORCE)')


def test_a_truncate_has_a_key_that_reads_as_null_and_the_sinks_read_it_as_a_truncate(registry_url, prefix):
    """Debezium's truncate has no key; our topics are compacted and refuse one without (the
    capture stopped at a TRUNCATE). Its key is Avro null under a schema of its own."""
    from cdc.sink_events import decode_key

    client = SchemaRegistryClient({"url": registry_url})
    encoder = _encoder(registry_url, prefix, "postgresql", PG, PG_COLUMNS)
    records = []
    encoder.emit([ChangeEvent(Op.TRUNCATE, PG, None, None, None, 5, 0)], None, None,
                 lambda topic, value, key, headers: records.append((topic, value, key)), now_ms=0)
    [(topic, value, key)] = records
    schema, datum = _framed(key, client)
    assert schema == "null" and datum is None and decode_key(key) == {}
    assert decode_record(_record(Record(topic, key, value), 0)).op == Op.TRUNCATE
