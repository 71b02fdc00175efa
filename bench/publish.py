"""Publish throughput: change events serialized and published (acks=all), beside a raw producer.

    .venv/bin/cdc dev up --only kafka
    .venv/bin/python -m bench.publish [--events 500000] [--partitions 3] [--rounds 5]

Measures, in one run on this machine:
  raw       confluent-kafka Producer (acks=all, idempotent, the same settings) sending the
            same key/value bytes, pre-serialized, no delivery callbacks: the ceiling.
  kafka     our path: EnvelopeEncoder.encode (the json format) + KafkaLog writer.publish with
            delivery tracking and a checkpoint per batch, then flush.
  debezium  the same path in the debezium-json format (Connect JSON with schemas, Debezium's
            encodings; cdc/formats/), and raw-dbz: the raw producer sending those bytes, so the
            cost of encoding and the cost of the bigger records show apart.
  avro      the same path in the avro format (Confluent wire format, schemas in the stack's
            registry, written by cdc/formats/avro_write.py, in C where cdc/_avro.c is built),
            and raw-avro: the raw producer sending those bytes. Left out when no registry is
            known (REGISTRY_URL, or --registry).
  embedded  the json path into the embedded SQLite log (fsync on commit), each round.
Targets (issue 33): kafka >= 70% of raw; debezium-json and avro >= 70% of json; embedded >= 50%
of the kafka path. Each round prints the machine's load: figures from a busy machine are rough,
the ratios within one round less so. Runs are in bench/results/publish.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import tempfile
import time
import uuid

from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId, TransactionInfo
from cdc.formats import make_encoder
from cdc.positions import Counter
from cdc.serde import EnvelopeEncoder

ORDERS = TableId("shop", "public", "orders")
# The shape of realistic_events' rows, as the PostgreSQL source publishes it (debezium-json's schemas).
ORDERS_SHAPE = SchemaChange(ORDERS, (
    Column("id", "bigint", True, False), Column("customer_id", "integer"), Column("status", "text"),
    Column("total", "numeric(10,2)"), Column("currency", "character(3)"), Column("items", "integer"),
    Column("note", "text"), Column("created_at", "timestamp with time zone"),
    Column("updated_at", "timestamp with time zone"), Column("tags", "text[]")), 1, 0)


def encoder_for(fmt: str, prefix: str, registry_url: str | None = None) -> EnvelopeEncoder:
    encoder = make_encoder(fmt, "postgresql", "bench", prefix, registry_url=registry_url)
    if fmt != "json":
        encoder.learn([ORDERS_SHAPE])
        encoder.schema_versions[ORDERS] = ORDERS_SHAPE.version
    return encoder


def realistic_events(n: int, keys: int = 100_000) -> list[ChangeEvent]:
    """Order rows as a PostgreSQL source emits them: 10 columns, ~300 bytes of JSON per value."""
    rng = random.Random(7)
    table = ORDERS
    statuses = ["new", "paid", "shipped", "delivered", "cancelled"]
    events = []
    for i in range(n):
        key = rng.randrange(keys)
        row = {"id": key, "customer_id": rng.randrange(50_000), "status": rng.choice(statuses),
               "total": f"{rng.randrange(100_000) / 100:.2f}", "currency": "EUR",
               "items": rng.randrange(1, 20), "note": "deliver to the back door" if i % 7 == 0 else None,
               "created_at": "2026-11-21T10:15:30.123456Z", "updated_at": "2026-11-21T10:17:02.654321Z",
               "tags": ["priority", "gift"] if i % 5 == 0 else []}
        events.append(ChangeEvent(
            op=Op.UPDATE if i % 3 else Op.CREATE, table=table, key={"id": key}, before=None, after=row,
            version=23_456_789 + i * 120, ts_ms=1_763_720_000_000 + i,
            source_fields={"txId": 5_000 + i // 10, "lsn": 23_456_789 + i * 120},
            transaction=TransactionInfo(str(5_000 + i // 10), i % 10 + 1, i % 10 + 1)))
    return events


def batches(pool: list, total: int, size: int):
    """``total`` items in batches of ``size``, cycling through ``pool``.

    A source hands over fresh batches that are hot in the CPU cache; cycling through a pool of a
    few batches keeps that true here, where half a million events made up front would make every
    access a cache miss (and measure memory, not the pipeline).
    """
    for start in range(0, total, size):
        offset = start % len(pool)
        yield pool[offset:offset + min(size, total - start)]


def run_ours(log, topic_prefix: str, events: list[ChangeEvent], total: int, batch_size: int,
             fmt: str = "json", registry_url: str | None = None) -> tuple[float, int]:
    encoder = encoder_for(fmt, topic_prefix, registry_url)
    encoder.encode(events[:1])  # the avro format registers its schemas here, not in the timed loop
    writer = log.writer()
    began = time.perf_counter()
    for seq, batch in enumerate(batches(events, total, batch_size), 1):
        writer.publish_events(encoder, batch, Counter(seq))  # as the runtime does
        writer.poll()
    safe = writer.flush(120)
    elapsed = time.perf_counter() - began
    writer.close()
    assert safe == Counter(seq), f"the last checkpoint was not acknowledged: {safe}"
    keys = sum(len(r.key) for r in encoder.encode(events[:1000])) * total // 1000
    return elapsed, encoder.value_bytes + keys


def run_raw(bootstrap: str, topic: str, pairs: list[tuple[bytes, bytes]], total: int, batch_size: int,
            config: dict) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **config})
    produce, poll = producer.produce, producer.poll
    began = time.perf_counter()
    for batch in batches(pairs, total, batch_size):
        for key, value in batch:
            while True:
                try:
                    produce(topic, value, key)
                    break
                except BufferError:
                    poll(0.05)
        poll(0)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - began
    assert remaining == 0
    return elapsed


def run_embedded(prefix: str, events: list[ChangeEvent], args: argparse.Namespace,
                 settings) -> tuple[float, int]:
    """The json path into a fresh embedded log (SQLite, fsync on commit) in a temporary directory."""
    from cdc.log.embedded import EmbeddedLog

    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedLog(tmp, settings)
        try:
            embedded.ensure_topic(f"{prefix}.public.orders", settings)
            return run_ours(embedded, prefix, events, args.events, args.batch)
        finally:
            embedded.close()


def line(label: str, n: int, nbytes: int, seconds: float, baseline: float | None = None) -> str:
    rate = n / seconds
    text = f"{label:<10} {rate:>12,.0f} events/s {nbytes / seconds / 1e6:>8.1f} MB/s  ({seconds:.2f}s)"
    if baseline:
        text += f"  = {rate / baseline:.0%} of raw"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="alternating raw/ours runs (medians reported)")
    parser.add_argument("--bootstrap", default=None, help="Kafka (default: KAFKA_BOOTSTRAP of .cdc/dev.env)")
    parser.add_argument("--registry", default=None,
                        help="schema registry for the avro format (default: REGISTRY_URL of .cdc/dev.env)")
    parser.add_argument("--skip-embedded", action="store_true")
    args = parser.parse_args()

    from cdc.dev.stack import read_env
    from cdc.log.base import TopicSettings
    from cdc.log.kafka import PRODUCER_DEFAULTS, KafkaLog

    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP") or read_env().get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise SystemExit("no Kafka: run `.venv/bin/cdc dev up --only kafka` or pass --bootstrap")
    registry = args.registry or os.environ.get("REGISTRY_URL") or read_env().get("REGISTRY_URL")
    events = realistic_events(4 * args.batch)  # a pool of distinct events, cycled (see batches)
    gc.freeze()  # the pool is no garbage: collections need not walk it
    encoder = EnvelopeEncoder("postgresql", "bench", "raw")
    pairs = [(r.key, r.value) for r in encoder.encode(events)]
    raw_bytes = sum(len(k) + len(v) for k, v in pairs) * args.events // len(pairs)
    dbz_pairs = [(r.key, r.value) for r in encoder_for("debezium-json", "raw").encode(events)]
    dbz_bytes = sum(len(k) + len(v) for k, v in dbz_pairs) * args.events // len(dbz_pairs)
    avro_pairs: list[tuple[bytes, bytes]] = []
    if registry:
        avro_pairs = [(r.key, r.value) for r in encoder_for("avro", "raw", registry).encode(events)]
    avro_bytes = sum(len(k) + len(v) for k, v in avro_pairs) * args.events // max(1, len(avro_pairs))
    settings = TopicSettings(partitions=args.partitions)
    print(f"{args.events:,} change events, {raw_bytes / args.events:.0f} bytes each (key+value; "
          f"{dbz_bytes / args.events:.0f} in debezium-json, {avro_bytes / args.events:.0f} in avro), "
          f"batches of {args.batch}, {args.partitions} partitions, acks=all")
    if not registry:
        print("no schema registry (run `cdc dev up --only kafka,registry` or pass --registry): avro left out")

    # Raw and ours alternate, each on fresh topics, for --rounds rounds: the broker shares these
    # cores and its speed drifts (JIT, segment rolls, page cache), so one pair of runs can land
    # anywhere in a +-20% band; the medians of alternating runs compare like with like.
    kafka = KafkaLog(bootstrap, settings)
    raw_rates, our_rates, raw_dbz_rates, dbz_rates, raw_avro_rates, avro_rates = [], [], [], [], [], []
    embedded_rates: list[float] = []
    loads: list[float] = []  # the machine's load after each round: figures from a busy machine are rough
    for round_ in range(1, args.rounds + 1):
        prefix = f"bench_{uuid.uuid4().hex[:8]}"
        dbz_prefix = f"{prefix}_dbz"
        raw_topic, our_topic = f"{prefix}.raw.orders", f"{prefix}.public.orders"
        raw_dbz_topic, dbz_topic = f"{prefix}.rawdbz.orders", f"{dbz_prefix}.public.orders"
        for topic in (raw_topic, our_topic, raw_dbz_topic, dbz_topic):
            kafka.ensure_topic(topic, settings)
        raw_seconds = run_raw(bootstrap, raw_topic, pairs, args.events, args.batch, PRODUCER_DEFAULTS)
        seconds, nbytes = run_ours(kafka, prefix, events, args.events, args.batch)
        raw_dbz_seconds = run_raw(bootstrap, raw_dbz_topic, dbz_pairs, args.events, args.batch, PRODUCER_DEFAULTS)
        dbz_seconds, dbz_nbytes = run_ours(kafka, dbz_prefix, events, args.events, args.batch, "debezium-json")
        raw_rates.append(args.events / raw_seconds)
        our_rates.append(args.events / seconds)
        raw_dbz_rates.append(args.events / raw_dbz_seconds)
        dbz_rates.append(args.events / dbz_seconds)
        print(f"round {round_}: " + line("raw", args.events, raw_bytes, raw_seconds))
        print(f"round {round_}: " + line("kafka", args.events, nbytes, seconds, raw_rates[-1]))
        print(f"round {round_}: " + line("raw-dbz", args.events, dbz_bytes, raw_dbz_seconds, raw_rates[-1]))
        print(f"round {round_}: " + line("debezium", args.events, dbz_nbytes, dbz_seconds, raw_rates[-1]))
        topics = [raw_topic, our_topic, raw_dbz_topic, dbz_topic]
        if registry:
            avro_prefix = f"{prefix}_avro"
            raw_avro_topic, avro_topic = f"{prefix}.rawavro.orders", f"{avro_prefix}.public.orders"
            topics += [raw_avro_topic, avro_topic]
            for topic in (raw_avro_topic, avro_topic):
                kafka.ensure_topic(topic, settings)
            raw_avro_seconds = run_raw(bootstrap, raw_avro_topic, avro_pairs, args.events, args.batch,
                                       PRODUCER_DEFAULTS)
            avro_seconds, avro_nbytes = run_ours(kafka, avro_prefix, events, args.events, args.batch, "avro",
                                                 registry)
            raw_avro_rates.append(args.events / raw_avro_seconds)
            avro_rates.append(args.events / avro_seconds)
            print(f"round {round_}: " + line("raw-avro", args.events, avro_bytes, raw_avro_seconds, raw_rates[-1]))
            print(f"round {round_}: " + line("avro", args.events, avro_nbytes, avro_seconds, raw_rates[-1]))
        for topic in topics:
            kafka.delete_topic(topic)
        if not args.skip_embedded:
            embedded_seconds, embedded_nbytes = run_embedded(prefix, events, args, settings)
            embedded_rates.append(args.events / embedded_seconds)
            print(f"round {round_}: " + line("embedded", args.events, embedded_nbytes, embedded_seconds,
                                             raw_rates[-1]) + f", {embedded_rates[-1] / our_rates[-1]:.0%} of kafka")
        loads.append(os.getloadavg()[0])
        print(f"round {round_}: load {loads[-1]:.1f} (1-minute average; 2 cores here)")
    kafka.close()
    raw_rate, ours = statistics.median(raw_rates), statistics.median(our_rates)
    raw_dbz, dbz = statistics.median(raw_dbz_rates), statistics.median(dbz_rates)
    print(f"load: {min(loads):.1f}-{max(loads):.1f} over the rounds")
    print(f"median: raw {raw_rate:,.0f} events/s, kafka {ours:,.0f} events/s = {ours / raw_rate:.0%} of raw "
          f"(target 70%)")
    print(f"median: debezium-json {dbz:,.0f} events/s = {dbz / raw_rate:.0%} of raw, {dbz / ours:.0%} of json "
          f"(target 70%); raw producer with its bytes {raw_dbz:,.0f} events/s (debezium-json = {dbz / raw_dbz:.0%} "
          f"of that)")
    if avro_rates:
        raw_avro, avro = statistics.median(raw_avro_rates), statistics.median(avro_rates)
        print(f"median: avro {avro:,.0f} events/s = {avro / raw_rate:.0%} of raw, {avro / ours:.0%} of json "
              f"(target 70%); raw producer with its bytes {raw_avro:,.0f} events/s (avro = {avro / raw_avro:.0%} "
              f"of that)")
    if embedded_rates:
        embedded = statistics.median(embedded_rates)
        print(f"median: embedded {embedded:,.0f} events/s = {embedded / raw_rate:.0%} of raw, {embedded / ours:.0%} "
              f"of the kafka path (target 50%)")



if __name__ == "__main__":
    main()
