"""Type conversion against a real PostgreSQL: the same rows read by COPY (as the snapshot reads
them) and streamed through a pgoutput slot (as the source streams them) convert to the expected
JSON values, and to byte-identical JSON for snapshot and stream."""

from __future__ import annotations

import select
import struct
import time
import uuid

import orjson
import psycopg2
import pytest
from psycopg2.extras import LogicalReplicationConnection

from sources.postgres.types import (
    SESSION_SETTINGS,
    TypeKind,
    convert_row,
    converter_for,
    iter_copy_batches,
    iter_copy_rows,
    load_type_catalog,
    session_options,
)

pytestmark = pytest.mark.postgres

SETUP = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
CREATE TYPE pair AS (a int4, b text);
"""


def _range(lower, upper, lower_inc, upper_inc):
    return {"lower": lower, "upper": upper, "lower_inc": lower_inc, "upper_inc": upper_inc}


# (column, type, SQL for row 1, expected value for row 1, SQL for row 2, expected for row 2).
# Row 1 holds typical values, row 2 edge values; row 3 is NULL in every column but the key.
COLUMNS = [
    ("c_int2", "int2", "-32768", -32768, "0", 0),
    ("c_int8", "int8", "9223372036854775807", 9223372036854775807, "-9223372036854775808", -9223372036854775808),
    ("c_oid", "oid", "4294967295", 4294967295, "0", 0),
    ("c_numeric", "numeric", "12.50", "12.50", "'NaN'", "NaN"),
    ("c_numeric_inf", "numeric", "'Infinity'", "Infinity", "'-Infinity'", "-Infinity"),
    ("c_float4", "float4", "0.1", 0.1, "'NaN'", "NaN"),
    ("c_float8", "float8", "1.5e300", 1.5e300, "'-Infinity'", "-Infinity"),
    ("c_float8_inf", "float8", "'Infinity'", "Infinity", "'-0'", -0.0),
    ("c_bool", "bool", "true", True, "false", False),
    ("c_text", "text", "'hello'", "hello",
     "E'tab\\there\\nnew line\\r \\\\ back \"q\" \\'s é🎉 \\\\N'", "tab\there\nnew line\r \\ back \"q\" 's é🎉 \\N"),
    ("c_varchar", "varchar(20)", "'v'", "v", "''", ""),
    ("c_bpchar", "char(5)", "'abc'", "abc  ", "''", "     "),
    ("c_name", "name", "'nm'", "nm", "'ü'", "ü"),
    ("c_char", "\"char\"", "'x'", "x", "'y'", "y"),
    ("c_bytea", "bytea", "'\\x0001ff'", "AAH/", "'\\x00000000'", "AAAAAA=="),
    ("c_bytea_empty", "bytea", "''", "", "'\\x5c0a09'", "XAoJ"),
    ("c_date", "date", "'2024-02-29'", "2024-02-29", "'0044-03-15 BC'", "0044-03-15 BC"),
    ("c_date_inf", "date", "'infinity'", "infinity", "'-infinity'", "-infinity"),
    ("c_time", "time", "'03:04:05.5'", "03:04:05.5", "'24:00:00'", "24:00:00"),
    ("c_timetz", "timetz", "'10:00:00.25+02'", "10:00:00.25+02", "'00:00:00-05:30'", "00:00:00-05:30"),
    ("c_ts", "timestamp", "'2024-01-02 03:04:05.123456'", "2024-01-02T03:04:05.123456",
     "'infinity'", "infinity"),
    ("c_ts_bc", "timestamp", "'2024-01-02 03:04:05'", "2024-01-02T03:04:05",
     "'0044-03-15 12:00:00 BC'", "0044-03-15 12:00:00 BC"),
    ("c_tstz", "timestamptz", "'2024-01-02 03:04:05.123456+05'", "2024-01-01T22:04:05.123456Z",
     "'-infinity'", "-infinity"),
    ("c_tstz_edge", "timestamptz", "'2024-01-02 03:04:05.5+00'", "2024-01-02T03:04:05.5Z",
     "'0044-03-15 12:00:00+00 BC'", "0044-03-15 12:00:00+00 BC"),
    ("c_interval", "interval", "'1 year 2 mons 3 days 04:05:06.7'", "P1Y2M3DT4H5M6.7S", "'-1 day'", "P-1D"),
    ("c_uuid", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
     "'00000000-0000-0000-0000-000000000000'", "00000000-0000-0000-0000-000000000000"),
    ("c_inet", "inet", "'10.0.0.1/8'", "10.0.0.1/8", "'::1'", "::1"),
    ("c_cidr", "cidr", "'10.0.0.0/8'", "10.0.0.0/8", "'2001:db8::/32'", "2001:db8::/32"),
    ("c_macaddr", "macaddr", "'08:00:2b:01:02:03'", "08:00:2b:01:02:03",
     "'ff:ff:ff:ff:ff:ff'", "ff:ff:ff:ff:ff:ff"),
    ("c_macaddr8", "macaddr8", "'08:00:2b:01:02:03:04:05'", "08:00:2b:01:02:03:04:05",
     "'08:00:2b:01:02:03'", "08:00:2b:ff:fe:01:02:03"),
    ("c_money", "money", "1234.5", "$1,234.50", "-1234.5", "-$1,234.50"),
    ("c_bit", "bit(3)", "B'101'", "101", "B'000'", "000"),
    ("c_varbit", "varbit", "B'1010'", "1010", "B''", ""),
    ("c_xml", "xml", "'<a>x</a>'", "<a>x</a>", "'<b>é &amp; \"q\"</b>'", "<b>é &amp; \"q\"</b>"),
    ("c_tsvector", "tsvector", "'a b'", "'a' 'b'", "''", ""),
    ("c_point", "point", "'(1,2)'", "(1,2)", "'(-1.5,0)'", "(-1.5,0)"),
    ("c_line", "line", "'{1,2,3}'", "{1,2,3}", "'{1,-1,0}'", "{1,-1,0}"),
    ("c_lseg", "lseg", "'[(0,0),(1,1)]'", "[(0,0),(1,1)]", "'[(0,0),(0,0)]'", "[(0,0),(0,0)]"),
    ("c_box", "box", "'((0,0),(1,1))'", "(1,1),(0,0)", "'((0,0),(0,0))'", "(0,0),(0,0)"),
    ("c_path", "path", "'((0,0),(1,1))'", "((0,0),(1,1))", "'[(0,0),(1,1)]'", "[(0,0),(1,1)]"),
    ("c_polygon", "polygon", "'((0,0),(1,1),(1,0))'", "((0,0),(1,1),(1,0))", "'((0,0))'", "((0,0))"),
    ("c_circle", "circle", "'<(0,0),1>'", "<(0,0),1>", "'<(1,1),0>'", "<(1,1),0>"),
    ("c_lsn", "pg_lsn", "'0/16B3748'", "0/16B3748", "'FFFFFFFF/FFFFFFFF'", "FFFFFFFF/FFFFFFFF"),
    ("c_json", "json", "'{\"a\": [1, 2.50, null]}'", {"a": [1, 2.5, None]},
     "'[1e400, \"\\u00e9\\n\", {\"k\": 1, \"k\": 2}]'", ["1e400", "é\n", {"k": 2}]),
    ("c_jsonb", "jsonb", "'{\"b\": {\"c\": \"é\"}, \"a\": 1}'", {"a": 1, "b": {"c": "é"}},
     "'{\"k\": [null, {\"d\": 1.0}], \"t\": \"tab\\t\"}'", {"k": [None, {"d": 1.0}], "t": "tab\t"}),
    ("c_mood", "mood", "'happy'", "happy", "'sad'", "sad"),
    ("c_posint", "posint", "7", 7, "2147483647", 2147483647),
    ("c_pair", "pair", "ROW(1, 'a b')", "(1,\"a b\")", "ROW(NULL, 'x\"y')", "(,\"x\"\"y\")"),
    ("c_int4range", "int4range", "'[1,5)'", _range(1, 5, True, False), "'empty'", "empty"),
    ("c_numrange", "numrange", "'(,2.5]'", _range(None, "2.5", False, True), "'(,)'", _range(None, None, False, False)),
    ("c_tstzrange", "tstzrange", "'[2024-01-01 00:00+00,2024-02-01 00:00+00)'",
     _range("2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z", True, False),
     "'[-infinity,infinity]'", _range("-infinity", "infinity", True, True)),
    ("c_daterange", "daterange", "'[2024-01-01,infinity)'", _range("2024-01-01", "infinity", True, False),
     "'[2024-01-01,2024-01-01]'", _range("2024-01-01", "2024-01-02", True, False)),
    ("c_int4multirange", "int4multirange", "'{[1,3), [5,7)}'",
     [_range(1, 3, True, False), _range(5, 7, True, False)], "'{}'", []),
    ("c_tsmultirange", "tsmultirange", "'{[2024-01-01 00:00, 2024-01-02 00:00)}'",
     [_range("2024-01-01T00:00:00", "2024-01-02T00:00:00", True, False)],
     "'{(,2024-01-01 00:00]}'", [_range(None, "2024-01-01T00:00:00", False, True)]),
    ("c_int_arr", "int4[]", "'{1,2,3}'", [1, 2, 3], "'{}'", []),
    ("c_int_2d", "int4[]", "'{{1,2},{3,4}}'", [[1, 2], [3, 4]],
     "'[0:1][1:2]={{1,NULL},{3,4}}'", [[1, None], [3, 4]]),
    ("c_text_arr", "text[]", "'{a,\"b c\"}'", ["a", "b c"],
     "ARRAY['', 'NULL', NULL, 'a,b', '{x}', 'q\"', E'back\\\\slash', ' lead', 'é🎉', E'tab\\t', 'null']",
     ["", "NULL", None, "a,b", "{x}", "q\"", "back\\slash", " lead", "é🎉", "tab\t", "null"]),
    ("c_text_3d", "text[]", "'{{{a},{b}},{{c},{d}}}'", [[["a"], ["b"]], [["c"], ["d"]]], "'{{NULL}}'", [[None]]),
    ("c_tstz_arr", "timestamptz[]", "ARRAY['2024-01-02 03:04:05+00'::timestamptz]", ["2024-01-02T03:04:05Z"],
     "ARRAY['infinity'::timestamptz, NULL]", ["infinity", None]),
    ("c_box_arr", "box[]", "ARRAY['((0,0),(1,1))'::box, '((2,2),(3,3))']", ["(1,1),(0,0)", "(3,3),(2,2)"],
     "'{}'", []),
    ("c_jsonb_arr", "jsonb[]", "ARRAY['{\"a\": 1}'::jsonb, '\"x\"']", [{"a": 1}, "x"],
     "ARRAY[NULL::jsonb, '[]', 'null']", [None, [], None]),
    ("c_bytea_arr", "bytea[]", "ARRAY['\\x00'::bytea, '\\xff']", ["AA==", "/w=="],
     "ARRAY[''::bytea, NULL, '\\x0000']", ["", None, "AAA="]),
    ("c_mood_arr", "mood[]", "'{sad,happy}'", ["sad", "happy"], "'{}'", []),
    ("c_numeric_arr", "numeric[]", "'{1.50,NaN}'", ["1.50", "NaN"],
     "'{Infinity,-Infinity,NULL}'", ["Infinity", "-Infinity", None]),
    ("c_float_arr", "float8[]", "'{1.5,NaN,Infinity}'", [1.5, "NaN", "Infinity"],
     "'{-Infinity,0,-0}'", ["-Infinity", 0.0, -0.0]),
    ("c_range_arr", "int4range[]", "ARRAY['[1,3)'::int4range, 'empty']",
     [_range(1, 3, True, False), "empty"], "'{}'", []),
    ("c_date_arr", "date[]", "'{2024-01-01,infinity}'", ["2024-01-01", "infinity"],
     "'[0:1]={2024-01-01,-infinity}'", ["2024-01-01", "-infinity"]),
    ("c_uuid_arr", "uuid[]", "ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid]",
     ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"], "'{}'", []),
    ("c_posint_arr", "posint[]", "ARRAY[1, 2]::posint[]", [1, 2], "ARRAY[NULL]::posint[]", [None]),
]
HSTORE_COLUMNS = [
    ("c_hstore", "hstore", "'a=>1, \"b c\"=>NULL'", {"a": "1", "b c": None},
     # hstore orders keys by length, then bytes
     "E'\"q\\\\\"x\"=>\"NULL\", \"bs\\\\\\\\\"=>\"\", \"é\"=>\"ü\"'", {"é": "ü", "bs\\": "", "q\"x": "NULL"}),
    ("c_hstore_empty", "hstore", "''", {}, "'k=>\"v, w\"'", {"k": "v, w"}),
    ("c_hstore_arr", "hstore[]", "ARRAY['a=>1'::hstore, 'b=>NULL']", [{"a": "1"}, {"b": None}],
     "ARRAY[''::hstore, NULL]", [{}, None]),
]


def _connect(dsn: str, **kwargs):
    return psycopg2.connect(dsn, options=session_options(), **kwargs)


def _has_hstore(conn) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'hstore'")
        return cur.fetchone()[0] == 1


def _insert_texts(payload: bytes) -> list[str | None]:
    """The column texts of a pgoutput Insert message (protocol version 1):
    'I', int32 relation oid, 'N', int16 column count, then per column 'n' (NULL), 'u' (unchanged
    TOAST) or 't' + int32 length + text."""
    assert payload[:1] == b"I" and payload[5:6] == b"N", payload[:8]
    (count,) = struct.unpack_from("!h", payload, 6)
    pos, texts = 8, []
    for _ in range(count):
        kind = payload[pos:pos + 1]
        pos += 1
        if kind == b"n":
            texts.append(None)
        elif kind == b"t":
            (length,) = struct.unpack_from("!i", payload, pos)
            texts.append(payload[pos + 4:pos + 4 + length].decode("utf-8"))
            pos += 4 + length
        else:
            raise AssertionError(f"unexpected column kind {kind!r} in an insert")
    assert pos == len(payload)
    return texts


def _stream_inserts(dsn: str, slot: str, publication: str, count: int) -> list[list[str | None]]:
    conn = _connect(dsn, connection_factory=LogicalReplicationConnection)
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slot, decode=False,
                              options={"proto_version": "1", "publication_names": publication})
        inserts: list[list[str | None]] = []
        deadline = time.monotonic() + 60
        while len(inserts) < count:
            message = cur.read_message()
            if message is None:
                assert time.monotonic() < deadline, f"only {len(inserts)} of {count} inserts streamed"
                select.select([cur], [], [], 1.0)
                continue
            if message.payload[:1] == b"I":
                inserts.append(_insert_texts(message.payload))
            cur.send_feedback(flush_lsn=message.data_start)
        return inserts
    finally:
        conn.close()


def _typed_table(conn, family: str, before_rows=None) -> list:
    """Create ``typed`` with the family's columns (``before_rows(cur)`` runs before the three rows
    go in) and fill it; the family's column list."""
    with conn.cursor() as cur:
        if family == "hstore":
            if not _has_hstore(conn):
                pytest.skip("the hstore extension is not installed on this server (postgresql-contrib)")
            cur.execute("CREATE EXTENSION IF NOT EXISTS hstore")
            columns = HSTORE_COLUMNS
        else:
            cur.execute(SETUP)
            columns = COLUMNS
        cur.execute("CREATE TABLE typed (id int4 PRIMARY KEY, "
                    + ", ".join(f"{name} {sql_type}" for name, sql_type, *_ in columns) + ")")
        if before_rows is not None:
            before_rows(cur)
        names = ", ".join(["id"] + [c[0] for c in columns])
        cur.execute(f"INSERT INTO typed ({names}) VALUES (1, {', '.join(c[2] for c in columns)})")
        cur.execute(f"INSERT INTO typed ({names}) VALUES (2, {', '.join(c[4] for c in columns)})")
        cur.execute("INSERT INTO typed (id) VALUES (3)")
    return columns


