"""Streaming throughput: a mixed workload read from a PostgreSQL slot into Kafka, beside pg_recvlogical.

    .venv/bin/cdc dev up --only postgres,kafka
    .venv/bin/python -m bench.pg_stream [--changes 1000000] [--txn-rows 5000] [--partitions 3]
                                        [--profile stream.prof]

Steps, in one run on this machine:
  1. a fresh database with an ``orders`` table (bigint key, int, text, numeric(10,2), two
     timestamptz, a mostly-NULL text note), REPLICA IDENTITY DEFAULT.
  2. both slots, before any change: the source's own (a PostgresSource with ``snapshot: never``
     started once on the empty table: it makes the publication and the slot, as in production)
     and a second pgoutput slot for the baseline (pg_create_logical_replication_slot).
  3. the workload, server-side SQL, sequential transactions of ``--txn-rows`` rows: 50% INSERT ...
     SELECT generate_series, 35% UPDATE of id ranges (status, total, updated_at), 15% DELETE of the
     oldest ids, interleaved. ``end`` is pg_current_wal_insert_lsn() taken inside the last
     transaction after its last change: every workload change lies below it, the last commit
     (whose end LSN is what a checkpoint stores) above it.
  4. baseline: ``pg_recvlogical --start --no-loop -E end -f /dev/null`` on the second slot with the
     same pgoutput options as the source (proto_version, publication_names, messages, streaming):
     it exits on the first record past ``end``, the last commit. The server decodes; nothing is
     converted or stored: the ceiling of reading this WAL.
  5. ours: a SourceRunner (this process, on a thread, as a worker runs it) from the source's slot
     into KafkaLog (acks=all, idempotent, the production producer settings), timed from its start
     until the stored offset passes ``end``, i.e. every change is acknowledged by Kafka and the
     offset record too. Offsets are stored every ``--offset-interval`` seconds, 1.0 as the runtime
     does: the end is seen up to that late (so the figure errs low, never high); a smaller interval
     sees it sooner but costs an acks=all round trip per save on the capture thread.
  6. with ``--cluster``: the same changes from a slot of their own (made with the first, before the
     workload) into the three-node Kafka of ``cdc dev up --profile cluster``, topics at its
     replication factor 3 and ``min.insync.replicas`` 2, acks=all: its rate beside the single
     broker's.
Then slots, topics and the database are dropped. Target: ours >= 60% of pg_recvlogical.

``--profile FILE`` runs the capture thread under cProfile (slower: compare rates without it) and
prints the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg2
import psycopg2.extensions

# --- shared with bench.pg_snapshot -----------------------------------------------------------------

def stack_settings() -> dict[str, str]:
    """PG_DSN, KAFKA_BOOTSTRAP, PG_BINDIR from the environment, else from .cdc/dev.env."""
    from cdc.dev.stack import read_env

    env = read_env()
    out = {k: os.environ.get(k) or env.get(k, "") for k in ("PG_DSN", "KAFKA_BOOTSTRAP", "PG_BINDIR")}
    missing = [k for k in ("PG_DSN", "KAFKA_BOOTSTRAP") if not out[k]]
    if missing:
        raise SystemExit(f"no {', '.join(missing)}: run `.venv/bin/cdc dev up --only postgres,kafka`")
    return out


def cluster_bootstrap() -> str:
    """The three-node Kafka's bootstrap servers (``cdc dev up --profile cluster``)."""
    from cdc.dev.stack import read_env

    found = os.environ.get("KAFKA_CLUSTER_BOOTSTRAP") or read_env().get("KAFKA_CLUSTER_BOOTSTRAP")
    if not found:
        raise SystemExit("no KAFKA_CLUSTER_BOOTSTRAP: run `.venv/bin/cdc dev up --profile cluster`")
    return found


def with_dbname(dsn: str, dbname: str) -> str:
    return psycopg2.extensions.make_dsn(dsn, dbname=dbname)


