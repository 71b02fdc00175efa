"""The debezium-json format: Connect JSON shapes and Debezium's encodings, and the sink runtime's
decoding of it back to the json format's envelope (so sinks read either format unchanged)."""

from __future__ import annotations

import base64
from decimal import Decimal

import orjson
import pytest

from cdc.events import ChangeEvent, Column, Op, SchemaChange, SnapshotMarker, TableId, TransactionInfo
from cdc.formats import make_encoder
from cdc.formats.connect_types import DebeziumOptions
from cdc.formats.connect_values import java_big_integer_bytes
from cdc.log.base import LogRecord
from cdc.serde import EnvelopeEncoder
from cdc.sink_events import decode_record

PG = TableId("shop", "public", "items")
PG_COLUMNS = (Column("id", "integer", True, False), Column("price", "numeric(10,2)"), Column("n", "numeric"),
              Column("d", "date"), Column("t", "time without time zone"), Column("t3", "time(3) without time zone"),
              Column("ts", "timestamp without time zone"), Column("ts3", "timestamp(3) without time zone"),
              Column("tz", "timestamp with time zone"), Column("j", "jsonb"), Column("u", "uuid"),
              Column("b", "bytea"), Column("flag", "boolean"), Column("r", "real"), Column("tags", "text[]"),
              Column("iv", "interval"), Column("m", "money"))
PG_ROW = {"id": 7, "price": "-12.50", "n": "3.14159", "d": "1958-06-03", "t": "03:04:05.5", "t3": "23:59:59.123",
          "ts": "2024-01-02T03:04:05.5", "ts3": "2001-02-03T04:05:06.12", "tz": "2024-01-02T03:04:05.123456Z",
          "j": {"a": [1, 2.5, None]}, "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "b": "AP8=", "flag": True,
          "r": 0.5, "tags": ["x", None], "iv": "P1DT2H", "m": "$1,234.50"}

MY = TableId("shop", None, "items")
MY_COLUMNS = (Column("id", "int(11)", True, False), Column("ti", "tinyint(1)"), Column("iu", "int(10) unsigned"),
              Column("price", "decimal(10,2)"), Column("dt", "datetime"), Column("dt6", "datetime(6)"),
              Column("ts", "timestamp(6)"), Column("tm", "time"), Column("y", "year(4)"),
              Column("e", "enum('small','large')"), Column("s", "set('a','b','c')"), Column("b1", "bit(1)"),
              Column("b10", "bit(10)"), Column("j", "json"), Column("bl", "blob"), Column("f", "float"))
MY_ROW = {"id": 1, "ti": 1, "iu": 4294967295, "price": "0.05", "dt": "2024-01-02T03:04:05",
          "dt6": "1999-12-31T23:59:59.999999", "ts": "2024-01-02T03:04:05.5Z", "tm": "-12:34:56.7", "y": 2024,
          "e": "large", "s": ["a", "c"], "b1": 1, "b10": 682, "j": {"k": "v"}, "bl": "YmxvYg==", "f": 3.14159}


def _encoder(connector: str, table: TableId, columns, options=None):
    encoder = make_encoder("debezium-json", connector, "src", "p", options=options)
    encoder.learn([SchemaChange(table, columns, 100, 0)])
    encoder.schema_versions[table] = 100
    return encoder


def _event(table, row, op=Op.CREATE, fields=None, before=None, tx=None):
    return ChangeEvent(op, table, {"id": row["id"]}, before, row if op is not Op.DELETE else None, 123, 1000,
                       SnapshotMarker.FALSE, fields, tx)


def _record(record, offset=0):
    return LogRecord(record.topic, 0, offset, record.key, record.value, 0)


def _fields(schema: dict) -> dict:
    return {f["field"]: f for f in schema["fields"]}


def test_java_big_integer_bytes_are_minimal_twos_complement():
    assert java_big_integer_bytes(0) == b"\x00"
    assert java_big_integer_bytes(127) == b"\x7f"
    assert java_big_integer_bytes(128) == b"\x00\x80"
    assert java_big_integer_bytes(-128) == b"\x80"
    assert java_big_integer_bytes(-129) == b"\xff\x7f"
    assert java_big_integer_bytes(-1250) == (-1250).to_bytes(2, "big", signed=True)


