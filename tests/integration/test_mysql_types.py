"""Every column type through both paths: the snapshot (text protocol) and the binlog (row images)
give byte-for-byte the same JSON, and the values the contract asks for (see sources/mysql/types.py)."""

from __future__ import annotations

import base64

import orjson
import pytest

from cdc.log.embedded import EmbeddedLog
from tests.conftest import mysql_connect
from tests.integration.pg_capture import snapshot_row_as_streamed, topic_state, wait_until
from tests.integration.test_mysql_source import capturing, execute, mysql_config

pytestmark = pytest.mark.mysql

TYPES_TABLE = """
CREATE TABLE typed (
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, mi MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED,
  bi BIGINT, biu BIGINT UNSIGNED, bool_col BOOLEAN,
  d1 DECIMAL(10,2), d2 DECIMAL(65,30), d3 DECIMAL(5,0), d4 DECIMAL(4,4),
  f FLOAT, f2 FLOAT, dbl DOUBLE, dbl2 DOUBLE,
  ch CHAR(5), vc VARCHAR(40), l1 VARCHAR(20) CHARACTER SET latin1, asc_col VARCHAR(5) CHARACTER SET ascii,
  tx TEXT, lt LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  bn BINARY(4), vb VARBINARY(10), bl BLOB, lb LONGBLOB,
  j JSON, j2 JSON, e ENUM('small','medium','large'), e0 ENUM('a','b'), st SET('a','b','c'), st0 SET('x','y'),
  b1 BIT(1), b10 BIT(10), b64 BIT(64), y YEAR, y0 YEAR,
  da DATE, dz DATE, dt0 DATETIME, dt3 DATETIME(3), dt6 DATETIME(6), dtz DATETIME,
  ts0 TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL, ts6 TIMESTAMP(6) NULL, tsz TIMESTAMP NULL,
  tm0 TIME, tm1 TIME(1), tm6 TIME(6), tmn TIME(3),
  g GEOMETRY, pt POINT,
  n_int INT, n_text TEXT, n_dt DATETIME(6)
)"""

TYPES_ROW = r"""({id}, -128, 255, -32768, 16777215, -2147483648, 4294967295,
 -9223372036854775808, 18446744073709551615, TRUE,
 -12345678.90, 12345678901234567890123456789012345.123456789012345678901234567890, -99999, 0.5,
 3.14159, 16777217, 0.1, -1.7976931348623157e308,
 'ab  ', 'ünïcödé 😀 "q" \\ tab	', {latin1}, 'plain',
 'text', '{{"not": "json"}}',
 'a\0', 'xy\0', 'blob\0bytes', REPEAT('z', 70000),
 '{{"a": [1, 2.5, null, true], "b": {{"c": "d", "ü": "é"}}, "n": 12345678901234567890}}', '"just a string"',
 'medium', '', 'a,c', '', b'1', b'1010101010', b'1111111111111111111111111111111111111111111111111111111111111111',
 2024, 0,
 '2024-02-29', '0000-00-00', '2024-01-02 03:04:05', '2024-01-02 03:04:05.12', '1999-12-31 23:59:59.999999',
 '0000-00-00 00:00:00',
 '2024-01-02 03:04:05', '2024-01-02 03:04:05.5', '1970-01-01 05:30:01.000001', '0000-00-00 00:00:00',
 '12:34:56', '-12:34:56.7', '838:59:59.000001', '-00:00:00.5',
 ST_GeomFromText('LINESTRING(0 0, 1 1)'), ST_GeomFromText('POINT(1 2)'),
 NULL, NULL, NULL)"""