@pytest.mark.parametrize("family", ["core", "hstore"])
def test_copy_and_pgoutput_give_the_expected_and_identical_json(pg_dsn, family):
    conn = _connect(pg_dsn)
    conn.autocommit = True
    slot = f"slot_{uuid.uuid4().hex[:10]}"

    def publish(cur) -> None:
        cur.execute("CREATE PUBLICATION pub_typed FOR TABLE typed")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))

    columns = _typed_table(conn, family, publish)
    with conn.cursor() as cur:
        cur.execute("SELECT atttypid FROM pg_attribute WHERE attrelid = 'typed'::regclass AND attnum > 0 "
                    "AND NOT attisdropped ORDER BY attnum")
        type_oids = [row[0] for row in cur.fetchall()]
        for setting, value in SESSION_SETTINGS.items():
            cur.execute("SELECT current_setting(%s)", (setting,))
            assert cur.fetchone()[0] == value, setting

    catalog = load_type_catalog(conn, type_oids)
    by_name = {info.name: info for info in catalog.values()}
    if family == "hstore":
        assert by_name["hstore"].kind is TypeKind.BASE and by_name["hstore"].oid >= 16384
        assert by_name["_hstore"].kind is TypeKind.ARRAY and by_name["_hstore"].element_oid == by_name["hstore"].oid
    else:
        assert by_name["mood"].kind is TypeKind.ENUM
        assert by_name["posint"].kind is TypeKind.DOMAIN and by_name["posint"].base_oid == 23
        assert by_name["_posint"].kind is TypeKind.ARRAY
        assert catalog[by_name["_posint"].element_oid].name == "posint"
        assert by_name["pair"].kind is TypeKind.COMPOSITE
        assert by_name["int4multirange"].kind is TypeKind.MULTIRANGE
        assert by_name["int4multirange"].element_oid == by_name["int4range"].oid
        assert by_name["int4multirange"].range_subtype_oid == 23 and by_name["int4range"].range_subtype_oid == 23
        assert by_name["_box"].kind is TypeKind.ARRAY and by_name["box"].delimiter == ";"
        assert by_name["int4"].kind is TypeKind.BASE  # reached from the domain, the arrays and the ranges
        assert by_name["_int4"].kind is TypeKind.ARRAY and by_name["_int4"].element_oid == 23

    converters = [(name, converter_for(oid, catalog)) for name, oid in zip(["id"] + [c[0] for c in columns],
                                                                           type_oids)]
    expected = [{"id": 1, **{c[0]: c[3] for c in columns}},
                {"id": 2, **{c[0]: c[5] for c in columns}},
                {"id": 3, **{c[0]: None for c in columns}}]

    with conn.cursor() as cur:
        copied = [convert_row(converters, texts)
                  for texts in iter_copy_rows(cur, "COPY (SELECT * FROM typed ORDER BY id) TO STDOUT")]
    conn.close()
    for row, want in zip(copied, expected, strict=True):
        for name in want:
            assert row[name] == want[name] and type(row[name]) is type(want[name]), \
                f"row {want['id']} column {name}: {row[name]!r} != {want[name]!r}"
        assert orjson.dumps(row) == orjson.dumps(want)

    streamed = [convert_row(converters, texts) for texts in _stream_inserts(pg_dsn, slot, "pub_typed", 3)]
    for snapshot_row, stream_row in zip(copied, streamed, strict=True):
        assert orjson.dumps(stream_row) == orjson.dumps(snapshot_row)


