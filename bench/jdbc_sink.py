"""The apply side beside Debezium's: one ``debezium-json`` topic applied into PostgreSQL by the
Debezium JDBC sink connector and by our SQL sink, each into a fresh database, in the same run.

    .venv/bin/cdc dev up --only postgres,kafka
    .venv/bin/python -m bench.jdbc_sink [--changes 200000] [--keys 50000] [--partitions 3]
                                        [--skip-default] [--skip-tuned]

Steps, in one run on this machine:
  1. the workload, published once: ``--changes`` changes of an ``orders`` table (bigint key, int,
     text, numeric(10,2), a mostly-NULL text, timestamptz, and ``seq``, the number of the change
     that wrote the row) over ``--keys`` random keys: creates, updates and 10% deletes (each
     followed by a tombstone), in the ``debezium-json`` format (Connect JSON with schemas, as our
     encoder writes it, cdc/formats/) into one topic of ``--partitions`` partitions, its shape on
     ``<prefix>.schema-changes`` as ``cdc run`` publishes it.
  2. each applier in turn, into a database of its own, timed from the start of its process until
     the target holds every live key at its newest change and no deleted key (``count(*)`` and
     ``sum(seq)`` equal to the workload's; then every row is compared once, untimed):
       * ours: ``cdc run --only wh`` with one SQL sink (``type: sql``, its defaults: batch_size
         2000, batch_wait_ms 200, typed staging and version-guarded upserts), reading the topic
         from its start as a new consumer group;
       * Debezium default: ``io.debezium:debezium-connector-jdbc`` in Kafka Connect standalone
         (``cdc.dev.connect``, the same jars as tests/integration/test_debezium_jdbc_sink.py),
         ``insert.mode=upsert``, ``primary.key.mode=record_key``, ``delete.enabled=true``,
         ``schema.evolution=basic`` (it makes the table), one task, everything else its default
         (batch.size=500, Connect's consumer max.poll.records=500);
       * Debezium tuned, as its docs allow: ``batch.size=10000`` with the worker's
         ``consumer.max.poll.records=10000`` (the docs: a batch never exceeds what one poll
         returns), ``use.reduction.buffer=true`` (one write per key per batch, as ours reduces),
         and the PostgreSQL driver's ``reWriteBatchedInserts=true``.
     Process start counts on both sides (Python's imports; the JVM and Connect's plugin scan).
Then the topics and databases are dropped. Prints each rate (changes/s), ours / Debezium, and the
machine's load.

Measured on the shared 2-core machine, 200k changes over 50k keys (14,183 deletes), 3 partitions,
load 21-40 (other work on the machine): ours 2,561 changes/s (78 s), Debezium default 425/s
(471 s), Debezium tuned 532/s (376 s): ours 6.0x default and 4.8x tuned. With
``collection.name.format=${source.table}`` (as tests/integration/test_debezium_jdbc_sink.py sets
it) Debezium cannot name a table for a tombstone and logs a warning for each one it skips (its
deletes come from the delete records, ``delete.enabled``); ours reads the tombstones and skips
them silently. On a machine this loaded the figures are mostly waiting for a core: compare the
ratio, and run it again on a quiet machine before quoting the rates.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import tempfile
import uuid
from decimal import Decimal
from pathlib import Path

import psycopg2
from psycopg2.extensions import parse_dsn

from bench.pg_stream import delete_topics, execute, stack_settings
from bench.side_by_side import add_contender_arguments, contenders, load, time_cdc, time_connect, wait_until_done

COLUMNS = ("id", "customer_id", "status", "total", "note", "updated_at", "seq")
DEBEZIUM_TUNED = {"batch.size": "10000", "use.reduction.buffer": "true"}
WORKER_TUNED = {"consumer.max.poll.records": "10000"}


def orders_shape(version: int):
    from cdc.events import Column, SchemaChange, TableId

    return SchemaChange(TableId("shop", "public", "orders"), (
        Column("id", "bigint", True, False), Column("customer_id", "integer"), Column("status", "text"),
        Column("total", "numeric(10,2)"), Column("note", "text"),
        Column("updated_at", "timestamp with time zone"), Column("seq", "bigint")), version, 0)


class Workload:
    """The changes, and the final table they leave (key -> row, deleted keys absent)."""

    def __init__(self, changes: int, keys: int, seed: int = 18) -> None:
        from cdc.events import ChangeEvent, Op, TransactionInfo

        rng = random.Random(seed)
        table = orders_shape(1).table
        self.final: dict[int, dict] = {}
        self.events = []
        self.deletes = 0
        for seq in range(1, changes + 1):
            key = rng.randrange(keys)
            common = dict(table=table, key={"id": key}, version=1_000_000 + seq, ts_ms=1_763_720_000_000 + seq,
                          source_fields={"txId": 5_000 + seq // 10, "lsn": 1_000_000 + seq},
                          transaction=TransactionInfo(str(5_000 + seq // 10), seq % 10 + 1, seq % 10 + 1))
            if key in self.final and rng.random() < 0.1:
                self.events.append(ChangeEvent(op=Op.DELETE, before={"id": key}, after=None, **common))
                del self.final[key]
                self.deletes += 1
                continue
            row = {"id": key, "customer_id": rng.randrange(50_000), "status": rng.choice(["new", "paid", "shipped"]),
                   "total": f"{rng.randrange(10_000_000) / 100:.2f}",
                   "note": "deliver to the back door" if seq % 7 == 0 else None,
                   "updated_at": f"2026-11-21T10:{seq // 60 % 60:02d}:{seq % 60:02d}.{seq % 1_000_000:06d}Z", "seq": seq}
            self.events.append(ChangeEvent(op=Op.UPDATE if key in self.final else Op.CREATE, before=None, after=row,
                                           **common))
            self.final[key] = row

    def expected(self) -> tuple[int, int]:
        """count(*) and sum(seq) of the final table."""
        return len(self.final), sum(row["seq"] for row in self.final.values())


def publish(kafka, prefix: str, workload: Workload, partitions: int) -> str:
    """The workload in debezium-json into ``<prefix>.public.orders``, its shape first."""
    from cdc.formats import make_encoder
    from cdc.log.base import TopicSettings
    from cdc.positions import Counter
    from cdc.serde import encode_schema_change, schema_changes_topic

    shape = orders_shape(1)
    topic = shape.table.topic(prefix)
    kafka.ensure_topic(topic, TopicSettings(partitions=partitions))
    kafka.ensure_topic(schema_changes_topic(prefix), TopicSettings(partitions=1))
    encoder = make_encoder("debezium-json", "postgresql", "bench", prefix)
    encoder.learn([shape])
    encoder.schema_versions[shape.table] = shape.version
    writer = kafka.writer()
    writer.publish([encode_schema_change(shape, "bench", prefix)])
    for start in range(0, len(workload.events), 5000):
        writer.publish_events(encoder, workload.events[start:start + 5000], Counter(start + 1))
        writer.poll()
    writer.flush(120)
    writer.close()
    return topic


def target_state(dsn: str) -> tuple[int, int] | None:
    try:
        rows = execute(dsn, "SELECT count(*), coalesce(sum(seq), 0) FROM orders")
    except psycopg2.Error:  # no table yet
        return None
    return int(rows[0][0]), int(rows[0][1])


def wait_for_target(dsn: str, expected: tuple[int, int], timeout: float):
    """``wait(began, alive, describe)`` for bench.side_by_side: the seconds from ``began`` until
    the target's count and sum(seq) are the workload's."""
    def probe() -> tuple[bool, str]:
        state = target_state(dsn)
        return state == expected, f"the target at {state} of {expected}"

    return lambda began, alive, describe: wait_until_done(probe, began, alive, describe, timeout, "applier", 0.2)


def check_rows(dsn: str, workload: Workload) -> None:
    """Every row equals the workload's final row (the timed condition compared only sums)."""
    rows = execute(dsn, "SELECT id, customer_id, status, total, note, updated_at, seq FROM orders")
    got = {r[0]: r for r in rows}
    assert len(got) == len(workload.final), f"{len(got)} rows, expected {len(workload.final)}"
    for key, row in workload.final.items():
        have = got[key]
        assert (have[1], have[2], have[3], have[4], have[6]) == (
            row["customer_id"], row["status"], Decimal(row["total"]), row["note"], row["seq"]), (have, row)
        assert have[5].isoformat().replace("+00:00", "Z") == row["updated_at"], (have[5], row["updated_at"])