def test_postgres_values_and_schemas_are_debeziums():
    [record] = _encoder("postgresql", PG, PG_COLUMNS).encode([_event(PG, PG_ROW, fields={"txId": 5, "lsn": 99})],
                                                             now_ms=5)
    value = orjson.loads(record.value)
    row = value["payload"]["after"]
    assert base64.b64decode(row["price"]) == (-1250).to_bytes(2, "big", signed=True)
    assert row["n"] == {"scale": 5, "value": base64.b64encode(java_big_integer_bytes(314159)).decode()}
    assert row["d"] == -4230                       # days since 1970-01-01
    assert row["t"] == 11_045_500_000              # MicroTime
    assert row["t3"] == 86_399_123                 # time(3): io.debezium.time.Time, milliseconds
    assert row["ts"] == 1_704_164_645_500_000      # MicroTimestamp
    assert row["ts3"] == 981_173_106_120           # timestamp(3): io.debezium.time.Timestamp, milliseconds
    assert row["tz"] == "2024-01-02T03:04:05.123456Z"
    assert orjson.loads(row["j"]) == {"a": [1, 2.5, None]}
    assert row["b"] == "AP8=" and row["u"] == PG_ROW["u"] and row["tags"] == ["x", None]
    assert row["iv"] == 26 * 3600 * 1_000_000      # MicroDuration
    assert base64.b64decode(row["m"]) == java_big_integer_bytes(123450)
    after = _fields(_fields(value["schema"])["after"])
    assert after["price"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert after["price"]["parameters"] == {"scale": "2", "connect.decimal.precision": "10"}
    assert after["n"]["name"] == "io.debezium.data.VariableScaleDecimal"
    assert [after[c]["name"] for c in ("d", "t", "t3", "ts", "ts3", "tz", "j", "u")] == [
        "io.debezium.time.Date", "io.debezium.time.MicroTime", "io.debezium.time.Time",
        "io.debezium.time.MicroTimestamp", "io.debezium.time.Timestamp", "io.debezium.time.ZonedTimestamp",
        "io.debezium.data.Json", "io.debezium.data.Uuid"]
    assert after["id"]["optional"] is False and after["price"]["optional"] is True
    assert value["schema"]["name"] == "p.public.items.Envelope"
    source = value["payload"]["source"]
    assert source["connector"] == "postgresql" and source["txId"] == 5 and source["lsn"] == 99
    assert source["cdc_version"] == 123 and source["cdc_schema_version"] == 100
    assert isinstance(source["version"], str)
    assert source["ts_us"] == 1_000_000 and source["ts_ns"] == 1_000_000_000
    assert value["payload"]["ts_us"] == 5000 and value["payload"]["ts_ns"] == 5_000_000
    key = orjson.loads(record.key)
    assert key == {"schema": {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}],
                              "optional": False, "name": "p.public.items.Key"}, "payload": {"id": 7}}


def test_mysql_values_and_schemas_are_debeziums():
    [record] = _encoder("mysql", MY, MY_COLUMNS).encode(
        [_event(MY, MY_ROW, fields={"file": "binlog.000001", "pos": 4, "row": 0, "gtid": "0-1-2"})], now_ms=5)
    value = orjson.loads(record.value)
    row = value["payload"]["after"]
    assert row["ti"] == 1 and row["iu"] == 4294967295
    assert base64.b64decode(row["price"]) == b"\x05"
    assert row["dt"] == 1_704_164_645_000           # datetime(0): io.debezium.time.Timestamp (ms)
    assert row["dt6"] == 946_684_799_999_999        # datetime(6): MicroTimestamp
    assert row["ts"] == "2024-01-02T03:04:05.5Z"
    assert row["tm"] == -(12 * 3600 + 34 * 60 + 56) * 1_000_000 - 700_000  # MicroTime (adaptive_time_microseconds)
    assert row["y"] == 2024 and row["e"] == "large" and row["s"] == "a,c" and row["b1"] is True
    assert base64.b64decode(row["b10"]) == (682).to_bytes(2, "little")
    assert orjson.loads(row["j"]) == {"k": "v"} and row["bl"] == "YmxvYg=="
    after = _fields(_fields(value["schema"])["after"])
    assert after["ti"]["type"] == "int16" and after["iu"]["type"] == "int64" and after["f"]["type"] == "float"
    assert after["e"]["parameters"] == {"allowed": "small,large"}
    assert after["y"]["name"] == "io.debezium.time.Year"
    source = value["payload"]["source"]
    assert (source["file"], source["pos"], source["row"], source["gtid"]) == ("binlog.000001", 4, 0, "0-1-2")
    assert source["table"] == "items" and "schema" not in source