def test_copy_rows_stream_in_bounded_batches(pg_dsn):
    conn = _connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            batches = list(iter_copy_batches(
                cur, "COPY (SELECT g, E'a\\tb\\\\' || g, CASE WHEN g % 2 = 0 THEN NULL ELSE 'x' END "
                     "FROM generate_series(1, 10500) g) TO STDOUT", batch_rows=1000))
        assert [len(b) for b in batches] == [1000] * 10 + [500]
        rows = [row for batch in batches for row in batch]
        assert rows[0] == ["1", "a\tb\\1", "x"] and rows[-1] == ["10500", "a\tb\\10500", None]
        with conn.cursor() as cur:  # the connection is usable after a complete COPY
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


def test_copy_errors_reach_the_consumer(pg_dsn):
    conn = _connect(pg_dsn)
    try:
        with conn.cursor() as cur, pytest.raises(psycopg2.errors.UndefinedTable):
            list(iter_copy_rows(cur, "COPY (SELECT * FROM no_such_table) TO STDOUT"))
    finally:
        conn.close()


def test_closing_early_cancels_a_slow_copy(pg_dsn):
    conn = _connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            # Row 3 takes a minute. The NOTICE before the sleep makes the server flush rows 1 and 2
            # (COPY itself buffers), so the reader thread has handed them over and waits on the
            # server when the consumer stops.
            cur.execute("CREATE FUNCTION slow(g int) RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
                        "IF g = 3 THEN RAISE NOTICE 'flush'; PERFORM pg_sleep(60); END IF; RETURN g; END $$")
            conn.commit()
            rows = iter_copy_rows(cur, "COPY (SELECT slow(g) FROM generate_series(1, 3) g) TO STDOUT",
                                  batch_rows=1)
            assert [next(rows), next(rows)] == [["1"], ["2"]]
            started = time.monotonic()
            rows.close()
            assert time.monotonic() - started < 10
    finally:
        conn.close()


