"""Incremental snapshot throughput, and the stream's latency while one runs (PostgreSQL or MariaDB).

    .venv/bin/cdc dev up --only postgres            (mysql for --source mariadb; add kafka for --log kafka)
    .venv/bin/python -m bench.incremental_snapshot [--source postgres|mariadb] [--rows 200000]
                                                   [--chunk-rows 1024] [--rate 200] [--log embedded|kafka]

Steps, in one run on this machine:
  1. a fresh database with an ``orders`` table of ``--rows`` rows (bench.pg_stream's columns) and a
     ``ticks`` table; baseline: reading the whole table through the driver into nothing
     (PostgreSQL: ``COPY (SELECT * FROM orders) TO STDOUT``; MariaDB: an unbuffered ``SELECT *``
     with no type conversion), the ceiling of reading it from this process.
  2. the source with ``snapshot: never`` and a signal table, in a SourceRunner on a thread (as a
     worker runs it) into the log; a writer thread inserts ``--rate`` ticks a second, each carrying
     the wall-clock time just before its commit.
  3. stream latency with no snapshot running (``--quiet-seconds``), then an incremental snapshot
     of ``orders`` requested (``request_snapshot``), timed until its last chunk is emitted, with
     the stream's latency measured all along.

Latency is per tick: from just before its commit until the source hands its change to the
runtime (the source's ``poll``), so it shows how long a chunk holds the stream back; publishing
adds the same to both phases. Rows/s counts the table's rows over the snapshot's time.

Measured (60k-100k rows, embedded log, 200 ticks/s, 2 cores shared with other helpers at load
average 15-22, so every figure is inflated and varies run to run):

    PostgreSQL, chunks of 1,024: COPY 220k-416k rows/s; incremental 8k-14k rows/s (seven runs);
        stream latency p50/p95/max 2-3/10-13/30-180 ms without a snapshot, 35-51/175-445/389-744 ms
        during it
    PostgreSQL, chunks of 4,096: COPY 331k-377k rows/s; incremental 8k-9k rows/s; during it
        190-206/773-944/1337-1797 ms
    MariaDB, chunks of 1,024 (one run): SELECT 37k rows/s; incremental 4.3k rows/s; stream latency
        p50/p95/max 117/221/462 ms without a snapshot (the binlog stream's batching, heartbeat
        0.2 s), 164/414/505 ms during it

Where the time went (PostgreSQL; cProfile of the runner's thread, 60k rows in chunks of 1,024,
7.7 s in all including a second of idle stream before and after): publishing into the embedded
log 2.8 s, the stream's reads (mostly waiting in select, idle or for the watermarks to come back
through the slot) 1.8 s, reading the chunks (COPY) 1.4 s, writing the watermarks 0.7 s. Reading
the next chunk while the previous one's watermarks come back was tried: A/B runs showed no
difference above the noise on this machine, so it was left out. Larger chunks hold the stream
back longer per poll, so its latency grows with them.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlparse

import psycopg2

from bench.pg_stream import ORDERS_DDL, ORDERS_INSERT, RunnerThread, execute, fresh_database, source_config


class NullSink:
    def write(self, data) -> None:
        pass


@dataclass
class Setup:
    """A database with ``orders`` and ``ticks``, and the source's config for it."""

    config: object
    source_class: type
    table: str                     # orders, as the source names it
    baseline: str                  # what the baseline read is
    baseline_rate: float           # rows/s
    connect: Callable[[], object]  # a DB-API connection in autocommit, for the ticks


def timed_read(read: Callable[[], None], rows: int) -> float:
    began = time.monotonic()
    read()
    return rows / (time.monotonic() - began)


@contextmanager
def postgres(args, state: str, settings: dict) -> Iterator[Setup]:
    from sources.postgres.source import PostgresSource

    name = f"incr_{uuid.uuid4().hex[:8]}"
    with fresh_database(settings["PG_DSN"], name) as dsn:
        execute(dsn, ORDERS_DDL, "CREATE TABLE ticks (id bigserial PRIMARY KEY, sent_ms bigint NOT NULL)")
        execute(dsn, ORDERS_INSERT, params=(1, args.rows))
        execute(dsn, "VACUUM ANALYZE orders")
        conn = psycopg2.connect(dsn)

        def copy() -> None:
            with conn.cursor() as cur:
                cur.copy_expert("COPY (SELECT * FROM orders) TO STDOUT", NullSink(), size=1 << 20)

        try:
            rate = timed_read(copy, args.rows)
        finally:
            conn.close()

        def connect():
            ticks = psycopg2.connect(dsn)
            ticks.autocommit = True
            return ticks

        yield Setup(source_config(dsn, name, state, snapshot="never", signal_table="public.cdc_signal",
                                  incremental_chunk_rows=args.chunk_rows, heartbeat_interval=1.0),
                    PostgresSource, "public.orders", "COPY", rate, connect)


