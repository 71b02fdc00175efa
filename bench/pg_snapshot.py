"""Snapshot throughput: a PostgreSQL table read by the source's snapshot into Kafka, beside COPY.

    .venv/bin/cdc dev up --only postgres,kafka
    .venv/bin/python -m bench.pg_snapshot [--rows 1000000] [--workers 1,2,4] [--threads] [--chunk-pages 2048]
                                          [--compare-events] [--compare-producer] [--rounds 1]
                                          [--profile snapshot.prof]
    .venv/bin/python -m bench.pg_copy_read       # the reader alone, each way (its docstring)

Steps, in one run on this machine:
  1. a fresh database with an ``orders`` table of ``--rows`` rows (the columns of bench.pg_stream:
     bigint key, int, text, numeric(10,2), two timestamptz, a mostly-NULL text note), vacuumed so
     no reader pays for hint bits, and read once so every reader finds it in memory.
  2. baseline: ``COPY (SELECT * FROM orders) TO STDOUT`` through psycopg2 ``copy_expert`` into a
     sink that drops the bytes, on a connection with the source's session settings: the ceiling of
     reading the table through this driver (one connection, no parsing).
  3. ours, once per ``--workers`` count (each beside a COPY run just before it, printed too): a
     PostgresSource with ``snapshot: initial_only`` and that many ``snapshot_workers`` (reader
     processes, snapshot/processes.py; ``--threads`` also runs them as threads) (chunks of
     ``snapshot_chunk_pages``, the default unless given) in a SourceRunner (this process, on a thread, as a worker runs it) into KafkaLog (acks=all), timed
     from its start (the slot with its exported snapshot included) until it finishes: every row
     acknowledged by Kafka and the position stored.
Then slots, topics and the database are dropped. Target: ours >= 150,000 rows/s, and >= 40% of COPY.

Printed beside each run: the load average before and after it, and the CPU seconds per side
(``ours``: this process with every thread, librdkafka's included, and the reader processes once
they ended; ``PostgreSQL``: the backends of the run's database, sampled from /proc; ``broker``:
the local Kafka broker's process). On these shared 2-core machines the wall-clock rates follow
the load (COPY itself measured 0.2M-1.4M rows/s across runs of one afternoon); the CPU seconds
per row do not, and they are what a snapshot costs. ``--producer KEY=VALUE`` overrides a
producer setting (``compression.type=none`` ...).

Where the time goes (1M rows; CPU per row, from those figures, perf, and timing each step alone):

* before (issue #16 part 4 start): ours 4.4 us, PostgreSQL 3.1 us, broker 1.5 us per row. The
  server's share was the row-JSON statement: 3.2 us of CPU per row for ``row_to_json`` over the
  JSON expressions against 0.55 us for the plain ``COPY (SELECT <columns>)`` of the same table.
  Since then the reader makes the row JSON from the plain COPY text (``sources/postgres/
  copy_json.py``, C in ``_copyjson.c``, the same bytes): PostgreSQL 0.5 us per row.
* then each row became an event in the publishing process (a tuple, a key dict, an int, an
  ``orjson.Fragment``: 0.26 us, ``_copyjson.int_key_events``) and was encoded from it (0.31 us,
  ``_encode.emit``). Now a block of plain rows goes on as it was read, a ``RowBlock``
  (cdc/events.py), and the json format makes each record from its line (``_encode.emit_rows``,
  0.10 us per row for both steps; the same bytes). ``--compare-events`` runs the old path
  (``sources.postgres.snapshot.ROW_BLOCKS`` off) right before the new one.
* what is left of the publishing process is mostly confluent-kafka and librdkafka. Timed alone
  (bench/snapshot_produce.py, the same record shapes and producer settings, load ~10): 0.6 us per
  record inside ``Producer.produce`` (argument parsing, a per-message state, librdkafka's copy and
  partitioner), 0.3 us serving acknowledgements in ``poll``/``flush`` (confluent-kafka's delivery
  trampoline takes the GIL and frees that state for every message even when only failures are
  reported, and with no ``on_delivery`` at all alike: cdc/log/delivery.py), and 0.9 us in
  librdkafka's own threads (perf: lz4 about a third of it, then copies, per-message bookkeeping
  after the acks, locks and the socket). The broker took 0.7-0.8 us per record at that load (and
  1-2.5 us at loads of 30-40). Compression: ``none`` and ``snappy`` cost the broker 3-4.5x what
  lz4 costs it (3.0-3.5 against 0.7-0.8 us; it must read every record of a compacted topic) and
  librdkafka no less; ``zstd`` costs librdkafka 0.5 us more: lz4 stays. Lingering longer or
  batches of 100k records changed nothing measurable. ``produce_batch`` with the dicts it needs
  measured no cheaper than ``produce``. The readers (COPY through psycopg2 and the row JSON) take
  0.9 us per row in one process, more with several (each pays its interpreter's start-up, ~0.3 s).

Before RowBlocks, on a quiet machine (load 0.9-1.4, after the copy_json merge): COPY 1,467k rows/s;
processes 1/2/4: 348k 341k 308k (24% 23% 21%); threads 1/2: 360k 417k (25% 28%); CPU per row:
processes ours 3.6-4.3 + PostgreSQL 0.5 + broker 0.5-0.7 us, threads ours 3.3 + 0.5 + 0.5 us (the
code before copy_json: processes 110k 104k 92k, 6-8% of COPY).

Message sizes: values ~500 bytes (~300 bytes of envelope around a ~200-byte row JSON), keys ~10 bytes.

Paired runs (1M rows; each count first with events, ``--compare-events``, then with RowBlocks, in
one session at loads 27-45 while other helpers ran test suites; rows/s and CPU us per row):

    1 process    events 47k, ours 4.2, PostgreSQL 0.6, broker 1.4 | blocks 56k, ours 3.3, PostgreSQL 0.5, broker 1.0
    2 processes  events 25k, ours 4.5, PostgreSQL 0.5, broker 1.6 | blocks 38k, ours 3.9, PostgreSQL 0.5, broker 0.9
    4 processes  events 25k, ours 5.3, PostgreSQL 0.5, broker 1.3 | blocks 31k, ours 4.5, PostgreSQL 0.5, broker 1.0
    1 thread     events 32k, ours 3.4, PostgreSQL 0.5, broker 1.3 | blocks 40k, ours 2.7, PostgreSQL 0.5, broker 1.2
    2 threads    events 34k, ours 3.6, PostgreSQL 0.5, broker 2.9 | blocks 36k, ours 3.0, PostgreSQL 0.5, broker 1.0
    4 threads    events 25k, ours 3.6, PostgreSQL 0.5, broker 1.4 | blocks 28k, ours 2.9, PostgreSQL 0.5, broker 1.1
    (an earlier pair at load 20-25: 1 process ours 4.4 -> 3.5 us, 1 thread 3.4 -> 2.6 us; two more
     rounds at load 34-48: 1 process 4.1 -> 3.4 and 4.3 -> 3.3 us, 1 thread 3.2 -> 2.8 and 3.5 -> 2.9 us;
     one at load 36-56: 2 processes 5.0 -> 3.9 us, 4 processes 5.5 -> 4.7 us)

So RowBlocks take 0.6-0.9 us of CPU per row off the publishing process (about a fifth), in every
mode. The wall-clock rates and their share of COPY follow the load on these machines (COPY itself
measured 0.15M-0.66M rows/s in this session, 1.46M quiet) and are no measure of the change.
Quiet, after the merge (load 1.9-2.8, two runs of ``--workers 1,2,4 --threads``): COPY 1.42-1.54M
rows/s; processes 1/2/4 27%/22-26%/20-22% of COPY (384k/354-369k/306-324k rows/s); threads 1/2/4
29-30%/31-32%/29-32% (411-483k/449-493k/406-514k rows/s); ours 2.2-2.6 us/row with threads.

The block producer (cdc/log/block_producer.py over cdc/_rdproduce.c, our own librdkafka binding):
a RowBlock goes to librdkafka in one call, each record made from its line in C and produced with
the GIL released, delivery reports counted in C. ``--compare-producer`` runs each count first with
every record through confluent-kafka (the code before it) and then through the block producer.
Timed alone (bench/snapshot_produce.py, 300k records, two rounds at load 36-37), CPU us per
record: confluent-kafka produce 0.65-0.72 + acknowledgements 0.39-0.41 + librdkafka's threads
1.03-1.14 + broker 0.83-1.03 = 3.10; the block producer (reports for every record counted in C)
produce_rows 0.49-0.55 + final flush 0.12-0.15 + librdkafka's threads 0.93 + broker 0.57-0.60 =
2.13-2.20. So about 1 us a record less, a third of it in the broker (it took the block
producer's fuller batches more cheaply in every pair). Reporting failures only
(``delivery.report.only.error``, ``block``) moved 0.1 us from the calling thread to librdkafka's
and saved nothing in total, so the writer counts every report.

Paired in one session (1M rows; each count first confluent-kafka, then the block producer; load
40-67 while other helpers ran test suites; rows/s, % of the COPY measured in the same run, CPU us
per row ours/PostgreSQL/broker):

    1 process    11k 12%  3.8/0.6/4.3 | 15k 15%  3.0/0.5/1.8
    2 processes  21k 22%  4.1/0.5/3.1 | 30k 31%  3.6/0.5/2.3
    4 processes  19k 19%  5.1/0.5/3.2 | 22k 23%  4.6/0.5/2.6
    1 thread     24k 25%  3.3/0.6/2.5 | 34k 36%  2.7/0.6/1.6
    2 threads    32k 33%  3.1/0.5/1.7 | 29k 30%  3.1/0.6/1.4
    4 threads    29k 30%  3.0/0.5/1.5 | 35k 36%  2.9/0.5/1.5
    a second session at load 33-36 (COPY 223k rows/s at its start):
    1 process    38k 17%  3.4/0.5/1.0 | 56k 25%  2.8/0.5/0.7
    2 processes  45k 20%  4.0/0.5/0.8 | 56k 25%  3.4/0.5/0.8
    1 thread     40k 18%  2.7/0.5/0.8 | 33k 15%  2.8/0.5/0.8
    2 threads    37k 17%  2.8/0.5/0.9 | 41k 18%  2.5/0.5/0.7

With reader processes the capture process spends 0.5-0.8 us a row less in every pair (the
records no longer pass through Python); with reader threads (the default) 0.6, 0.3, 0.1 and 0.0
less and once 0.1 more: the block producer releases the GIL for the whole block, so the reader
threads take it in between, and the handoffs cost part of what was saved.

The block reader (sources/postgres/copy_out.py, ``_copyjson.copy_out``): psycopg2's
``copy_expert`` called the reader's ``write`` once per row (libpq hands COPY data out a row per
``PQgetCopyData``), a GIL round trip, a bytes object and a Python call per row; now a C loop over
the libpq psycopg2 loaded reads blocks of 2048 rows without the GIL, makes their row JSON in the
same loop and hands each block to Python once. The reader alone (bench/pg_copy_read.py, 1M rows,
load 11-12, this process's CPU): copy_expert into the bench's null sink 0.17-0.23 us a row, into
the readers' line blocks 0.24-0.32 and 0.40-0.65 with the row JSON; the C loop 0.09-0.19 and
0.22-0.29. So the reader took 0.4-0.65 us a row with its row JSON and takes 0.25 now; the 0.9 us
counted above included its process's start-up. Most of the 0.7-2.2 s the reader processes take
(``of which readers``) is their start-up (importing the source package costs a spawned reader
~0.27 s of CPU, 0.04 s of it psycopg2), a fixed cost per process, not per row.

Paired in two sessions (main, the block reader alone, s6snap's block producer alone, both
together, each a whole ``--workers 1,2,4 --threads`` run in turn, two rounds a session; loads 9-13 and 10-17 while other helpers ran suites; CPU us
a row of our process, means over the rounds, readers' share in brackets; PostgreSQL 0.4-0.6 and
the broker 0.5-0.8 in every run, 1.2 once):

                 1 process     2 processes   4 processes   1 thread   2 threads   4 threads
    main         3.4 [0.85]    3.7 [1.2]     4.4 [2.0]     2.8        2.9         2.8
    block reader 3.4 [0.7]     3.9 [1.15]    4.4 [1.85]    2.6        2.6         2.7
    producer     3.1 [0.85]    3.5 [1.3]     4.1 [2.15]    2.6        2.6         2.5
    both         3.1 [0.75]    3.3 [1.1]     4.1 [1.85]    2.2        2.2         2.2
    (four rounds of main, the block reader and both, two of the producer; in threads, per round:
     main 2.4-3.4, the block reader 2.4-2.9, the producer 2.4-2.7, both 2.0-2.4)
    a third session, main against this branch with both merged, two rounds at load 8-16:
    main         3.3-3.6       3.8-3.9       4.5-4.6       2.8        3.0-3.1     2.8-3.0
    both         2.9-3.0       3.2-3.6       4.0           2.0-2.4    2.0-2.5     2.2-2.3
    (threads, as a share of the run's COPY rate and of the COPY just before each: both, second
     round, 37%, 43% and 39% / 32%, 36% and 23%; both, first round, 16-23% / 24-30%; main
     18-27% / 15-30%: the rates follow the load)

The block reader alone takes 0.1-0.2 us a row off the readers, and off the totals less than the
noise between rounds with processes, ~0.2 us with threads; the block producer alone 0.3 us;
together, with reader threads (the default), 0.6 us a row (2.2 against 2.8, a fifth of our
process): the producer releases the GIL for a whole block, and only now that the reader threads
no longer take it back for every row is that time saved rather than spent on handoffs. With
reader processes together 0.3-0.4 us.

Quiet, with both blocks (load 0.2-1.7, 1M rows, three runs of ``--workers 1,2,4 --threads``, one
session; % of the run's COPY, 1.42-1.59M rows/s, and in brackets of the COPY just before each):

    1 thread     698k 48% (48%)   665k 46% (47%)   640k 44% (45%)
    2 threads    687k 47% (43%)   625k 43% (43%)   591k 41% (41%)
    4 threads    657k 45% (42%)   676k 47% (46%)   651k 45% (45%)
    1 process    486k 33% (35%)   497k 34% (34%)   492k 34% (34%)
    2 processes  427k 29% (27%)   464k 32% (32%)   471k 33% (33%)
    4 processes  408k 28% (27%)   428k 30% (29%)   422k 29% (30%)
    CPU a row: threads ours 1.6 us, PostgreSQL 0.4, broker 0.3-0.4; processes ours 2.3-3.3

So the 40% target holds with reader threads, the default (``snapshot_processes: false``), in every
run: 41-48% of COPY. Reader processes stay under it (28-34%): each pays its interpreter's start-up
(importing the source package, ~0.27 s of CPU) and the pickling of its blocks, which threads do
not, and now that the COPY loop runs in C without the GIL, threads use both cores as processes
were meant to. Before both blocks, quiet: threads 29-33%, processes 20-27%. What remains per row
is librdkafka's per-message work (its copy, partitioner, queue and bookkeeping after the acks) and
the broker's (a compacted, lz4-compressed topic), which a client cannot take off.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import shutil
import tempfile
import time
import uuid

import psycopg2

from bench.bootstrap import ServerCpu
from bench.pg_stream import (
    ORDERS_DDL,
    ORDERS_INSERT,
    RunnerThread,
    delete_topics,
    drop_slots,
    execute,
    fresh_database,
    max_rss_mb,
    print_profile,
    source_config,
    stack_settings,
)

TARGET = 150_000


class NullSink:
    """A file for copy_expert that keeps nothing."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        return len(data)