@pytest.mark.parametrize("mode, expected", [("string", "-12.50"), ("double", -12.5)])
def test_decimal_handling_modes(mode, expected):
    encoder = _encoder("postgresql", PG, PG_COLUMNS, DebeziumOptions(decimal_handling_mode=mode))
    [record] = encoder.encode([_event(PG, PG_ROW)], now_ms=5)
    value = orjson.loads(record.value)
    assert value["payload"]["after"]["price"] == expected
    assert _fields(_fields(value["schema"])["after"])["price"]["type"] == ("string" if mode == "string" else "double")
    # double mode is lossy, as Debezium's: the schema no longer says "decimal", so it stays a number
    assert decode_record(_record(record)).after["price"] == ("-12.50" if mode == "string" else -12.5)


def test_a_delete_has_every_column_with_nulls_and_then_a_tombstone():
    encoder = _encoder("postgresql", PG, PG_COLUMNS)
    delete, tombstone = encoder.encode([_event(PG, {"id": 7}, Op.DELETE, before={"id": 7})], now_ms=5)
    before = orjson.loads(delete.value)["payload"]["before"]
    assert before == dict.fromkeys((c.name for c in PG_COLUMNS), None) | {"id": 7}
    assert tombstone.value is None and tombstone.key == delete.key


def test_transaction_ids_take_debeziums_txid_lsn_form():
    encoder = _encoder("postgresql", PG, PG_COLUMNS)
    [record] = encoder.encode([_event(PG, PG_ROW, fields={"txId": 571, "lsn": 53195832},
                                      tx=TransactionInfo("571", 2, 1))], now_ms=5)
    assert orjson.loads(record.value)["payload"]["transaction"] == {
        "id": "571:53195832", "total_order": 2, "data_collection_order": 1}


@pytest.mark.parametrize("connector, table, columns, row", [
    ("postgresql", PG, PG_COLUMNS, {k: v for k, v in PG_ROW.items() if k not in ("iv", "m")}),
    ("mysql", MY, MY_COLUMNS, {k: v for k, v in MY_ROW.items() if k not in ("b1",)}),
])
def test_sinks_see_the_same_event_in_either_format(connector, table, columns, row):
    """What the sink runtime hands a sink is the same whichever format the topic holds: the
    decoding in cdc.sink_events turns debezium-json back into the json format's values."""
    events = [_event(table, row, fields={"txId": 1, "lsn": 2} if connector == "postgresql" else {"file": "f", "pos": 1,
                                                                                                 "row": 0}),
              _event(table, {"id": row["id"]}, Op.DELETE, before={"id": row["id"]})]
    plain = EnvelopeEncoder(connector, "src", "p")
    plain.schema_versions[table] = 100
    as_json = [decode_record(_record(r, i)) for i, r in enumerate(plain.encode(events, now_ms=5))]
    as_debezium = [decode_record(_record(r, i)) for i, r in
                   enumerate(_encoder(connector, table, columns).encode(events, now_ms=5))]
    for a, b in zip(as_json, as_debezium, strict=True):
        assert (a.topic, a.key, a.op, a.version, a.ts_ms) == (b.topic, b.key, b.op, b.version, b.ts_ms)
        assert b.source.get("schema_version") == a.source.get("schema_version")
        if a.after is not None:
            assert b.after == _same_instants(a.after)
        if a.before is not None:
            assert {k: v for k, v in b.before.items() if v is not None} == a.before