@contextmanager
def mariadb(args, state: str, settings: dict) -> Iterator[Setup]:
    import pymysql.cursors

    from sources.mysql.config import MySqlConfig
    from sources.mysql.source import MySqlSource

    url = settings["MYSQL_URL"]
    db = f"incr_{uuid.uuid4().hex[:8]}"
    parsed = urlparse(url)

    def connect(database: str | None = db, **extra):
        return pymysql.connect(host=parsed.hostname, port=parsed.port or 3306, user=parsed.username or "root",
                               password=parsed.password or "", database=database, autocommit=True, **extra)

    admin = connect(None)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{db}`")
            cur.execute(f"USE `{db}`")
            cur.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id INT NOT NULL, status VARCHAR(16) "
                        "NOT NULL, total DECIMAL(10,2) NOT NULL, created_at DATETIME(6) NOT NULL, updated_at "
                        "DATETIME(6) NOT NULL, note TEXT)")
            cur.execute("CREATE TABLE ticks (id BIGINT AUTO_INCREMENT PRIMARY KEY, sent_ms BIGINT NOT NULL)")
            cur.execute("INSERT INTO orders SELECT seq, (seq * 7919) % 50000 + 1, ELT(1 + seq % 5, 'new', 'paid', "
                        "'shipped', 'delivered', 'cancelled'), ((seq * 104729) % 100000) / 100.0, "
                        "TIMESTAMPADD(SECOND, seq * 37, '2026-01-01'), TIMESTAMPADD(SECOND, seq * 41, '2026-01-01'), "
                        "IF(seq % 7 = 0, CONCAT('deliver to the back door, ring twice (order ', seq, ')'), NULL) "
                        f"FROM seq_1_to_{args.rows}")
        reader = connect(conv={})

        def select() -> None:
            with reader.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute("SELECT * FROM orders")
                while cur.fetchmany(4096):
                    pass

        try:
            rate = timed_read(select, args.rows)
        finally:
            reader.close()
        config = MySqlConfig(name=db, url=url, tables=[f"{db}.*"], snapshot="never", signal_table=f"{db}.cdc_signal",
                             incremental_chunk_rows=args.chunk_rows, server_id=random.randrange(10_000, 2**31))
        yield Setup(config, MySqlSource, f"{db}.orders", "SELECT * (unbuffered, no conversion)", rate, connect)
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        admin.close()


def ticker(connect: Callable[[], object], rate: float, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        conn = connect()
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


def stack_settings(source: str, needs_kafka: bool) -> dict[str, str]:
    """The servers' addresses from the environment, else from .cdc/dev.env."""
    import os

    from cdc.dev.stack import read_env

    env = read_env()
    wanted = ["PG_DSN" if source == "postgres" else "MYSQL_URL"] + (["KAFKA_BOOTSTRAP"] if needs_kafka else [])
    out = {k: os.environ.get(k) or env.get(k, "") for k in wanted}
    missing = [k for k in wanted if not out[k]]
    if missing:
        raise SystemExit(f"no {', '.join(missing)}: run `.venv/bin/cdc dev up --only "
                         f"{'postgres' if source == 'postgres' else 'mysql'}{' kafka' if needs_kafka else ''}`")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=("postgres", "mariadb"), default="postgres")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk-rows", type=int, default=1024)
    parser.add_argument("--rate", type=float, default=200, help="ticks a second written while it runs")
    parser.add_argument("--quiet-seconds", type=float, default=5.0)
    parser.add_argument("--log", choices=("embedded", "kafka"), default="embedded")
    args = parser.parse_args()

    from cdc.log.base import TopicSettings
    from cdc.offsets import OffsetStore
    from cdc.runtime.runner import SourceRunner

    settings = stack_settings(args.source, args.log == "kafka")
    state = tempfile.mkdtemp(prefix="cdc-bench-")
    setup_for = postgres if args.source == "postgres" else mariadb
    try:
        with setup_for(args, state, settings) as setup:
            if args.log == "kafka":
                from cdc.log.kafka import KafkaLog
                log = KafkaLog(settings["KAFKA_BOOTSTRAP"])
            else:
                from cdc.log.embedded import EmbeddedLog
                log = EmbeddedLog(f"{state}/log", fsync=False)
            name = setup.config.name
            source = setup.source_class(setup.config, None)
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
                writer = ticker(setup.connect, args.rate, stop)
                time.sleep(args.quiet_seconds)
                began_ms = time.time() * 1000
                began = time.monotonic()
                source.request_snapshot([setup.table])
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
            print(f"{args.source}: incremental snapshot of {args.rows:,} rows in chunks of {args.chunk_rows:,} "
                  f"({args.log} log, {args.rate:g} ticks/s written meanwhile)")
            print(f"  {setup.baseline} (same table, same run): {setup.baseline_rate:,.0f} rows/s")
            print(f"  incremental snapshot: {rate:,.0f} rows/s ({seconds:.1f} s, "
                  f"{rate / setup.baseline_rate:.0%} of the baseline)")
            print(f"  stream latency, no snapshot: {percentiles(quiet)}")
            print(f"  stream latency, during it:   {percentiles(during)}")
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
