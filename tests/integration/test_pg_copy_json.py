"""The snapshot's lines made in the reader (sources/postgres/copy_json.py) against what the server
prints for the row-JSON statement, byte for byte, over every column type that has a server-side
JSON expression and values chosen to hit each rule (escapes, control characters, numbers that are
not JSON numbers, BC and infinite timestamps, bytea, values at the TOAST threshold)."""

from __future__ import annotations

import io

import psycopg2
import pytest

from cdc.serde import EnvelopeEncoder
from sources.postgres.catalog import table_meta
from sources.postgres.copy_json import CopyJson, compiled
from sources.postgres.snapshot import Chunk, SnapshotRows
from sources.postgres.toast import MIN_TOASTABLE_CHARS
from sources.postgres.types import converter_for, load_type_catalog, session_options
from tests.integration.test_pg_types_live import _typed_table

pytestmark = pytest.mark.postgres

# Rows added to ``typed``'s served columns: (column, SQL value) per row, the rest NULL.
EXTRA_ROWS = [
    {"c_text": "E'\\x01\\x7f\\b\\f\\v\\\\ \"q\" \\t\\r\\n é🎉'", "c_varchar": "E'a\\\\'", "c_name": "E'\\\\N'",
     "c_float8": "1e-300", "c_float4": "'-0'", "c_int2": "-1", "c_bool": "false",
     "c_bytea": "E'\\\\x5c0d0a09'", "c_ts": "'-infinity'", "c_tstz": "'infinity'"},
    {"c_text": f"repeat('é', {MIN_TOASTABLE_CHARS})", "c_xml": f"repeat('<a/>', {MIN_TOASTABLE_CHARS})::xml", "c_numeric": "repeat('9', 600)::numeric",
     "c_bytea": f"decode(repeat('ab', {MIN_TOASTABLE_CHARS // 2 - 1}), 'hex')",
     "c_bytea_empty": f"decode(repeat('5c', {MIN_TOASTABLE_CHARS // 2}), 'hex')",
     "c_float8": "'NaN'", "c_float4": "'Infinity'"},
    {"c_text": f"E'\\\\' || repeat('\t', {MIN_TOASTABLE_CHARS - 1})", "c_tsvector": "'a:1 b:2'::tsvector",
     "c_xml": f"repeat('y', {MIN_TOASTABLE_CHARS - 1})::xml"},
]


def _connect(dsn: str):
    conn = psycopg2.connect(dsn, options=session_options())
    conn.autocommit = True
    return conn


def _copy(conn, sql: str) -> bytes:
    out = io.BytesIO()
    with conn.cursor() as cur:
        cur.copy_expert(sql, out)
    return out.getvalue()


def _plans(conn, table: str):
    with conn.cursor() as cur:
        cur.execute("SELECT %s::regclass::oid", (table,))
        oid = cur.fetchone()[0]
    meta = table_meta(conn, oid, "db", {})
    catalog = load_type_catalog(conn, [c.type_oid for c in meta.columns])

    def plan(client_json: bool):
        rows = SnapshotRows(7, 1, lambda oids: [converter_for(o, catalog) for o in oids], None, batch=100,
                            types=catalog, client_json=client_json)
        return rows.plan(Chunk(meta, None, None))

    return plan(False), plan(True)


def _served_table(conn, key_type: str) -> str:
    """``served``: the key and every column of ``typed`` that the server's expressions serve."""
    _typed_table(conn, "core")
    with conn.cursor() as cur:
        cur.execute("SELECT attname, atttypid FROM pg_attribute WHERE attrelid = 'typed'::regclass "
                    "AND attnum > 1 AND NOT attisdropped ORDER BY attnum")
        typed = cur.fetchall()
        catalog = load_type_catalog(conn, [oid for _, oid in typed])
        from sources.postgres.types.server_json import json_kind

        served = [name for name, oid in typed if json_kind(oid, catalog) is not None]
        cur.execute(f"CREATE TABLE served AS SELECT id::{key_type} AS id, {', '.join(served)} FROM typed")
        cur.execute("ALTER TABLE served ADD PRIMARY KEY (id)")
        for n, row in enumerate(EXTRA_ROWS, 10):
            key = f"E'key\\t{n}\\\\'" if key_type == "text" else str(n)
            cur.execute(f"INSERT INTO served (id, {', '.join(row)}) VALUES ({key}, {', '.join(row.values())})")
    return "served"


@pytest.mark.skipif(compiled() is None, reason="sources.postgres._copyjson not built, or CDC_NATIVE=0")
@pytest.mark.parametrize("key_type", ["int8", "text"])
def test_the_readers_lines_are_the_servers(pg_dsn, key_type):
    conn = _connect(pg_dsn)
    try:
        table = _served_table(conn, key_type)
        by_server, by_reader = _plans(conn, table)
        assert by_server.rewrite is None and isinstance(by_reader.rewrite, CopyJson)
        assert "row_to_json" in by_server.sql and "row_to_json" not in by_reader.sql
        want = _copy(conn, by_server.sql)
        plain = _copy(conn, by_reader.sql)
        assert want.count(b"\n") == 3 + len(EXTRA_ROWS)
        assert by_reader.rewrite.rewrite_lines(plain) == want  # the Python twin
        assert by_reader.rewrite(plain) == want                 # the C function
        # The records are the server statement's, byte for byte (same builders, same lines).
        encoder = EnvelopeEncoder("postgresql", "src", "p")
        assert (encoder.encode(by_server.events(want), now_ms=5)
                == encoder.encode(by_reader.events(by_reader.rewrite(plain)), now_ms=5))
    finally:
        conn.close()


def test_tables_the_server_cannot_serve_keep_the_converters(pg_dsn):
    conn = _connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE with_json (id int PRIMARY KEY, doc jsonb)")
        by_server, by_reader = _plans(conn, "with_json")
        assert by_reader.rewrite is None and not by_reader.server_json
        assert by_reader.sql == by_server.sql
    finally:
        conn.close()
