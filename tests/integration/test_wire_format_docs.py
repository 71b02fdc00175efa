"""docs/wire-formats.md's type tables, made from real rows: a PostgreSQL and a MariaDB table with a
column per common type, captured by the real sources, each value shown in the ``json`` format, in
``debezium-json`` (Debezium's default modes) with its Connect schema, and in ``avro`` as a consumer
reads it (confluent-kafka's ``AvroDeserializer`` with the stack's schema registry), beside the
value that Debezium's own connector (PostgreSQL, MariaDB; 3.5.0.Final in Kafka Connect standalone)
writes for the same row, with its defaults and with ``decimal.handling.mode=string``.

The test fails when the tables in the docs differ from what the sources and encoders produce now;
``CDC_WRITE_DOCS=1`` writes them instead (then commit docs/wire-formats.md).
"""

from __future__ import annotations

import os
import random
import re
import uuid
from pathlib import Path
from urllib.parse import urlparse

import orjson
import pytest

from cdc.dev.connect import ConnectStandalone, first_value
from cdc.events import ChangeEvent, Op, SnapshotMarker
from cdc.formats import make_encoder
from cdc.formats.connect_types import DebeziumOptions
from cdc.formats.debezium_json import DebeziumJsonEncoder
from cdc.formats.shapes import known_shapes
from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from tests.integration.pg_capture import capturing, execute, pg_config, wait_until
from tests.integration.test_mysql_source import execute as my_execute
from tests.integration.test_mysql_source import mysql_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-formats.md"

# (column type, SQL literal of the value shown)
POSTGRES = [
    ("smallint", "-32768"), ("integer", "2147483647"), ("bigint", "-9223372036854775808"), ("boolean", "true"),
    ("real", "3.14159"), ("double precision", "-1.5e300"), ("numeric(10,2)", "-12345.60"),
    ("numeric", "3.14159265358979323846"), ("money", "1234.5"), ("text", "'ünïcödé'"),
    ("varchar(20)", "'abc'"), ("char(5)", "'ab'"), ("bytea", "'\\x00ff'"), ("date", "'1958-06-03'"),
    ("time", "'13:14:15.5'"), ("time(3)", "'23:59:59.123'"), ("timetz", "'10:00:00+02'"),
    ("timestamp", "'2024-01-02 03:04:05.123456'"), ("timestamp(3)", "'2001-02-03 04:05:06.7'"),
    ("timestamptz", "'2024-01-02 03:04:05.5+01'"), ("interval", "'1 day 2 hours'"),
    ("json", "'{\"a\": [1, 2.5]}'"), ("jsonb", "'{\"b\": {\"c\": null}}'"),
    ("uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"), ("xml", "'<a>1</a>'"), ("inet", "'192.168.0.1/24'"),
    ("text[]", "ARRAY['x', NULL]"), ("integer[]", "ARRAY[1, 2]"), ("bit(1)", "B'1'"), ("bit(4)", "B'1010'"),
]
MYSQL = [
    ("TINYINT", "-128"), ("BOOLEAN", "TRUE"), ("SMALLINT UNSIGNED", "65535"), ("MEDIUMINT", "-8388608"),
    ("INT", "-2147483648"), ("INT UNSIGNED", "4294967295"), ("BIGINT", "-9223372036854775808"),
    ("BIGINT UNSIGNED", "18446744073709551615"), ("FLOAT", "3.14159"), ("DOUBLE", "-1.5e300"),
    ("DECIMAL(10,2)", "-12345.60"), ("CHAR(5)", "'ab'"), ("VARCHAR(20)", "'ünïcödé'"), ("TEXT", "'text'"),
    ("BINARY(4)", "X'00ff'"), ("VARBINARY(8)", "X'00ff'"), ("BLOB", "'blob'"), ("DATE", "'1958-06-03'"),
    ("DATETIME", "'2024-01-02 03:04:05'"), ("DATETIME(3)", "'2024-01-02 03:04:05.12'"),
    ("DATETIME(6)", "'1999-12-31 23:59:59.999999'"), ("TIMESTAMP NULL", "'2024-01-02 03:04:05'"),
    ("TIMESTAMP(6) NULL", "'2024-01-02 03:04:05.5'"), ("TIME", "'-12:34:56'"), ("TIME(3)", "'13:14:15.5'"),
    ("YEAR", "2024"), ("JSON", "'{\"a\": [1, 2.5]}'"), ("ENUM('small','large')", "'large'"),
    ("SET('a','b','c')", "'a,c'"), ("BIT(1)", "b'1'"), ("BIT(10)", "b'1010101010'"),
]


def _cell(value) -> str:
    text = orjson.dumps(value).decode() if not isinstance(value, str) or value == "" else orjson.dumps(value).decode()
    return "`" + text.replace("|", "\\|") + "`"


