"""The chunk digests of ``cdc verify`` (cdc/api/digest.py): each database's SQL renders a row into
the reference's text and hash, on real PostgreSQL and MariaDB, edge values included. A rendering
that differs from the reference would make every chunk of such a value differ (a slow verify),
and one that renders two different values alike would hide a difference: both fail here."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import psycopg2
import pytest

from cdc.api.digest import (
    DigestColumn,
    DigestPlan,
    Kind,
    digest_of,
    mysql_hash,
    mysql_value,
    postgres_hash,
    postgres_value,
    row_hash,
    row_text,
)
from tests.conftest import mysql_connect

PLAN = DigestPlan("id", (DigestColumn("id", Kind.INTEGER), DigestColumn("price", Kind.DECIMAL, 2),
                         DigestColumn("note", Kind.TEXT), DigestColumn("flag", Kind.BOOLEAN),
                         DigestColumn("day", Kind.DATE), DigestColumn("at", Kind.INSTANT),
                         DigestColumn("ts", Kind.TIMESTAMP)))

PLUS_TWO = timezone(timedelta(hours=2))
ROWS = [
    {"id": -5, "price": Decimal("1.005"), "note": "", "flag": True, "day": date(1, 1, 1),
     "at": datetime(2026, 12, 6, 16, 40, 0, 1, tzinfo=UTC), "ts": datetime(1, 1, 1)},
    {"id": 0, "price": Decimal("-1.005"), "note": "a|b", "flag": False, "day": date(2026, 2, 28),
     "at": datetime(2026, 1, 1, 1, 30, tzinfo=PLUS_TWO), "ts": datetime(2026, 12, 6, 16, 40, 0, 999999)},
    {"id": 7, "price": Decimal("123456789.994"), "note": "ünïcødé 🎉 it's", "flag": None, "day": None,
     "at": None, "ts": None},
    {"id": 8, "price": None, "note": "\\N", "flag": True, "day": date(9999, 12, 31),
     "at": datetime(1970, 1, 1, tzinfo=UTC), "ts": datetime(2000, 2, 29, 23, 59, 59)},
    {"id": 9007199254740993, "price": Decimal("0"), "note": None, "flag": None, "day": None, "at": None, "ts": None},
]


def _expected() -> list[tuple[int, str, int]]:
    return [(row["id"], row_text(PLAN, row), row_hash(row_text(PLAN, row))) for row in ROWS]


@pytest.mark.postgres
def test_postgresql_renders_rows_as_the_reference(pg_dsn):
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            # A session zone far from UTC: an instant's text must not depend on it.
            cur.execute("SET TimeZone = 'America/Los_Angeles'")
            cur.execute("CREATE TABLE t (id bigint PRIMARY KEY, price numeric(14,3), note text, flag boolean, "
                        "day date, at timestamptz, ts timestamp)")
            for row in ROWS:
                cur.execute("INSERT INTO t VALUES (%(id)s, %(price)s, %(note)s, %(flag)s, %(day)s, %(at)s, %(ts)s)",
                            row)
            values = [postgres_value(c, f'"{c.name}"') for c in PLAN.columns]
            cur.execute(f"SELECT id, {' || chr(124) || '.join(values)}, {postgres_hash(values)} FROM t ORDER BY id")
            assert cur.fetchall() == _expected()
            cur.execute(f"SELECT count(*), sum({postgres_hash(values)}) FROM t")
            assert tuple(map(int, cur.fetchone())) == digest_of(PLAN, ROWS)
    finally:
        conn.close()


@pytest.mark.mysql
def test_mariadb_renders_rows_as_the_reference(mysql_url, mysql_db):
    conn = mysql_connect(mysql_url, mysql_db, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            # DATETIME holds UTC (the SQL sink's choice): the instants are stored so.
            cur.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, price DECIMAL(14,3), note LONGTEXT, flag BOOLEAN, "
                        "day DATE, at DATETIME(6), ts DATETIME(6)) CHARACTER SET utf8mb4")
            for row in ROWS:
                at = row["at"] and row["at"].astimezone(UTC).replace(tzinfo=None)
                cur.execute("INSERT INTO t VALUES (%s, %s, %s, %s, %s, %s, %s)",
                            (row["id"], row["price"], row["note"], row["flag"], row["day"], at, row["ts"]))
            values = [mysql_value(c, f"`{c.name}`") for c in PLAN.columns]
            cur.execute(f"SELECT id, CONCAT_WS('|', {', '.join(values)}), {mysql_hash(values)} FROM t ORDER BY id")
            assert [(int(i), text, int(h)) for i, text, h in cur.fetchall()] == _expected()
            cur.execute(f"SELECT count(*), sum({mysql_hash(values)}) FROM t")
            assert tuple(map(int, cur.fetchone())) == digest_of(PLAN, ROWS)
    finally:
        conn.close()


def test_the_reference_tells_apart_what_a_store_may_get_wrong():
    """Pure logic: values a broken store could hold instead render differently."""
    base = dict(ROWS[1])
    texts = {row_text(PLAN, base)}
    for change in ({"price": Decimal("-1.00")}, {"note": "a"}, {"note": None}, {"flag": None}, {"flag": True},
                   {"at": base["at"] + timedelta(microseconds=1)}, {"ts": None}, {"day": date(2026, 3, 1)}):
        texts.add(row_text(PLAN, {**base, **change}))
    assert len(texts) == 9
    # A text holding the separator cannot pass for two columns.
    assert row_text(PLAN, {**base, "note": "a|b", "flag": None}) != row_text(PLAN, {**base, "note": "a", "flag": None})


def test_source_columns_map_to_the_kinds_and_casts_their_stores_hold():
    """Pure logic: which PostgreSQL and MariaDB source columns take a digest, and how a PostgreSQL
    source casts a value to the warehouse's type (a real through its text, as the event carries it)."""
    from sources.mysql.types import ColumnType
    from sources.mysql.verify_reader import _kind_of as mysql_kind
    from sources.postgres.verify_reader import _cast
    from sources.postgres.verify_reader import _kind_of as pg_kind

    assert [pg_kind(t) for t in ("integer", "numeric(10,2)", "character varying(20)", "timestamp(3) with time zone",
                                 "timestamp without time zone", "date", "boolean", "jsonb", "real", None)] == \
        [Kind.INTEGER, Kind.DECIMAL, Kind.TEXT, Kind.INSTANT, Kind.TIMESTAMP, Kind.DATE, Kind.BOOLEAN, None, None, None]
    assert [mysql_kind(ColumnType(d, c)) for d, c in (("int", "int(11) unsigned"), ("tinyint", "tinyint(1)"),
                                                       ("timestamp", "timestamp(6)"), ("datetime", "datetime"),
                                                       ("enum", "enum('a')"), ("blob", "blob"))] == \
        [Kind.INTEGER, None, Kind.INSTANT, Kind.TIMESTAMP, Kind.TEXT, None]
    assert mysql_kind(ColumnType("varchar", "varchar(10)", binary=True)) is None
    assert _cast('"r"', "real", "double precision") == '"r"::text::double precision'
    assert _cast('"a"', "integer[]", "jsonb") == 'to_jsonb("a")' and _cast('"j"', "json", "jsonb") == '"j"::jsonb'
    assert _cast('"m"', "money", "text") == '"m"::text' and _cast('"p"', "numeric", "numeric(10,2)") == '"p"::numeric(10,2)'