def execute(dsn: str, *statements: str, params: tuple | None = None) -> list:
    """Run statements in autocommit; returns the rows of the last one (if any)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


@contextmanager
def fresh_database(admin_dsn: str, name: str):
    """A new database (its DSN), dropped at the end together with the slots made in it."""
    execute(admin_dsn, f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(admin_dsn, name)
    finally:
        drop_slots(admin_dsn, name)
        execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drop_slots(admin_dsn: str, database: str, timeout: float = 30.0) -> None:
    """Drop every slot of ``database``, waiting for walsenders that are still going away."""
    deadline = time.monotonic() + timeout
    while True:
        rows = execute(admin_dsn, "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                       params=(database,))
        if not rows:
            return
        for slot, pid in rows:
            if pid is None:
                try:
                    execute(admin_dsn, "SELECT pg_drop_replication_slot(%s)", params=(slot,))
                except psycopg2.Error:
                    pass  # became active meanwhile: next round
            elif time.monotonic() > deadline - timeout / 2:
                execute(admin_dsn, "SELECT pg_terminate_backend(%s)", params=(pid,))
        if time.monotonic() > deadline:
            raise RuntimeError(f"slots {[r[0] for r in rows]} of {database} could not be dropped")
        time.sleep(0.1)


def delete_topics(kafka, prefix: str) -> None:
    for topic in kafka.topics():
        if topic.startswith(prefix + "."):
            kafka.delete_topic(topic)


ORDERS_DDL = """
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    customer_id int NOT NULL,
    status      text NOT NULL,
    total       numeric(10,2) NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    note        text
)"""

# Rows as a shop makes them: ~100 bytes of text output each, one in seven with a note.
ORDERS_INSERT = """
INSERT INTO orders (id, customer_id, status, total, created_at, updated_at, note)
SELECT g, (g * 7919) %% 50000 + 1,
       (ARRAY['new','paid','shipped','delivered','cancelled'])[1 + g %% 5],
       ((g * 104729) %% 100000) / 100.0,
       timestamptz '2026-01-01 00:00:00+00' + g * interval '37 seconds' + (g %% 1000) * interval '1 microsecond',
       timestamptz '2026-01-01 00:00:00+00' + g * interval '41 seconds' + (g %% 997) * interval '1 microsecond',
       CASE WHEN g %% 7 = 0 THEN 'deliver to the back door, ring twice (order ' || g || ')' END
