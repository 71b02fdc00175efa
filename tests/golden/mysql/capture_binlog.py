"""Capture row events from a real MariaDB binlog into ``tests/golden/mysql/rows.json``.

Run it again whenever the golden file should come from another server version::

    PYTHONPATH=. .venv/bin/python tests/golden/mysql/capture_binlog.py [--url mysql://root@host:port]

(default URL: ``MYSQL_URL`` from the environment or ``.cdc/dev.env``). It creates the scratch
database ``golden_binlog_capture``, runs the workload below, reads the binlog from just before it
with pymysqlreplication, and stores for each table its column specs (``ColumnSpec``, as the source
derives them from the table map) and for each row event its kind and row-image bytes (what the
source's decoder is given). ``tests/unit/test_mysql_decoder.py`` asserts on values that follow
from this workload, so change both together.

Workload (``all_types`` has one column of each type the source decodes):

1. ``all_types``: a full row (id 1), a row of NULLs (id 2), a row of extremes and negatives (id 3),
   a row of zero dates inserted with ``sql_mode=''`` (id 4);
2. an update of id 1 (three columns change), then an update moving id 2 to id 20;
3. a delete of id 3;
4. ``narrow``: 300 rows in one INSERT (several rows per event, a 2-byte VARCHAR length, a SET
   with 10 members stored in 2 bytes), then one UPDATE of all of them.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
OUT = HERE / "rows.json"
DATABASE = "golden_binlog_capture"

ALL_TYPES = """
CREATE TABLE all_types (
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT, miu MEDIUMINT UNSIGNED,
  i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  d1 DECIMAL(10,2), d2 DECIMAL(30,10), d3 DECIMAL(5,0), d4 DECIMAL(4,4),
  f FLOAT, dbl DOUBLE,
  ch CHAR(5), vc VARCHAR(20), vl VARCHAR(10) CHARACTER SET latin1, tx TEXT, mt MEDIUMTEXT,
  bn BINARY(4), vb VARBINARY(10), bl BLOB,
  j JSON, e ENUM('small','medium','large'), st SET('a','b','c'), b1 BIT(1), b10 BIT(10), b64 BIT(64),
  y YEAR, dt DATE,
  dt0 DATETIME, dt3 DATETIME(3), dt6 DATETIME(6),
  ts0 TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL, ts6 TIMESTAMP(6) NULL,
  tm0 TIME, tm1 TIME(1), tm4 TIME(4), tm6 TIME(6)
)"""

FULL_ROW = """(1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
 -9223372036854775808, 18446744073709551615,
 -12345678.90, 12345678901234567890.0123456789, 99999, 0.1234,
 3.14159, 2.718281828459045,
 'ab  ', 'héllo wörld', 'caf\xe9', 'text', 'medium text',
 'a\\0', 'xy\\0', 'blob\\0bytes',
 '{"a": [1, 2.5, null], "b": {"c": "d"}}', 'medium', 'a,c', b'1', b'1010101010', b'1111111111111111111111111111111111111111111111111111111111111111',
 2024, '2024-02-29',
 '2024-01-02 03:04:05', '2024-01-02 03:04:05.123', '2024-01-02 03:04:05.123456',
 '2024-01-02 03:04:05', '2024-01-02 03:04:05.5', '1970-01-01 00:00:01.000001',
 '12:34:56', '-12:34:56.7', '838:59:59.9999', '-838:59:59.000000')"""

EXTREMES_ROW = """(3, 127, 0, 32767, 0, 8388607, 0, 2147483647, 0, 9223372036854775807, 0,
 99999999.99, -99999999999999999999.9999999999, -99999, -0.9999,
 -1.5e-10, -1.7976931348623157e308,
 '', '', '', '', '',
 '', '', '',
 '[]', 'small', '', b'0', b'0', b'0',
 1901, '1000-01-01',
 '1000-01-01 00:00:00', '9999-12-31 23:59:59.999', '9999-12-31 23:59:59.999999',
 '2038-01-19 03:14:07', '2038-01-19 03:14:07.99', '2038-01-19 03:14:07.999999',
 '-838:59:59', '00:00:00.1', '-00:00:00.0001', '-00:00:01.000001')"""

NARROW = """
CREATE TABLE narrow (
  id INT PRIMARY KEY, label VARCHAR(300), tags SET('t0','t1','t2','t3','t4','t5','t6','t7','t8','t9') NOT NULL,
  qty SMALLINT NOT NULL, price DECIMAL(8,3) NOT NULL
) CHARACTER SET utf8mb4"""


def default_url() -> str:
    url = os.environ.get("MYSQL_URL")
    if url:
        return url
    env = Path(__file__).resolve().parents[3] / ".cdc" / "dev.env"
    for line in env.read_text().splitlines():
        if line.startswith("MYSQL_URL="):
            return line.split("=", 1)[1]
    raise SystemExit("no MYSQL_URL: run `.venv/bin/cdc dev up --only mysql`")


def capture(url: str) -> dict:
    import pymysql
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

    from sources.mysql.columns import specs_from_table_map

    parsed = urlparse(url)
    settings = dict(host=parsed.hostname, port=parsed.port or 3306, user=parsed.username or "root",
                    password=parsed.password or "")
    conn = pymysql.connect(**settings, autocommit=True)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        cur.execute(f"CREATE DATABASE {DATABASE}")
        cur.execute(f"USE {DATABASE}")
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(ALL_TYPES)
        cur.execute(NARROW)
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
        cur.execute("SELECT VERSION()")
        version = cur.fetchone()[0]
        cur.execute("INSERT INTO all_types VALUES " + FULL_ROW)
        cur.execute("INSERT INTO all_types (id) VALUES (2)")
        cur.execute("INSERT INTO all_types VALUES " + EXTREMES_ROW)
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute("INSERT INTO all_types (id, dt, dt0, dt6, ts0, ts6, y) VALUES "
                    "(4, '0000-00-00', '0000-00-00 00:00:00', '2024-00-10 10:00:00', '0000-00-00 00:00:00', "
                    "'0000-00-00 00:00:00', 0)")
        cur.execute("SET SESSION sql_mode = DEFAULT")
        cur.execute("UPDATE all_types SET vc = 'changed', bi = 42, j = '{\"k\": true}' WHERE id = 1")
        cur.execute("UPDATE all_types SET id = 20 WHERE id = 2")
        cur.execute("DELETE FROM all_types WHERE id = 3")
        cur.execute("INSERT INTO narrow SELECT seq, repeat(concat('label ', seq, ' '), 20), "
                    "CONCAT_WS(',', IF(seq % 2, 't0', NULL), IF(seq % 3 = 0, 't9', NULL)), seq, seq * 1.125 "
                    "FROM seq_1_to_300")
        cur.execute("UPDATE narrow SET qty = -qty, price = -price")
        cur.execute("SHOW MASTER STATUS")
        end = cur.fetchone()[1]
    conn.close()

    stream = BinLogStreamReader(settings, server_id=4242, log_file=file, log_pos=pos, resume_stream=True,
                                blocking=False, only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent,
                                                             DeleteRowsEvent], only_schemas=[DATABASE],
                                enable_logging=False)
    tables: dict[str, list] = {}
    events = []
    kinds = {WriteRowsEvent: "write", UpdateRowsEvent: "update", DeleteRowsEvent: "delete"}
    for event in stream:
        if event.packet.log_pos > end:
            break
        if isinstance(event, TableMapEvent):
            specs = specs_from_table_map(event, "mariadb", {"j"} if event.table == "all_types" else set())
            tables[event.table] = [s.to_dict() for s in specs]
        else:
            packet = event.packet.packet
            body = packet._data[packet._position:20 + event.event_size]
            events.append({"table": event.table, "kind": kinds[type(event)],
                           "body": base64.b64encode(body).decode()})
    stream.close()
    conn = pymysql.connect(**settings, autocommit=True)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE {DATABASE}")
    conn.close()
    return {"server_version": version, "tables": tables, "events": events}


def load() -> dict:
    return json.loads(OUT.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    result = capture(args.url or default_url())
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(result['events'])} row events of {sorted(result['tables'])} from {result['server_version']} "
          f"written to {OUT}")


if __name__ == "__main__":
    main()
