"""The snapshot's COPY read in blocks by the C loop over the libpq psycopg2 runs on (sources/postgres/copy_out.py)
against psycopg2's copy_expert: the same bytes on a table of awkward values (escapes, control
characters, NULLs, TOAST-sized text, bytea, unicode), with and without the row JSON made in the
loop, and the same typed errors for a server error and for a connection killed mid-COPY."""

from __future__ import annotations

import io
import time

import psycopg2
import psycopg2.extensions
import pytest

from cdc import native
from cdc.errors import PermanentError, RetriableError
from sources.postgres import copy_out
from sources.postgres.copy_out import copy_blocks
from sources.postgres.snapshot_procs import copy_lines
from tests.integration.test_pg_copy_json import _connect, _plans, _served_table

pytestmark = pytest.mark.postgres


@pytest.fixture(params=[True, False], ids=["c_loop", "copy_expert"])
def use_c(request):
    if request.param:
        # This build has a compiler, libpq's headers and psycopg2 built on the same libpq
        # (scripts/setup): the C loop must be the one under test.
        assert copy_out.c_loop_ready(), copy_out.why_not_c_loop()
    with native.choose(request.param):
        yield request.param


def _blocks(conn, sql: str, lines: int, rewrite=None) -> list[bytes]:
    blocks: list[bytes] = []
    rows = copy_blocks(conn, sql, lines, blocks.append, rewrite)
    assert rows == sum(block.count(b"\n") for block in blocks)
    return blocks


def test_the_c_loop_reads_what_copy_expert_reads(pg_dsn):
    assert copy_out.c_loop_ready(), copy_out.why_not_c_loop()
    conn = _connect(pg_dsn)
    try:
        table = _served_table(conn, "text")
        with conn.cursor() as cur:  # values TOASTed out of line, larger than libpq's first buffer
            cur.execute(f"INSERT INTO {table} (id, c_text, c_bytea) SELECT 'huge', string_agg(md5(g::text), E'\\t'), "
                        "decode(string_agg(md5(g::text), ''), 'hex') FROM generate_series(1, 10000) g")
        _, plan = _plans(conn, table)
        everything = f"COPY (SELECT * FROM {table} ORDER BY id) TO STDOUT"
        reference = io.BytesIO()
        with conn.cursor() as cur:
            cur.copy_expert(everything, reference)
        want = reference.getvalue()
        assert b"\\\\" in want and b"\\N" in want and len(want) > 100_000  # the awkward values are there
        for lines in (1, 2, 1000):
            blocks = _blocks(conn, everything, lines)
            assert b"".join(blocks) == want
            assert all(block.endswith(b"\n") and block.count(b"\n") <= lines for block in blocks)
        # The row JSON made in the loop, against the same made by the reference from copy_expert's lines.
        made_in_loop = b"".join(_blocks(conn, plan.sql, 2, plan.rewrite))
        with native.reference():
            assert made_in_loop == b"".join(_blocks(conn, plan.sql, 2, plan.rewrite))
        assert made_in_loop == plan.rewrite.rewrite_lines(b"".join(_blocks(conn, plan.sql, 2)))
    finally:
        conn.close()


class _Reader:
    def __init__(self, conn) -> None:
        self.conn = conn


def test_a_server_error_is_the_same_typed_error(pg_dsn, use_c):
    conn = _connect(pg_dsn)
    try:
        with pytest.raises(psycopg2.errors.UndefinedTable) as raised:
            copy_blocks(conn, "COPY no_such_table TO STDOUT", 10, lambda block: None)
        assert raised.value.pgcode == "42P01" and str(raised.value).startswith('relation "no_such_table"')
        with pytest.raises(PermanentError, match=r"reading public.no_such_table.*SQLSTATE 42P01"):
            copy_lines(_Reader(conn), (0, "public.no_such_table", "COPY no_such_table TO STDOUT", 10, None),
                       lambda item: None)
        with conn.cursor() as cur:  # the connection is still usable
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


def test_a_connection_killed_mid_copy_is_a_retriable_error(pg_dsn, use_c):
    conn = _connect(pg_dsn)
    killer = _connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            # ~25 MB of COPY text: far more than the socket buffers hold once the backend is gone.
            cur.execute("CREATE TABLE big AS SELECT g AS id, repeat(md5(g::text), 8) AS t "
                        "FROM generate_series(1, 100000) g")
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
        blocks: list[bytes] = []

        def emit(item) -> None:
            blocks.append(item[1])
            if len(blocks) == 1:  # rows have arrived: now the backend goes
                with killer.cursor() as cur:
                    cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    while True:
                        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
                        if cur.fetchone()[0] == 0:
                            break
                        time.sleep(0.05)

        with pytest.raises(RetriableError, match="reading public.big for the snapshot") as raised:
            copy_lines(_Reader(conn), (0, "public.big", "COPY big TO STDOUT", 100, None), emit)
        assert isinstance(raised.value.__cause__, psycopg2.OperationalError)
        assert blocks and sum(block.count(b"\n") for block in blocks) < 100_000
    finally:
        conn.close()
        killer.close()


def test_outside_a_transaction_psycopg2_still_begins_one(pg_dsn, use_c):
    # incremental.py reads its chunks on a connection that is not autocommit, between transactions:
    # psycopg2 sends BEGIN before the COPY there, and so it must stay.
    conn = psycopg2.connect(pg_dsn)
    try:
        assert conn.status == psycopg2.extensions.STATUS_READY
        assert _blocks(conn, "COPY (SELECT 1, 'a') TO STDOUT", 10) == [b"1\ta\n"]
        assert conn.status == psycopg2.extensions.STATUS_BEGIN
        conn.rollback()
    finally:
        conn.close()