def _same_instants(row: dict) -> dict:
    """The json format prints MySQL DATETIME(fsp) with exactly fsp digits; read back from
    debezium-json it has no trailing zeros. The same instant either way."""
    out = dict(row)
    for name, value in row.items():
        if isinstance(value, str) and "T" in value and "." in value and not value.endswith("Z"):
            out[name] = value.rstrip("0").rstrip(".")
    return out


def test_rows_of_a_table_without_a_shape_get_an_inferred_schema():
    encoder = make_encoder("debezium-json", "generator", "gen", "p")
    table = TableId("gen", "public", "orders")
    [record] = encoder.encode([ChangeEvent(Op.CREATE, table, {"id": 1}, None,
                                           {"id": 1, "amount": 2.5, "note": "x", "meta": {"a": 1}}, 1, 0)], now_ms=0)
    value = orjson.loads(record.value)
    after = _fields(_fields(value["schema"])["after"])
    assert (after["id"]["type"], after["amount"]["type"], after["note"]["type"]) == ("int64", "double", "string")
    assert decode_record(_record(record)).after == {"id": 1, "amount": 2.5, "note": "x", "meta": {"a": 1}}


def test_a_truncates_key_reads_as_null_in_connect_and_a_compacted_topic_takes_it():
    """Debezium writes no key, which our compacted topics refuse (the capture stopped there)."""
    from cdc.sink_events import decode_key

    encoder = _encoder("postgresql", PG, PG_COLUMNS)
    records = []
    encoder.emit([ChangeEvent(Op.TRUNCATE, PG, None, None, None, 5, 0)], None, None,
                 lambda topic, value, key, headers: records.append((topic, value, key, headers)), now_ms=0)
    [(topic, value, key, headers)] = records
    assert orjson.loads(key) == {"schema": None, "payload": None} and decode_key(key) == {}
    assert orjson.loads(value)["payload"]["op"] == "t"
    assert headers == [("cdc.version", b"5"), ("cdc.source", b"src")]


def test_decimal_strings_round_trip_exactly():
    assert Decimal(decode_record(_record(_encoder("postgresql", PG, PG_COLUMNS).encode(
        [_event(PG, PG_ROW | {"n": "-0.000001"})], now_ms=0)[0])).after["n"]) == Decimal("-0.000001")


@pytest.mark.parametrize("column, text", [
    ("n", "-12345678901234567890123456789012345678901234567890.5"),   # numeric: VariableScaleDecimal
    ("price", "123456789012345678901234567890123.125"),               # numeric(10,2): rounded to the scale
])
def test_decimals_wider_than_28_digits_keep_every_digit(column, text):
    """Python's default Decimal context has 28 digits: scaling with it rounded wider numerics."""
    from decimal import Context

    expected = Decimal(text) if column == "n" else Decimal(text).quantize(Decimal("0.01"), context=Context(prec=99))
    [record, *_] = _encoder("postgresql", PG, PG_COLUMNS).encode([_event(PG, PG_ROW | {column: text})], now_ms=0)
    assert Decimal(decode_record(_record(record)).after[column]) == expected


def test_cdc_tail_prints_both_formats_alike():
    from cdc.runtime.cli import format_record

    row = {k: v for k, v in PG_ROW.items() if k not in ("iv", "m")}  # see test_interval_and_money_read_back
    events = [_event(PG, row), _event(PG, {"id": 7}, Op.DELETE, before={"id": 7})]
    plain = EnvelopeEncoder("postgresql", "src", "p")
    as_json = [format_record(_record(r, i)) for i, r in enumerate(plain.encode(events, now_ms=5))]
    as_debezium = [format_record(_record(r, i)) for i, r in
                   enumerate(_encoder("postgresql", PG, PG_COLUMNS).encode(events, now_ms=5))]
    assert as_json[0].splitlines()[0] == 'p.public.items[0]@0 c {"id":7} version=123'
    assert as_debezium[:1] == as_json[:1]
    # a delete's before: every column in debezium-json (nulls for those the source did not send)
    assert as_debezium[1].splitlines()[0] == as_json[1].splitlines()[0]
    assert as_debezium[2] == as_json[2] == 'p.public.items[0]@2 {"id":7} <tombstone>'


