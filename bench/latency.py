"""End-to-end latency: a commit in PostgreSQL -> its Kafka record -> its row in a SQL target.

    .venv/bin/cdc dev up --only postgres kafka
    .venv/bin/python -m bench.latency [--rates 1000 10000] [--seconds 20] [--sink-wait-ms 200]

The pipeline is the real daemon, ``cdc run`` (a PostgreSQL source into Kafka, 3 partitions, and an
SQL sink into another PostgreSQL database), started as a user would, in a session of its own. For
each rate a writer commits inserts into the source at that steady rate, in one transaction every
10 ms (10 rows each at 1k/s, 100 at 10k/s), and notes the wall clock when each COMMIT returned.
Two watchers note when each change becomes visible:

  kafka  a consumer of the topic (assigned at its end before the writer starts) takes the time a
         record reaches it: commit -> a consumer can read the record;
  sql    a reader of the target table, querying new ids every 5 ms: commit -> the row is visible.

Prints p50/p95/p99/max of both per rate (one machine, one clock), and the Kafka figure split in
two by each record's timestamp (CreateTime: the wall clock, in ms, when ``cdc run`` produced it):
commit -> produced (PostgreSQL's walsender, our source, encoding) and produced -> consumer (the
producer's batching, the broker's append and acknowledgement, the consumer's fetch). The issue's
targets at 10k/s: commit -> Kafka p99 <= 50 ms, commit -> SQL row p99 <= 1 s. The sink's
``batch_wait_ms`` (how long it gathers a batch, ``--sink-wait-ms``; 200 ms by default as for
users) is part of the SQL figure. The default run takes about a minute and a half; ``--seconds``
makes it longer.

With ``--cluster`` the same runs follow into the three-node Kafka of ``cdc dev up --profile
cluster`` (topics at its replication factor 3 and ``min.insync.replicas`` 2, acks=all), after
the single broker's.

The writer and each watcher run in processes of their own: in one process a watcher decoding
records holds the GIL while the writer's COMMIT returns, and the writer's clock then reads late
(latencies too small, some below zero). On a loaded machine the writer's process can still be
descheduled between COMMIT returning and reading the clock; a minimum below zero shows it. The Kafka watcher waits for its first record with
``poll`` and then takes what else is there without waiting: ``consume(n, timeout)`` waits until
it has ``n`` records or the timeout passed, which at 1k/s added ~25 ms of the watcher's own to
every figure (the p50 of 37 ms measured before issue #18's latency work was mostly that and the
producer's linger).

Where the time went (issue #18; each hop timestamped in the daemon: the walsender's send time
of each message, when the source read it, when it was produced, the broker's LogAppendTime, when
the watcher got it; load 8-17 on 2 cores, 1k/s): commit -> walsender sent p50 0.3 ms, sent ->
read 0.2 ms, read -> produced 0.2 ms, produced -> broker append 10.1 ms (the producer's
``linger.ms=10``), append -> watcher 27.6 ms (the watcher's ``consume`` wait above). Now the
runner has a batch that found the source caught up sent at once (``LogWriter.send_now``; a
backlog still batches with the linger): produced -> append p50 0.2 ms.

Before and after, this bench, alternating main's code and this code on the same stack, 20 s per
rate (the machine shared with other work at load 19-29 throughout; no quiet machine was
available), commit -> Kafka p50 / p95 / p99 in ms:
  1k/s   before 12.9/50.2/113.9, 12.4/23.9/41.0, 12.4/23.9/45.3, 12.4/25.6/54.2, 12.4/26.8/75.2
         after  11.4/302/639 (load 28), 2.4/11.6/56.4, 3.7/14.8/33.1
  10k/s  before 21/67/107, 2038/3717/3977, 694/1570/1704, 1232/4728/5168, 70/317/482
         after  594/1272/1375, 28/330/464, 638/2022/2299
(A first version that let ``send_now`` wait up to 50 ms for acknowledgements: 1k/s 3.3/19.1/44.1
and 6.3/87/183, 10k/s 102/509/623 and 3102/5356/5494; under load it held the capture thread
while acknowledgements took tens of ms, hence the 2 ms bound.)
At 1k/s produced -> consumer went from p50 11.7-11.9 ms to 1.7-1.9 ms in every run. At 10k/s
on this machine both versions fall behind by up to seconds in the capture process (commit ->
produced) whenever the machine is starved, so those runs say nothing about the 50 ms target;
run it on a quiet machine for that. The capture throughput did not change: bench.pg_stream
(300k changes, alternating) main 20.9k/20.7k/30.6k/17.6k/18.1k changes/s, this 20.1k/23.4k/
22.8k/20.1k/14.0k; send_now ran 3 times in such a run (a backlog's batches are not caught up).
bench.publish (200k events, 3 rounds) 36.5k events/s against 36.7k (it does not use the runner).

On a quiet machine after the merge (load 1.1-1.7, three runs, p50 / p95 / p99 in ms):
  1k/s   commit -> Kafka 1.5/2.9/7.1; commit -> SQL row 116.7/211.3/224.0
  10k/s  commit -> Kafka 2.2/5.0/9.0 and 2.1/5.1/8.2; commit -> SQL row 132.7/221.0/243.6 and
         128.2/216.6/261.2
Issue #18's targets at 10k/s (commit -> Kafka p99 <= 50 ms, commit -> SQL row p99 <= 1 s) are
met there; on the loaded machine above they are not, since the capture process waits for a core.
(Before the work, on a quiet machine at load 0.7-1.9: 10k/s commit -> Kafka 37.9/64.1/81.3,
commit -> SQL row 170.5/275.3/321.5, most of the first the watcher's own wait.)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import psycopg2

from bench.pg_stream import cluster_bootstrap, drop_slots, execute, stack_settings
from bench.side_by_side import stop_group

TICK = 0.01  # one source transaction every 10 ms
mp = multiprocessing.get_context("spawn")  # no fork of a process holding librdkafka's threads


def percentiles(samples: list[float]) -> str:
    if not samples:
        return "no samples"
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return f"min {ordered[0] * 1000:7.1f} ms  p50 {at(0.50):8.1f} ms  p95 {at(0.95):8.1f} ms  p99 {at(0.99):8.1f} ms  max {ordered[-1] * 1000:8.1f} ms"


def watch_kafka(bootstrap: str, topic: str, ready, stop, results) -> None:
    """In a process of its own: for each id, when its record reached this consumer and the
    record's own timestamp (CreateTime: when the daemon produced it)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"latency-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    metadata = consumer.list_topics(topic, timeout=15)
    ends = [TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), 15)[1])
            for p in metadata.topics[topic].partitions]
    consumer.assign(ends)
    seen: dict[int, tuple[float, float]] = {}
    ready.set()
    while not stop.is_set():
        first = consumer.poll(0.05)  # returns at the first record
        if first is None:
            continue
        now = time.time()
        for message in (first, *consumer.consume(10_000, 0)):  # and whatever else is here, no wait
            if message.error() is None and message.value() is not None:
                id_ = orjson.loads(message.key())["id"]
                if id_ not in seen:
                    seen[id_] = (now, message.timestamp()[1] / 1000)
        results.put(len(seen))
    consumer.close()
    results.put(seen)