def _avro_cell(value) -> str:
    """A value as the Avro deserializer hands it to a Python consumer: JSON where it is plain
    JSON, else Python's repr (Decimal, date, datetime, bytes)."""
    text = orjson.dumps(value).decode() if _plain(value) else repr(value)
    return "`" + text.replace("|", "\\|") + "`"


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    return value is None or type(value) in (str, int, float, bool)


def _schema_text(field: dict) -> str:
    name = field.get("name")
    params = field.get("parameters")
    text = field["type"] + (f" {name}" if name else "")
    if params:
        text += " (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
    return text.replace("|", "\\|")


def _table(types: list[tuple[str, str]], ours: dict, theirs: dict) -> str:
    """``ours``/``theirs``: {"json": after, "default": after, "string": after, "fields": {column: schema}}
    (``theirs`` without "json"). Debezium's values are shown where they differ from ours ("=" where
    they are the same); the string mode only where it differs from the default."""
    lines = ["| column type | value written | `json` | `debezium-json` | `avro`, as a consumer decodes it | "
             "Debezium's connector | Connect schema (ours; Debezium's where different) | "
             "`decimal.handling.mode=string`: ours, Debezium's |",
             "|---|---|---|---|---|---|---|---|"]
    for index, (type_name, literal) in enumerate(types):
        column = f"c{index}"
        mine, their = ours["default"][column], theirs["default"][column]
        schema, their_schema = _schema_text(ours["fields"][column]), _schema_text(theirs["fields"][column])
        if their_schema != schema:
            schema += f"; Debezium: {their_schema}"
        string_mode = ""
        if ours["string"][column] != mine or theirs["string"][column] != their:
            string_mode = _cell(ours["string"][column]) + (
                ", =" if theirs["string"][column] == ours["string"][column] else f", {_cell(theirs['string'][column])}")
        lines.append(f"| {type_name} | `{literal.replace('|', chr(92) + '|')}` | {_cell(ours['json'][column])} | "
                     f"{_cell(mine)} | {_avro_cell(ours['avro'][column])} | "
                     f"{'=' if their == mine else _cell(their)} | {schema} | {string_mode} |")
    return "\n".join(lines) + "\n"


def _ours(log, prefix: str, source: str, connector: str, topic: str, registry_url: str) -> dict:
    """Our values for the one row of ``topic``: json, debezium-json with the defaults and with
    decimal_handling_mode string, avro (defaults) as read back with the registry, and the after
    struct's field schemas."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    [record] = [r for r in log.read_all(topic) if r.value is not None]
    envelope = orjson.loads(record.value)
    shapes = known_shapes(log, prefix, source)
    [shape] = [s for s in shapes if s.table.topic(prefix) == topic]
    event = ChangeEvent(Op(envelope["op"]), shape.table, orjson.loads(record.key), None, envelope["after"],
                        envelope["source"]["version"], envelope["source"]["ts_ms"], SnapshotMarker.TRUE)
    out = {"json": envelope["after"]}
    for mode in ("precise", "string"):
        encoder = DebeziumJsonEncoder(connector, source, prefix, options=DebeziumOptions(decimal_handling_mode=mode))
        encoder.learn(shapes)
        encoder.schema_versions[shape.table] = shape.version
        [encoded] = encoder.encode([event], now_ms=0)
        value = orjson.loads(encoded.value)
        out["default" if mode == "precise" else "string"] = value["payload"]["after"]
        if mode == "precise":
            out["fields"] = _after_fields(value)
    # A fresh prefix: the registry's subjects are per topic and outlive a test run.
    encoder = make_encoder("avro", connector, source, f"docs{uuid.uuid4().hex[:8]}", registry_url=registry_url)
    encoder.learn(shapes)
    encoder.schema_versions[shape.table] = shape.version
    [encoded] = encoder.encode([event], now_ms=0)
    assert encoded.value[0] == 0, "the avro encoder should write Confluent's framing"
    read = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    out["avro"] = read(encoded.value, SerializationContext(encoded.topic, MessageField.VALUE))["after"]
    return out


def _after_fields(value: dict) -> dict:
    after = next(f for f in value["schema"]["fields"] if f["field"] == "after")
    return {f["field"]: f for f in after["fields"]}


def _theirs(tmp_path: Path, bootstrap: str, connector: dict[str, str], table_topic: str) -> dict:
    """Debezium's own connector on the same table, with its defaults and decimal.handling.mode=string
    (two connectors in one worker): the after struct of the row's snapshot record, and its schemas."""
    tag = uuid.uuid4().hex[:8]
    worker = ConnectStandalone(tmp_path, bootstrap)
    prefixes = {"default": f"dbzd{tag}", "string": f"dbzs{tag}"}
    connectors = {}
    for mode, prefix in prefixes.items():
        settings = {k: v.replace("{tag}", f"{mode[0]}{tag}") for k, v in connector.items()}
        settings.update({"topic.prefix": prefix, "snapshot.mode": "initial", "tasks.max": "1",
                         # the dev broker creates no topics on its own: Connect does, with these
                         "topic.creation.default.replication.factor": "1",
                         "topic.creation.default.partitions": "1"})
        if mode == "string":
            settings["decimal.handling.mode"] = "string"
        if "database.server.id" in settings:
            # each binlog client needs its own server id: MariaDB drops the first of two that share one
            settings["database.server.id"] = str(random.randrange(10_000, 2**31))
        connectors[f"dbz-{mode}"] = settings
    worker.start(connectors)
    try:
        out = {}
        for mode, prefix in prefixes.items():
            value = first_value(bootstrap, f"{prefix}.{table_topic}", worker)
            out[mode] = value["payload"]["after"]
            if mode == "default":
                out["fields"] = _after_fields(value)
        return out
    finally:
        worker.stop()


