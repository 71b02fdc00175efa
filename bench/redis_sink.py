"""Redis sink throughput: keys/s through the whole sink path beside raw pipelined SETs, same run.

    .venv/bin/cdc dev up --only redis,redis-cluster
    .venv/bin/python -m bench.redis_sink [--keys 200000] [--rounds 3] [--batch 2000] [--format json]
                                         [--target single|cluster|both]

Steps, on each target (the stack's single server, its three-master cluster), in one run:
  1. records: ``--keys`` change events of an ``orders`` table (bench.sql_upsert's rows), each a
     distinct key, as the log holds them: key and envelope JSON bytes. The JSON strings the sink
     stores (the ``after`` rows) are prepared too, before any clock runs.
  2. raw: redis-py pipelines of ``--pipeline`` plain ``SET key value`` of those prepared strings,
     no guard, no decoding: the ceiling of this client against this server.
  3. ours: each record decoded (``decode_record``, as the sink runtime does) and ``RedisSink.write``
     in batches of ``--batch``: the newest change per key, the version guard per key (row key +
     version companion; on a single server 64 rows per EVALSHA), pipelines of ``--pipeline`` rows,
     counters. Then ``write`` alone, on records decoded beforehand (the sink's own share).
Raw and ours alternate for ``--rounds`` rounds on fresh key prefixes; the medians are printed with
their ratio, and the keys are checked (every key holds its row). Target: ours >= 50% of raw.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import uuid

import orjson
import redis
from redis.cluster import RedisCluster

from bench.sql_upsert import make_events
from cdc.log.base import LogRecord
from cdc.sink_events import decode_record
from sinks.redis.config import RedisSinkConfig
from sinks.redis.sink import RedisSink

TARGET = 0.5


def records(count: int) -> tuple[list[LogRecord], list[bytes]]:
    events = make_events(count, updates=0.0)
    out, values = [], []
    for event in events:
        envelope = {"before": None, "after": event.after, "op": event.op.value, "ts_ms": 0,
                    "source": event.source, "transaction": None}
        out.append(LogRecord(event.topic, 0, event.offset, orjson.dumps(event.key), orjson.dumps(envelope), 0))
        values.append(orjson.dumps(event.after))
    return out, values


def env_url(name: str) -> str:
    url = os.environ.get(name)
    if not url:
        from cdc.dev.stack import read_env

        url = read_env().get(name)
    if not url:
        raise SystemExit(f"{name} is not set: start the stack (cdc dev up --only redis,redis-cluster)")
    return url


def clear(client, prefix: str) -> None:
    pipe = client.pipeline(transaction=False)
    for n, key in enumerate(client.scan_iter(match=f"{prefix}*", count=5000)):
        pipe.unlink(key)
        if n % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def run_raw(client, values: list[bytes], pipeline: int, prefix: str) -> float:
    keys = [f"{prefix}:public.orders:{i + 1}" for i in range(len(values))]
    began = time.perf_counter()
    for start in range(0, len(values), pipeline):
        pipe = client.pipeline(transaction=False)
        for key, value in zip(keys[start:start + pipeline], values[start:start + pipeline]):
            pipe.set(key, value)
        pipe.execute()
    return len(values) / (time.perf_counter() - began)


def run_ours(url: str, cluster: bool, recs: list[LogRecord], batch: int, pipeline: int, fmt: str,
             prefix: str, decoded: list | None = None) -> float:
    config = RedisSinkConfig(name="bench", url=url, cluster=cluster, topics=["bench.*"], key_prefix=prefix,
                             format=fmt, pipeline_size=pipeline)
    sink = RedisSink(config)
    sink.start()
    try:
        began = time.perf_counter()
        for start in range(0, len(recs), batch):
            sink.write(decoded[start:start + batch] if decoded is not None
                       else [decode_record(r) for r in recs[start:start + batch]])
        return len(recs) / (time.perf_counter() - began)
    finally:
        sink.stop()


def check(client, prefix: str, values: list[bytes], fmt: str) -> None:
    for i in (0, len(values) // 2, len(values) - 1):
        key = f"{prefix}:public.orders:{i + 1}"
        stored = client.get(key) if fmt == "json" else orjson.dumps(
            {k.decode(): v.decode() for k, v in client.hgetall(key).items()})
        expected = values[i] if fmt == "json" else orjson.dumps(
            {k: (v if isinstance(v, str) else str(v)) for k, v in orjson.loads(values[i]).items() if v is not None})
        assert stored == expected, (key, stored, expected)


def bench(target: str, args) -> None:
    cluster = target == "cluster"
    url = env_url("REDIS_CLUSTER_URL" if cluster else "REDIS_URL")
    client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    recs, values = records(args.keys)
    raw_rates, our_rates, write_rates = [], [], []
    decoded = [decode_record(r) for r in recs]
    # The prepared records stand for the log, which a real sink does not hold in memory: keep the
    # collector off them, or every full collection walks them (both paths alike).
    gc.collect()
    gc.freeze()
    for round_ in range(args.rounds):
        prefix = f"b{uuid.uuid4().hex[:6]}"
        raw_rates.append(run_raw(client, values, args.pipeline, prefix))
        clear(client, prefix)
        prefix = f"b{uuid.uuid4().hex[:6]}"
        our_rates.append(run_ours(url, cluster, recs, args.batch, args.pipeline, args.format, prefix))
        check(client, prefix, values, args.format)
        clear(client, prefix)
        prefix = f"b{uuid.uuid4().hex[:6]}"
        write_rates.append(run_ours(url, cluster, recs, args.batch, args.pipeline, args.format, prefix, decoded))
        clear(client, prefix)
        print(f"  {target} round {round_ + 1}: raw SET {raw_rates[-1]:,.0f} keys/s, "
              f"sink ({args.format}, guarded) {our_rates[-1]:,.0f} keys/s "
              f"(write() alone, records decoded beforehand: {write_rates[-1]:,.0f} keys/s)")
    raw, ours, alone = (statistics.median(r) for r in (raw_rates, our_rates, write_rates))
    gc.unfreeze()
    print(f"{target}: raw pipelined SET {raw:,.0f} keys/s; sink {ours:,.0f} keys/s = {ours / raw:.0%} of raw "
          f"(target {TARGET:.0%}: {'met' if ours / raw >= TARGET else 'NOT met'}); write() alone "
          f"{alone:,.0f} keys/s = {alone / raw:.0%}")
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--pipeline", type=int, default=1000)
    parser.add_argument("--format", choices=["json", "hash"], default="json")
    parser.add_argument("--target", choices=["single", "cluster", "both"], default="both")
    args = parser.parse_args()
    print(f"load: {open('/proc/loadavg').read().strip()}")
    for target in (["single", "cluster"] if args.target == "both" else [args.target]):
        bench(target, args)
    print(f"load: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
