"""The delta sink's avro writer schemas (spark_sinks/avro_records.py): which ids are change
envelopes and which are keys, and the error without a registry. Pure logic: the registry is a
function here; tests/integration/test_spark_delta_formats.py reads a real one."""

from __future__ import annotations

import orjson
import pytest

from cdc.api import ConfigError
from cdc.formats.avro import strip_logical_types
from cdc.formats.avro_schema import to_avro, to_connect
from spark_sinks.avro_records import AvroSchemas
from spark_sinks.connect_json import ConnectCodecs

ROW = {"type": "struct", "name": "p.public.t.Value", "optional": True, "fields": [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"}]}
SOURCE = {"type": "struct", "name": "io.debezium.connector.postgresql.Source", "optional": False, "fields": [
    {"type": "int64", "optional": False, "field": "ts_ms"}, {"type": "int64", "optional": False, "field": "cdc_version"},
    {"type": "int64", "optional": True, "field": "cdc_schema_version"}]}
ENVELOPE = {"type": "struct", "name": "p.public.t.Envelope", "optional": False, "fields": [
    {**ROW, "field": "before"}, {**ROW, "field": "after"}, {**SOURCE, "field": "source"},
    {"type": "string", "optional": False, "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}
KEY = {"type": "struct", "name": "p.public.t.Key", "optional": False,
       "fields": [{"type": "int32", "optional": False, "field": "id"}]}


def _registry(schemas: dict[int, dict]):
    """A registry as ``SinkContext.avro_writer_schema`` answers: (Avro text without logical types, Connect)."""
    def fetch(url: str, schema_id: int) -> tuple[str, dict]:
        avro = to_avro(schemas[schema_id])
        return orjson.dumps(strip_logical_types(avro)).decode(), to_connect(avro)
    return fetch


def test_envelopes_and_keys_are_told_apart_and_their_rows_learnt():
    codecs = ConnectCodecs()
    schemas = AvroSchemas("http://registry", codecs, _registry({7: ENVELOPE, 8: KEY}))
    schemas.learn("lake", {7, 8})
    known = schemas.known()
    assert (known[7].envelope, known[7].shaped, known[7].timed) == (True, True, True)
    assert known[8].envelope is False
    assert '"logicalType"' not in known[7].text  # spark-avro yields the Decimal's bytes, not a decimal
    price = codecs.get(7).field("price")
    assert price["name"] == "org.apache.kafka.connect.data.Decimal" and price["parameters"]["scale"] == "2"
    assert [f["field"] for f in codecs.get(8).fields] == ["id"]


def test_a_foreign_record_is_no_envelope():
    """An Avro value without our source fields is not read as a change (its records are poison)."""
    foreign = {**ENVELOPE, "fields": [f for f in ENVELOPE["fields"] if f["field"] != "source"]}
    schemas = AvroSchemas("http://registry", ConnectCodecs(), _registry({3: foreign}))
    schemas.learn("lake", {3})
    assert schemas.known()[3].envelope is False


def test_without_a_registry_the_error_says_which_setting():
    schemas = AvroSchemas(None, ConnectCodecs(), _registry({}))
    with pytest.raises(ConfigError, match="sink lake .delta. read avro records .schema ids \\[4\\]. but no schema "
                                          "registry is configured: set log.schema_registry.url"):
        schemas.learn("lake", {4})