def run_ours(directory: Path, bootstrap: str, prefix: str, topic: str, dsn_url: str, expected, timeout: float) -> float:
    url = dsn_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    return time_cdc(directory,
                    f"log:\n  kafka: {{bootstrap_servers: '{bootstrap}', topic_prefix: {prefix}}}\n"
                    f"sinks:\n  - {{name: wh, type: sql, url: '{url}', topics: ['{topic}']}}\n"
                    f"http: null\n",
                    ["--only", "wh"], wait_for_target(dsn_url, expected, timeout))


def run_debezium(directory: Path, bootstrap: str, topic: str, dsn_url: str, expected, timeout: float,
                 tuned: bool) -> float:
    dsn = parse_dsn(dsn_url)
    url = f"jdbc:postgresql://{dsn.get('host', '127.0.0.1')}:{dsn.get('port', '5432')}/{dsn['dbname']}"
    connector = {
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "tasks.max": "1", "topics": topic,
        "connection.url": url + ("?reWriteBatchedInserts=true" if tuned else ""),
        "connection.username": dsn.get("user", "postgres"), "connection.password": dsn.get("password", ""),
        "insert.mode": "upsert", "primary.key.mode": "record_key", "delete.enabled": "true",
        "schema.evolution": "basic", "use.time.zone": "UTC", "collection.name.format": "${source.table}",
    }
    if tuned:
        connector.update(DEBEZIUM_TUNED)
    # A name of its own per run: Connect's consumer group (connect-<name>) starts at the topic's start.
    return time_connect(directory, bootstrap, {f"jdbc-{uuid.uuid4().hex[:8]}": connector},
                        WORKER_TUNED if tuned else None, wait_for_target(dsn_url, expected, timeout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000, help="changes in the topic")
    parser.add_argument("--keys", type=int, default=50_000, help="distinct keys they change")
    add_contender_arguments(parser, "applier")
    args = parser.parse_args()

    from cdc.log.base import TopicSettings
    from cdc.log.kafka import KafkaLog

    # SIGTERM (timeout, a supervisor) unwinds through the finally blocks: no JVM or database left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings = stack_settings()
    admin, bootstrap = settings["PG_DSN"], settings["KAFKA_BOOTSTRAP"]
    run_id = uuid.uuid4().hex[:8]
    prefix = f"bench_jdbc_{run_id}"
    appliers = contenders(args)
    databases = {label: f"bench_jdbc_{run_id}_{i}" for i, (label, _) in enumerate(appliers)}
    work_dir = Path(tempfile.mkdtemp(prefix="bench-jdbc-"))
    kafka = KafkaLog(bootstrap, TopicSettings(partitions=args.partitions))
    try:
        workload = Workload(args.changes, args.keys)
        topic = publish(kafka, prefix, workload, args.partitions)
        expected = workload.expected()
        print(f"workload: {args.changes:,} changes over {args.keys:,} keys ({workload.deletes:,} deletes, each with "
              f"a tombstone) in debezium-json, {args.partitions} partitions; final table {expected[0]:,} rows")
        rates = {}
        for label, tuned in appliers:
            name = databases[label]
            execute(admin, f'CREATE DATABASE "{name}"')
            dsn = admin.rsplit("/", 1)[0] + "/" + name
            directory = work_dir / label.replace(" ", "-")
            print(f"{label}: running ({load()})", flush=True)
            if tuned is None:
                seconds = run_ours(directory, bootstrap, prefix, topic, dsn, expected, args.timeout)
            else:
                seconds = run_debezium(directory, bootstrap, topic, dsn, expected, args.timeout, tuned)
            check_rows(dsn, workload)
            rates[label] = args.changes / seconds
            print(f"{label:<17} {rates[label]:>10,.0f} changes/s  ({seconds:.1f}s; every row checked)", flush=True)
        for label, rate in rates.items():
            if label != "ours":
                print(f"ours / {label}: {rates['ours'] / rate:.2f}x")
        print(f"load after: {load()}")
    finally:
        delete_topics(kafka, prefix)
        kafka.close()
        for name in databases.values():
            execute(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