def test_interval_and_money_read_back_as_the_same_amounts():
    [record] = _encoder("postgresql", PG, PG_COLUMNS).encode([_event(PG, PG_ROW)], now_ms=0)
    after = decode_record(_record(record)).after
    assert after["iv"] == "PT93600S"    # P1DT2H: the same length, in seconds
    assert after["m"] == "1234.50"      # $1,234.50: the amount without the currency's symbol


def _delta_app(tmp_path, fmt: str):
    from cdc.config.model import AppConfig
    from cdc.plugins import sink_plugin

    lake = sink_plugin("delta").config_model.model_validate(
        {"name": "lake", "type": "delta", "topics": ["p.*"], "path": str(tmp_path / "d"),
         "checkpoint": str(tmp_path / "c")})
    return AppConfig.model_validate({"log": {"embedded": {"path": str(tmp_path / "log")}, "format": fmt},
                                     "sinks": [lake], "http": None})


def test_the_delta_sink_reads_debezium_json(tmp_path):
    """The Spark Delta sink decodes both formats itself (spark_sinks/parse.py): it starts on either."""
    from cdc.runtime.worker import SelfRunningSink, build_runner

    assert isinstance(build_runner(_delta_app(tmp_path, "debezium-json"), "lake"), SelfRunningSink)


def test_a_sink_that_reads_the_topics_itself_refuses_a_format_it_does_not_list(tmp_path, monkeypatch):
    """A sink that parses Kafka records itself, past the runtime's decoding, would dead-letter
    every record of a format it cannot read: it refuses to start, naming the sink and format."""
    from cdc.errors import ConfigError
    from cdc.runtime.worker import build_runner
    from spark_sinks.delta import DeltaSink

    monkeypatch.setattr(DeltaSink, "formats", ("json",))
    with pytest.raises(ConfigError, match="sink lake .delta. .*cannot read log.format debezium-json: it reads json"):
        build_runner(_delta_app(tmp_path, "debezium-json"), "lake")


def test_the_delta_sink_names_itself_and_the_format_it_cannot_read():
    from cdc.errors import ConfigError
    from spark_sinks.formats import check_format

    check_format("lake", "debezium-json")
    check_format("lake", "avro")
    with pytest.raises(ConfigError, match="sink lake \\(delta\\) cannot read log.format 'protobuf': it reads json, "
                                          "debezium-json, avro"):
        check_format("lake", "protobuf")


def test_time_and_binary_modes():
    columns = (Column("id", "integer", True, False), Column("d", "date"), Column("t", "time without time zone"),
               Column("t3", "time(3) without time zone"), Column("ts", "timestamp without time zone"),
               Column("b", "bytea"))
    row = {"id": 1, "d": "1970-01-02", "t": "00:00:01.5", "t3": "00:00:01.5", "ts": "1970-01-01T00:00:01.5",
           "b": "AP8="}

    def encoded(**options):
        [record] = _encoder("postgresql", PG, columns, DebeziumOptions(**options)).encode([_event(PG, row)], now_ms=0)
        value = orjson.loads(record.value)
        fields = _fields(_fields(value["schema"])["after"])
        return value["payload"]["after"], {k: (f["type"], f.get("name")) for k, f in fields.items()}

    after, types = encoded(time_precision_mode="connect")
    assert (after["d"], after["t"], after["t3"], after["ts"]) == (1, 1500, 1500, 1500)
    assert types["d"] == ("int32", "org.apache.kafka.connect.data.Date")
    assert types["t"] == ("int32", "org.apache.kafka.connect.data.Time")
    assert types["ts"] == ("int64", "org.apache.kafka.connect.data.Timestamp")
    after, types = encoded(time_precision_mode="adaptive_time_microseconds")
    assert (after["t3"], types["t3"]) == (1_500_000, ("int64", "io.debezium.time.MicroTime"))
    after, types = encoded(binary_handling_mode="hex")
    assert (after["b"], types["b"]) == ("00ff", ("string", None))
    after, types = encoded(binary_handling_mode="base64")
    assert (after["b"], types["b"]) == ("AP8=", ("string", None))
    after, types = encoded(binary_handling_mode="base64-url-safe")
    assert after["b"] == "AP8="
    # read back by the sink runtime in the json format's forms, whatever the mode
    for mode in ("connect", "adaptive", "adaptive_time_microseconds"):
        [record] = _encoder("postgresql", PG, columns, DebeziumOptions(time_precision_mode=mode)).encode(
            [_event(PG, row)], now_ms=0)
        back = decode_record(_record(record)).after
        assert (back["d"], back["t"], back["ts"]) == ("1970-01-02", "00:00:01.5", "1970-01-01T00:00:01.5")


