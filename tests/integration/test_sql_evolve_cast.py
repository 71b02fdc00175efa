"""``schema_policy: evolve`` over a type change the source made with a cast of its own: PostgreSQL's
``ALTER COLUMN ... TYPE double precision`` of a numeric(12,2) and of a bigint rewrites every row
without logging one. The SQL sink changes its column with the same cast (``evolve.casts_alike``),
so the rows it holds equal the source's afterwards, bit for bit, those the source never wrote
again included. Real PostgreSQL source and capture, Kafka, the sink runtime; PostgreSQL, MariaDB
and DuckDB targets (SQLite changes no column's type and stops)."""

from __future__ import annotations

import threading

import pytest

from cdc.errors import SchemaChangeError
from cdc.runtime.sink_runner import SinkRunner
from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink
from tests.integration.pg_capture import (
    capturing,
    execute,
    kafka_log,  # noqa: F401 - the fixture ``log``
    pg_config,
    topic_state,
    wait_until,
)
from tests.live_ddl import differences, rows_of, target_types

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

COLUMNS = ["id", "amount", "big"]
# Decimals that are no binary fraction, the widest numeric(12,2), and integers past 2**53, which a
# double rounds (odd ones to an even neighbour).
SEED = ("INSERT INTO orders SELECT g, g * 1.01 + 0.07, 9007199254740993 + g FROM generate_series(1, 30) g",
        "INSERT INTO orders VALUES (31, 9999999999.99, -9007199254740995), (32, -0.01, NULL)")
CAST = "ALTER TABLE orders ALTER COLUMN amount TYPE double precision, ALTER COLUMN big TYPE double precision"


@pytest.fixture(params=["postgres", pytest.param("mysql", marks=pytest.mark.mysql), "duckdb", "sqlite"])
def target(request, tmp_path) -> tuple[str, str]:
    """(the sink's URL of a fresh target database, the URL the test reads it by)."""
    if request.param == "postgres":
        url = request.getfixturevalue("target_dsn")
        return url, url
    if request.param == "mysql":
        url = f"{request.getfixturevalue('mysql_url')}/{request.getfixturevalue('mysql_db')}"
        return url, url.replace("mysql://", "mysql+pymysql://", 1)
    url = f"{request.param}:///{tmp_path / ('wh.' + request.param)}"
    return url, url


def _catch_up(log, prefix: str, url: str) -> None:
    config = SqlSinkConfig(name=f"{prefix}-wh", type="sql", url=url, topics=[f"{prefix}.public.*"],
                           batch_wait_ms=50, schema_policy="evolve")
    SinkRunner(SqlSink(config), log, prefix).run(threading.Event(), until_caught_up=True)


def test_evolve_applies_the_sources_own_cast_to_the_rows_it_holds(pg_dsn, target, log, kafka_topic, tmp_path):
    url, read_url = target
    source = pg_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
    execute(pg_dsn, "CREATE TABLE orders (id integer PRIMARY KEY, amount numeric(12,2), big bigint)", *SEED)
    prefix, topic = kafka_topic, f"{kafka_topic}.public.orders"
    with capturing(pg_config(pg_dsn, tmp_path), log, prefix) as capture:
        wait_until(lambda: len(topic_state(log, topic)) == 32, what="the snapshot", capture=capture)
        _catch_up(log, prefix, url)
        assert differences(read_url, source, "orders", COLUMNS) is None
        execute(pg_dsn, CAST, "INSERT INTO orders VALUES (1000, 1.2345678901234567, 9007199254740993)")
        wait_until(lambda: '{"id":1000}' in topic_state(log, topic), what="the row of the new shape", capture=capture)
    if url.startswith("sqlite"):  # no ALTER of a column's type there: it stops, as before
        with pytest.raises(SchemaChangeError, match=r"column amount: numeric\(12,2\) -> double precision"):
            _catch_up(log, prefix, url)
        return
    _catch_up(log, prefix, url)
    # Equal as floats, the 32 rows the source's ALTER rewrote without a word included.
    assert differences(read_url, source, "orders", COLUMNS) is None
    assert len(rows_of(read_url, "orders", COLUMNS)) == 33
    types = target_types(read_url, "orders")
    assert types["amount"] == types["big"] == ("DOUBLE PRECISION" if url.startswith("postgres") else "DOUBLE")
