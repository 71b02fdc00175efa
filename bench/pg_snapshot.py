"""Snapshot throughput: a PostgreSQL table read by the source's snapshot into Kafka, beside COPY.

    .venv/bin/cdc dev up --only postgres,kafka
    .venv/bin/python -m bench.pg_snapshot [--rows 1000000] [--workers 1,2,4] [--chunk-pages 2048]
                                          [--profile snapshot.prof]

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

Where the time goes (1M rows; CPU per row, from those figures, py-spy and timing each step alone):

* before (issue #16 part 4 start): ours 4.4 us, PostgreSQL 3.1 us, broker 1.5 us per row. The
  server's share was the row-JSON statement: 3.2 us of CPU per row for ``row_to_json`` over the
  JSON expressions against 0.55 us for the plain ``COPY (SELECT <columns>)`` of the same table.
* now the reader makes the row JSON from the plain COPY text (``sources/postgres/copy_json.py``,
  C in ``_copyjson.c``, the same bytes): PostgreSQL 0.5 us per row. The publishing process spends
  about 1.1 us per row making events (now in C for an integer key, ``int_key_events``), 0.25 us
  encoding the envelopes (``_speedups.emit``), 0.9 us in ``Producer.produce`` and another 1.0 us
  in librdkafka's threads (lz4, requests); the readers about 0.5-1 us (COPY, the JSON, the pipe,
  and a second of process start-up per run). ``compression.type=none`` cost the broker more
  (1.8-2.0 against 1.1 us per row in the same conditions) and this process no less, so lz4 stays.
  ``produce_batch`` measured 0.3 us per record cheaper than ``produce`` alone, not enough to pay
  for its per-record dicts and partial-failure handling.

So a snapshot row now costs about 5.6 us of CPU in all with reader threads (ours 3.6, PostgreSQL
0.5, broker 1.5) and 6.4-8.2 us with 1-4 reader processes (each pays its start-up and the pipe),
against 8.4 and 9.8 us before, measured in the same hour at the same load (the "before" rows
below: this bench with ``sources.postgres.copy_json._copyjson`` set to None, which is the code
as it was); COPY costs about 0.7 us. Two cores at 5.6 us a row allow at most about 0.36M rows/s,
25-35% of what COPY measured on a quiet machine (1.06-1.44M rows/s), and the Python producer
path alone (produce, librdkafka, broker: about 3 us a row) is more than 40% of COPY allows on two
cores. Under the loads these machines had (18-44), wall-clock rates follow the scheduler's share
rather than the work: moving the row JSON from a server backend into our process cut the total
CPU by a third but did not raise the loaded rates measurably.

Measured (1M rows, 2 cores shared with other helpers; rows/s, share of the first COPY rate of the
run and of the COPY run just before it, load average during the run):

    before (code at the start of this work):
      quiet:  COPY 1,441k; processes 1/2/4: 110k 104k 92k (8% 7% 6%)                      load 2-5
      COPY 183k; processes 1/2: 24k 19k (13% 11%); threads 1/2: 38k 35k (21% 19%)        load 36-40
              cpu per row: processes ours 5.0-5.6 + PostgreSQL 3.1 + broker 1.7 us;
                           threads ours 3.9-4.0 + PostgreSQL 3.2 + broker 1.3-1.4 us
    now:
      COPY 405k; processes 1/2/4: 76k 66k 52k (19% 16% 13%)                               load 18-20
      COPY 211k; processes 1/2/4: 33k 26k 20k (16% 13% 9%); threads 1/2/4: 30k 30k 29k (14%) load 33-41
              cpu per row: processes ours 4.5-6.0 + PostgreSQL 0.5 + broker 1.4-1.7 us;
                           threads ours 3.6-3.7 + PostgreSQL 0.5 + broker 1.4-1.5 us

      quiet, after the merge (three runs back to back, load 0.9-1.4):
      COPY 1,467k; processes 1/2/4: 348k 341k 308k (24% 23% 21%)
      COPY 1,463k; processes 1/2: 323k 318k (22% 22%); threads 1/2: 360k 417k (25% 28%)
              cpu per row: processes ours 3.6-4.3 + PostgreSQL 0.5 + broker 0.5-0.7 us;
                           threads ours 3.3 + PostgreSQL 0.5 + broker 0.5 us

The 40%-of-COPY target was reached in no run. On the quiet machine the same code reads 3x the
rows/s of the code before (348k against 110k with one reader process; 22-28% of COPY against
6-8%), and issue #18's 150,000 rows/s is passed with every reader count; what is left is our
process's ~3.3-3.8 us a row (producing through librdkafka most of it), against COPY's 0.7.
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
from bench.pg_stream import (ORDERS_DDL, ORDERS_INSERT, RunnerThread, delete_topics, drop_slots, execute,
                             fresh_database, max_rss_mb, print_profile, source_config, stack_settings)

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

    def __enter__(self) -> "CpuMeter":
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
        per_row = lambda s: f"{s:.1f}s ({s / rows * 1e6:.1f} us/row)"
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
            blocks = [False, True] if args.compare_events else [pg_snapshot.ROW_BLOCKS]
            runs = [(count, processes, row_blocks) for _ in range(args.rounds) for count, processes in runs
                    for row_blocks in blocks]
            for number, (count, processes, row_blocks) in enumerate(runs):
                pg_snapshot.ROW_BLOCKS = row_blocks
                kind = ("p" if processes else "t") + ("" if row_blocks else "e")
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
                         + ("" if row_blocks else ", events"))
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
