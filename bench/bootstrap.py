"""Bootstrap throughput: a new SQL target filled from a compacted topic, beside COPY.

    .venv/bin/cdc dev up --only postgres kafka
    .venv/bin/python -m bench.bootstrap [--events 500000] [--keys 200000] [--rounds 1]
    .venv/bin/python -m bench.bootstrap --events 3000000 --keys 1000000     # issue #18's size

Measures, in one run (the topic is published once):
  copy       COPY of the final rows (one per live key) into a plain PostgreSQL table: the floor
             for loading that data.
  bootstrap  what `cdc bootstrap` does: a SinkRunner reads the topic from offset 0 to its end
             (Kafka, 3 partitions, every update and delete of the history still there, as before
             compaction) and writes it through the SQL sink (version-guarded upserts) into a new
             PostgreSQL database. Records/s over the whole history, and rows/s of the final table.
             "now": reading and decoding the next batch while the sink writes one, upserts staged
             as typed COPY rows; "before": one after the other, upserts staged as jsonb (how it
             ran before issue #18). ``--rounds`` alternates them, each into a fresh database.
Issue #18's targets: >= 100,000 records/s and >= 25% of COPY's rows/s.

Where the time went (before; 600k changes over 200k keys, 10% deletes, cProfile and the
server's statement log): 84% in the server, of which the upsert's ``INSERT ... SELECT CAST(s.j->>'c'
AS type) ... ON CONFLICT`` with its anti-join on remembered deletes 34%, the version-guarded
deletes and tombstones (``DELETE ... USING cdc_stage``) 19%, the jsonb COPY 13%; in Python
decoding (orjson, SinkEvent) and the reduction to the newest version per key, on the same thread,
so neither side ever ran while the other did. Random keys over a large table cost the server more
per row than bench/sql_upsert.py's mostly new keys.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import random
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
    parser.add_argument("--hashed-deletes", action="store_true",
                        help="also run \"now\" with the remembered-delete check as the planner's hash anti-join")
    parser.add_argument("--now-only", action="store_true", help="skip the \"before\" runs")
    args = parser.parse_args()

    from cdc.dev.stack import read_env
    from cdc.events import ChangeEvent, Op, TableId
    from cdc.log.base import TopicSettings
    from cdc.log.kafka import KafkaLog
    from cdc.positions import Counter
    from cdc.runtime.sink_runner import SinkRunner
    from cdc.serde import EnvelopeEncoder
    from sinks.sql.config import SqlSinkConfig
    from sinks.sql.sink import SqlSink

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
        kafka.ensure_topic(topic, TopicSettings(partitions=3))
        rng = random.Random(1)
        final: dict[int, dict | None] = {}
        encoder = EnvelopeEncoder("postgresql", "bench", prefix)
        writer = kafka.writer()
        batch = []
        for i in range(args.events):
            key = rng.randrange(args.keys)
            if final.get(key) is not None and rng.random() < 0.1:
                batch.append(ChangeEvent(Op.DELETE, table, {"id": key}, {"id": key}, None, i + 1, 0))
                final[key] = None
            else:
                row = {"id": key, "customer_id": key % 5000, "status": rng.choice(["new", "paid", "shipped"]),
                       "total": f"{rng.randrange(100_000) / 100:.2f}", "note": "x" * rng.randrange(0, 40)}
                batch.append(ChangeEvent(Op.UPDATE if key in final else Op.CREATE, table, {"id": key}, None,
                                         row, i + 1, 0))
                final[key] = row
            if len(batch) == 5000:
                writer.publish_events(encoder, batch, None)
                writer.poll()
                batch = []
        writer.publish_events(encoder, batch, Counter(1))
        writer.flush(120)
        writer.close()
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
        server_pid = _postmaster_pid(admin)
        for round_ in range(args.rounds):
            variants = [("now", True)] + ([("hashed", True)] if args.hashed_deletes else []) + \
                ([] if args.now_only else [("before", False)])
            for label, now in variants:
                name = f"{database}_{round_}{label}"
                with admin.cursor() as cur:
                    cur.execute(f'CREATE DATABASE "{name}"')
                try:
                    url = (target.rsplit("/", 1)[0] + "/" + name).replace("postgresql://", "postgresql+psycopg2://", 1)
                    sink = SqlSink(SqlSinkConfig(name="bench", type="sql", url=url, topics=[f"{prefix}.*"],
                                                 batch_size=args.batch))
                    if label != "now":  # set once the sink has its applier
                        start = sink.start

                        def start_variant(start=start, sink=sink, label=label):
                            start()
                            sink.applier.probe_deletes = False  # "before": jsonb and hashed deletes
                            if label == "before":
                                sink.applier.typed_upserts = False
                        sink.start = start_variant
                    runner = SinkRunner(sink, kafka, prefix, group=f"bench-{run_id}-{round_}{label}",
                                        read_ahead=now)
                    load = os.getloadavg()[0]
                    cpu = _cpu_seconds(server_pid)
                    began = time.perf_counter()
                    runner.run(threading.Event(), from_start=True, until_caught_up=True)
                    seconds = time.perf_counter() - began
                    cpu = [after - before for after, before in zip(_cpu_seconds(server_pid), cpu)]
                    conn = psycopg2.connect(target.rsplit("/", 1)[0] + "/" + name)
                    with conn.cursor() as cur:
                        cur.execute("SELECT count(*) FROM orders")
                        landed = cur.fetchone()[0]
                    conn.close()
                finally:
                    with admin.cursor() as cur:
                        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                assert landed == len(rows), f"the target has {landed} rows, the source {len(rows)}"
                print(f"bootstrap {label:6} {records / seconds:>10,.0f} records/s  {len(rows) / seconds:>9,.0f} final rows/s  "
                      f"({seconds:6.2f}s)  = {len(rows) / seconds / (len(rows) / copy_s):4.0%} of COPY's rows/s   "
                      f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})   cpu: ours {cpu[0]:.1f}s, "
                      f"PostgreSQL {cpu[1]:.1f}s" + ("" if server_pid else " (not local: unknown)"), flush=True)
    finally:
        kafka.delete_topic(topic)
        kafka.close()
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()


def _postmaster_pid(admin) -> int | None:
    """The PostgreSQL server's process id, when it runs on this machine (the dev stack)."""
    with admin.cursor() as cur:
        cur.execute("SHOW data_directory")
        path = os.path.join(cur.fetchone()[0], "postmaster.pid")
    try:
        with open(path) as file:
            return int(file.readline())
    except (OSError, ValueError):
        return None


def _cpu_seconds(server_pid: int | None) -> tuple[float, float]:
    """CPU seconds used so far by this process (every thread) and by the PostgreSQL server: its
    postmaster with the backends that ended (reaped: its children's time) and those still running."""
    ours = sum(os.times()[:2])
    if server_pid is None:
        return ours, 0.0
    tick = os.sysconf("SC_CLK_TCK")

    def stat(pid: int, children: bool) -> float:
        try:
            with open(f"/proc/{pid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return sum(int(f) for f in fields[11:15 if children else 13]) / tick

    server = stat(server_pid, True)
    try:
        with open(f"/proc/{server_pid}/task/{server_pid}/children") as file:
            server += sum(stat(int(pid), False) for pid in file.read().split())
    except OSError:
        pass
    return ours, server


if __name__ == "__main__":
    main()
