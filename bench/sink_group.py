"""Sink scale-out: the SQL sink as 1 and as 3 processes of one Kafka consumer group
(``scale_out: group``), each into a fresh PostgreSQL database, in the same run.

    .venv/bin/cdc dev up --only postgres kafka
    .venv/bin/python -m bench.sink_group [--events 600000] [--keys 200000] [--partitions 6]
                                         [--members 1 3] [--rounds 1]

Steps:
  1. one topic of ``--partitions`` partitions holding ``--events`` changes (updates of random keys
     over ``--keys`` keys, 10% deletes), published once;
  2. per member count, a fresh database and a fresh group: that many member processes (each a
     SinkRunner with the SQL sink, as ``cdc run --only SINK`` runs it) start together and join the
     group. The clock starts once every member owns partitions (the group's start-up and first
     rebalances are not counted; what the members committed meanwhile is subtracted) and stops
     when the group's committed offsets reach the topic's end. Prints events/s over that window,
     the ratio to one member, and the load average before and after;
  3. checks that the target holds every live key.

What to expect: the members are processes, so they are not bound by one GIL; but every member and
the PostgreSQL server share this machine's cores. On a machine with two cores the server's side of
the upserts and the members' decoding compete for the same CPUs, and three members gain little
over one; the gain shows where the members run on machines (or cores) of their own.

Measured (2 cores shared with other work, PostgreSQL on the same cores; defaults): at load 8,
17.3k records/s with one member and 21.1k with three (1.22x, 200k changes); at load 19-24,
8.5k/9.1k with one and 22.1k/21.0k with three (2.6x/2.3x, two rounds). Under that much load most
of the gain is three processes getting a larger share of the contended cores, not the work
spreading over idle ones: read these figures as "members share the work and nothing is lost",
not as a speed-up to expect.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import psycopg2


def member(args: argparse.Namespace) -> None:
    """One member: the SQL sink in group ``args.group`` until SIGTERM."""
    from cdc.log.kafka import KafkaLog
    from cdc.runtime.sink_runner import SinkRunner
    from sinks.sql.config import SqlSinkConfig
    from sinks.sql.sink import SqlSink

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    kafka = KafkaLog(args.kafka)
    sink = SqlSink(SqlSinkConfig(name=args.group, type="sql", url=args.url, topics=[f"{args.prefix}.*"],
                                 batch_size=10_000, scale_out="group"))
    try:
        SinkRunner(sink, kafka, args.prefix, group=args.group).run(stop)
    finally:
        kafka.close()


def publish_orders(kafka, prefix: str, events: int, keys: int, partitions: int) -> dict[int, dict | None]:
    """``events`` changes of random keys of ``keys`` into the orders topic of ``prefix`` (updates,
    10% deletes of live keys; made with ``partitions``), always the same for the same arguments;
    returns each key's final row (None: deleted)."""
    from cdc.events import ChangeEvent, Op, TableId
    from cdc.log.base import TopicSettings
    from cdc.positions import Counter
    from cdc.serde import EnvelopeEncoder

    table = TableId("shop", "public", "orders")
    kafka.ensure_topic(table.topic(prefix), TopicSettings(partitions=partitions))
    rng = random.Random(1)
    final: dict[int, dict | None] = {}
    encoder = EnvelopeEncoder("postgresql", "bench", prefix)
    writer = kafka.writer()
    batch = []
    for i in range(events):
        key = rng.randrange(keys)
        if final.get(key) is not None and rng.random() < 0.1:
            batch.append(ChangeEvent(Op.DELETE, table, {"id": key}, {"id": key}, None, i + 1, 0))
            final[key] = None
        else:
            row = {"id": key, "customer_id": key % 5000, "status": rng.choice(["new", "paid", "shipped"]),
                   "total": f"{rng.randrange(100_000) / 100:.2f}", "note": "x" * rng.randrange(0, 40)}
            batch.append(ChangeEvent(Op.UPDATE if key in final else Op.CREATE, table, {"id": key}, None, row,
                                     i + 1, 0))
            final[key] = row
        if len(batch) == 5000:
            writer.publish_events(encoder, batch, None)
            writer.poll()
            batch = []
    writer.publish_events(encoder, batch, Counter(1))
    writer.flush(120)
    writer.close()
    return final