def test_a_truncate_in_debezium_json_goes_through_the_embedded_log_to_a_sink_event(tmp_path):
    from cdc.log.base import TopicSettings
    from cdc.log.embedded import EmbeddedLog
    from cdc.positions import Counter

    log = EmbeddedLog(tmp_path / "log", TopicSettings(partitions=2))
    encoder = _encoder("postgresql", PG, PG_COLUMNS)
    log.ensure_topic(encoder.topic(PG), TopicSettings(partitions=2))
    writer = log.writer()
    writer.publish_events(encoder, [_event(PG, PG_ROW), ChangeEvent(Op.TRUNCATE, PG, None, None, None, 200, 0)],
                          Counter(1))
    assert writer.flush(10) == Counter(1)
    writer.close()
    events = [decode_record(r) for r in log.read_all(encoder.topic(PG))]
    truncates = [e for e in events if e.op is Op.TRUNCATE]
    assert len(truncates) == 2 and all(e.key == {} and e.version == 200 for e in truncates)  # one per partition
    log.close()


def test_every_source_field_written_is_in_the_source_schema():
    """JsonConverter reads a struct by its schema: a field of the payload that the schema lacks
    would be dropped, one the payload lacks would fail a required field."""
    for connector, table, columns, row in (("postgresql", PG, PG_COLUMNS, PG_ROW), ("mysql", MY, MY_COLUMNS, MY_ROW),
                                           ("generator", PG, PG_COLUMNS, PG_ROW)):
        [record] = _encoder(connector, table, columns).encode([_event(table, row)], now_ms=0)
        value = orjson.loads(record.value)
        schema = _fields(value["schema"])["source"]
        assert [f["field"] for f in schema["fields"]] == list(value["payload"]["source"]), connector
        assert schema["name"] == f"io.debezium.connector.{connector}.Source"


def test_rows_naming_no_shape_take_the_newest_learned():
    encoder = make_encoder("debezium-json", "postgresql", "src", "p")
    encoder.learn([SchemaChange(PG, (Column("id", "integer", True, False), Column("a", "text")), 1, 0)])
    event = ChangeEvent(Op.CREATE, PG, {"id": 1}, None, {"id": 1, "a": "x", "d": "2024-01-01"}, 5, 0)
    encoder.encode([event], now_ms=0)
    encoder.learn([SchemaChange(PG, (Column("id", "integer", True, False), Column("a", "text"),
                                     Column("d", "date")), 2, 0)])
    [record] = encoder.encode([event], now_ms=0)
    assert orjson.loads(record.value)["payload"]["after"]["d"] == 19723


def test_the_generator_runs_in_debezium_json():
    """Its events carry a transaction and a txId but no LSN: the id stays the source's own."""
    from sources.generator import GeneratorConfig, GeneratorSource

    source = GeneratorSource(GeneratorConfig(name="gen", type="generator", table="orders", events=5), None)
    source.start()
    batch = source.poll(1.0)
    source.stop()
    records = make_encoder("debezium-json", "generator", "gen", "p").encode(batch.events, now_ms=0)
    events = [decode_record(_record(r, i)) for i, r in enumerate(records)]
    assert events and all(e.op is not None for e in events)
    assert orjson.loads(records[0].value)["payload"]["transaction"]["id"] == batch.events[0].transaction.id