def _write_or_check(section: str, table: str) -> None:
    text = DOC.read_text()
    begin, end = f"<!-- generated: {section} -->\n", f"<!-- end: {section} -->"
    start, stop = text.index(begin) + len(begin), text.index(end)
    if os.environ.get("CDC_WRITE_DOCS"):
        DOC.write_text(text[:start] + table + text[stop:])
        return
    assert text[start:stop] == table, (f"docs/wire-formats.md ({section}) is out of date: run this test with "
                                       f"CDC_WRITE_DOCS=1 and commit the file")


@pytest.mark.postgres
@pytest.mark.kafka
@pytest.mark.registry
def test_postgres_type_table(pg_dsn, tmp_path, kafka_bootstrap, registry_url):
    columns = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(POSTGRES))
    values = ", ".join(v for _, v in POSTGRES)
    execute(pg_dsn, f"CREATE TABLE typed (id int PRIMARY KEY, {columns})",
            f"INSERT INTO typed VALUES (1, {values})")
    log = EmbeddedLog(tmp_path / "log", TopicSettings())
    with capturing(pg_config(pg_dsn, tmp_path, tables=["public.typed"]), log, "docs") as capture:
        wait_until(lambda: "docs.public.typed" in log.topics() and log.read_all("docs.public.typed"),
                   what="the snapshot row", capture=capture)
    ours = _ours(log, "docs", "pg", "postgresql", "docs.public.typed", registry_url)
    dsn = urlparse(pg_dsn)
    theirs = _theirs(tmp_path, kafka_bootstrap, {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": dsn.hostname, "database.port": str(dsn.port), "database.user": dsn.username or "postgres",
        "database.password": dsn.password or "", "database.dbname": dsn.path.lstrip("/"), "plugin.name": "pgoutput",
        "slot.name": "dbz_{tag}", "publication.name": "dbz_{tag}", "publication.autocreate.mode": "filtered",
        "table.include.list": "public.typed"}, "public.typed")
    _write_or_check("postgres", _table(POSTGRES, ours, theirs))


@pytest.mark.mysql
@pytest.mark.kafka
@pytest.mark.registry
def test_mysql_type_table(mysql_url, mysql_db, tmp_path, kafka_bootstrap, registry_url):
    columns = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(MYSQL))
    values = ", ".join(v for _, v in MYSQL)
    my_execute(mysql_url, mysql_db, f"CREATE TABLE typed (id INT PRIMARY KEY, {columns})",
               "SET time_zone = '+00:00'", f"INSERT INTO typed VALUES (1, {values})")
    log = EmbeddedLog(tmp_path / "log", TopicSettings())
    topic = f"docs.{mysql_db}.typed"
    with capturing(mysql_config(mysql_url, mysql_db), log, "docs") as capture:
        wait_until(lambda: topic in log.topics() and log.read_all(topic), what="the snapshot row", capture=capture)
    ours = _ours(log, "docs", "my", "mysql", topic, registry_url)
    url = urlparse(mysql_url)
    theirs = _theirs(tmp_path, kafka_bootstrap, {
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "database.hostname": url.hostname, "database.port": str(url.port), "database.user": url.username or "root",
        "database.password": url.password or "", "database.server.id": "per-connector",
        "database.include.list": mysql_db, "table.include.list": f"{mysql_db}.typed",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(tmp_path / "history-{tag}.dat"),
        "database.ssl.mode": "disable"}, f"{mysql_db}.typed")
    _write_or_check("mysql", re.sub(re.escape(mysql_db), "shop", _table(MYSQL, ours, theirs)))
