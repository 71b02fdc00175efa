"""Streaming throughput: a mixed workload read from the MariaDB binlog into Kafka, beside the
plain pymysqlreplication iteration and ``mariadb-binlog --verbose`` over the same binlog.

    .venv/bin/cdc dev up --only mysql,kafka
    .venv/bin/python -m bench.mysql_stream [--changes 1000000] [--txn-rows 5000] [--partitions 3]
                                           [--profile stream.prof] [--decode-only]

Steps, in one run on this machine:
  1. a fresh database with an ``orders`` table (bigint key, int, varchar, DECIMAL(10,2), a
     TIMESTAMP(6) and a DATETIME(6), a mostly-NULL text note), and FLUSH BINARY LOGS, so that the
     workload starts a binlog file of its own; ``start`` is the position after the flush.
  2. the workload, server-side SQL, sequential transactions of ``--txn-rows`` rows: 50% INSERT ...
     SELECT from a sequence, 35% UPDATE of id ranges (status, total, updated_at), 15% DELETE of the
     oldest ids, interleaved (the plan of bench.pg_stream). ``end`` is SHOW MASTER STATUS after the
     last commit. Other sessions' transactions in between (other tests) are read by everyone alike.
  3. baseline 1: ``mariadb-binlog --verbose --base64-output=decode-rows --read-from-remote-server``
     from ``start`` to ``end`` into /dev/null: the C client decodes every row into pseudo-SQL.
  4. baseline 2: plain pymysqlreplication, ``BinLogStreamReader`` from ``start``, iterating
     ``event.rows`` of every row event until ``end``: its generic per-value decoding.
  5. ours, decode only: the source's ``poll`` loop from ``start`` until its checkpoint passes ``end``
     (with the collector settings the runner uses, ``tune_gc``)
     (change events made, nothing encoded or sent).
  6. ours, end to end: a SourceRunner (this process, on a thread, as a worker runs it) from
     ``start`` into KafkaLog (acks=all, idempotent, the production producer settings), timed until
     the stored offset passes ``end``: every change acknowledged by Kafka and the offset record too.
     Offsets are stored every ``--offset-interval`` seconds (1.0 as the runtime does), so the end
     is seen up to that late (the figure errs low, never high).
Then the topics and the database are dropped. Target: ours >= 100k row changes/s.

``--profile FILE`` runs step 6 under cProfile (slower: compare rates without it) and prints the top
functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import random
import shutil
import subprocess
import time
import uuid
from urllib.parse import urlparse

import pymysql

from bench.pg_stream import (
    Workload,
    add_capture_arguments,
    delete_topics,
    max_rss_mb,
    plan,
    print_profile,
    time_capture,
)


def stack_settings() -> dict[str, str]:
    from cdc.dev.stack import read_env

    env = read_env()
    out = {k: os.environ.get(k) or env.get(k, "") for k in ("MYSQL_URL", "KAFKA_BOOTSTRAP")}
    missing = [k for k, v in out.items() if not v]
    if missing:
        raise SystemExit(f"no {', '.join(missing)}: run `.venv/bin/cdc dev up --only mysql,kafka`")
    return out


def connect(url: str, db: str | None = None):
    parsed = urlparse(url)
    return pymysql.connect(host=parsed.hostname, port=parsed.port or 3306, user=parsed.username or "root",
                           password=parsed.password or "", database=db, autocommit=True)


ORDERS_DDL = """
CREATE TABLE orders (
    id          BIGINT PRIMARY KEY,
    customer_id INT NOT NULL,
    status      VARCHAR(16) NOT NULL,
    total       DECIMAL(10,2) NOT NULL,
    created_at  TIMESTAMP(6) NOT NULL,
    updated_at  DATETIME(6) NOT NULL,
    note        TEXT
)"""

# Rows as a shop makes them (the row shape of bench.pg_stream): one in seven with a note.
ORDERS_INSERT = """
INSERT INTO orders (id, customer_id, status, total, created_at, updated_at, note)
SELECT seq, (seq * 7919) % 50000 + 1, ELT(1 + seq % 5, 'new', 'paid', 'shipped', 'delivered', 'cancelled'),
       ((seq * 104729) % 100000) / 100.0,
       TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq * 37 SECOND + INTERVAL seq % 1000 MICROSECOND,
       TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq * 41 SECOND + INTERVAL seq % 997 MICROSECOND,
       IF(seq % 7 = 0, CONCAT('deliver to the back door, ring twice (order ', seq, ')'), NULL)
