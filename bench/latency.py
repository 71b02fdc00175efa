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

Prints p50/p95/p99/max of both per rate (one machine, one clock). The issue's targets at 10k/s:
commit -> Kafka p99 <= 50 ms, commit -> SQL row p99 <= 1 s. The sink's ``batch_wait_ms`` (how
long it gathers a batch, ``--sink-wait-ms``; 200 ms by default as for users) is part of the SQL
figure. The default run takes about a minute and a half; ``--seconds`` makes it longer.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import orjson
import psycopg2

from bench.pg_stream import drop_slots, execute, stack_settings

TICK = 0.01  # one source transaction every 10 ms


def percentiles(samples: list[float]) -> str:
    if not samples:
        return "no samples"
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return f"min {ordered[0] * 1000:7.1f} ms  p50 {at(0.50):8.1f} ms  p95 {at(0.95):8.1f} ms  p99 {at(0.99):8.1f} ms  max {ordered[-1] * 1000:8.1f} ms"


class KafkaWatcher(threading.Thread):
    """Notes when each id's record reaches a consumer of ``topic``."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer, TopicPartition

        self.seen: dict[int, float] = {}
        self.stop = threading.Event()
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"latency-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 5})
        metadata = self.consumer.list_topics(topic, timeout=15)
        partitions = list(metadata.topics[topic].partitions)
        ends = [TopicPartition(topic, p, self.consumer.get_watermark_offsets(TopicPartition(topic, p), 15)[1])
                for p in partitions]
        self.consumer.assign(ends)

    def run(self) -> None:
        while not self.stop.is_set():
            for message in self.consumer.consume(1000, 0.05):
                if message.error() is None and message.value() is not None:
                    now = time.time()
                    self.seen.setdefault(orjson.loads(message.key())["id"], now)
        self.consumer.close()


class SqlWatcher(threading.Thread):
    """Notes when each id's row becomes visible in the target table (ids at or above ``low``)."""

    def __init__(self, dsn: str, table: str, low: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table, self.low = dsn, table, low
        self.seen: dict[int, float] = {}
        self.stop = threading.Event()
        self.slowest = 0.0  # the longest query: the resolution of this watcher

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        floor = self.low  # every id below it was seen
        with conn.cursor() as cur:
            while not self.stop.is_set():
                asked = time.time()
                cur.execute(f"SELECT id FROM {self.table} WHERE id >= %s", (floor,))
                now = time.time()
                self.slowest = max(self.slowest, now - asked)
                for (id_,) in cur.fetchall():
                    self.seen.setdefault(id_, now)
                while floor in self.seen:
                    floor += 1
                time.sleep(0.005)
        conn.close()


def write_steadily(dsn: str, rate: int, seconds: float, first_id: int) -> dict[int, float]:
    """Commit ``rate`` inserts a second for ``seconds``; the time each id's COMMIT returned."""
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
    behind = time.monotonic() - began - seconds
    if behind > 1:
        print(f"  (the writer fell {behind:.1f} s behind its schedule: the machine is busy)")
    return committed


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
    args = parser.parse_args()

    settings = stack_settings()
    admin, kafka = settings["PG_DSN"], settings["KAFKA_BOOTSTRAP"]
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
            print(f"{'rate':>8}  {'changes':>8}  path")
            first_id = 1
            for rate in args.rates:
                kafka_watch = KafkaWatcher(kafka, topic)
                sql_watch = SqlWatcher(target, "lat", first_id)
                kafka_watch.start()
                sql_watch.start()
                load = os.getloadavg()[0]
                committed = write_steadily(source, rate, args.seconds, first_id)
                last = max(committed)
                wait_for(f"the last row of the {rate}/s run", lambda: last in sql_watch.seen
                         and len(sql_watch.seen) >= len(committed), 120)
                wait_for("the last Kafka record", lambda: len(kafka_watch.seen) >= len(committed), 60)
                kafka_watch.stop.set()
                sql_watch.stop.set()
                kafka_watch.join()
                sql_watch.join()
                to_kafka = [kafka_watch.seen[i] - t for i, t in committed.items() if i in kafka_watch.seen]
                to_sql = [sql_watch.seen[i] - t for i, t in committed.items() if i in sql_watch.seen]
                print(f"{rate:>8,}  {len(committed):>8,}  commit -> Kafka record  {percentiles(to_kafka)}")
                print(f"{'':>8}  {'':>8}  commit -> SQL row       {percentiles(to_sql)}   "
                      f"(load {load:.1f} -> {os.getloadavg()[0]:.1f}; slowest watcher query {sql_watch.slowest * 1000:.0f} ms)",
                      flush=True)
                first_id = last + 1
    finally:
        if daemon is not None and daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        for topic in log.topics():
            if topic.startswith(prefix + "."):
                log.delete_topic(topic)
        log.close()
        drop_slots(admin, source_db)
        execute(admin, f'DROP DATABASE IF EXISTS "{source_db}" WITH (FORCE)',
                f'DROP DATABASE IF EXISTS "{target_db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