def watch_sql(dsn: str, table: str, low: int, ready, stop, results) -> None:
    """In a process of its own: when each id's row became visible in ``table`` (ids from ``low``),
    querying new ids every 5 ms; and the longest query (the resolution of this watcher)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    seen: dict[int, float] = {}
    slowest = 0.0
    floor = low  # every id below it was seen
    ready.set()
    with conn.cursor() as cur:
        while not stop.is_set():
            asked = time.time()
            cur.execute(f"SELECT id FROM {table} WHERE id >= %s", (floor,))
            now = time.time()
            slowest = max(slowest, now - asked)
            rows = cur.fetchall()
            for (id_,) in rows:
                seen.setdefault(id_, now)
            while floor in seen:
                floor += 1
            if rows:
                results.put(len(seen))
            time.sleep(0.005)
    conn.close()
    results.put((seen, slowest))


def write_steadily(dsn: str, rate: int, seconds: float, first_id: int, results) -> None:
    """In a process of its own: commit ``rate`` inserts a second for ``seconds``; puts the time
    each id's COMMIT returned, and how far behind its schedule it fell."""
    per_tick = max(1, round(rate * TICK))
    committed: dict[int, float] = {}
    conn = psycopg2.connect(dsn)
    next_id, began = first_id, time.monotonic()
    ticks = int(seconds / TICK)
    with conn.cursor() as cur:
        for tick in range(ticks):
            due = began + tick * TICK
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            cur.execute("INSERT INTO lat (id, note) SELECT g, 'change ' || g FROM generate_series(%s, %s) g",
                        (next_id, next_id + per_tick - 1))
            conn.commit()
            now = time.time()
            for id_ in range(next_id, next_id + per_tick):
                committed[id_] = now
            next_id += per_tick
    conn.close()
    results.put((committed, time.monotonic() - began - seconds))