@pytest.mark.parametrize("family", ["core", "hstore"])
def test_server_json_expressions_give_the_converters_values(pg_dsn, family):
    """What the snapshot reads when PostgreSQL prints the row JSON (types/server_json.py) equals
    what the converters make of the same rows' text, value for value, for every type that has an
    expression; the types without one are exactly those the converters build structures for."""
    from sources.postgres.snapshot import quote_ident
    from sources.postgres.types.server_json import json_expression

    conn = _connect(pg_dsn)
    conn.autocommit = True
    columns = _typed_table(conn, family)
    with conn.cursor() as cur:
        cur.execute("SELECT attname, atttypid FROM pg_attribute WHERE attrelid = 'typed'::regclass "
                    "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")
        typed = cur.fetchall()
    catalog = load_type_catalog(conn, [oid for _, oid in typed])
    expressions = {name: json_expression(oid, catalog, "x." + quote_ident(name)) for name, oid in typed}
    kinds = {name: catalog[oid].kind if oid in catalog else TypeKind.BASE for name, oid in typed}
    structured = {name for name, kind in kinds.items()
                  if kind in (TypeKind.ARRAY, TypeKind.RANGE, TypeKind.MULTIRANGE)}
    without = {name for name, expression in expressions.items() if expression is None}
    want_without = structured | {c[0] for c in columns if c[1] in ("json", "jsonb", "hstore")}
    assert without == want_without
    served = {name: e for name, e in expressions.items() if e is not None}
    assert len(served) > (40 if family == "core" else 0)

    converters = [(name, converter_for(oid, catalog)) for name, oid in typed]
    select = ", ".join(f"{e} AS {quote_ident(n)}" for n, e in served.items())
    with conn.cursor() as cur:
        by_converters = [convert_row(converters, texts)
                         for texts in iter_copy_rows(cur, "COPY (SELECT * FROM typed ORDER BY id) TO STDOUT")]
        by_server = [orjson.loads(texts[0]) for texts in iter_copy_rows(
            cur, f"COPY (SELECT row_to_json(j) FROM typed x CROSS JOIN LATERAL (SELECT {select}) j "
                 f"ORDER BY x.id) TO STDOUT")]
    conn.close()
    for want, got in zip(by_converters, by_server, strict=True):
        for name in served:
            # Values as a JSON reader sees them: -0 and -0.0 are the same number.
            assert got[name] == orjson.loads(orjson.dumps(want[name])), \
                f"row {want['id']} column {name}: server {got[name]!r} != converters {want[name]!r}"


