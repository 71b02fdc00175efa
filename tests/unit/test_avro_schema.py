"""Connect schemas -> Avro schemas as Confluent's AvroData writes them (what Debezium's
AvroConverter registers), and back; and the delta sink taking it."""

from __future__ import annotations

import fastavro

from cdc.formats.avro_schema import avro_name, to_avro, to_connect

ROW = {"type": "struct", "name": "p.public.items.Value", "optional": True, "fields": [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "int16", "optional": True, "field": "sm"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
    {"type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Date", "version": 1, "field": "cd"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "ts"},
    {"type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
     "doc": "Variable scaled decimal", "field": "n",
     "fields": [{"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"}]},
    {"type": "array", "optional": True, "items": {"type": "string", "optional": True}, "field": "tags"},
]}
ENVELOPE = {"type": "struct", "name": "p.public.items.Envelope", "version": 2, "optional": False, "fields": [
    {**ROW, "field": "before"}, {**ROW, "field": "after"},
    {"type": "string", "optional": True, "default": "false", "field": "snapshot"},
    {"type": "string", "optional": False, "field": "op"}]}


def test_an_envelope_converts_as_avrodata_converts_it():
    avro = to_avro(ENVELOPE)
    fastavro.parse_schema(avro)  # a valid Avro schema
    assert (avro["type"], avro["namespace"], avro["name"]) == ("record", "p.public.items", "Envelope")
    assert avro["connect.name"] == "p.public.items.Envelope" and avro["connect.version"] == 2
    fields = {f["name"]: f for f in avro["fields"]}
    row = fields["before"]["type"][1]
    assert fields["before"]["type"][0] == "null" and fields["before"]["default"] is None
    assert fields["after"]["type"] == ["null", "p.public.items.Value"]  # a record is defined once
    assert fields["snapshot"] == {"name": "snapshot", "type": ["string", "null"], "default": "false"}
    assert fields["op"] == {"name": "op", "type": "string"}
    columns = {f["name"]: f["type"] for f in row["fields"]}
    assert columns["id"] == "int"
    assert columns["sm"] == ["null", {"type": "int", "connect.type": "int16"}]
    assert columns["price"][1] == {"type": "bytes", "connect.version": 1,
                                   "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                                   "connect.name": "org.apache.kafka.connect.data.Decimal", "scale": 2,
                                   "precision": 10, "logicalType": "decimal"}
    assert columns["cd"][1]["logicalType"] == "date"
    assert columns["ts"][1] == {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}
    assert columns["n"][1]["name"] == "VariableScaleDecimal" and columns["n"][1]["namespace"] == "io.debezium.data"
    assert columns["tags"][1] == {"type": "array", "items": ["null", "string"]}


def test_back_to_connect_keeps_names_and_parameters():
    connect = to_connect(to_avro(ENVELOPE))
    fields = {f["field"]: f for f in connect["fields"]}
    assert fields["before"]["optional"] and fields["before"]["name"] == "p.public.items.Value"
    assert fields["after"]["name"] == "p.public.items.Value"  # a named reference resolves
    row = {f["field"]: f for f in fields["after"]["fields"]}
    assert row["price"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert row["price"]["parameters"]["scale"] == "2"
    assert (row["sm"]["type"], row["id"]["type"], row["ts"]["type"]) == ("int16", "int32", "int64")
    assert row["n"]["type"] == "struct" and [f["field"] for f in row["n"]["fields"]] == ["scale", "value"]


def test_names_avro_does_not_allow_are_adjusted_as_debezium_does():
    assert avro_name("my-db") == "my_db" and avro_name("9lives") == "_9lives"
    avro = to_avro({"type": "struct", "name": "cdc-1.my-db.items.Key", "fields": []})
    assert (avro["namespace"], avro["name"]) == ("cdc_1.my_db.items", "Key")
    fastavro.parse_schema(avro)


def test_the_delta_sink_takes_the_avro_format(tmp_path):
    """The Spark Delta sink reads Kafka in Spark, past the runtime's decoding, and decodes avro
    records itself (spark_sinks/avro_records.py): a config with format avro builds its runner, as
    ``cdc validate`` does."""
    from cdc.config.model import AppConfig
    from cdc.plugins import sink_plugin
    from cdc.runtime.worker import SelfRunningSink, build_runner

    lake = sink_plugin("delta").config_model.model_validate(
        {"name": "lake", "type": "delta", "topics": ["p.*"], "path": str(tmp_path / "d"),
         "checkpoint": str(tmp_path / "c")})
    app = AppConfig.model_validate({"log": {"embedded": {"path": str(tmp_path / "log")}, "format": "avro",
                                            "schema_registry": {"url": "http://127.0.0.1:1"}},
                                    "sinks": [lake], "http": None})
    assert isinstance(build_runner(app, "lake"), SelfRunningSink)
