"""Our ``debezium-json`` and ``avro`` topics, read by Debezium's own JDBC sink connector, unmodified.

A PostgreSQL source and a MariaDB source, each with a table of the common column types, captured
by ``cdc run`` with ``log.format: debezium-json`` (or ``avro``) into Kafka; one Kafka Connect
standalone worker runs the Debezium JDBC sink (``io.debezium:debezium-connector-jdbc`` from Maven
Central) for both topics into a PostgreSQL target database, with ``JsonConverter``
``schemas.enable=true`` (for ``avro``: Apicurio's ``AvroConverter`` in Confluent mode, against the
stack's registry), upserts
by record key, deletes enabled and tables made by the connector itself (``schema.evolution``).
A writer inserts, updates, deletes and changes primary keys in both sources while all of it runs.
The test waits until each target table equals its source, value by value, and checks that the
connector typed the columns (numeric, date, timestamp, json, uuid, bytea ... not text).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import time
import uuid
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

import psycopg2
import psycopg2.extras
import pytest

from cdc.dev.connect import ConnectStandalone
from tests.conftest import mysql_connect
from tests.daemon import cdc_process, stop_daemon
from tests.integration.pg_capture import execute

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.mysql]

PG_TABLE = """CREATE TABLE items (
  id integer PRIMARY KEY, sm smallint, big bigint, flag boolean, r real, dp double precision,
  price numeric(10,2), vnum numeric, name varchar(40), note text, ch char(3),
  d date, t time, ts timestamp, ts3 timestamp(3), tz timestamptz,
  j jsonb, js json, u uuid, b bytea)"""
PG_COLUMNS = ["id", "sm", "big", "flag", "r", "dp", "price", "vnum", "name", "note", "ch", "d", "t", "ts", "ts3",
              "tz", "j", "js", "u", "b"]

MY_TABLE = """CREATE TABLE items (
  id INT PRIMARY KEY, ti TINYINT, si SMALLINT, i INT, bi BIGINT, iu INT UNSIGNED, flag BOOLEAN,
  f FLOAT, dbl DOUBLE, price DECIMAL(10,2), name VARCHAR(40), tx TEXT,
  d DATE, dt DATETIME, dt6 DATETIME(6), ts TIMESTAMP(6) NULL, tm TIME, j JSON, e ENUM('small','large'),
  bl BLOB)"""
MY_COLUMNS = ["id", "ti", "si", "i", "bi", "iu", "flag", "f", "dbl", "price", "name", "tx", "d", "dt", "dt6", "ts",
              "tm", "j", "e", "bl"]

# Target column types the connector must choose from our schemas (not text).
PG_TYPED = {"sm": "smallint", "big": "bigint", "flag": "boolean", "r": "real", "dp": "double precision",
            "price": "numeric", "vnum": ("numeric", "double precision"), "d": "date", "t": "time without time zone",
            "ts": "timestamp without time zone", "ts3": "timestamp without time zone",
            "tz": "timestamp with time zone", "j": ("json", "jsonb"), "js": ("json", "jsonb"), "u": "uuid",
            "b": "bytea"}
MY_TYPED = {"ti": "smallint", "si": "smallint", "i": "integer", "bi": "bigint", "iu": "bigint", "f": "real",
            "dbl": "double precision", "price": "numeric", "d": "date", "dt": "timestamp without time zone",
            "dt6": "timestamp without time zone", "ts": "timestamp with time zone",
            "tm": "time without time zone", "j": ("json", "jsonb"), "bl": "bytea"}


def pg_row(rng: random.Random, id_: int) -> dict:
    nullable = rng.random() < 0.15
    return {
        "id": id_, "sm": rng.randint(-32768, 32767), "big": rng.randint(-2**63, 2**63 - 1),
        "flag": rng.random() < 0.5, "r": rng.choice([3.14159, -0.5, 1e10]), "dp": rng.uniform(-1e6, 1e6),
        "price": Decimal(rng.randint(-10**9, 10**9)) / 100, "vnum": Decimal(f"{rng.randint(-10**6, 10**6)}.{rng.randint(0, 999)}"),
        "name": f"name ü {id_} {rng.randint(0, 999)}", "note": None if nullable else "x" * rng.randint(0, 50),
        "ch": rng.choice(["abc", "ab ", "xyz"]),
        "d": dt.date(1950, 1, 1) + dt.timedelta(days=rng.randint(0, 40000)),
        "t": dt.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59), rng.choice([0, 500000, 123456])),
        "ts": dt.datetime(2024, 1, 2, 3, 4, 5, rng.choice([0, 123456])) + dt.timedelta(minutes=rng.randint(-10**6, 10**6)),
        "ts3": dt.datetime(2001, 2, 3, 4, 5, 6, rng.choice([0, 120000])),
        "tz": dt.datetime(2024, 5, 6, 7, 8, 9, rng.choice([0, 654321]), tzinfo=dt.UTC),
        "j": psycopg2.extras.Json({"k": id_, "list": [1, 2.5, None, True], "s": "é"}),
        "js": psycopg2.extras.Json([id_, "two"]), "u": str(uuid.UUID(int=rng.getrandbits(128))),
        "b": None if nullable else bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 20))),
    }


def my_row(rng: random.Random, id_: int) -> dict:
    nullable = rng.random() < 0.15
    return {
        "id": id_, "ti": rng.randint(-128, 127), "si": rng.randint(-32768, 32767), "i": rng.randint(-2**31, 2**31 - 1),
        "bi": rng.randint(-2**63, 2**63 - 1), "iu": rng.randint(0, 2**32 - 1), "flag": rng.randint(0, 1),
        "f": rng.choice([3.14159, -0.5, 1e10]), "dbl": rng.uniform(-1e6, 1e6),
        "price": Decimal(rng.randint(-10**9, 10**9)) / 100, "name": f"name ü {id_}",
        "tx": None if nullable else "t" * rng.randint(0, 40),
        "d": dt.date(1950, 1, 1) + dt.timedelta(days=rng.randint(0, 40000)),
        "dt": dt.datetime(2020, 1, 2, 3, 4, 5) + dt.timedelta(seconds=rng.randint(0, 10**8)),
        "dt6": dt.datetime(2021, 1, 2, 3, 4, 5, rng.choice([0, 1, 999999])),
        "ts": dt.datetime(2022, 3, 4, 5, 6, 7, rng.choice([0, 500000])),
        "tm": dt.timedelta(seconds=rng.randint(0, 86399)),
        "j": json.dumps({"k": id_, "a": [1, "b"]}), "e": rng.choice(["small", "large", None]),
        "bl": None if nullable else bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 20))),
    }


class Writer:
    """Inserts, updates, deletes and primary-key changes against one source table."""

    def __init__(self, rng: random.Random, make, run_sql, placeholder: str) -> None:
        self.rng, self.make, self.run_sql, self.p = rng, make, run_sql, placeholder
        self.ids: list[int] = []
        self.next_id = 1

    def insert(self) -> None:
        row = self.make(self.rng, self.next_id)
        self.next_id += 1
        names = ", ".join(row)
        self.run_sql(f"INSERT INTO items ({names}) VALUES ({', '.join([self.p] * len(row))})", list(row.values()))
        self.ids.append(row["id"])

    def step(self) -> None:
        choice = self.rng.random()
        if not self.ids or choice < 0.35:
            return self.insert()
        id_ = self.rng.choice(self.ids)
        if choice < 0.7:
            row = self.make(self.rng, id_)
            del row["id"]
            sets = ", ".join(f"{n} = {self.p}" for n in row)
            self.run_sql(f"UPDATE items SET {sets} WHERE id = {self.p}", [*row.values(), id_])
        elif choice < 0.85:
            self.run_sql(f"DELETE FROM items WHERE id = {self.p}", [id_])
            self.ids.remove(id_)
        else:  # a primary-key change: a delete of the old key and a create of the new one
            new = self.next_id
            self.next_id += 1
            self.run_sql(f"UPDATE items SET id = {self.p} WHERE id = {self.p}", [new, id_])
            self.ids[self.ids.index(id_)] = new


# Debezium's JDBC sink writes a VariableScaleDecimal (numeric without a fixed scale) into a
# double precision column, as it does for Debezium's own PostgreSQL connector: compared as doubles.
AS_DOUBLE = {"vnum"}


def _norm(value, column: str = ""):
    """One comparable form per value, whichever database and driver it came from."""
    if isinstance(value, memoryview):
        return bytes(value)
    if column in AS_DOUBLE and value is not None:
        return float(value)
    if isinstance(value, Decimal):
        return value.normalize()
    if isinstance(value, dt.timedelta):  # a MySQL TIME of the day
        return (dt.datetime.min + value).time()
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, bool):
        return int(value)
    return value


def _pg_rows(dsn: str, table: str, columns: list[str]) -> dict[int, dict] | None:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
            return {r[0]: {c: _norm(v, c) for c, v in zip(columns, r)} for r in cur.fetchall()}
    except psycopg2.errors.UndefinedTable:
        return None
    finally:
        conn.close()


def _my_rows(url: str, db: str) -> dict[int, dict]:
    conn = mysql_connect(url, db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(f"SELECT {', '.join(MY_COLUMNS)} FROM items")
            return {r[0]: {c: _norm(v) for c, v in zip(MY_COLUMNS, r)} for r in cur.fetchall()}
    finally:
        conn.close()


def _column_types(dsn: str, table: str) -> dict[str, str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
                        (table,))
            return dict(cur.fetchall())
    finally:
        conn.close()


def _jdbc(dsn: str) -> tuple[str, str, str]:
    parsed = urlparse(dsn)
    return (f"jdbc:postgresql://{parsed.hostname}:{parsed.port}{parsed.path}", parsed.username or "postgres",
            parsed.password or "")


def _diff(expected: dict, actual: dict | None) -> str:
    if actual is None:
        return "no target table yet"
    lines = [f"missing {k}" for k in expected if k not in actual][:5]
    lines += [f"extra {k}" for k in actual if k not in expected][:5]
    for k in expected:
        if k in actual and expected[k] != actual[k]:
            lines += [f"{k}.{c}: {expected[k][c]!r} != {actual[k].get(c)!r}"
                      for c in expected[k] if expected[k][c] != actual[k].get(c)][:5]
            break
    return "; ".join(lines)


def _avro_converters(registry_url: str) -> dict[str, str]:
    """Worker settings: keys and values through Apicurio's Avro converter reading Confluent's
    wire format (no headers, the 4-byte id being the registry's content id)."""
    settings = {}
    for side in ("key", "value"):
        settings |= {f"{side}.converter": "io.apicurio.registry.utils.converter.AvroConverter",
                     f"{side}.converter.apicurio.registry.url": registry_url.replace("/apis/ccompat/v7",
                                                                                     "/apis/registry/v2"),
                     f"{side}.converter.apicurio.registry.as-confluent": "true",
                     f"{side}.converter.apicurio.registry.use-id": "contentId",
                     f"{side}.converter.apicurio.registry.headers.enabled": "false"}
    return settings


def _log_section(kafka_bootstrap: str, prefix: str, fmt: str, registry_url: str | None) -> str:
    registry = f"  schema_registry: {{url: '{registry_url}'}}\n" if fmt == "avro" else ""
    return (f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {prefix}}}\n"
            f"  format: {fmt}\n{registry}")