@pytest.mark.parametrize("key_type", ["bigint", "text"])
def test_snapshot_rows_server_json_and_converters_make_the_same_events(pg_dsn, key_type, tmp_path):
    """SnapshotRows with the server printing the row JSON (whole batches at once where no line has
    an escape or a long value, line by line where one does) against SnapshotRows with the
    converters: the same keys and the same rows, event for event."""
    from sources.postgres.catalog import table_meta
    from sources.postgres.snapshot import Chunk, SnapshotReader, SnapshotRows
    from sources.postgres.toast import ToastStore

    conn = _connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE plain (id {key_type} PRIMARY KEY, name text, amount numeric(10,2), "
                    "at timestamptz, note text)")
        # Batches of plain rows; one batch with a backslash, one with a tab and a newline in a value,
        # one with a long value: those go line by line.
        cur.execute("INSERT INTO plain SELECT g::text::" + key_type + ", 'name ' || g, g * 1.25, "
                    "timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute', "
                    "CASE WHEN g % 3 = 0 THEN NULL WHEN g = 2500 THEN 'back\\slash' "
                    "WHEN g = 3700 THEN E'tab\\there\\nnewline' WHEN g = 4100 THEN repeat('x', 900) "
                    "ELSE 'note ' || g END FROM generate_series(1, 5000) g")
        cur.execute("SELECT 'plain'::regclass::oid")
        oid = cur.fetchone()[0]
    meta = table_meta(conn, oid, "db", {})
    catalog = load_type_catalog(conn, [c.type_oid for c in meta.columns])
    exporter = _connect(pg_dsn)
    with exporter.cursor() as cur:
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SELECT pg_export_snapshot()")
        snapshot_name = cur.fetchone()[0]

    def events(server_json: bool) -> list:
        rows = SnapshotRows(7, 1, lambda oids: [converter_for(o, catalog) for o in oids],
                            ToastStore(tmp_path / f"toast-{server_json}.db"), batch=1000, types=catalog,
                            server_json=server_json)
        reader = SnapshotReader(pg_dsn, session_options(), snapshot_name, "test")
        batches: list = []
        try:
            rows.read(reader, Chunk(meta, None, None), batches.append)
        finally:
            reader.close()
        return ([event for events, _, _ in batches for event in events],
                [entry for _, _, toast in batches for entry in toast])

    (by_server, server_toast), (by_converters, converter_toast) = events(True), events(False)
    # The long value is handed to the TOAST store either way (a later update may leave it out).
    assert server_toast == converter_toast and len(server_toast) == 1 and server_toast[0][2] == "x" * 900
    exporter.close()
    conn.close()
    assert len(by_server) == len(by_converters) == 5000
    assert any(isinstance(e.after, orjson.Fragment) for e in by_server)
    for got, want in zip(by_server, by_converters, strict=True):
        assert got.key == want.key
        assert orjson.loads(orjson.dumps(got.after)) == orjson.loads(orjson.dumps(want.after)), got.key
        assert got._replace(after=None) == want._replace(after=None)
