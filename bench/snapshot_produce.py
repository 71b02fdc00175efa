"""What producing one snapshot row costs, piece by piece, without the source (beside bench.pg_snapshot).

    .venv/bin/cdc dev up --only kafka
    .venv/bin/python -m bench.snapshot_produce [--records 300000] [--rounds 2] [--variant NAME ...]

Records shaped as bench.pg_snapshot's (an ``orders`` row's envelope, ~450 bytes, key ``{"id":N}``),
made beforehand, are produced through one confluent-kafka ``Producer`` with the log's settings
(``cdc.log.kafka.PRODUCER_DEFAULTS``: idempotent, acks=all, lz4, failure-only delivery reports) to
a fresh 3-partition compacted topic, then flushed. Printed per record, in CPU microseconds (which
the load of a shared machine does not inflate the way it does wall-clock rates):

* ``produce``: the calling thread inside ``Producer.produce`` (argument parsing, a per-message
  state, librdkafka's copy of key and value, the partitioner, the queue);
* ``deliveries``: the calling thread inside ``poll``/``flush``: every acknowledged message comes
  back through confluent-kafka's delivery trampoline, which takes the GIL and frees the message
  state even when only failures are reported to Python (``delivery.report.only.error``);
* ``librdkafka``: the client's own threads (batching, lz4, the requests and their acks);
* ``broker``: the local Kafka broker's process (validating, decompressing for the compacted topic,
  appending), from /proc.

Variants: ``now`` (the log's settings), ``no-reports`` (no ``on_delivery`` at all), compression
``none``/``snappy``/``zstd``, and longer lingering/bigger batches, all through confluent-kafka; and
``block``/``block-every``: the same records as RowBlock lines (10,000 a block) through our block
producer (cdc/log/block_producer.py over cdc/_rdproduce.c, with the same settings), librdkafka
reporting failures only (``block``) or every record, counted in C (``block-every``, what the
writer runs). For those, ``produce`` is the calling thread inside ``produce_rows`` (making each
record from its line, librdkafka's copy, partitioner and queue, and the reports served on the
way) and ``deliveries`` the final flush. See bench.pg_snapshot's docstring for the figures and
what they mean for the snapshot.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.pg_snapshot import listening_pid, process_cpu
from bench.pg_stream import stack_settings
from cdc.log.kafka import PRODUCER_DEFAULTS

STATUSES = (b"new", b"paid", b"shipped", b"delivered", b"cancelled")
VARIANTS: dict[str, tuple[dict, bool]] = {  # name -> (producer settings over the log's, failure reports)
    "now": ({}, True),
    "no-reports": ({}, False),
    "none": ({"compression.type": "none"}, True),
    "snappy": ({"compression.type": "snappy"}, True),
    "zstd": ({"compression.type": "zstd"}, True),
    "linger-100": ({"linger.ms": 100, "batch.num.messages": 100_000, "batch.size": 4_000_000}, True),
    "block": ({}, True),
    "block-every": ({}, False),  # our block producer (cdc/log/block_producer.py), a RowBlock's lines per call
}


VALUE_HEAD = b'{"before":null,"after":'
VALUE_TAIL = (b',"op":"r","ts_ms":1764000000000,"source":{"connector":'
              b'"postgresql","name":"bench_snap","db":"bench_snapshot","schema":"public","table":"orders",'
              b'"snapshot":"true","ts_ms":1764000000000,"version":123456789,"txId":null,"lsn":123456789},'
              b'"transaction":null}')


def row(i: int) -> bytes:
    return (b'{"id":%d,"customer_id":%d,"status":"%s","total":"%d.%02d","created_at":"2026-01-01T00:%02d:%02d.%06dZ",'
             b'"updated_at":"2026-01-01T00:%02d:%02d.%06dZ","note":null}'
             % (i, (i * 7919) % 50000 + 1, STATUSES[i % 5], (i * 104729) % 100000 // 100, i % 100,
                i % 60, i % 59, i % 1000, i % 60, i % 53, i % 997))


def record(i: int) -> tuple[bytes, bytes]:
    return VALUE_HEAD + row(i) + VALUE_TAIL, b'{"id":%d}' % i


def blocks(count: int, rows_per_block: int = 10_000) -> list[bytes]:
    """The same records as RowBlock lines (``<key>\t<row JSON>\n``), for the block producer."""
    return [b"".join(b"%d\t%s\n" % (i, row(i)) for i in range(first, min(count, first + rows_per_block - 1) + 1))
            for first in range(1, count + 1, rows_per_block)]


def run_blocks(topic: str, lines: list[bytes], count: int, config: dict, broker: int | None) -> tuple:
    """(produce, deliveries, ours, broker, wall seconds) of the block producer: ``produce`` is the
    calling thread inside ``produce_rows`` (making the records from the lines, librdkafka's copy and
    partitioner, the delivery reports served on the way), ``deliveries`` inside the final flush."""
    from cdc.log.block_producer import open_block_producer

    producer = open_block_producer(config)
    if producer is None:
        raise RuntimeError("the block producer is not built (cdc/_rdproduce.c)")
    try:
        producer.produce_rows(topic, b"0\t{}\n", b"", b"", b"warm-", b"up")
        producer.flush(30)
        ours, main, brk, wall = sum(os.times()[:2]), time.thread_time(), process_cpu(broker), time.perf_counter()
        for block in lines:
            producer.produce_rows(topic, block, VALUE_HEAD, VALUE_TAIL, b'{"id":', b"}")
        in_produce = time.thread_time() - main
        if producer.flush(120):
            raise RuntimeError("records left unacknowledged after 120s")
        if producer.error() is not None:
            raise producer.error()
        ours, main = sum(os.times()[:2]) - ours, time.thread_time() - main
        return in_produce, main - in_produce, ours, process_cpu(broker) - brk, time.perf_counter() - wall
    finally:
        producer.close(5)


def run(name: str, records: list[tuple[bytes, bytes]], bootstrap: str, admin: AdminClient,
        broker: int | None, lines: list[bytes]) -> str:
    extra, reports = VARIANTS[name]
    topic = f"bench_produce_{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 3, 1, config={"cleanup.policy": "compact"})])[topic].result(15)
    config = {"bootstrap.servers": bootstrap, **PRODUCER_DEFAULTS, **extra}
    if name.startswith("block"):
        from cdc.log import block_producer
        block_producer.ONLY_FAILURES = reports
        load = os.getloadavg()[0]
        count = len(records)
        try:
            in_produce, deliveries, ours, brk, wall = run_blocks(topic, lines, count, config, broker)
        finally:
            admin.delete_topics([topic])
        def us(seconds):
            return f"{seconds / count * 1e6:5.2f}"
        return (f"{name:<11} produce {us(in_produce)}  deliveries {us(deliveries)}  "
                f"librdkafka {us(ours - in_produce - deliveries)}  broker {us(brk) if broker else '  ?  '}  "
                f"= {(ours + brk) / count * 1e6:.2f} us/record;  {count / wall:>9,.0f} records/s, load {load:.1f}")
    if reports:
        config.update({"on_delivery": lambda err, msg: None, "delivery.report.only.error": True})
    producer = Producer(config)
    try:
        producer.produce(topic, b"{}", b"warm-up")  # metadata and the idempotent producer id first
        producer.flush(30)
        count, step = len(records), 10_000
        load = os.getloadavg()[0]
        ours, main, brk, wall = sum(os.times()[:2]), time.thread_time(), process_cpu(broker), time.perf_counter()
        in_produce = 0.0
        produce = producer.produce
        for start in range(0, count, step):
            began = time.thread_time()
            for value, key in records[start:start + step]:
                try:
                    produce(topic, value, key)
                except BufferError:
                    producer.poll(0.05)
                    produce(topic, value, key)
            in_produce += time.thread_time() - began
            producer.poll(0)
        if producer.flush(120):
            raise RuntimeError("records left unacknowledged after 120s")
        ours, main = sum(os.times()[:2]) - ours, time.thread_time() - main
        brk, wall = process_cpu(broker) - brk, time.perf_counter() - wall
    finally:
        producer = None
        admin.delete_topics([topic])
    def us(seconds):
        return f"{seconds / count * 1e6:5.2f}"
    return (f"{name:<11} produce {us(in_produce)}  deliveries {us(main - in_produce)}  librdkafka {us(ours - main)}"
            f"  broker {us(brk) if broker else '  ?  '}  = {(ours + brk) / count * 1e6:.2f} us/record;"
            f"  {count / wall:>9,.0f} records/s, load {load:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="default: all")
    args = parser.parse_args()
    bootstrap = stack_settings()["KAFKA_BOOTSTRAP"]
    records = [record(i) for i in range(1, args.records + 1)]
    lines = blocks(args.records)
    print(f"{len(records):,} records, {sum(len(v) for v, _ in records) / len(records):.0f} bytes of value each; "
          "CPU microseconds per record")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker = listening_pid(int(bootstrap.rsplit(":", 1)[1]))
    for _ in range(args.rounds):
        for name in args.variant or list(VARIANTS):
            print(run(name, records, bootstrap, admin, broker, lines), flush=True)


if __name__ == "__main__":
    main()
