"""Incremental snapshot throughput, and the stream's latency while one runs (PostgreSQL).

    .venv/bin/cdc dev up --only postgres            (add kafka for --log kafka)
    .venv/bin/python -m bench.incremental_snapshot [--rows 200000] [--chunk-rows 4096] [--rate 200]
                                                   [--log embedded|kafka]

Steps, in one run on this machine:
  1. a fresh database with an ``orders`` table of ``--rows`` rows (bench.pg_stream's columns) and a
     ``ticks`` table; baseline: ``COPY (SELECT * FROM orders) TO STDOUT`` into a sink that drops
     the bytes (the ceiling of reading the table through this driver).
  2. a PostgresSource with ``snapshot: never`` and a signal table, in a SourceRunner on a thread
     (as a worker runs it) into the log; a writer thread inserts ``--rate`` ticks a second, each
     carrying the wall-clock time just before its commit.
  3. stream latency with no snapshot running (``--quiet-seconds``), then an incremental snapshot
     of ``orders`` requested (``request_snapshot``), timed until its last chunk is emitted, with
     the stream's latency measured all along.

Latency is per tick: from just before its commit until the source hands its change to the
runtime (the source's ``poll``), so it shows how long a chunk holds the stream back; publishing
adds the same to both phases. Rows/s counts the table's rows over the snapshot's time.

Measured (60k-100k rows, embedded log, 200 ticks/s, 2 cores shared with other helpers at load
average 15-19, so every figure is inflated and varies run to run):

    chunks of 1,024: COPY 224k-416k rows/s; incremental 8k-14k rows/s (six runs); stream latency
                     p50/p95/max 2/10-13/30-180 ms without a snapshot, 35-50/175-445/389-731 ms
                     during it
    chunks of 4,096: COPY 331k-377k rows/s; incremental 8k-9k rows/s; during it 190-206/773-944/
                     1337-1797 ms

Where the time went (cProfile of the runner's thread, 60k rows in chunks of 1,024, 7.7 s in all
including a second of idle stream before and after): publishing into the embedded log 2.8 s,
the stream's reads (mostly waiting in select, idle or for the watermarks to come back through the
slot) 1.8 s, reading the chunks (COPY) 1.4 s, writing the watermarks 0.7 s. Reading the next chunk
while the previous one's watermarks come back was tried: A/B runs showed no difference above the
noise on this machine, so it was left out. Larger chunks hold the stream back longer per poll, so
its latency grows with them.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
import uuid

import psycopg2

from bench.pg_stream import ORDERS_DDL, ORDERS_INSERT, RunnerThread, execute, fresh_database, source_config


class NullSink:
    def write(self, data) -> None:
        pass


def copy_rate(dsn: str, rows: int) -> float:
    conn = psycopg2.connect(dsn)
    try:
        began = time.monotonic()
        with conn.cursor() as cur:
            cur.copy_expert("COPY (SELECT * FROM orders) TO STDOUT", NullSink(), size=1 << 20)
        return rows / (time.monotonic() - began)
    finally:
        conn.close()


def ticker(dsn: str, rate: float, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        interval = 1 / rate
        with conn.cursor() as cur:
            while not stop.is_set():
                cur.execute("INSERT INTO ticks (sent_ms) VALUES (%s)", (int(time.time() * 1000),))
                time.sleep(interval)
        conn.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def percentiles(values: list[float]) -> str:
    if not values:
        return "no ticks"
    values = sorted(values)
    at = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return (f"p50 {at(0.5):.0f} ms, p95 {at(0.95):.0f} ms, p99 {at(0.99):.0f} ms, max {values[-1]:.0f} ms "
            f"({len(values)} ticks, mean {statistics.fmean(values):.0f} ms)")


def stack_settings(needs_kafka: bool) -> dict[str, str]:
    """PG_DSN (and KAFKA_BOOTSTRAP for --log kafka) from the environment, else from .cdc/dev.env."""
    import os

    from cdc.dev.stack import read_env

    env = read_env()
    out = {k: os.environ.get(k) or env.get(k, "") for k in ("PG_DSN", "KAFKA_BOOTSTRAP")}
    missing = [k for k in ("PG_DSN", "KAFKA_BOOTSTRAP") if not out[k] and (k == "PG_DSN" or needs_kafka)]
    if missing:
        raise SystemExit(f"no {', '.join(missing)}: run `.venv/bin/cdc dev up --only postgres"
                         f"{' kafka' if needs_kafka else ''}`")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk-rows", type=int, default=4096)
    parser.add_argument("--rate", type=float, default=200, help="ticks a second written while it runs")
    parser.add_argument("--quiet-seconds", type=float, default=5.0)
    parser.add_argument("--log", choices=("embedded", "kafka"), default="embedded")
    args = parser.parse_args()

    from cdc.log.base import TopicSettings
    from cdc.offsets import OffsetStore
    from cdc.runtime.runner import SourceRunner
    from sources.postgres.source import PostgresSource

    settings = stack_settings(args.log == "kafka")
    name = f"incr_{uuid.uuid4().hex[:8]}"
    state = tempfile.mkdtemp(prefix="cdc-bench-")
    try:
        with fresh_database(settings["PG_DSN"], name) as dsn:
            execute(dsn, ORDERS_DDL, "CREATE TABLE ticks (id bigserial PRIMARY KEY, sent_ms bigint NOT NULL)")
            execute(dsn, ORDERS_INSERT, params=(1, args.rows))
            execute(dsn, "VACUUM ANALYZE orders")
            copy = copy_rate(dsn, args.rows)
            if args.log == "kafka":
                from cdc.api import open_kafka_log
                log = open_kafka_log(settings["KAFKA_BOOTSTRAP"])
            else:
                from cdc.log.embedded import EmbeddedLog
                log = EmbeddedLog(f"{state}/log", fsync=False)
            config = source_config(dsn, name, state, snapshot="never", signal_table="public.cdc_signal",
                                   incremental_chunk_rows=args.chunk_rows, heartbeat_interval=1.0)
            source = PostgresSource(config, None)
            latencies: list[tuple[float, float]] = []  # (when, ms)
            real_poll = source.poll

            def poll(timeout):
                batch = real_poll(timeout)
                if batch is not None:
                    now = time.time() * 1000
                    latencies.extend((now, now - e.after["sent_ms"]) for e in batch.events
                                     if e.table.table == "ticks" and e.after is not None)
                return batch

            source.poll = poll
            runner = SourceRunner(source, log, OffsetStore(log, name), name, TopicSettings(partitions=1))
            capture = RunnerThread(runner).start()
            stop = threading.Event()
            try:
                while source.phase != "streaming":
                    capture.check()
                    time.sleep(0.05)
                writer = ticker(dsn, args.rate, stop)
                time.sleep(args.quiet_seconds)
                began_ms = time.time() * 1000
                began = time.monotonic()
                source.request_snapshot(["public.orders"])
                time.sleep(0.2)
                while source.incremental_snapshot() is not None:
                    capture.check()
                    time.sleep(0.02)
                seconds = time.monotonic() - began
                ended_ms = time.time() * 1000
                time.sleep(1.0)
                stop.set()
                writer.join()
            finally:
                stop.set()
                capture.stop()
                log.close()
            quiet = [ms for at, ms in latencies if at < began_ms]
            during = [ms for at, ms in latencies if began_ms <= at <= ended_ms]
            rate = args.rows / seconds
            print(f"incremental snapshot of {args.rows:,} rows in chunks of {args.chunk_rows:,} ({args.log} log, "
                  f"{args.rate:g} ticks/s written meanwhile)")
            print(f"  COPY (same table, same run):   {copy:,.0f} rows/s")
            print(f"  incremental snapshot:          {rate:,.0f} rows/s ({seconds:.1f} s, {rate / copy:.0%} of COPY)")
            print(f"  stream latency, no snapshot:   {percentiles(quiet)}")
            print(f"  stream latency, during it:     {percentiles(during)}")
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