FROM seq_{first}_to_{last}"""


def run_workload(url: str, db: str, changes: int, txn_rows: int) -> tuple[Workload, tuple[str, int]]:
    steps = plan(changes, txn_rows)
    work = Workload()
    conn = connect(url, db)
    conn.autocommit(False)
    began = time.perf_counter()
    inserted = deleted = 0
    cursor_id = 1
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        for kind, rows in steps:
            if kind == "insert":
                count = cur.execute(ORDERS_INSERT.format(first=inserted + 1, last=inserted + rows))
                inserted += rows
            elif kind == "update":
                if cursor_id <= deleted or cursor_id + rows - 1 > inserted:
                    cursor_id = deleted + 1
                count = cur.execute(
                    "UPDATE orders SET status = CASE status WHEN 'new' THEN 'paid' WHEN 'paid' THEN 'shipped' "
                    "ELSE 'delivered' END, total = total + 1.25, updated_at = updated_at + INTERVAL 3602.5 SECOND "
                    "WHERE id BETWEEN %s AND %s", (cursor_id, cursor_id + rows - 1))
                cursor_id += rows
            else:
                count = cur.execute("DELETE FROM orders WHERE id BETWEEN %s AND %s", (deleted + 1, deleted + rows))
                deleted += rows
            if count != rows:
                raise AssertionError(f"{kind} touched {count} rows, not {rows}")
            setattr(work, kind + "s", getattr(work, kind + "s") + rows)
            conn.commit()
            work.transactions += 1
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    conn.close()
    work.seconds = time.perf_counter() - began
    return work, (file, int(pos))


def binlog_files(url: str, first: str, last: str) -> list[str]:
    conn = connect(url)
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        names = [row[0] for row in cur.fetchall()]
    conn.close()
    return names[names.index(first):names.index(last) + 1]


# --- the readers --------------------------------------------------------------------------------------

def run_mariadb_binlog(url: str, files: list[str], start: int, end: int) -> float:
    binary = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if binary is None:
        raise SystemExit("mariadb-binlog not found (apt-get install mariadb-client)")
    parsed = urlparse(url)
    command = [binary, "--read-from-remote-server", f"--host={parsed.hostname}", f"--port={parsed.port or 3306}",
               f"--user={parsed.username or 'root'}", "--verbose", "--base64-output=decode-rows",
               f"--start-position={start}", f"--stop-position={end}", *files]
    if parsed.password:
        command.insert(1, f"--password={parsed.password}")
    began = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        result = subprocess.run(command, stdout=sink, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - began
    if result.returncode != 0:
        raise RuntimeError(f"mariadb-binlog failed ({result.returncode}): {result.stderr.decode().strip()}")
    return elapsed


def run_pymysqlreplication(url: str, db: str, files: list[str], start: int, end: int) -> tuple[float, int]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    parsed = urlparse(url)
    settings = dict(host=parsed.hostname, port=parsed.port or 3306, user=parsed.username or "root",
                    passwd=parsed.password or "")
    reader = BinLogStreamReader(settings, server_id=random.randrange(10_000, 2**31), log_file=files[0],
                                log_pos=start, resume_stream=True, blocking=True,
                                only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent],
                                only_schemas=[db], enable_logging=False)
    rows = 0
    began = time.perf_counter()
    try:
        for event in reader:
            if type(event) is XidEvent:  # the last one ends at ``end``
                if reader.log_file == files[-1] and event.packet.log_pos >= end:
                    break
                continue
            rows += len(event.rows)
    finally:
        reader.close()
    return time.perf_counter() - began, rows


def source_config(url: str, db: str, **overrides):
    from sources.mysql.config import MySqlConfig

    settings = dict(name=db, type="mysql", url=url, server_id=random.randrange(10_000, 2**31), tables=[f"{db}.*"],
                    snapshot="never")
    settings.update(overrides)
    return MySqlConfig.model_validate(settings)


def run_decode_only(config, start, files: list[str], end: int) -> tuple[float, int, float]:
    """(wall seconds, events, this process's CPU seconds)."""
    from cdc.runtime.runner import tune_gc
    from sources.mysql.source import MySqlSource

    source = MySqlSource(config, start)
    source.start()
    tune_gc()  # as the runner does once its source has started
    events = 0
    began, cpu_began = time.perf_counter(), time.process_time()
    try:
        while True:
            batch = source.poll(1.0)
            if batch is None:
                continue
            events += len(batch.events)
            position = batch.checkpoint
            if position is not None and position.file == files[-1] and position.pos >= end:
                break
    finally:
        source.stop()
    return time.perf_counter() - began, events, time.process_time() - cpu_began


def run_ours(config, start, kafka, prefix: str, partitions: int, files: list[str], end: int,
             offset_interval: float, profile: cProfile.Profile | None, timeout: float):
    from sources.mysql.source import MySqlSource

    def reached(stored) -> bool:
        return stored is not None and stored is not start and stored.file == files[-1] and stored.pos >= end

    return time_capture(lambda offsets: MySqlSource(config, start), kafka, prefix, partitions, offset_interval,
                        profile, timeout, reached, f"{files[-1]}:{end}")


def line(label: str, n: int, seconds: float, baseline: float | None = None) -> str:
    rate = n / seconds
    text = f"{label:<28} {rate:>10,.0f} rows/s  ({n:,} rows in {seconds:.2f}s)"
    if baseline:
        text += f"  = {rate / baseline:.1f}x plain pymysqlreplication"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_capture_arguments(parser)
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument("--decode-only", action="store_true",
                        help="only step 5 (the row path without Kafka), with its CPU time: for paired runs")
    args = parser.parse_args()

    from cdc.log.base import TopicSettings
    from cdc.log.kafka import KafkaLog
    from cdc.positions import MySqlPosition

    settings = stack_settings()
    url = settings["MYSQL_URL"]
    run_id = uuid.uuid4().hex[:8]
    db = f"bench_stream_{run_id}"
    prefix = f"bench_{run_id}"
    kafka = KafkaLog(settings["KAFKA_BOOTSTRAP"], TopicSettings(partitions=args.partitions))
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{db}`")
            cur.execute(f"USE `{db}`")
            cur.execute(ORDERS_DDL)
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW MASTER STATUS")
            first_file, start_pos = cur.fetchone()[:2]
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (first_file, start_pos))
            gtid = cur.fetchone()[0]
        start = MySqlPosition(first_file, int(start_pos), gtid)
        work, (last_file, end) = run_workload(url, db, args.changes, args.txn_rows)
        files = binlog_files(url, first_file, last_file)
        print(f"workload: {work.changes:,} row changes ({work.inserts:,} inserts, {work.updates:,} updates, "
              f"{work.deletes:,} deletes) in {work.transactions:,} transactions of <= {args.txn_rows:,} rows, "
              f"made in {work.seconds:.1f}s; binlog {files[0]}:{start.pos} .. {files[-1]}:{end} ({len(files)} files)")
        print(f"Kafka acks=all, {args.partitions} partitions, {os.cpu_count()} CPUs shared with MariaDB and Kafka")

        if args.decode_only:
            seconds, events, cpu = run_decode_only(source_config(url, db), start, files, end)
            if events != work.changes:
                raise AssertionError(f"the source made {events} events, the workload {work.changes} changes")
            print(line("ours, decode only", events, seconds) + f"  cpu {cpu / events * 1e6:.2f} us/row")
            return
        baseline = None
        if not args.skip_baselines:
            seconds = run_mariadb_binlog(url, files, start.pos, end)
            print(line("mariadb-binlog --verbose", work.changes, seconds))
            seconds, rows = run_pymysqlreplication(url, db, files, start.pos, end)
            if rows != work.changes:
                raise AssertionError(f"pymysqlreplication saw {rows} rows, the workload made {work.changes}")
            baseline = rows / seconds
            print(line("pymysqlreplication .rows", rows, seconds))
            seconds, events, _ = run_decode_only(source_config(url, db), start, files, end)
            if events != work.changes:
                raise AssertionError(f"the source made {events} events, the workload {work.changes} changes")
            print(line("ours, decode only", events, seconds, baseline))

        rss_before = max_rss_mb()
        profile = cProfile.Profile() if args.profile is not None else None
        seconds, stats = run_ours(source_config(url, db), start, kafka, prefix, args.partitions, files, end,
                                  args.offset_interval, profile, args.timeout)
        if stats.events != work.changes:
            raise AssertionError(f"the capture published {stats.events} events, the workload made {work.changes}")
        print(line("ours, into Kafka", stats.events, seconds, baseline)
              + f"  {stats.bytes / seconds / 1e6:.1f} MB/s of values")
        print(f"peak RSS {max_rss_mb():.0f} MB (before the capture {rss_before:.0f} MB)")
        if profile is not None:
            print_profile(profile, args.profile or None)
    finally:
        delete_topics(kafka, prefix)  # the tables', the offsets and the schema-changes topics
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
        kafka.close()


if __name__ == "__main__":
    main()
