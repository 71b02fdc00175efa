"""Bootstrap throughput: a new SQL target filled from a compacted topic, beside COPY.

    .venv/bin/cdc dev up --only postgres kafka
    .venv/bin/python -m bench.bootstrap [--events 500000] [--keys 200000] [--rounds 1]
    .venv/bin/python -m bench.bootstrap --events 3000000 --keys 1000000     # issue #18's size

Measures, in one run (the topic is published once), "now" (batch by batch, below) beside "bulk":
what `cdc bootstrap` runs into PostgreSQL since the bulk path (``SinkRunner.rebuild``: the history
reduced to the newest version per key in windows in C, cdc/_window.c, read partition after
partition, each window whose keys the new generation does not hold yet COPYed straight into it
while the next is read, sinks/sql/bulk_load.py; ``--window-mb`` sets
``bulk_window_mb``, ``--bulk-only`` skips "now"). Each line prints the CPU seconds of this
process, of the server and of the dev stack's Kafka broker, also per record: on a loaded machine
those are the figures to compare.


  copy       COPY of the final rows (one per live key) into a plain PostgreSQL table: the floor
             for loading that data.
  bootstrap  what `cdc bootstrap` does: a SinkRunner reads the topic from offset 0 to its end
             (Kafka, 3 partitions, every update and delete of the history still there, as before
             compaction) and writes it through the SQL sink (version-guarded upserts) into a new
             PostgreSQL database. Records/s over the whole history, and rows/s of the final table.
             "now": reading and decoding the next batch while the sink writes one, upserts staged
             as typed COPY rows, and the rows left as JSON bytes from the log to the COPY text
             (``raw_rows``: the C decoder and COPY loop of cdc/_decode.c and cdc/_copytext.c, no dict per row);
             "dicts": the same with every row decoded to a dict (how "now" ran before the raw
             rows); "before": every row a dict, upserts staged as jsonb (how it ran before issue
             #18, but reading ahead of the writes: the runner has no switch to read only after
             each write). ``--rounds`` alternates them, each into a fresh database.
Issue #18's targets: >= 100,000 records/s and >= 25% of COPY's rows/s.

Also printed per run: the CPU seconds of this process (reading, decoding, the sink's Python side;
every thread, librdkafka's included) and of the PostgreSQL backends serving the run's database
(sampled from /proc, so only with a server on this machine). On a loaded machine these are the
figures to read: wall time there is mostly waiting for a core. ``--probed-deletes`` also runs
"now" with the remembered-delete check as a per-row probe of the deletes' key instead of the
planner's hash anti-join over every remembered delete of the table, ``--rebuild`` also runs
``SinkRunner.rebuild`` (``cdc rebuild``: a new generation, then the switch) batch by batch
("rebuild", as for a sink whose ``bulk_loads`` is false), ``--batch`` sets the sink's
``batch_size``, ``--now-only`` skips "dicts" and "before", ``--no-before`` skips "before" (at
issue #18's size it alone takes longer than the rest), ``--read-only`` also runs "read" (the
bulk path's reading alone: packed reads into the windows, nothing loaded).

The runner has no switches for how it reads (they were there for this bench only), so the
comparisons with the old ways of reading are gone: "bulk-ck" (``--confluent-reads``: the bulk
path reading through confluent-kafka), "bulk-seq" (``--seq-reads``: every partition at once,
then the load) and "rb-seq" (a rebuild reading only after each write). The figures below that
name them were measured with them, before.

Where the time went (before; 600k changes over 200k keys, 10% deletes, cProfile and the
server's statement log): 84% in the server, of which the upsert's ``INSERT ... SELECT CAST(s.j->>'c'
AS type) ... ON CONFLICT`` with its anti-join on remembered deletes 34%, the version-guarded
deletes and tombstones (``DELETE ... USING cdc_stage``) 19%, the jsonb COPY 13%; in Python
decoding (orjson, SinkEvent) and the reduction to the newest version per key, on the same thread,
so neither side ever ran while the other did. Random keys over a large table cost the server more
per row than bench/sql_upsert.py's mostly new keys.

Where the time went with rows decoded to dicts (300k changes over 100k keys and 100k over 30k, load 13-20 on 2 cores;
py-spy of both threads, statement durations from the server log, CPU seconds as above): the
statement log's durations are load-inflated (12 s of statements in a 37 s run), the CPU seconds
are not: this process used 1.6-1.9 s per 107k records (15-18 us a record) and its PostgreSQL
backends 0.5-0.9 s. Python's share, by py-spy and timing of each step alone: decoding about 6 us
a record (orjson 3.8 us, building the SinkEvent 1.3 us), reading through librdkafka and
LogRecords about 2 us, reducing to the newest version per key about 2 us, the typed COPY text
about 2 us a row. In the server the version-guarded upsert is most of it (a conflicting row is an
index probe, a lock and a non-HOT update), then the typed COPY, the deletes and commits. The
remembered-delete check is a hash anti-join that reads every remembered delete of the table at
every batch; a per-row probe of their key instead (``--probed-deletes``) took more server CPU at
37k remembered deletes (9.4-9.6 s against 7.5-7.7 s for 1.07M records, two rounds), so it stays off. Batches of
20,000 instead of the default 2,000 took about 20% less CPU (1.7 + 0.5 s instead of 1.9 + 0.9 s
for 107k records): per-batch work (statements, the table checks, commits) is paid 10x less often.

Where the time goes now (rows left as JSON bytes, ``raw_rows``; load 20-45 on 2 cores shared
with other work, so CPU seconds and same-run ratios only). 300k changes over 100k keys, batches
of 10k, one run: this process 4.2 s of CPU for "now" against 5.6 s for "dicts" and 5.0 s for
"before" (13 against 17.5 us a record), PostgreSQL 1.9, 1.9 and 4.7 s; 1M changes over 300k keys,
one run: 12.4 s against 17.2 s (11.6 against 16.1 us a record), PostgreSQL 10.0 and 9.7 s; wall
time there followed the load (5.9k against 6.9k records/s at load 37 -> 25 and 25 -> 22). At
issue #18's size (3M over 1M, batches of 20k, load 23-33) "now" took 59.2 s here and 34.9 s in
PostgreSQL, 3.7k records/s; a run before this change (dicts, batches of 10k, load 16-21) 63.3
and 38.3 s, 7.3k records/s (the same run's "dicts" was lost to a server restart). By step, each timed alone
over the same records (200k over 1M keys from Kafka, batches of 20k, CPU time): reading
through librdkafka and LogRecords 2.9-3.2 us a record either way; decoding 3.7-4.0 us (from
5.5-7.1 us for dicts: orjson no longer builds the row, the C decoder builds the source block
with the names and strings that repeat reused); ``SqlSink.write``'s Python side 6-7 us (from
9-10 us): the reduction to the newest version per key (``orjson.dumps`` of each key and the
dictionary work) is now its largest part, the C COPY loop a fraction of a microsecond a row
alone, more among a batch's scattered objects. The server's CPU is unchanged by this (the same
statements): at issue #18's size it is about as much as the Python side and bounds a bootstrap
on two shared cores as much as Python does.

At issue #18's size (3M over 1M keys, --bulk-only, load 25-27): "bulk" 26.4k records/s, 15% of the
same run's COPY, CPU ours 11.8 s (3.71 us a record), PostgreSQL 3.4 s (1.05 us); main's "now" on
the quiet machine took 26.6 s and 28.1 s.

Where the time goes in "bulk" (1M changes over 333k keys, 1.06M records with tombstones; load
38-40 on 2 cores, so CPU per record; each step also timed alone): this process 3.4 us a record
(11.4 for "now" in the same run), PostgreSQL 0.9 us (8.2). Of ours, reading is most of it: the
consumer's ``consume`` (librdkafka's fetch and lz4 in its threads, a Message object per record)
about 1.5 us a record and turning Messages into LogRecords 0.75-0.8 us; the window's C loop
(parse the envelope in place, hash the key, copy the newest row's bytes) 0.5-1.1 us a record,
without the GIL; per kept key, building its event 0.35 us and its COPY line 0.4 us. Garbage
collection had been the largest cost of the load side (building a window's events took 2.5 us a
key with it on, 0.35 off: the collector walked hundreds of thousands of live tuples again and
again), so it is paused during a bulk rebuild. The server's part is a plain COPY into an empty
indexed table plus the deletes' COPY. What was left: reading (2.3 us a record, two thirds of ours).

Reading packed (cdc/log/kafka_bulk.py, cdc/_rdconsume.c: librdkafka's queue drained in C with the
GIL released into one bytes object per read, parsed in place by the window, no Message or
LogRecord per record; "bulk-ck" read the old way).
Each piece alone, 300k records over 100k keys from 3 partitions, CPU per record (all of this
process's threads / its main thread / the broker's JVM), load 35-49, two rounds:

  confluent-kafka, read only          1.53-2.45 us   1.13-1.49 us   0.40-0.57 us
  packed, read only                   0.52-0.65      0.14-0.15      0.17
  confluent-kafka, read + window      2.48-3.18      2.06-2.37      0.57-0.80
  packed, read + window               1.49-1.63      1.04-1.12      0.33

So reading went from 1.5-2.5 us a record to about 0.5 (most of it librdkafka's fetch and lz4 on
its own threads; 0.15 on the main thread), and the window's C loop (parse the envelope, hash the
key, copy the newest row) is now most of the main thread's part, about 0.9 us a record. Fetch
settings for a bulk read (``max.partition.fetch.bytes`` 8 MB, ``fetch.max.bytes`` 64 MB,
``queued.max.messages.kbytes`` 128 MB, ``queued.min.messages`` 500k) against librdkafka's
defaults, packed read only, two rounds: 0.55 against 0.40-0.48 us a record of ours, broker
0.20-0.27 against 0.13-0.33: no CPU gain. But CPU was not what bounded the wall time: on the quiet
machine (load 0.9-1.6) the packed "bulk" at issue #18's size took 27 s of wall for 6 s of our CPU,
1.9 s of PostgreSQL's and 0.6 s of the broker's, the main thread waiting in librdkafka's poll.
librdkafka stops fetching once its local queue holds ``queued.min.messages`` (100,000) or
``queued.max.messages.kbytes`` (64 MB) and looks again only after a backoff (up to a second), so
a reader that drains the queue at once mostly waits. With a million messages and 256 MB
(``BULK_PREFETCH`` in cdc/log/kafka_bulk.py; either alone: 13 s) the same bootstrap took 7.0-8.0 s,
five runs: 398,593-453,408 records/s, 109-124k final rows/s, 23%, 24%, 25%, 25%, 26% of the same
run's COPY (426-512k rows/s), max RSS 1.5 GB. The confluent-kafka path ("bulk-ck") has the same
wait, cut by ``fetch.queue.backoff.ms`` 10 ms (cdc/log/kafka.py, every consumer of the log;
librdkafka 2.0's packed reader has no such setting): 26.4 s -> 11.9-12.1 s, 15-17% of COPY.

At issue #18's size (3M changes over 1M keys, 3.19M records, --bulk-only --confluent-reads, the
same topic, alternating; load 33-61, so CPU only), round 1: "bulk" ours 8.3 s (2.60 us a
record), PostgreSQL 4.2 s (1.32), broker 3.6 s (1.12); "bulk-ck" ours 11.7 s (3.67), PostgreSQL
3.9 s (1.22), broker 4.7 s (1.46) (round 1's broker figures include other reads of the same
broker of mine meanwhile); round 2, a new topic, load 32-34: "bulk" ours 7.4 s (2.31), PostgreSQL
3.3 s (1.02), broker 1.4 s (0.44), 97 s, 31% of that run's COPY; "bulk-ck" ours 10.9 s (3.43),
PostgreSQL 3.4 s (1.05), broker 1.5 s (0.48), 123 s, 25%. So the sink process uses about 3.3 s
(30%) less CPU at this size, PostgreSQL and the broker the same.
Reading and loading overlapped. Until here the window was loaded only once the whole topic was
read: about 3.5 s of reading, then 3.6 s of loading on the quiet machine, never at once. Now the
partitions are read one after another (``cdc.runtime.window_fill.stages``; the packed reader is
assigned one partition at a time, small ones together), and once a partition is read to its end its keys'
newest versions are final: its window is loaded on the sink's thread
(cdc/runtime/window_loads.py) while the next partition is read. A window goes in by plain COPY
only if the generation holds none of its keys: the keys loaded so far are kept as sorted 64-bit
hashes (8 bytes a key, inside the window's bound), and a window that shares one (a key in two partitions of a topic whose partition count
grew, the rest of a partition whose window filled up) goes through the guarded writes.
"bulk-seq" read in the old order (every partition at once, then the load); each bulk line also
prints the time spent loading windows and the sink thread's CPU for it.

Each piece alone, at issue #18's size (3M over 1M keys, 3.19M records, --bulk-only --seq-reads
--read-only --rounds 3, one session, load 10-13 on 2 cores shared with other work, so CPU seconds
are the figures to read):

  read alone (packed reads into windows)   ours 4.8 s (1.50 us a record)   broker 0.4-0.6 s
  load alone ("bulk-seq"'s windows)        sink thread 1.81-1.99 s          PostgreSQL 2.6-2.9 s

So of this process's 7 s, reading (librdkafka's threads, the window's C loop) is about 4.8 and
loading's Python side (events and COPY text per key, on the sink's thread) about 1.9; PostgreSQL's
COPY about 2.8. Ten paired rounds of "bulk" (staged) and "bulk-seq" in four sessions (load
6.5-18): this process 6.5-8.1 s (mean 7.27) against 6.8-8.0 s (mean 7.33), PostgreSQL 2.6-3.5 s
(mean 3.10) against 2.5-3.2 s (mean 2.88), the sink thread's load 1.88-2.51 s against 1.81-1.99 s;
wall 30.9, 40.5, 28.7, 40.7, 37.2, 26.6, 24.9, 10.6, 14.1, 19.9 s against 42.3, 34.6, 26.9, 43.8,
35.9, 43.2, 23.6, 11.9, 23.3, 21.6 s (main's own bench between them, five rounds, load 13.5-17: 56.9-61.6 s; this
process 7.9-8.2 s, PostgreSQL 3.3-3.6 s). At that load the wall time follows the load: two cores shared
by four workloads give the overlap no free core. On a quiet machine the CPU above (about 10 s
under load, about 8.5 s quiet before this change) spread over two cores bounds a bootstrap at
4-5 s against the 7-8 s of the old order; not measured quietly here (the lead does after merging).

Not done (for "now"), and why: reducing before decoding pays only for keys repeated within one batch
(about 1% at 20k records over 1M keys), and the decode it would skip is now the light one (no
row); several partitions in parallel has no core to run on here, the Python thread and the
server already take both.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import threading
import time
import uuid

import psycopg2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=1, help="runs of now and before, alternated")
    parser.add_argument("--batch", type=int, default=10_000, help="the sink's batch_size (records per write)")
    parser.add_argument("--probed-deletes", action="store_true",
                        help="also run \"now\" with the remembered-delete check as a per-row probe")
    parser.add_argument("--rebuild", action="store_true",
                        help="also run SinkRunner.rebuild (cdc rebuild) batch by batch (no bulk loads)")
    parser.add_argument("--now-only", action="store_true", help="skip the \"dicts\" and \"before\" runs")
    parser.add_argument("--no-before", action="store_true", help="skip the \"before\" runs (the slowest)")
    parser.add_argument("--bulk-only", action="store_true", help="only the \"bulk\" runs")
    parser.add_argument("--read-only", action="store_true",
                        help="also run \"read\": the bulk path's reading alone (packed reads into the windows, "
                             "no load)")
    parser.add_argument("--window-mb", type=int, default=None,
                        help="bulk_window_mb of the \"bulk\" runs (default: the sink's default)")
    args = parser.parse_args()

    from bench.sink_group import publish_orders
    from cdc.dev.stack import read_env
    from cdc.events import TableId
    from cdc.log.kafka import KafkaLog
    from cdc.runtime.sink_runner import SinkRunner
    from sinks.sql.config import SqlSinkConfig
    from sinks.sql.sink import SqlSink
    DictRowsSqlSink, BatchRebuildSqlSink = _dict_rows_sink(), _batch_rebuild_sink()

    env = read_env()
    run_id = uuid.uuid4().hex[:8]
    prefix, database = f"bench_{run_id}", f"bench_{run_id}"
    admin = psycopg2.connect(env["PG_DSN"])
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{database}"')
    target = env["PG_DSN"].rsplit("/", 1)[0] + "/" + database
    kafka = KafkaLog(env["KAFKA_BOOTSTRAP"])
    table = TableId("shop", "public", "orders")
    topic = table.topic(prefix)
    try:
        final = publish_orders(kafka, prefix, args.events, args.keys, 3)
        rows = [r for r in final.values() if r is not None]
        records = sum(kafka.end_offsets(topic).values())
        print(f"history: {args.events:,} changes over {args.keys:,} keys ({records:,} records incl. tombstones); "
              f"final table: {len(rows):,} rows")

        conn = psycopg2.connect(target)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE copy_floor (id int PRIMARY KEY, customer_id int, status text, "
                        "total numeric(10,2), note text)")
            text = "".join(f"{r['id']}\t{r['customer_id']}\t{r['status']}\t{r['total']}\t{r['note']}\n" for r in rows)
            began = time.perf_counter()
            cur.copy_expert("COPY copy_floor FROM STDIN", io.StringIO(text))
            conn.commit()
            copy_s = time.perf_counter() - began
        conn.close()
        print(f"copy             {len(rows) / copy_s:>10,.0f} rows/s   ({copy_s:.2f}s)   (load {os.getloadavg()[0]:.1f})")

        del final
        gc.collect()
        # The final rows stay alive for the check: a million dicts that every full garbage
        # collection of the runs would walk, a cost `cdc bootstrap` itself does not have.
        gc.freeze()
        for round_ in range(args.rounds):
            variants = ([] if args.bulk_only else ["now"]) + ["bulk"] + (["read"] if args.read_only else []) + \
                (["probed"] if args.probed_deletes else []) + \
                ([] if args.now_only or args.bulk_only else ["dicts"] + ([] if args.no_before else ["before"])) + \
                (["rebuild"] if args.rebuild else [])
            for label in variants:
                name = f"{database}_{round_}{label}"
                with admin.cursor() as cur:
                    cur.execute(f'CREATE DATABASE "{name}"')
                try:
                    url = (target.rsplit("/", 1)[0] + "/" + name).replace("postgresql://", "postgresql+psycopg2://", 1)
                    config = SqlSinkConfig(name="bench", type="sql", url=url, topics=[f"{prefix}.*"],
                                           batch_size=args.batch,
                                           **({"bulk_window_mb": args.window_mb} if args.window_mb else {}))
                    # "dicts" and "before": every row decoded to a dict, as before the raw rows
                    sink = (DictRowsSqlSink if label in ("dicts", "before") else
                            BatchRebuildSqlSink if label == "rebuild" else SqlSink)(config)
                    if label in ("probed", "before"):  # set once the sink has its applier
                        start = sink.start

                        def start_variant(start=start, sink=sink, label=label):
                            start()
                            if label == "probed":
                                sink.applier.probe_deletes = True
                            else:  # "before": the jsonb staging
                                sink.applier.typed_upserts = False
                        sink.start = start_variant
                    runner = SinkRunner(sink, kafka, prefix, group=f"bench-{run_id}-{round_}{label}")
                    loading = _timed_loads(runner, skip=label == "read")
                    load = os.getloadavg()[0]
                    ours = sum(os.times()[:2])
                    broker = broker_cpu()
                    with ServerCpu(env["PG_DSN"], name) as server:
                        began = time.perf_counter()
                        if label in ("bulk", "read", "rebuild"):  # "bulk": what `cdc bootstrap` runs for PostgreSQL
                            runner.rebuild(threading.Event())
                        else:
                            runner.run(threading.Event(), from_start=True, until_caught_up=True)
                        seconds = time.perf_counter() - began
                    cpu = [sum(os.times()[:2]) - ours, server.total()]
                    broker = None if broker is None else broker_cpu() - broker
                    conn = psycopg2.connect(target.rsplit("/", 1)[0] + "/" + name)
                    with conn.cursor() as cur:
                        cur.execute("SELECT count(*) FROM orders" if label != "read" else "SELECT 0")
                        landed = cur.fetchone()[0]
                    conn.close()
                finally:
                    with admin.cursor() as cur:
                        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                assert landed == len(rows) or label == "read", f"the target has {landed} rows, the source {len(rows)}"
                print(f"bootstrap {label:6} {records / seconds:>10,.0f} records/s  {len(rows) / seconds:>9,.0f} final rows/s  "
                      f"({seconds:6.2f}s)  = {len(rows) / seconds / (len(rows) / copy_s):4.0%} of COPY's rows/s   "
                      f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})   cpu: ours {cpu[0]:.1f}s "
                      f"({cpu[0] / records * 1e6:.2f} us/record), PostgreSQL " +
                      ("unknown (not local)" if cpu[1] is None else
                       f"{cpu[1]:.1f}s ({cpu[1] / records * 1e6:.2f} us/record)") +
                      ("" if broker is None else f", broker {broker:.1f}s ({broker / records * 1e6:.2f} us/record)") +
                      ("" if not loading[0] else f"; windows loaded: {loading[0]:.2f}s of wall, "
                       f"{loading[1]:.2f}s of the sink thread's CPU"),
                      flush=True)
    finally:
        kafka.delete_topic(topic)
        kafka.close()
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()


def _timed_loads(runner, skip: bool) -> list[float]:
    """[wall seconds, sink thread CPU seconds] spent loading windows (bulk paths), filled as the
    run goes; ``skip``: the windows are dropped instead of loaded (reading alone)."""
    spent = [0.0, 0.0]
    windows = runner.rebuilds.windows
    load_window = windows.load_window

    def timed(window, bulk, generation):
        wall, cpu = time.perf_counter(), time.thread_time()
        if not skip:
            load_window(window, bulk, generation)
        spent[0] += time.perf_counter() - wall
        spent[1] += time.thread_time() - cpu
    windows.load_window = timed
    return spent


def _batch_rebuild_sink():
    from sinks.sql.sink import SqlSink

    class BatchRebuildSqlSink(SqlSink):
        bulk_loads = False  # a rebuild writes batch by batch, as for a store without bulk loads
    return BatchRebuildSqlSink


def _dict_rows_sink():
    from sinks.sql.sink import SqlSink

    class DictRowsSqlSink(SqlSink):
        raw_rows = False  # the runtime decodes every row to a dict (how it ran before the raw rows)
    return DictRowsSqlSink


def broker_cpu() -> float | None:
    """CPU seconds the dev stack's Kafka broker (its JVM) used so far, from /proc; None when the
    broker is not the local dev stack's. Other users of the broker count too: the bench is the
    only one on a dev stack of its own."""
    from cdc.dev.stack import status
    try:
        pid = next(row.pid for row in status() if row.name == "kafka")
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except (OSError, StopIteration, TypeError, ValueError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerCpu:
    """CPU seconds of the PostgreSQL backends serving one database, when the server runs on this
    machine (the dev stack): sampled from /proc twice a second while a run lasts, since other
    databases of the same server (other benches, tests) must not count."""

    def __init__(self, dsn: str, database: str) -> None:
        self.dsn, self.database = dsn, database
        self.seconds: dict[int, float] = {}  # backend pid -> its CPU seconds at the last sample
        self.local = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ServerCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def total(self) -> float | None:
        return sum(self.seconds.values()) if self.local else None

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            while True:
                with conn.cursor() as cur:
                    cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.database,))
                    pids = [row[0] for row in cur.fetchall()]
                for pid in pids:
                    try:
                        with open(f"/proc/{pid}/stat") as file:
                            fields = file.read().rsplit(")", 1)[1].split()
                    except OSError:
                        if not self.seconds:
                            self.local = False  # not this machine's server (or it is gone)
                        continue
                    self.seconds[pid] = (int(fields[11]) + int(fields[12])) / tick
                if self._stop.wait(0.5):
                    return
        finally:
            conn.close()


if __name__ == "__main__":
    main()
