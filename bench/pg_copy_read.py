"""The snapshot reader's own cost: CPU per row of reading a table's COPY in this process, each way.

    .venv/bin/cdc dev up --only postgres
    .venv/bin/python -m bench.pg_copy_read [--rows 1000000] [--rounds 2]

On bench.pg_snapshot's ``orders`` table, the chunk statement the snapshot runs (the plain COPY of
every column; the row JSON is made in the reader), read on one connection into a sink that keeps
nothing, timed by this process's CPU seconds (the load does not inflate them much; wall time is
printed too, and it is mostly the server's):

* ``copy_expert -> NullSink``: psycopg2's loop into a Python ``write`` that counts bytes, as
  bench.pg_snapshot's COPY baseline reads;
* ``copy_expert -> io.BytesIO``: the same loop into a C-level ``write``;
* ``copy_expert -> blocks``: psycopg2's loop into the readers' line-block writer
  (``copy_out._LineBlocks``, what the readers used before the C loop and fall back to), without
  and with the row JSON (``copy_json.CopyJson``);
* ``C loop -> blocks``: ``copy_out.copy_blocks``, libpq's loop in C without the GIL, without and
  with the row JSON made in the same loop.
* ``psycopg 3 -> blocks``: where psycopg 3 is importable (not a dependency), ``cursor.copy`` read
  a row per ``read()`` and joined into the same blocks, without and with the row JSON (the C
  rewrite of ``_copyjson`` per block): the alternative to the C loop that drives no libpq itself.

Measured (load 11-12 on the shared 2-core machine, 1M rows, two sessions of two rounds): copy_expert
into the null sink 0.17-0.23 us a row, into BytesIO 0.21-0.33, into the line blocks 0.24-0.32 and
0.40-0.65 with the row JSON; the C loop 0.09-0.19 (0.09-0.10 in three rounds of four) and
0.22-0.29 with the row JSON. So driving COPY through psycopg2 a row at a time costs a reader about
0.15-0.4 us a row, which the C loop takes off; the reader was never the large part of a snapshot
row's 3-4 us (bench.pg_snapshot's docstring).
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import time
import uuid

import psycopg2

try:
    import psycopg  # only to compare with: not a dependency of the project
except ImportError:
    psycopg = None

from bench.pg_snapshot import NullSink, make_table
from bench.pg_stream import fresh_database, stack_settings


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def orders_plan(conn):
    """The snapshot's plan of the whole ``orders`` table (its COPY statement and row JSON)."""
    from sources.postgres.catalog import table_meta
    from sources.postgres.snapshot import Chunk, SnapshotRows
    from sources.postgres.types import converter_for, load_type_catalog

    with conn.cursor() as cur:
        cur.execute("SELECT 'orders'::regclass::oid")
        oid = cur.fetchone()[0]
    meta = table_meta(conn, oid, "db", {})
    catalog = load_type_catalog(conn, [c.type_oid for c in meta.columns])
    rows = SnapshotRows(1, 1, lambda oids: [converter_for(o, catalog) for o in oids], None, batch=2048,
                        types=catalog)
    return rows.plan(Chunk(meta, None, None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from sources.postgres import copy_out
    from sources.postgres.types import session_options

    if not copy_out.c_loop_ready():
        raise SystemExit(f"the C loop is not available here: {copy_out.why_not_c_loop()}")
    settings = stack_settings()
    with fresh_database(settings["PG_DSN"], f"bench_copy_read_{uuid.uuid4().hex[:8]}") as dsn:
        make_table(dsn, args.rows)
        conn = psycopg2.connect(dsn, options=session_options())
        conn.autocommit = True
        conn3 = None
        try:
            plan = orders_plan(conn)
            assert plan.rewrite is not None, "the row JSON is made by the server here: no _copyjson build"
            sql = plan.sql

            def expert(sink) -> None:
                with conn.cursor() as cur:
                    cur.copy_expert(sql, sink, size=1 << 20)

            def blocks(use_c: bool, rewrite) -> None:
                # Only the read loop changes (copy_blocks' fallback is copy_expert): the row JSON
                # stays the C rewrite either way, so the two reads are compared alone.
                real = copy_out.c_loop_ready
                if not use_c:
                    copy_out.c_loop_ready = lambda: False
                try:
                    copy_out.copy_blocks(conn, sql, 2048, lambda block: None, rewrite)
                finally:
                    copy_out.c_loop_ready = real

            if psycopg is not None:
                conn3 = psycopg.connect(dsn, options=session_options(), autocommit=True)

            def psycopg3(rewrite) -> None:
                with conn3.cursor() as cur, cur.copy(sql) as copy:
                    rows, read = [], copy.read
                    while data := read():
                        rows.append(data)
                        if len(rows) == 2048:
                            block = b"".join(rows)
                            rows.clear()
                            if rewrite is not None:
                                rewrite(block)
                    if rows and rewrite is not None:
                        rewrite(b"".join(rows))

            ways = [("copy_expert -> NullSink", lambda: expert(NullSink())),
                    ("copy_expert -> io.BytesIO", lambda: expert(io.BytesIO())),
                    ("copy_expert -> blocks", lambda: blocks(False, None)),
                    ("copy_expert -> blocks + row JSON", lambda: blocks(False, plan.rewrite)),
                    ("C loop -> blocks", lambda: blocks(True, None)),
                    ("C loop -> blocks + row JSON", lambda: blocks(True, plan.rewrite))]
            if psycopg is not None:
                ways += [(f"psycopg 3 ({psycopg.pq.__impl__}) -> blocks", lambda: psycopg3(None)),
                         (f"psycopg 3 ({psycopg.pq.__impl__}) -> blocks + row JSON", lambda: psycopg3(plan.rewrite))]
            expert(NullSink())  # warm the cache
            for number in range(args.rounds):
                print(f"round {number + 1}, load {os.getloadavg()[0]:.1f}")
                for label, run in ways:
                    began_cpu, began = cpu_seconds(), time.perf_counter()
                    run()
                    used, elapsed = cpu_seconds() - began_cpu, time.perf_counter() - began
                    print(f"  {label:<44} cpu {used / args.rows * 1e6:5.2f} us/row   "
                          f"wall {elapsed / args.rows * 1e6:5.2f} us/row", flush=True)
        finally:
            conn.close()
            if conn3 is not None:
                conn3.close()


if __name__ == "__main__":
    main()