def run_group(args, kafka, prefix: str, topic: str, members: int, url: str, group: str) -> tuple[float, int]:
    """(seconds, events) of the measured window for ``members`` processes in ``group``."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": args.kafka})
    ends = kafka.end_offsets(topic)
    total = sum(ends.values())
    command = [sys.executable, "-m", "bench.sink_group", "--member", "--kafka", args.kafka, "--prefix", prefix,
               "--group", group, "--url", url]
    processes = [subprocess.Popen(command, start_new_session=True) for _ in range(members)]
    reader = kafka.reader(group)  # only to read the group's commits; it does not join

    def committed() -> int:
        return sum(offset or 0 for offset in reader.committed(list(ends)).values())

    def owners() -> int:
        description = admin.describe_consumer_groups([group])[group].result(15)
        return sum(1 for m in description.members or () if m.assignment and m.assignment.topic_partitions)

    try:
        while owners() < members:
            if any(p.poll() is not None for p in processes):
                raise SystemExit("a member exited before the group formed")
            time.sleep(0.05)
        began, start = time.perf_counter(), committed()
        while (done := committed()) < total:
            if any(p.poll() is not None for p in processes):
                raise SystemExit("a member exited during the run")
            time.sleep(0.05)
        return time.perf_counter() - began, done - start
    finally:
        reader.close()
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each member count, alternated")
    parser.add_argument("--member", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kafka", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.member:
        return member(args)

    from cdc.dev.stack import read_env
    from cdc.log.kafka import KafkaLog

    env = read_env()
    args.kafka = env["KAFKA_BOOTSTRAP"]
    run_id = uuid.uuid4().hex[:8]
    prefix = f"bench_{run_id}"
    topic = f"{prefix}.public.orders"
    kafka = KafkaLog(args.kafka)
    admin = psycopg2.connect(env["PG_DSN"])
    admin.autocommit = True
    try:
        final = publish_orders(kafka, prefix, args.events, args.keys, args.partitions)
        live = sum(row is not None for row in final.values())
        print(f"topic: {args.events:,} changes over {args.keys:,} keys in {args.partitions} partitions; "
              f"{live:,} keys live at the end; {os.cpu_count()} cores")
        rates: dict[int, list[float]] = {}
        for round_ in range(args.rounds):
            for members in args.members:
                name = f"bench_{run_id}_{round_}_{members}"
                with admin.cursor() as cur:
                    cur.execute(f'CREATE DATABASE "{name}"')
                dsn = env["PG_DSN"].rsplit("/", 1)[0] + "/" + name
                try:
                    load = os.getloadavg()[0]
                    seconds, events = run_group(args, kafka, prefix, topic, members,
                                                dsn.replace("postgresql://", "postgresql+psycopg2://", 1), name)
                    conn = psycopg2.connect(dsn)
                    with conn.cursor() as cur:
                        cur.execute("SELECT count(*) FROM orders")
                        landed = cur.fetchone()[0]
                    conn.close()
                finally:
                    with admin.cursor() as cur:
                        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                assert landed == live, f"the target has {landed} rows, the source {live}"
                rate = events / seconds
                rates.setdefault(members, []).append(rate)
                one = rates.get(1, [None])[-1]
                ratio = f"  = {rate / one:4.2f}x one member" if one and members != 1 else ""
                print(f"{members} member{'s' if members > 1 else ' '}  {rate:>9,.0f} records/s  "
                      f"({events:,} records in {seconds:5.1f}s){ratio}   (load {load:.1f} -> {os.getloadavg()[0]:.1f})",
                      flush=True)
    finally:
        kafka.delete_topic(topic)
        kafka.close()
        admin.close()


if __name__ == "__main__":
    main()