FORMATS = ["debezium-json", pytest.param("avro", marks=pytest.mark.registry)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_debezium_jdbc_sink_reproduces_both_sources(tmp_path: Path, pg_dsn, mysql_url, mysql_db, target_dsn,
                                                     kafka_bootstrap, fmt, request):
    registry_url = request.getfixturevalue("registry_url") if fmt == "avro" else None
    rng = random.Random(17)
    execute(pg_dsn, PG_TABLE)
    conn = mysql_connect(mysql_url, mysql_db)
    conn.cursor().execute(MY_TABLE)

    pg_conn = psycopg2.connect(pg_dsn)
    pg_conn.autocommit = True

    def pg_sql(sql, params):
        with pg_conn.cursor() as cur:
            cur.execute(sql, params)

    def my_sql(sql, params):
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(sql, params)

    pg_writer = Writer(rng, pg_row, pg_sql, "%s")
    my_writer = Writer(rng, my_row, my_sql, "%s")
    for _ in range(20):  # rows for the snapshots
        pg_writer.insert()
        my_writer.insert()

    prefix = f"dbz_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "cdc.yaml"
    config.write_text(
        _log_section(kafka_bootstrap, prefix, fmt, registry_url) +
        f"sources:\n"
        f"  - {{name: pg, type: postgres, dsn: '{pg_dsn}', tables: ['public.items'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1}}\n"
        f"  - {{name: my, type: mysql, url: '{mysql_url}', server_id: {rng.randrange(10_000, 2**31)}, "
        f"tables: ['{mysql_db}.items']}}\n"
        f"http: null\n")
    daemon = cdc_process(config, "run", log="cdc.log")
    url, user, password = _jdbc(target_dsn)
    common = {"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "tasks.max": "1",
              "connection.url": url, "connection.username": user, "connection.password": password,
              "insert.mode": "upsert", "primary.key.mode": "record_key", "delete.enabled": "true",
              "schema.evolution": "basic", "use.time.zone": "UTC"}
    connect = ConnectStandalone(tmp_path, kafka_bootstrap)
    connect.start({
        "pg-sink": {**common, "topics": f"{prefix}.public.items", "collection.name.format": "pg_${source.table}"},
        "my-sink": {**common, "topics": f"{prefix}.{mysql_db}.items", "collection.name.format": "my_${source.table}"},
    }, _avro_converters(registry_url) if fmt == "avro" else None)
    try:
        for _ in range(60):  # while the snapshots, the streams and the connector run
            pg_writer.step()
            my_writer.step()
        deadline = time.monotonic() + float(os.environ.get("DBZ_DEADLINE", 240))
        pg_expected, my_expected = _pg_rows(pg_dsn, "items", PG_COLUMNS), _my_rows(mysql_url, mysql_db)
        while True:
            pg_actual = _pg_rows(target_dsn, "pg_items", PG_COLUMNS)
            my_actual = _pg_rows(target_dsn, "my_items", MY_COLUMNS)
            if pg_actual == pg_expected and my_actual == my_expected:
                break
            assert daemon.poll() is None, (tmp_path / "cdc.log").read_text()[-3000:]
            assert connect.alive(), connect.log_tail()
            if time.monotonic() > deadline:
                pytest.fail(f"PostgreSQL: {_diff(pg_expected, pg_actual)}\nMariaDB: {_diff(my_expected, my_actual)}\n"
                            f"{connect.log_tail()}")
            time.sleep(1)
        assert len(pg_expected) > 20 and len(my_expected) > 20
        for table, typed in (("pg_items", PG_TYPED), ("my_items", MY_TYPED)):
            types = _column_types(target_dsn, table)
            wrong = {c: types.get(c) for c, want in typed.items()
                     if types.get(c) not in (want if isinstance(want, tuple) else (want,))}
            assert not wrong, f"{table}: columns typed otherwise than expected: {wrong}"
    finally:
        connect.stop()
        stop_daemon(daemon)
        conn.close()
        pg_conn.close()


@pytest.mark.parametrize("fmt", ["json", *FORMATS])
def test_our_sql_sink_reads_every_format(tmp_path: Path, pg_dsn, target_dsn, kafka_bootstrap, fmt, request):
    """Our own SQL sink, unchanged, keeps a PostgreSQL target equal to the source from topics in
    any format: the sink runtime decodes them all into the same events."""
    registry_url = request.getfixturevalue("registry_url") if fmt == "avro" else None
    rng = random.Random(7)
    execute(pg_dsn, PG_TABLE)
    pg_conn = psycopg2.connect(pg_dsn)
    pg_conn.autocommit = True

    def pg_sql(sql, params):
        with pg_conn.cursor() as cur:
            cur.execute(sql, params)

    writer = Writer(rng, pg_row, pg_sql, "%s")
    for _ in range(10):
        writer.insert()
    prefix = f"fmt_{uuid.uuid4().hex[:8]}"
    url = target_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
    config = tmp_path / "cdc.yaml"
    config.write_text(
        _log_section(kafka_bootstrap, prefix, fmt, registry_url) +
        f"sources:\n  - {{name: pg, type: postgres, dsn: '{pg_dsn}', tables: ['public.items'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1}}\n"
        f"sinks:\n  - {{name: wh, type: sql, url: '{url}', topics: ['{prefix}.public.*'], batch_wait_ms: 50}}\n"
        f"http: null\n")
    daemon = cdc_process(config, "run", log="cdc.log")
    try:
        for _ in range(40):
            writer.step()
        expected = _pg_rows(pg_dsn, "items", PG_COLUMNS)
        deadline = time.monotonic() + 120
        while (actual := _pg_rows(target_dsn, "items", PG_COLUMNS)) != expected:
            assert daemon.poll() is None, (tmp_path / "cdc.log").read_text()[-3000:]
            if time.monotonic() > deadline:
                pytest.fail(f"{_diff(expected, actual)}\n{(tmp_path / 'cdc.log').read_text()[-3000:]}")
            time.sleep(0.5)
    finally:
        stop_daemon(daemon)
        pg_conn.close()
