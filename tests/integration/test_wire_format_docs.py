"""docs/wire-formats.md's type tables, made from real rows: a PostgreSQL and a MariaDB table with a
column per common type, captured by the real sources, each value shown in the ``json`` format and
in ``debezium-json`` (Debezium's default modes) with its Connect schema.

The test fails when the tables in the docs differ from what the sources and encoders produce now;
``CDC_WRITE_DOCS=1`` writes them instead (then commit docs/wire-formats.md).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import orjson
import pytest

from cdc.events import ChangeEvent, Op, SnapshotMarker
from cdc.formats.debezium_json import DebeziumJsonEncoder
from cdc.formats.shapes import known_shapes
from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from tests.integration.pg_capture import capturing, execute, pg_config, wait_until
from tests.integration.test_mysql_source import execute as my_execute, mysql_config

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


def _schema_text(field: dict) -> str:
    name = field.get("name")
    params = field.get("parameters")
    text = field["type"] + (f" {name}" if name else "")
    if params:
        text += " (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
    return text.replace("|", "\\|")


def _table(types: list[tuple[str, str]], after: dict, debezium_after: dict, fields: dict) -> str:
    lines = ["| column type | value written | `json` | `debezium-json` | Connect schema (debezium-json) |",
             "|---|---|---|---|---|"]
    for index, (type_name, literal) in enumerate(types):
        column = f"c{index}"
        lines.append(f"| {type_name} | `{literal.replace('|', chr(92) + '|')}` | {_cell(after[column])} | "
                     f"{_cell(debezium_after[column])} | {_schema_text(fields[column])} |")
    return "\n".join(lines) + "\n"


def _debezium(log, prefix: str, source: str, connector: str, topic: str) -> tuple[dict, dict, dict]:
    """(json after, debezium-json after, after's field schemas) of the one row of ``topic``."""
    [record] = [r for r in log.read_all(topic) if r.value is not None]
    envelope = orjson.loads(record.value)
    encoder = DebeziumJsonEncoder(connector, source, prefix)
    shapes = known_shapes(log, prefix, source)
    encoder.learn(shapes)
    [shape] = [s for s in shapes if s.table.topic(prefix) == topic]
    encoder.schema_versions[shape.table] = shape.version
    event = ChangeEvent(Op(envelope["op"]), shape.table, orjson.loads(record.key), None, envelope["after"],
                        envelope["source"]["version"], envelope["source"]["ts_ms"], SnapshotMarker.TRUE)
    [encoded] = encoder.encode([event], now_ms=0)
    value = orjson.loads(encoded.value)
    after_schema = next(f for f in value["schema"]["fields"] if f["field"] == "after")
    return envelope["after"], value["payload"]["after"], {f["field"]: f for f in after_schema["fields"]}


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
def test_postgres_type_table(pg_dsn, tmp_path):
    columns = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(POSTGRES))
    values = ", ".join(v for _, v in POSTGRES)
    execute(pg_dsn, f"CREATE TABLE typed (id int PRIMARY KEY, {columns})",
            f"INSERT INTO typed VALUES (1, {values})")
    log = EmbeddedLog(tmp_path / "log", TopicSettings())
    with capturing(pg_config(pg_dsn, tmp_path, tables=["public.typed"]), log, "docs") as capture:
        wait_until(lambda: "docs.public.typed" in log.topics() and log.read_all("docs.public.typed"),
                   what="the snapshot row", capture=capture)
    after, debezium_after, fields = _debezium(log, "docs", "pg", "postgresql", "docs.public.typed")
    _write_or_check("postgres", _table(POSTGRES, after, debezium_after, fields))


@pytest.mark.mysql
def test_mysql_type_table(mysql_url, mysql_db, tmp_path):
    columns = ", ".join(f"c{i} {t}" for i, (t, _) in enumerate(MYSQL))
    values = ", ".join(v for _, v in MYSQL)
    my_execute(mysql_url, mysql_db, f"CREATE TABLE typed (id INT PRIMARY KEY, {columns})",
               "SET time_zone = '+00:00'", f"INSERT INTO typed VALUES (1, {values})")
    log = EmbeddedLog(tmp_path / "log", TopicSettings())
    topic = f"docs.{mysql_db}.typed"
    with capturing(mysql_config(mysql_url, mysql_db), log, "docs") as capture:
        wait_until(lambda: topic in log.topics() and log.read_all(topic), what="the snapshot row", capture=capture)
    after, debezium_after, fields = _debezium(log, "docs", "my", "mysql", topic)
    _write_or_check("mysql", re.sub(re.escape(mysql_db), "shop", _table(MYSQL, after, debezium_after, fields)))
