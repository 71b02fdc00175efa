"""SQL sink throughput: change events upserted into PostgreSQL by ``SqlSink.write``, beside COPY.

    .venv/bin/cdc dev up --only postgres
    .venv/bin/python -m bench.sql_upsert [--events 500000] [--updates 0.3] [--batch 5000]
                                         [--rounds 2] [--labels raw,typed,jsonb] [--profile sql.prof]

Steps, in one run on this machine, in a fresh database:
  1. events: ``--events`` change events of an ``orders`` table (the columns of bench.pg_stream:
     bigint key, int, text, numeric(10,2), two timestamptz, a mostly-NULL text note) as the
     PostgreSQL source makes them (numerics as strings, timestamps as ISO-8601 with Z), a fraction
     ``--updates`` of them updates of a key inserted earlier, the rest inserts of new keys.
     Built before any clock runs, like the COPY text of step 2.
  2. baseline: the same rows as COPY text, ``COPY orders_copy FROM STDIN`` through psycopg2
     ``copy_expert`` into a plain table with the same columns and no key: the ceiling of getting
     these rows into the server through this driver.
  3. ours: an SqlSink (schema from a schema record, as the runtime gives it) ``write``s the events
     in batches of ``--batch``, each a transaction committed before the next, into a fresh table:
     "raw", the rows as the runtime hands them to this sink now (``raw_rows``: each row's JSON
     bytes, written into the typed COPY by the C loop of cdc/_copytext.c); "typed", the same
     staging from rows decoded to dicts (how the runtime handed them before); "jsonb", the earlier
     staging of each row as one jsonb document; alternately ``--rounds`` times. ``LABEL/N`` in
     ``--labels`` runs that staging with ``write_connections: N`` (``raw/1``: one transaction per
     write, as before the parts; ``raw/2``: the default, two parts at once).
Prints rows/s of each and the ratio to COPY; checks that the table holds every key at its newest
version. Target (issue #18): live upserts >= 150,000 events/s. Each line also prints the
machine's load, the CPU seconds of this process for the writes and those of the database's
PostgreSQL backends meanwhile (from /proc/PID/schedstat, so only with the server on this
machine), in total and per event: the figures load does not inflate the way it inflates wall time.

Where the time went (cProfile of 300k events, 30% updates, batches of 5,000, quiet machine):
jsonb staging: 2.6 s of 3.45 s in the server: the upsert's ``INSERT ... SELECT CAST(s.j->>'c' AS
type) ... ON CONFLICT`` 1.7 s (extracting and casting every column out of jsonb), the COPY of the
jsonb documents 0.8 s (jsonb parsing), commits 0.15 s; in Python the reduction to the newest
version per key 0.3 s, the COPY lines 0.25 s, and a per-row scan for columns of older shapes
0.14 s (now a set union in C). Typed staging moves the parsing into COPY's typed input (one pass,
no jsonb) and leaves the upsert moving rows; the Python side pays about twice the jsonb lines'
cost for the typed text. The runtime (bench/bootstrap.py) also decodes the next batch while this
one is written, which this benchmark, calling ``write`` directly, does not show.

Where the time goes now (300k events, 30% updates, 2 rounds, load 29-44 on 2 cores shared with
other work): raw rows 10.2k and 9.7k events/s, rows as dicts 8.2k and 8.3k, jsonb 8.5k and 8.4k,
COPY 70k-82k rows/s; this process's CPU for the writes 0.8-1.1 s per 300k events with raw or
dict rows (2.7-3.7 us an event: the reduction, the COPY text, the statements' client side), 0.7 s
with jsonb, whose cost is in the server. The server is the bound here: the decoding that raw rows
save happens before ``write`` (bench/bootstrap.py shows it).

Where the server's time went (each statement's backend CPU from /proc/PID/schedstat around it,
300k events, batches of 5,000, load about 9): 6.0 us of backend CPU an event against 3.1 us of
this process's, of which the version-guarded ``INSERT ... SELECT ... ON CONFLICT DO UPDATE``
4.1 us, the typed COPY into the stage 1.4 us, the per-transaction statements (generation lock,
watermarks, the remembered-deletes check, ``CREATE TEMPORARY TABLE IF NOT EXISTS``, the pool's
ping) and the commit 0.5 us. ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of the upsert: a sequential scan
of the stage (under 2% of it), then per new key a speculative insertion (index probe, heap insert,
index insert, a confirmation: three WAL records) and per existing key the row locked, updated and
indexed again (also three), about 250 bytes of WAL a row. No remembered deletes in this
benchmark, so no anti-join. Against a 350k-row table (5,000 staged rows, 70% new keys, median of
8): ``MERGE`` 4.8 us a row, ``ON CONFLICT`` 5.1, an ``UPDATE ... FROM`` of the existing keys and a
plain ``INSERT`` of the new ones 6.1 (and unsafe beside another writer; sinks/sql/README.md,
"Speed"): the statement's form is not where the time is, the heap and index work is. So the
server's share was kept and spread instead: with ``write_connections: 2`` (now the default) a
write's keys go to two transactions on two connections at once, and the server's side runs on
two cores while one part's COPY text is made beside the other's statements.

Paired, alternating runs of 500k events in one session, main's code, then ``raw/2``, then
``raw/1``, three times (load 31-54 on 2 cores shared with up to 7 other sessions, so wall time
says little; CPU per event is the figure to compare):

    main's code   13.8k, 10.8k, 12.5k events/s   this process 2.76-2.93 us/event   backends 6.27-6.38 us/event
    raw/1         17.7k, 12.6k, 10.5k events/s   this process 2.32-2.47 us/event   backends 6.13-6.44 us/event
    raw/2         21.5k, 15.3k, 11.5k events/s   this process 3.39-3.57 us/event   backends 6.71-6.94 us/event

``raw/1`` is main's path (one transaction per write) on this branch's build; main's checkout ran
an older build of cdc/_speedups.c, hence its 0.4 us more of this process's. ``raw/2`` was faster
than ``raw/1`` in each pair (10-22%), and paid for the overlap with about 1.1 us an event more of
this process's CPU (the split, a second transaction's statements and round trips, the threads'
hand-offs, all inflated by the load) and 0.4-0.6 us more of the server's (a second transaction's
fixed statements and commit). Quiet-machine figures are the ones to settle the default by.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import random
import time
import uuid

import orjson
from sqlalchemy.engine import make_url

from bench.pg_stream import execute, fresh_database, print_profile, stack_settings
from cdc.events import Op
from cdc.sink_events import SinkEvent

TARGET = 150_000
TOPIC = "bench.public.orders"
COLUMNS = [("id", "bigint", True), ("customer_id", "integer", False), ("status", "text", False),
           ("total", "numeric(10,2)", False), ("created_at", "timestamp with time zone", False),
           ("updated_at", "timestamp with time zone", False), ("note", "text", False)]
STATUSES = ["new", "paid", "packed", "shipped", "delivered", "cancelled"]


def schema_record() -> dict:
    return {"source": "bench", "db": "bench", "schema": "public", "table": "orders", "version": 1,
            "ts_ms": 0, "ddl": None,
            "columns": [{"name": n, "type": t, "key": k, "nullable": not k} for n, t, k in COLUMNS]}


def make_events(count: int, updates: float, seed: int = 7) -> list[SinkEvent]:
    rng = random.Random(seed)
    events, next_id = [], 1
    source = {"connector": "postgresql", "name": "bench", "db": "bench", "schema": "public",
              "table": "orders", "snapshot": "false"}
    for version in range(1, count + 1):
        if next_id > 1 and rng.random() < updates:
            key, op = rng.randrange(1, next_id), Op.UPDATE
        else:
            key, op, next_id = next_id, Op.CREATE, next_id + 1
        second = version % 86400
        row = {"id": key, "customer_id": (key * 7919) % 50000 + 1, "status": rng.choice(STATUSES),
               "total": f"{rng.randrange(100, 100000) / 100:.2f}",
               "created_at": f"2024-03-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}.{key % 1000:03d}Z",
               "updated_at": f"2024-03-02T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z",
               "note": f"gift wrap, leave at door {key}" if key % 7 == 0 else None}
        events.append(SinkEvent(TOPIC, 0, version, {"id": key}, op, None, row, version * 16,
                                {**source, "version": version * 16}))
    return events


def copy_text(events: list[SinkEvent]) -> bytes:
    lines = []
    for event in events:
        row = event.after
        lines.append("\t".join("\\N" if row[name] is None else str(row[name]) for name, _, _ in COLUMNS))
    return ("\n".join(lines) + "\n").encode()


def run_copy(dsn: str, data: bytes) -> float:
    import psycopg2

    execute(dsn, "CREATE TABLE orders_copy (id bigint, customer_id int, status text, total numeric(10,2), "
                 "created_at timestamptz, updated_at timestamptz, note text)")
    conn = psycopg2.connect(dsn)
    try:
        began = time.perf_counter()
        with conn.cursor() as cur:
            cur.copy_expert("COPY orders_copy FROM STDIN", io.BytesIO(data))
        conn.commit()
        return time.perf_counter() - began
    finally:
        conn.close()


def run_sink(dsn: str, events: list[SinkEvent], batch: int, profile: cProfile.Profile | None,
             typed: bool = True, admin_dsn: str = "", database: str = "",
             connections: int | None = None) -> tuple[float, float | None]:
    """Seconds of the writes, and the CPU seconds of the database's backends meanwhile (None: the
    server is not on this machine)."""
    from sinks.sql import SqlSink, SqlSinkConfig

    more = {} if connections is None else {"write_connections": connections}
    sink = SqlSink(SqlSinkConfig(name="bench", topics=[TOPIC], url=dsn, **more))
    record = schema_record()
    sink.schema_for = lambda topic, version=None: record
    sink.start()
    sink.applier.typed_upserts = typed
    sink.write(events[:1])  # the table and view exist before the clock starts
    try:
        server_before = backend_cpu(admin_dsn, database)
        began = time.perf_counter()
        if profile is not None:
            profile.enable()
        for start in range(1, len(events), batch):
            sink.write(events[start:start + batch])
        if profile is not None:
            profile.disable()
        seconds = time.perf_counter() - began
        server_after = backend_cpu(admin_dsn, database)
        if server_before is None or server_after is None:
            return seconds, None
        return seconds, sum(cpu - server_before.get(pid, 0.0) for pid, cpu in server_after.items())
    finally:
        sink.stop()


def backend_cpu(admin_dsn: str, database: str) -> dict[int, float] | None:
    """CPU seconds so far of each PostgreSQL backend connected to ``database``, from
    /proc/PID/schedstat (nanoseconds on a CPU, not clock ticks); None if the server is not local.
    The sink keeps its connections open for the whole run, so the difference of two readings is
    what its backends spent in between (a backend that joined meanwhile counts from its start)."""
    rows = execute(admin_dsn, "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                   params=(database,))
    out = {}
    for (pid,) in rows:
        try:
            with open(f"/proc/{pid}/schedstat") as file:
                out[pid] = int(file.read().split()[0]) / 1e9
        except OSError:
            return None
    return out


def check(dsn: str, events: list[SinkEvent]) -> None:
    newest: dict[int, int] = {}
    for event in events:
        newest[event.key["id"]] = event.version
    rows = execute(dsn, "SELECT count(*), sum(__cdc_version) FROM orders")
    count, total = rows[0]
    if count != len(newest) or int(total) != sum(newest.values()):
        raise SystemExit(f"wrong result: {count} rows (want {len(newest)}), version sum {total} "
                         f"(want {sum(newest.values())})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--updates", type=float, default=0.3, help="fraction of events that update a key")
    parser.add_argument("--batch", type=int, default=5000, help="events per SqlSink.write")
    parser.add_argument("--profile", help="write a cProfile of ours to this file and print the top")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each staging, alternated")
    parser.add_argument("--labels", default="raw,typed,jsonb",
                        help="which stagings to run, in this order each round (raw, typed, jsonb); LABEL/N: "
                             "with write_connections N (raw/1: one transaction per write)")
    args = parser.parse_args()

    settings = stack_settings()
    events = make_events(args.events, args.updates)
    keys = len({e.key["id"] for e in events})
    data = copy_text(events)
    # The runtime holds one batch at a time; the 500k events built up front here would otherwise
    # make every garbage collection walk them, a cost that only this benchmark has.
    gc.freeze()
    profile = cProfile.Profile() if args.profile else None
    name = f"bench_sql_{uuid.uuid4().hex[:8]}"
    url = make_url(settings["PG_DSN"]).set(drivername="postgresql+psycopg2", database=name)
    print(f"events: {len(events):,} over {keys:,} keys ({args.updates:.0%} updates), batches of {args.batch:,}")
    n = len(events) - 1
    # The rows as the runtime now hands them to this sink (raw_rows): the JSON bytes of each row.
    raw_events = [e._replace(after=orjson.dumps(e.after)) for e in events]
    gc.freeze()
    for round_ in range(args.rounds):
        for index, variant in enumerate(args.labels.split(",")):
            label, _, connections = variant.partition("/")
            typed = label != "jsonb"
            with fresh_database(settings["PG_DSN"], f"{name}_{round_}_{index}{label}") as dsn:
                copy_seconds = run_copy(dsn, data)
                url = url.set(database=f"{name}_{round_}_{index}{label}")
                cpu_before = time.process_time()
                ours_seconds, server_cpu = run_sink(url.render_as_string(hide_password=False),
                                                    raw_events if label == "raw" else events, args.batch,
                                                    profile if label == "raw" and round_ == 0 else None, typed,
                                                    settings["PG_DSN"], f"{name}_{round_}_{index}{label}",
                                                    int(connections) if connections else None)
                cpu_ours = time.process_time() - cpu_before
                check(dsn, events)
            copy_rate, ours_rate = len(events) / copy_seconds, n / ours_seconds
            print(f"round {round_ + 1}  COPY into a plain table       {len(events):>9,} rows   {copy_seconds:7.2f} s   "
                  f"{copy_rate:>10,.0f} rows/s")
            print(f"round {round_ + 1}  SqlSink.write, {variant:5} rows   {n:>9,} events {ours_seconds:7.2f} s   "
                  f"{ours_rate:>10,.0f} events/s   {ours_rate / copy_rate:.2f} x COPY   "
                  f"(target {TARGET:,}: {'met' if ours_rate >= TARGET else 'NOT met'})   "
                  f"(load {os.getloadavg()[0]:.1f}, cpu ours {cpu_ours:.2f}s = {cpu_ours / n * 1e6:.2f} us/event, "
                  f"server " + ("unknown (not local)" if server_cpu is None else
                                f"{server_cpu:.2f}s = {server_cpu / n * 1e6:.2f} us/event") + ")", flush=True)
    if profile is not None:
        print_profile(profile, args.profile)


if __name__ == "__main__":
    main()