def insert(url: str, db: str, id_: int) -> None:
    conn = mysql_connect(url, db)
    with conn.cursor() as cur:
        # Zero dates need a lax sql_mode; TIMESTAMPs are given in +05:30 and come out in UTC.
        cur.execute("SET SESSION sql_mode = '', time_zone = '+05:30'")
        # Three latin1 bytes that differ from ISO-8859-1: 0xE9 é, 0x80 € (cp1252), 0x81 (MySQL's U+0081).
        cur.execute("INSERT INTO typed VALUES " + TYPES_ROW.format(id=id_, latin1=conn.escape("café €\x81")))
    conn.close()


def test_snapshot_and_stream_give_the_same_json_for_every_type(mysql_url, mysql_db, tmp_path):
    execute(mysql_url, mysql_db, TYPES_TABLE)
    insert(mysql_url, mysql_db, 1)
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    topic = f"ty.{mysql_db}.typed"
    try:
        with capturing(mysql_config(mysql_url, mysql_db), log, "ty") as capture:
            wait_until(lambda: len(topic_state(log, topic)) == 1, capture=capture)
            insert(mysql_url, mysql_db, 2)
            wait_until(lambda: len(topic_state(log, topic)) == 2, capture=capture)
        a = snapshot_row_as_streamed(log, topic)
    finally:
        log.close()

    assert (a["ti"], a["tiu"], a["si"], a["mi"], a["i"], a["iu"]) == (-128, 255, -32768, 16777215, -2**31, 2**32 - 1)
    assert a["bi"] == -2**63 and a["biu"] == 2**64 - 1 and a["bool_col"] == 1
    assert b'"biu":18446744073709551615' in orjson.dumps(a)  # a JSON number beyond int64
    assert a["d1"] == "-12345678.90" and a["d3"] == "-99999" and a["d4"] == "0.5000"
    assert a["d2"] == "12345678901234567890123456789012345.123456789012345678901234567890"
    assert a["f"] == 3.14159 and a["f2"] == 16777216.0 and a["dbl"] == 0.1 and a["dbl2"] == -1.7976931348623157e308
    assert a["ch"] == "ab" and a["vc"] == 'ünïcödé 😀 "q" \\ tab\t' and a["l1"] == "café €\x81"
    assert a["asc_col"] == "plain" and a["tx"] == "text"
    assert a["lt"] == '{"not": "json"}'  # a LONGTEXT that is not JSON stays text
    assert base64.b64decode(a["bn"]) == b"a\0\0\0" and base64.b64decode(a["vb"]) == b"xy\0"
    assert base64.b64decode(a["bl"]) == b"blob\0bytes" and base64.b64decode(a["lb"]) == b"z" * 70000
    assert a["j"] == {"a": [1, 2.5, None, True], "b": {"c": "d", "ü": "é"}, "n": 12345678901234567890}
    assert a["j2"] == "just a string"
    assert a["e"] == "medium" and a["e0"] == "" and a["st"] == ["a", "c"] and a["st0"] == []
    assert (a["b1"], a["b10"], a["b64"]) == (1, 682, 2**64 - 1) and (a["y"], a["y0"]) == (2024, 0)
    assert a["da"] == "2024-02-29" and a["dz"] is None and a["dtz"] is None and a["tsz"] is None
    assert a["dt0"] == "2024-01-02T03:04:05" and a["dt3"] == "2024-01-02T03:04:05.120"
    assert a["dt6"] == "1999-12-31T23:59:59.999999"
    assert a["ts0"] == "2024-01-01T21:34:05Z" and a["ts2"] == "2024-01-01T21:34:05.50Z"
    assert a["ts6"] == "1970-01-01T00:00:01.000001Z"
    assert a["tm0"] == "12:34:56" and a["tm1"] == "-12:34:56.7" and a["tm6"] == "838:59:59.000001"
    assert a["tmn"] == "-00:00:00.500"
    point = base64.b64decode(a["pt"])
    assert point[:4] == b"\0\0\0\0" and point[4:] == bytes.fromhex("0101000000000000000000f03f0000000000000040")
    assert a["n_int"] is None and a["n_text"] is None and a["n_dt"] is None