class Watcher:
    """A watcher process: ``seen`` counts what it saw so far; ``result()`` stops it and returns
    what it collected."""

    def __init__(self, target, *args) -> None:
        self.ready, self.stop, self.results = mp.Event(), mp.Event(), mp.Queue()
        self.process = mp.Process(target=target, args=(*args, self.ready, self.stop, self.results), daemon=True)
        self.process.start()
        self.count = 0

    def wait_ready(self) -> None:
        if not self.ready.wait(60):
            raise SystemExit("a watcher did not start within 60 s")

    def seen(self) -> int:
        while not self.results.empty():
            item = self.results.get()
            if isinstance(item, int):
                self.count = item
        return self.count

    def result(self):
        self.stop.set()
        while True:
            item = self.results.get(timeout=120)
            if not isinstance(item, int):
                self.process.join(30)
                return item


def config_file(folder: Path, source: str, target: str, kafka: str, prefix: str, sink_wait_ms: int) -> Path:
    url = target.replace("postgresql://", "postgresql+psycopg2://", 1)
    path = folder / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 3}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{source}', tables: ['public.lat'], "
        f"state_dir: '{folder / 'state'}'}}\n"
        f"sinks:\n  - {{name: wh, type: sql, url: '{url}', topics: ['{prefix}.public.lat'], "
        f"batch_wait_ms: {sink_wait_ms}}}\n"
        f"http: null\n")
    return path


def wait_for(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=int, nargs="+", default=[1000, 10000], help="changes per second")
    parser.add_argument("--seconds", type=float, default=20, help="how long each rate is written")
    parser.add_argument("--sink-wait-ms", type=int, default=200, help="the SQL sink's batch_wait_ms")
    parser.add_argument("--cluster", action="store_true",
                        help="the same again into the three-node Kafka (cdc dev up --profile cluster: replication "
                             "factor 3, min.insync.replicas 2), after the single broker")
    args = parser.parse_args()

    settings = stack_settings()
    brokers = [("the single broker", settings["KAFKA_BOOTSTRAP"])]
    if args.cluster:
        brokers.append(("three nodes, replication factor 3", cluster_bootstrap()))
    for label, kafka in brokers:
        print(f"Kafka: {label} ({kafka})")
        measure(settings["PG_DSN"], kafka, args)