FROM generate_series(%s::bigint, %s::bigint) AS g"""


def source_config(dsn: str, name: str, state_dir: str, **overrides):
    from sources.postgres.config import PostgresConfig

    settings = dict(name=name, type="postgres", dsn=dsn, tables=["public.*"], slot=name, publication=name,
                    state_dir=state_dir)
    settings.update(overrides)
    return PostgresConfig.model_validate(settings)


class RunnerThread:
    """A SourceRunner on a thread, as a worker process runs it; optionally under cProfile."""

    def __init__(self, runner, profile: cProfile.Profile | None = None) -> None:
        self.runner = runner
        self.profile = profile
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="capture", daemon=True)

    def _run(self) -> None:
        try:
            if self.profile is not None:
                self.profile.runcall(self.runner.run, self.stop_event)
            else:
                self.runner.run(self.stop_event)
        except BaseException as err:  # noqa: BLE001 - raised by the caller
            self.error = err

    def start(self) -> RunnerThread:
        self.thread.start()
        return self

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def stop(self, timeout: float = 120) -> None:
        self.stop_event.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"the capture did not stop within {timeout:g}s")
        self.check()


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def print_profile(profile: cProfile.Profile, path: str | None, top: int = 15) -> None:
    stats = pstats.Stats(profile)
    if path:
        stats.dump_stats(path)
        print(f"profile written to {path}")
    stats.sort_stats("tottime").print_stats(top)


# --- the workload -----------------------------------------------------------------------------------

@dataclass
class Workload:
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    transactions: int = 0
    end_lsn: str = ""       # inside the last transaction, after its last change
    seconds: float = 0.0

    @property
    def changes(self) -> int:
        return self.inserts + self.updates + self.deletes


def plan(changes: int, txn_rows: int) -> list[tuple[str, int]]:
    """(kind, rows) per transaction: 50% insert, 35% update, 15% delete rows, interleaved so that
    each kind stays near its share all along; updates and deletes only touch live rows."""
    targets = {"insert": changes * 50 // 100, "update": changes * 35 // 100}
    targets["delete"] = changes - targets["insert"] - targets["update"]
    done = dict.fromkeys(targets, 0)
    live = 0
    steps = []
    while any(done[k] < targets[k] for k in targets):
        # the kind furthest behind its share goes next, if it can
        order = sorted((k for k in targets if done[k] < targets[k]), key=lambda k: done[k] / targets[k])
        for kind in order:
            rows = min(txn_rows, targets[kind] - done[kind])
            if kind == "insert" or live >= rows:
                break
        else:
            raise AssertionError("no transaction can run (too few inserts?)")
        if kind == "insert":
            live += rows
        elif kind == "delete":
            live -= rows
        done[kind] += rows
        steps.append((kind, rows))
    return steps


def run_workload(dsn: str, changes: int, txn_rows: int) -> Workload:
    steps = plan(changes, txn_rows)
    work = Workload()
    conn = psycopg2.connect(dsn)
    began = time.perf_counter()
    inserted = 0        # ids 1..inserted were inserted
    deleted = 0         # ids 1..deleted were deleted
    cursor_id = 1       # next id to update
    try:
        with conn.cursor() as cur:
            for i, (kind, rows) in enumerate(steps):
                if kind == "insert":
                    cur.execute(ORDERS_INSERT, (inserted + 1, inserted + rows))
                    inserted += rows
                elif kind == "update":
                    if cursor_id <= deleted or cursor_id + rows - 1 > inserted:
                        cursor_id = deleted + 1
                    cur.execute("UPDATE orders SET status = CASE status WHEN 'new' THEN 'paid' WHEN 'paid' "
                                "THEN 'shipped' ELSE 'delivered' END, total = total + 1.25, "
                                "updated_at = updated_at + interval '1 hour 2.5 seconds' "
                                "WHERE id BETWEEN %s AND %s", (cursor_id, cursor_id + rows - 1))
                    cursor_id += rows
                else:
                    cur.execute("DELETE FROM orders WHERE id BETWEEN %s AND %s", (deleted + 1, deleted + rows))
                    deleted += rows
                if cur.rowcount != rows:
                    raise AssertionError(f"{kind} touched {cur.rowcount} rows, not {rows}")
                setattr(work, kind + "s", getattr(work, kind + "s") + rows)
                if i == len(steps) - 1:
                    cur.execute("SELECT pg_current_wal_insert_lsn()::text")
                    work.end_lsn = cur.fetchone()[0]
                conn.commit()
                work.transactions += 1
    finally:
        conn.close()
    work.seconds = time.perf_counter() - began
    return work


def lsn_int(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


# --- the two readers --------------------------------------------------------------------------------

def run_recvlogical(bindir: str, dsn: str, slot: str, options: dict[str, str], end_lsn: str) -> float:
    binary = shutil.which("pg_recvlogical", path=bindir or None) or shutil.which("pg_recvlogical")
    if binary is None:
        raise SystemExit("pg_recvlogical not found: set PG_BINDIR")
    command = [binary, "-d", dsn, "--slot", slot, "--start", "--no-loop", "-E", end_lsn, "-f", "/dev/null"]
    for key, value in options.items():
        command += ["-o", f"{key}={value}"]
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if result.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({result.returncode}): {result.stderr.strip()}")
    return elapsed


def time_capture(make_source, kafka, prefix: str, partitions: int, offset_interval: float,
                 profile: cProfile.Profile | None, timeout: float, reached, end: str) -> tuple[float, object]:
    """Seconds until ``reached(stored position)`` of a SourceRunner of ``make_source(offsets)``
    into ``kafka``, and its stats; ``end`` names the workload's end in the error of a timeout.
    Shared by this benchmark and bench.mysql_stream."""
    from cdc.log.base import TopicSettings
    from cdc.offsets import OffsetStore
    from cdc.runtime.runner import SourceRunner

    offsets = OffsetStore(kafka, prefix)
    runner = SourceRunner(make_source(offsets), kafka, offsets, prefix, TopicSettings(partitions=partitions),
                          offset_interval=offset_interval)
    capture = RunnerThread(runner, profile)
    began = time.perf_counter()
    capture.start()
    try:
        deadline = time.monotonic() + timeout
        while not reached(runner.stored):
            capture.check()
            if not capture.thread.is_alive():
                raise RuntimeError("the capture ended before reaching the end of the workload")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the capture did not reach {end} within {timeout:g}s "
                                   f"(stored {runner.stored}, {runner.stats.events} events)")
            time.sleep(0.005)
        elapsed = time.perf_counter() - began
    finally:
        capture.stop()
        offsets.close()
    return elapsed, runner.stats


def run_ours(config, kafka, prefix: str, partitions: int, end: int, offset_interval: float,
             profile: cProfile.Profile | None, timeout: float) -> tuple[float, object]:
    from sources.postgres.source import PostgresSource

    return time_capture(lambda offsets: PostgresSource(config, offsets.load(config.name)), kafka, prefix, partitions,
                        offset_interval, profile, timeout, lambda stored: stored is not None and stored.lsn > end,
                        f"{end:X}")


def add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    """The options this benchmark and bench.mysql_stream share."""
    parser.add_argument("--changes", type=int, default=1_000_000, help="row changes in the workload")
    parser.add_argument("--txn-rows", type=int, default=5000, help="rows per workload transaction")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--offset-interval", type=float, default=1.0,
                        help="seconds between offset saves (the runtime default: 1.0)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds ours may take at most")
    parser.add_argument("--profile", nargs="?", const="", default=None, metavar="FILE",
                        help="run the capture under cProfile; print the top 15 by own time (and save FILE)")


def line(label: str, n: int, seconds: float, nbytes: int | None = None, baseline: float | None = None) -> str:
    rate = n / seconds
    text = f"{label:<15} {rate:>10,.0f} changes/s"
    text += f" {nbytes / seconds / 1e6:>7.1f} MB/s" if nbytes is not None else " " * 13
    text += f"  ({seconds:.2f}s)"
    if baseline:
        text += f"  = {rate / baseline:.0%} of pg_recvlogical"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_capture_arguments(parser)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--cluster", action="store_true",
                        help="also capture the same changes (a slot of their own) into the three-node Kafka "
                             "(cdc dev up --profile cluster: replication factor 3, min.insync.replicas 2)")
    args = parser.parse_args()

    from cdc.log.base import TopicSettings
    from cdc.log.kafka import KafkaLog
    from sources.postgres.source import PostgresSource

    settings = stack_settings()
    run_id = uuid.uuid4().hex[:8]
    name = f"bench_stream_{run_id}"
    prefix = f"bench_{run_id}"
    state_dir = tempfile.mkdtemp(prefix="bench-pg-stream-")
    kafka = KafkaLog(settings["KAFKA_BOOTSTRAP"], TopicSettings(partitions=args.partitions))
    # Topics at the cluster's own replication (3) and min.insync.replicas (2).
    cluster = KafkaLog(cluster_bootstrap(), TopicSettings(partitions=args.partitions)) if args.cluster else None
    try:
        with fresh_database(settings["PG_DSN"], name) as dsn:
            execute(dsn, ORDERS_DDL)
            # The source's slot and publication, made by the source itself on the empty table.
            config = source_config(dsn, name, state_dir, snapshot="never")
            setup = PostgresSource(config, None)
            setup.start()
            protocol = setup.protocol
            setup.stop()
            if args.cluster:   # a second slot of the source's, made before the workload as the first
                cluster_config = source_config(dsn, name, state_dir + "-cluster", slot=f"{name}_cluster",
                                               snapshot="never")
                cluster_setup = PostgresSource(cluster_config, None)
                cluster_setup.start()
                cluster_setup.stop()
            base_slot = f"{name}_base"
            execute(dsn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", params=(base_slot,))

            work = run_workload(dsn, args.changes, args.txn_rows)
            wal = execute(dsn, "SELECT pg_wal_lsn_diff(%s, confirmed_flush_lsn)::bigint FROM pg_replication_slots "
                               "WHERE slot_name = %s", params=(work.end_lsn, base_slot))[0][0]
            print(f"workload: {work.changes:,} row changes ({work.inserts:,} inserts, {work.updates:,} updates, "
                  f"{work.deletes:,} deletes) in {work.transactions:,} transactions of <= {args.txn_rows:,} rows, "
                  f"{wal / 1e6:,.0f} MB of WAL, made in {work.seconds:.1f}s; end {work.end_lsn}")
            print(f"pgoutput protocol {protocol}, Kafka acks=all, {args.partitions} partitions")

            baseline = None
            if not args.skip_baseline:
                options = {"proto_version": str(protocol), "publication_names": name, "messages": "true"}
                if protocol >= 2:
                    options["streaming"] = "on"
                seconds = run_recvlogical(settings["PG_BINDIR"], dsn, base_slot, options, work.end_lsn)
                baseline = work.changes / seconds
                print(line("pg_recvlogical", work.changes, seconds))

            rss_before = max_rss_mb()
            profile = cProfile.Profile() if args.profile is not None else None
            seconds, stats = run_ours(config, kafka, prefix, args.partitions, lsn_int(work.end_lsn),
                                      args.offset_interval, profile, args.timeout)
            label = "ours (profiled)" if profile else "ours -> kafka"
            print(line(label, work.changes, seconds, stats.bytes, baseline)
                  + ("" if profile or baseline is None or work.changes / seconds >= 0.6 * baseline
                     else "  BELOW the 60% target"))
            print(f"{'':<15} {stats.events:,} events, {stats.bytes / stats.events:.0f} bytes per value; "
                  f"peak RSS {max_rss_mb():.0f} MB (before the capture: {rss_before:.0f} MB)")
            if stats.events != work.changes:
                print(f"WARNING: {stats.events:,} events for {work.changes:,} changes")
            if profile is not None:
                print_profile(profile, args.profile or None)
            if args.cluster:
                single = work.changes / seconds
                cluster_seconds, cluster_stats = run_ours(cluster_config, cluster, prefix, args.partitions,
                                                          lsn_int(work.end_lsn), args.offset_interval, None,
                                                          args.timeout)
                rate = work.changes / cluster_seconds
                print(line("ours -> 3 nodes", work.changes, cluster_seconds, cluster_stats.bytes, baseline)
                      + f"  = {rate / single:.0%} of the single broker (replication factor 3, "
                        f"min.insync.replicas 2, acks=all)")
    finally:
        delete_topics(kafka, prefix)
        kafka.close()
        if cluster is not None:
            delete_topics(cluster, prefix)
            cluster.close()
        shutil.rmtree(state_dir + "-cluster", ignore_errors=True)
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