def listening_pid(port: int) -> int | None:
    """The pid of the local process listening on ``port`` (the dev stack's broker), from /proc;
    None when it is not on this machine or not ours to see."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as file:
                for row in file.readlines()[1:]:
                    fields = row.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{fields[9]}]")
        except OSError:
            continue
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                return int(pid)
        except OSError:
            continue
    return None


def process_cpu(pid: int | None) -> float:
    """CPU seconds used so far by process ``pid`` (all its threads); 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of one run, per side: this process with its reader processes (every thread,
    librdkafka's included), the PostgreSQL backends of the run's database, the Kafka broker."""

    def __init__(self, dsn: str, database: str, broker_pid: int | None) -> None:
        self.server = ServerCpu(dsn, database)
        self.broker_pid = broker_pid

    def __enter__(self) -> CpuMeter:
        self.load = os.getloadavg()[0]
        self._ours = sum(os.times()[:4])
        self._readers = sum(os.times()[2:4])
        self._broker = process_cpu(self.broker_pid)
        self.server.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)
        self.ours = sum(os.times()[:4]) - self._ours
        self.readers = sum(os.times()[2:4]) - self._readers  # the reader processes, once ended
        self.broker = process_cpu(self.broker_pid) - self._broker
        self.load_after = os.getloadavg()[0]

    def text(self, rows: int) -> str:
        server = self.server.total()
        def per_row(s):
            return f"{s:.1f}s ({s / rows * 1e6:.1f} us/row)"
        parts = [f"ours {per_row(self.ours)}" + (f" of which readers {self.readers:.1f}s" if self.readers else ""),
                 "PostgreSQL " + ("unknown" if server is None else per_row(server))]
        if self.broker_pid is not None:
            parts.append(f"broker {per_row(self.broker)}")
        return f"    load {self.load:.1f} -> {self.load_after:.1f}; cpu: " + ", ".join(parts)


def make_table(dsn: str, rows: int, step: int = 500_000) -> float:
    began = time.perf_counter()
    execute(dsn, ORDERS_DDL)
    for first in range(1, rows + 1, step):
        execute(dsn, ORDERS_INSERT, params=(first, min(rows, first + step - 1)))
    execute(dsn, "VACUUM (FREEZE, ANALYZE) orders")
    return time.perf_counter() - began


def run_copy(dsn: str) -> tuple[float, int]:
    from sources.postgres.types import session_options

    conn = psycopg2.connect(dsn, options=session_options())
    try:
        sink = NullSink()
        began = time.perf_counter()
        with conn.cursor() as cur:
            cur.copy_expert("COPY (SELECT * FROM orders) TO STDOUT", sink, size=1 << 20)
        elapsed = time.perf_counter() - began
        conn.rollback()
    finally:
        conn.close()
    return elapsed, sink.bytes


def run_ours(config, kafka, prefix: str, partitions: int, profile: cProfile.Profile | None,
             timeout: float) -> tuple[float, object]:
    from cdc.log.base import TopicSettings
    from cdc.offsets import OffsetStore
    from cdc.runtime.runner import SourceRunner
    from sources.postgres.source import PostgresSource

    offsets = OffsetStore(kafka, prefix)
    source = PostgresSource(config, offsets.load(config.name))
    runner = SourceRunner(source, kafka, offsets, prefix, TopicSettings(partitions=partitions))
    capture = RunnerThread(runner, profile)
    began = time.perf_counter()
    capture.start()
    try:
        capture.thread.join(timeout)
        elapsed = time.perf_counter() - began
        if capture.thread.is_alive():
            raise RuntimeError(f"the snapshot did not finish within {timeout:g}s ({runner.stats.events} events)")
        capture.check()
        if runner.stats.phase != "finished":
            raise RuntimeError(f"the capture ended in phase {runner.stats.phase}, not finished")
    finally:
        capture.stop()
        offsets.close()
    return elapsed, runner.stats


def line(label: str, rows: int, seconds: float, nbytes: int, baseline: float | None = None) -> str:
    rate = rows / seconds
    text = f"{label:<30} {rate:>10,.0f} rows/s {nbytes / seconds / 1e6:>7.1f} MB/s  ({seconds:.2f}s)"
    if baseline:
        text += f"  = {rate / baseline:.0%} of COPY"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workers", default="1,2,4", help="snapshot_workers counts to run, comma-separated")
    parser.add_argument("--threads", action="store_true",
                        help="also run each count with reader threads (snapshot_processes: false), to compare")
    parser.add_argument("--chunk-pages", type=int, default=None,
                        help="snapshot_chunk_pages (default: the source's default)")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--producer", action="append", default=[], metavar="KEY=VALUE",
                        help="a producer setting over the log's defaults (compression.type=none, linger.ms=50 ...)")
    parser.add_argument("--compare-events", action="store_true",
                        help="run each count twice in a row, first with the rows made into events in this "
                             "process (sources.postgres.snapshot.ROW_BLOCKS off: the code before RowBlock), "
                             "then as RowBlocks, to compare the two in the same conditions")
    parser.add_argument("--compare-producer", action="store_true",
                        help="run each count twice in a row, first with every record through confluent-kafka "
                             "(cdc.log.block_producer as not built: the code before the block producer), then "
                             "with RowBlocks through the block producer, alternating, in the same conditions")
    parser.add_argument("--rounds", type=int, default=1, help="times to run the whole list of runs")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one snapshot may take at most")
    parser.add_argument("--profile", nargs="?", const="", default=None, metavar="FILE",
                        help="run the runner thread under cProfile (not the reader threads); top 15 by own time")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]

    from cdc.log.base import TopicSettings
    from cdc.log.kafka import KafkaLog
    from sources.postgres.config import PostgresConfig

    settings = stack_settings()
    run_id = uuid.uuid4().hex[:8]
    database = f"bench_snapshot_{run_id}"
    state_dir = tempfile.mkdtemp(prefix="bench-pg-snapshot-")
    producer = dict(item.split("=", 1) for item in args.producer)
    kafka = KafkaLog(settings["KAFKA_BOOTSTRAP"], TopicSettings(partitions=args.partitions), producer_config=producer)
    prefixes = []
    try:
        with fresh_database(settings["PG_DSN"], database) as dsn:
            made = make_table(dsn, args.rows)
            pages, size = execute(dsn, "SELECT pg_relation_size('orders') / 8192, "
                                       "pg_size_pretty(pg_relation_size('orders'))")[0]
            run_copy(dsn)  # once to warm the cache, not measured
            broker_pid = listening_pid(int(settings["KAFKA_BOOTSTRAP"].rsplit(":", 1)[1]))
            with CpuMeter(settings["PG_DSN"], database, None) as cpu:
                seconds, nbytes = run_copy(dsn)
            copy_rate = args.rows / seconds
            print(f"orders: {args.rows:,} rows, {size} ({pages:,} pages), made in {made:.1f}s; "
                  f"{nbytes / args.rows:.0f} bytes of COPY text per row; Kafka acks=all, {args.partitions} partitions"
                  + "".join(f", {k}={v}" for k, v in producer.items()))
            print(line("COPY (copy_expert)", args.rows, seconds, nbytes))
            print(cpu.text(args.rows), flush=True)
            from sources.postgres import snapshot as pg_snapshot

            runs = [(count, True) for count in workers] + ([(count, False) for count in workers] if args.threads else [])
            from cdc.log import block_producer

            rdproduce = block_producer._rdproduce
            # (RowBlocks, through the block producer) per run of a count
            blocks = [(False, False), (True, False)] if args.compare_events else [(pg_snapshot.ROW_BLOCKS, False)]
            if args.compare_producer:
                blocks = [(row_blocks, ours) for row_blocks, _ in blocks for ours in (False, True)]
            elif block_producer.available():
                blocks = [(row_blocks, row_blocks) for row_blocks, _ in blocks]
            runs = [(count, processes, row_blocks, ours) for _ in range(args.rounds) for count, processes in runs
                    for row_blocks, ours in blocks]
            for number, (count, processes, row_blocks, ours) in enumerate(runs):
                pg_snapshot.ROW_BLOCKS = row_blocks
                # Only the producer changes (everything else stays compiled): as a build without it.
                block_producer._rdproduce = rdproduce if ours else None
                kind = ("p" if processes else "t") + ("" if row_blocks else "e") + ("b" if ours else "")
                name = f"bench_snap_{run_id}_{kind}{count}_{number}"
                prefix = f"bench_{run_id}_{kind}{count}_{number}"
                prefixes.append(prefix)
                overrides = dict(snapshot="initial_only", snapshot_workers=count, snapshot_processes=processes)
                if args.chunk_pages:
                    overrides["snapshot_chunk_pages"] = args.chunk_pages
                config = source_config(dsn, name, f"{state_dir}/{kind}{count}_{number}", **overrides)
                profile = cProfile.Profile() if args.profile is not None else None
                # COPY again right before this run: on a shared machine the load moves within a
                # run, and the ratio to the COPY next to it is the one less skewed by that.
                copy_before = run_copy(dsn)[0]
                with CpuMeter(settings["PG_DSN"], database, broker_pid) as cpu:
                    seconds, stats = run_ours(config, kafka, prefix, args.partitions, profile, args.timeout)
                label = (f"ours, {count} {'process' if processes else 'thread'}{'es' if processes and count > 1 else ''}"
                         f"{'s' if not processes and count > 1 else ''}" + (" (prof)" if profile else "")
                         + ("" if row_blocks else ", events") + (", block producer" if ours else ""))
                rate = args.rows / seconds
                print(line(label, args.rows, seconds, stats.bytes, copy_rate)
                      + f"  (COPY just before: {args.rows / copy_before:,.0f} rows/s, "
                        f"{copy_before / seconds:.0%})"
                      + ("" if profile or rate >= TARGET else f"  BELOW the {TARGET:,} rows/s target")
                      + f"  peak RSS {max_rss_mb():.0f} MB")
                print(cpu.text(args.rows), flush=True)
                if stats.events != args.rows:
                    print(f"WARNING: {stats.events:,} events for {args.rows:,} rows")
                if profile is not None:
                    print_profile(profile, f"{args.profile}.{kind}{count}_{number}" if args.profile else None)
                drop_slots(settings["PG_DSN"], database)  # initial_only leaves its slot behind
                delete_topics(kafka, prefix)
            chunk_pages = args.chunk_pages or PostgresConfig.model_fields["snapshot_chunk_pages"].default
            print(f"chunks of {chunk_pages} pages: {-(-pages // chunk_pages)} chunks")
    finally:
        for prefix in prefixes:
            delete_topics(kafka, prefix)
        kafka.close()
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