def measure(admin: str, kafka: str, args: argparse.Namespace) -> None:
    run_id = uuid.uuid4().hex[:8]
    source_db, target_db, prefix = f"lat_src_{run_id}", f"lat_dst_{run_id}", f"lat_{run_id}"
    execute(admin, f'CREATE DATABASE "{source_db}"', f'CREATE DATABASE "{target_db}"')
    source, target = (admin.rsplit("/", 1)[0] + "/" + name for name in (source_db, target_db))
    execute(source, "CREATE TABLE lat (id bigint PRIMARY KEY, note text)")
    daemon = None
    from cdc.log.kafka import KafkaLog

    log = KafkaLog(kafka)
    try:
        with tempfile.TemporaryDirectory(prefix="cdc-latency-") as folder:
            config = config_file(Path(folder), source, target, kafka, prefix, args.sink_wait_ms)
            daemon = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=folder,
                                      stdout=subprocess.DEVNULL, stderr=open(Path(folder) / "daemon.log", "wb"),
                                      start_new_session=True)
            # Evidence that the pipeline runs end to end before any clock: a row reaches the target.
            execute(source, "INSERT INTO lat VALUES (0, 'warm-up')")
            topic = f"{prefix}.public.lat"

            def landed() -> bool:
                if daemon.poll() is not None:
                    raise SystemExit(f"cdc run exited ({daemon.returncode}): {(Path(folder) / 'daemon.log').read_text()[-2000:]}")
                try:
                    return bool(execute(target, "SELECT 1 FROM lat WHERE id = 0"))
                except psycopg2.Error:
                    return False
            wait_for("the warm-up row in the target", landed, 120)
            print(f"{'rate':>8}  {'changes':>8}  path   (load {os.getloadavg()[0]:.1f})")
            first_id = 1
            for rate in args.rates:
                kafka_watch = Watcher(watch_kafka, kafka, topic)
                sql_watch = Watcher(watch_sql, target, "lat", first_id)
                kafka_watch.wait_ready()
                sql_watch.wait_ready()
                load = os.getloadavg()[0]
                writes = mp.Queue()
                writer = mp.Process(target=write_steadily, args=(source, rate, args.seconds, first_id, writes))
                writer.start()
                committed, behind = writes.get()
                writer.join()
                if behind > 1:
                    print(f"  (the writer fell {behind:.1f} s behind its schedule: the machine is busy)")
                wait_for(f"every row of the {rate}/s run in the target", lambda: sql_watch.seen() >= len(committed), 180)
                wait_for("every Kafka record", lambda: kafka_watch.seen() >= len(committed), 60)
                kafka_seen = kafka_watch.result()
                sql_seen, slowest = sql_watch.result()
                to_kafka = [kafka_seen[i][0] - t for i, t in committed.items() if i in kafka_seen]
                to_produced = [kafka_seen[i][1] - t for i, t in committed.items() if i in kafka_seen]
                produced_to_kafka = [got - made for got, made in kafka_seen.values()]
                to_sql = [sql_seen[i] - t for i, t in committed.items() if i in sql_seen]
                print(f"{rate:>8,}  {len(committed):>8,}  commit -> Kafka record  {percentiles(to_kafka)}")
                print(f"{'':>8}  {'':>8}    commit -> produced    {percentiles(to_produced)}  (ms clock)")
                print(f"{'':>8}  {'':>8}    produced -> consumer  {percentiles(produced_to_kafka)}  (ms clock)")
                print(f"{'':>8}  {'':>8}  commit -> SQL row       {percentiles(to_sql)}   "
                      f"(load {load:.1f} -> {os.getloadavg()[0]:.1f}; slowest watcher query {slowest * 1000:.0f} ms)",
                      flush=True)
                first_id = max(committed) + 1
    finally:
        if daemon is not None:
            stop_group(daemon)
        for topic in log.topics():
            if topic.startswith(prefix + "."):
                log.delete_topic(topic)
        log.close()
        drop_slots(admin, source_db)
        execute(admin, f'DROP DATABASE IF EXISTS "{source_db}" WITH (FORCE)',
                f'DROP DATABASE IF EXISTS "{target_db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
