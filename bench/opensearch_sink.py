"""OpenSearch sink throughput: the whole sink path beside a raw opensearch-py bulk, same node, same run.

    .venv/bin/cdc dev up --only kafka,opensearch
    .venv/bin/python -m bench.opensearch_sink [--events 200000] [--rounds 5] [--warmup 1] [--concurrency 2]
    .venv/bin/python -m bench.opensearch_sink --stages    # each step alone, no servers

Steps:
  1. events: ``--events`` inserts of distinct keys of an ``orders`` table (bigint key, int, text,
     numeric(10,2), two timestamptz, a mostly-NULL note), published once to a Kafka topic of 3
     partitions, with the table's schema record. The raw baseline's documents are the same rows,
     encoded to bulk NDJSON (orjson) before any clock runs.
  2. ``--warmup`` rounds first, not counted: the node's JIT warms up over the first runs (on a
     quiet machine the raw rate climbed 25k -> 52k -> 83k docs/s over three rounds, so a median
     of three cold rounds said more about the warm-up than about the sink path).
  3. ``--rounds`` counted rounds (5 by default, for a median that holds still), per round,
     alternating, each into a fresh index with the same mapping and settings:
     raw   ``client.bulk`` of the prepared NDJSON in requests of ``bulk_max_docs`` documents,
           ``--concurrency`` requests in flight (threads): what this node takes from this client.
     ours  what ``cdc bootstrap`` does: a SinkRunner reads the topic from offset 0 to its end,
           decodes each record, and the OpenSearch sink reduces, maps and bulk-writes them with
           external versions behind an alias (``bulk_concurrency`` = ``--concurrency``).
Prints documents/s of both per round with the CPU time per document of this process (the
client: every thread, the Kafka reader's included) and of the OpenSearch node (from /proc, when
the node runs on this machine), the ratio, and the medians. Target: ours >= 70% of raw. On two
shared cores every CPU second of the client is taken from the node, so the client's CPU per
document decides the ratio; and unlike the rates, CPU per document is not inflated by the load
from other work: compare code by it (paired runs, alternating) when the machine is busy.
``--versioned-raw`` gives the raw bulk the same external versions, to isolate what the node's
version checks cost from what the sink path costs.
``--writes-in-flight N`` sets the sink's ``writes_in_flight`` (1: each write completes before
the next is submitted, as before pipelining; the default 2 keeps the node's queue filled across
write boundaries). The runner has no switches for reading ahead of its writes or for its packed
reads (the bulk reader), so this bench no longer runs the sink path without them (the former
``--no-read-ahead`` and ``--confluent-reads``): the raw bulk beside it is the comparison.
``--via-rebuild`` runs the sink path as ``cdc bootstrap`` does for this sink
(``SinkRunner.rebuild``). Checks that the alias counts every document.

Note: this measures ``SinkRunner.run(from_start=True, until_caught_up=True)``. ``cdc bootstrap``
of this sink (``bootstrap_by_rebuild``) goes through ``SinkRunner.rebuild``, whose loop overlaps
reading and writing the same way.

After each side, outside its clock and inside its window of the node's CPU: its index is
refreshed (the segment of what was indexed since the last periodic refresh), counted and deleted
at once, so neither side's tail (that refresh, the merges it starts) runs in the other's window
(before, the raw index's was done in the sink path's). The sink path's line also gives the Kafka
broker's CPU per document (``broker``: serving the topic, which the raw bulk does not read).
With ``--via-rebuild`` the raw index is filled as the sink fills a generation nobody reads yet:
made with ``refresh_interval: -1``, set back and refreshed at the end inside its clock (the
sink's switch does both before the aliases move), so both sides write into indexes with the same
settings. Where the node's CPU per document went, and paired figures: sinks/opensearch/README.md
("Throughput").

Both clocks include making the index: the raw side's ``indices.create``, the sink's start (its
state, the index behind its alias) and its consumer joining the topic. The documents' rows name
their shape (``source.schema_version``), as a capture's rows do.

``--stages`` times each step of the sink path alone, without I/O or servers (CPU per document,
best of three, the C loops beside their Python references), with the sink process's collector
settings, and the sink path's own steps again in writes of ``--batch`` as the runner hands them out.

Where the client's time goes. Fourth round (session s9; scratch timings with ``tune_gc`` and
writes of 10,000, perf on this bench's sink path; main before it: 3.9-4.0 us a document, load
1-6):

  what the bench prints            3.7-4.7 us a document; of it decoding a packed batch 1.37-1.68,
                                   the reduction 0.13-0.31, split by shape 0.05-0.07, the items
                                   and NDJSON of rows as JSON bytes 0.50-1.07 (~2-2.7 us); the
                                   rest is the Kafka read's thread and the bulk requests' HTTP.
                                   ``--stages``
                                   used to time every row in one batch under the collector's
                                   default thresholds, which walked what the steps before made:
                                   decoding 2.5-2.7 and the reduction 1.25-1.5 us were mostly that
  the Kafka read's thread          perf put about half of the samples of a round in librdkafka's
                                   broker thread, most in the kernel zeroing pages first touched
                                   by the LZ4 decompression and the copies of fetched data (the
                                   bulk reader prefetches the backlog, ~0.2 page faults a record).
                                   A prefetch bounded to 8-16 MB halved the faults and did not move
                                   the CPU per document measurably (4.4-4.9 us both ways), nor did
                                   glibc's trim/mmap thresholds: left as it is
  decode (perf of decode_packed)   validating the envelope ~21%, the source and key dicts (made
                                   and freed) ~25%, tuples the rest. Now no LogRecord per record
                                   the C decoder takes, the key object parsed in C instead of an
                                   orjson.loads call, the dicts presized: 1.65-1.68 -> 1.43-1.44
                                   us (--stages, paired with main's code, load ~4)
  items + NDJSON                   tried and reverted: a raw row's line in one piece (no bytes for its _id and its
                                   document copied into the line after): 0.50-0.51 -> 0.48-0.49
                                   us, within the noise
  left                             the source block and key dicts of every event (this sink reads
                                   one source per topic and write, and the key for the _id): a
                                   capability that leaves them undecoded would take most of that
                                   ~25%; the Item per document (needed only for a request that
                                   reports an error); the read's thread

Third round (main before it: ~7.2 us a document on a quiet
machine, 200,000 documents; see sinks/opensearch/README.md, "Throughput", for the paired runs):

  Kafka read                       1.3 -> 0.2 us (a script reading the bench's topic both ways,
                                   load ~6): the runner fetches through the bulk reader
                                   (cdc/log/kafka_bulk.py) and ``decode_packed`` (cdc/_decode.c)
                                   makes the SinkEvents straight from the packed batch: no
                                   confluent-kafka Message, no LogRecord kept; decoding itself is
                                   unchanged (~2.3 us)
  the garbage collector            ``--batch 50000`` cost 10.8-12.4 us a document against 6.6 with
                                   the collector off (load ~10): it walked the batches in flight
                                   (events, actions, items: tuples) again and again, the more of
                                   them the larger the batch. The runner now sets the collector as
                                   a capture process does (cdc/runtime/gc_tuning.py), at every
                                   batch size
  requests                         each bulk request is sent as soon as its documents are encoded
                                   (the write's NDJSON is no longer made whole first): the node
                                   indexes the first requests of a write while the rest is encoded

What is left (``--stages``): decoding the envelope (~2.3 us: the SinkEvent, its key and source
objects), the reduction (~1.3), the items and their NDJSON (~2.1), split by shape (0.4).

Second round (py-spy --gil on this bench's sink path, and
``--stages`` on 100,000 documents of 383 bytes; load 20-25 from other work, so absolute figures
are inflated, their proportions are not):

  decode (records -> SinkEvents)   7.2 -> 4.1 us: one loop per batch (cdc/_decode.c
                                   decode_batch: the JSON key and envelope parsed by orjson, the
                                   SinkEvent made in C; any other record goes to decode_record);
                                   what is left is orjson.loads of the envelope (~4 us): now the
                                   largest part of the client's work by far (py-spy: ~60% of the
                                   samples holding the GIL)
  Kafka messages -> LogRecords     ~1 us of per-message method calls in Python -> one C loop
                                   (cdc.log.kafka.log_records) up to the first message with an error
  reduce (newest per _id)          2.5 -> 1.2 us: in C for batches of inserts, updates, deletes and
                                   tombstones keyed by one int or text column (sinks/opensearch/
                                   _lines.c), anything else the Python loop
  items + NDJSON                   2.4 + 1.3 us -> 2.4 us (C) / 3.2 us (Python twin): one pass;
                                   the version field spliced into the row's JSON instead of a copy
                                   of the row; orjson.dumps without OPT_NON_STR_KEYS (it doubled
                                   the cost of a dumps) unless a row needs it; requests cut by
                                   slices of the lines
  split by shape                   0.4 us, unchanged

What was left then was orjson.loads (the envelope's four objects and every value made into
Python objects) and the bulk requests' HTTP. Now the rows are not decoded at all: this sink
declares ``raw_rows``, the runtime's one envelope parser (``decode_one``, cdc/_decode_one.c, which
checks each value as strictly as orjson) hands an upsert's ``after`` over as the row's JSON bytes,
and the lines loop (``_lines.c``) makes the document from those bytes (the version field spliced
in before the closing brace; a table layout's include/exclude/rename by picking and renaming the
row's top-level members). ``--stages`` times "decode" both ways (rows as dicts, rows as bytes)
and the items both ways. Measured in paired runs against main before it: see
sinks/opensearch/README.md ("Throughput").

The first round (main before this one): decode 5.8 -> 4.0 us (NamedTuples instead of frozen
dataclasses), reduce 2.3 -> 1.9, items 3.0 -> 2.4, no Kafka metadata request in the shape lookup
(~25 ms per write), the next write handed out before the previous batch's commit.

Runs: see sinks/opensearch/README.md ("Throughput"), each with the load average it was
measured at. On two shared cores the client's CPU comes out of the node's share, and the load
from other work moves the raw rate by 2-5x between rounds of one run: compare ratios of one run.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import orjson

TARGET = 0.70
COLUMNS = [("id", "bigint", True), ("customer_id", "integer", False), ("status", "text", False),
           ("total", "numeric(10,2)", False), ("created_at", "timestamp with time zone", False),
           ("updated_at", "timestamp with time zone", False), ("note", "text", False)]
STATUSES = ["new", "paid", "packed", "shipped", "delivered", "cancelled"]


def make_rows(count: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for key in range(1, count + 1):
        second = key % 86400
        rows.append({"id": key, "customer_id": (key * 7919) % 50000 + 1, "status": rng.choice(STATUSES),
                     "total": f"{rng.randrange(100, 100000) / 100:.2f}",
                     "created_at": f"2024-03-01T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}.{key % 1000:03d}Z",
                     "updated_at": f"2024-03-02T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z",
                     "note": f"gift wrap, leave at door {key}" if key % 7 == 0 else None})
    return rows


def publish(kafka, prefix: str, rows: list[dict]) -> str:
    from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
    from cdc.log.base import TopicSettings
    from cdc.positions import Counter
    from cdc.serde import EnvelopeEncoder, encode_schema_change, schema_changes_topic

    table = TableId("shop", "public", "orders")
    topic = table.topic(prefix)
    kafka.ensure_topic(topic, TopicSettings(partitions=3))
    kafka.ensure_topic(schema_changes_topic(prefix), TopicSettings(partitions=1))
    writer = kafka.writer()
    columns = tuple(Column(n, t, key=k) for n, t, k in COLUMNS)
    writer.publish([encode_schema_change(SchemaChange(table, columns, 1, 0), "bench", prefix)])
    encoder = EnvelopeEncoder("postgresql", "bench", prefix)
    encoder.schema_versions[table] = 1  # rows name their shape (source.schema_version), as a capture's do
    for start in range(0, len(rows), 5000):
        events = [ChangeEvent(Op.CREATE, table, {"id": r["id"]}, None, r, 16 * r["id"], 0)
                  for r in rows[start:start + 5000]]
        writer.publish_events(encoder, events, None)
        writer.poll()
    writer.publish([], Counter(1))
    writer.flush(120)
    writer.close()
    return topic


def ndjson_chunks(index: str, rows: list[dict], per_request: int, versioned: bool) -> list[bytes]:
    chunks = []
    for start in range(0, len(rows), per_request):
        parts = []
        for row in rows[start:start + per_request]:
            head = {"_index": index, "_id": str(row["id"])}
            if versioned:
                head.update(version=16 * row["id"], version_type="external")
            parts.append(orjson.dumps({"index": head}))
            parts.append(orjson.dumps(row))
        chunks.append(b"\n".join(parts) + b"\n")
    return chunks


def run_raw(client, index: str, body: dict, chunks: list[bytes], concurrency: int, fill: bool = False) -> float:
    """``fill``: as the sink fills a generation nobody reads yet (``--via-rebuild``): the index
    made without periodic refreshes, its refresh interval set back and the index refreshed at the
    end, inside the clock (the sink's switch does both before readers see the index)."""
    def send(chunk: bytes) -> None:
        answer = client.bulk(body=chunk, params={"filter_path": "errors"})
        if answer.get("errors"):
            raise SystemExit(f"raw bulk into {index} had errors")

    # The clock runs from the index's creation, as the sink's does (its run makes its index).
    began = time.perf_counter()
    client.indices.create(index=index, body={**body, "settings": {"index": {"refresh_interval": "-1"}}} if fill
                          else body)
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(send, chunks))
    if fill:
        client.indices.put_settings(index=index, body={"index": {"refresh_interval": None}})
        client.indices.refresh(index=index)
    return time.perf_counter() - began


def run_ours(kafka, url: str, prefix: str, name: str, concurrency: int, per_request: int,
             batch: int, via_rebuild: bool = False, writes_in_flight: int | None = None) -> tuple[float, object]:
    from cdc.runtime.sink_runner import SinkRunner
    from sinks.opensearch import OpenSearchSink, OpenSearchSinkConfig

    config = OpenSearchSinkConfig(name=name, hosts=[url], topics=[f"{prefix}.*"], index_name=f"{name}.{{table}}",
                                  batch_size=batch, bulk_max_docs=per_request,
                                  bulk_concurrency=concurrency, drop_old_generation_after_s=0,
                                  **({} if writes_in_flight is None else {"writes_in_flight": writes_in_flight}))
    runner = SinkRunner(OpenSearchSink(config), kafka, prefix, group=name)
    began = time.perf_counter()
    if via_rebuild:  # what `cdc bootstrap` runs for this sink (bootstrap_by_rebuild)
        runner.rebuild(threading.Event())
    else:
        runner.run(threading.Event(), from_start=True, until_caught_up=True)
    return time.perf_counter() - began, runner


def settle(client, index: str, count: int, delete: str | None = None) -> None:
    """Refresh ``index`` (or alias), check it counts ``count`` documents, delete ``delete`` (the
    indexes; default ``index``)."""
    client.indices.refresh(index=index)
    landed = client.count(index=index)["count"]
    if landed != count:
        raise SystemExit(f"{index} counts {landed} documents, not {count}")
    client.indices.delete(index=delete or index, params={"ignore_unavailable": "true"})


def packed(records: list) -> object:
    """``records`` as the bulk reader hands them out (cdc/_rdconsume.c's layout)."""
    from cdc.log.kafka_bulk import PackedBatch

    return PackedBatch.of(records)


def stages(rows: list[dict], batch_size: int, repeat: int = 3) -> None:
    """``--stages``: CPU per document of each step of the sink path on these rows, without I/O
    (best of ``repeat``), the C loops beside their Python references. With the sink process's
    collector settings (``tune_gc``), and the packed reads' decoding, the reduction and the lines
    of rows as JSON bytes (the sink path's own steps) also in writes of ``batch_size`` events, as
    the runner hands them out: one batch of every row makes the collector walk what the steps
    before made, and inflated those steps 1.5-2x."""
    from cdc import native, sink_events
    from cdc.events import ChangeEvent, Op, TableId
    from cdc.log.base import LogRecord
    from cdc.runtime.gc_tuning import tune_gc
    from cdc.schema_order import split_by_schema
    from cdc.serde import EnvelopeEncoder
    from sinks.opensearch import documents, lines

    table = TableId("shop", "public", "orders")
    encoder = EnvelopeEncoder("postgresql", "bench", "p")
    encoder.schema_versions[table] = 1
    made = encoder.encode([ChangeEvent(Op.CREATE, table, {"id": r["id"]}, None, r, 16 * r["id"], 0) for r in rows])
    records = [LogRecord(r.topic, i % 3, i, r.key, r.value, 0) for i, r in enumerate(made)]
    gc.collect()
    tune_gc()

    def timed(name: str, module, fn) -> object:
        for use_c in ((True, False) if module is not None else (None,)):
            best = float("inf")
            with native.choose(use_c is not False):
                for _ in range(repeat):
                    began = time.process_time()
                    out = fn()
                    best = min(best, time.process_time() - began)
            label = name if use_c is None else f"{name} ({'C' if use_c else 'Python'})"
            print(f"  {label:<46} {best / len(rows) * 1e6:6.2f} us/document")
        return out

    print(f"{len(rows):,} documents, {len(records[0].value)} bytes per envelope; load {os.getloadavg()[0]:.2f}")
    events = timed("decode (records -> SinkEvents)", sink_events, lambda: sink_events.decode_batch(records, {})[0])
    raw = timed("decode, rows as JSON bytes (raw_rows)", None,
                lambda: sink_events.decode_batch(records, {}, True)[0])
    timed("  of which orjson.loads of the values", None, lambda: [orjson.loads(r.value) for r in records])
    batch = packed(records)
    timed("decode a packed batch (bulk reader, raw_rows)", None,
          lambda: sink_events.decode_packed(batch, {}, True)[0])
    timed("split by shape", None, lambda: split_by_schema(events))
    reduced = timed("reduce (newest per _id)", documents, lambda: documents.reduce(events))
    actions = list(reduced["p.public.orders"].actions.values())
    timed("items and NDJSON lines", lines, lambda: lines.encode(actions, "p.public.orders__g1", None, None, [], []))
    raw_actions = list(documents.reduce(raw)["p.public.orders"].actions.values())
    timed("items and NDJSON lines, rows as JSON bytes", lines,
          lambda: lines.encode(raw_actions, "p.public.orders__g1", None, None, [], []))
    events = raw = reduced = actions = raw_actions = None  # free them before the writes below
    print(f"  the sink path's steps, in writes of {batch_size:,} (as the runner hands them out):")
    writes = [packed(records[i:i + batch_size]) for i in range(0, len(records), batch_size)]
    decoded = timed("decode a packed batch (raw_rows)", None,
                    lambda: [sink_events.decode_packed(w, {}, True)[0] for w in writes])
    timed("split by shape", None, lambda: [split_by_schema(e) for e in decoded])
    reductions = timed("reduce (C)", None, lambda: [documents.reduce(e) for e in decoded])
    actions = [list(r["p.public.orders"].actions.values()) for r in reductions]
    timed("items and NDJSON lines, rows as JSON bytes (C)", None,
          lambda: [lines.encode(a, "p.public.orders__g1", None, None, [], []) for a in actions])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5, help="rounds counted (the medians)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted (the node's JIT)")
    parser.add_argument("--concurrency", type=int, default=2, help="bulk requests in flight, both sides")
    parser.add_argument("--per-request", type=int, default=2000, help="documents per bulk request, both sides")
    parser.add_argument("--batch", type=int, default=10_000, help="events per sink write (the runner's batch_size)")
    parser.add_argument("--versioned-raw", action="store_true",
                        help="the raw bulk carries the same external versions (isolates the node's cost of them)")
    parser.add_argument("--writes-in-flight", type=int, default=None,
                        help="the sink's writes_in_flight (default: the sink's default; 1: no pipelining)")
    parser.add_argument("--via-rebuild", action="store_true",
                        help="the sink path as `cdc bootstrap` runs it for this sink: SinkRunner.rebuild")
    parser.add_argument("--stages", action="store_true",
                        help="only time each step of the sink path without I/O (no servers needed)")
    args = parser.parse_args()
    if args.stages:
        stages(make_rows(args.events), args.batch)
        return

    from opensearchpy import OpenSearch

    import cdc.runtime.sink_runner  # noqa: F401 - imported before any clock runs, as opensearchpy is
    import sinks.opensearch  # noqa: F401
    from bench.pg_snapshot import listening_pid, process_cpu
    from cdc.dev.stack import read_env
    from cdc.log.kafka import KafkaLog
    from sinks.opensearch.generations import STATE_INDEX
    from sinks.opensearch.mapping import shape_of

    env = read_env()
    url = env["OPENSEARCH_URL"]
    node_pid = listening_pid(int(url.rsplit(":", 1)[1].split("/")[0]))
    broker_pid = listening_pid(int(env["KAFKA_BOOTSTRAP"].split(",")[0].rsplit(":", 1)[1]))
    run_id = uuid.uuid4().hex[:8]
    prefix = f"bench_{run_id}"
    kafka = KafkaLog(env["KAFKA_BOOTSTRAP"])
    client = OpenSearch(url, timeout=120, pool_maxsize=8)
    rows = make_rows(args.events)
    count = len(rows)
    columns = [{"name": n, "type": t, "key": k} for n, t, k in COLUMNS]
    body = {"mappings": shape_of(columns, {n: n for n, _, _ in COLUMNS}, {}).mappings}
    figures: dict[str, list[float]] = {k: [] for k in ("raw", "ours", "ratio", "raw_cpu", "ours_cpu", "raw_node",
                                                       "ours_node", "raw_broker", "ours_broker")}

    def us(seconds: float) -> str:
        return f"{seconds / count * 1e6:5.1f}"

    try:
        publish(kafka, prefix, rows)
        gc.collect()
        gc.freeze()
        print(f"{count:,} documents (one insert per key), requests of {args.per_request:,}, "
              f"{args.concurrency} in flight, {args.warmup} warm-up round(s) not counted; "
              f"OpenSearch node pid {node_pid or 'not on this machine'}; load before: {os.getloadavg()[0]:.2f}")
        print("CPU per document in us: client = this process, node = the OpenSearch node")
        for round_ in range(1 - args.warmup, args.rounds + 1):
            chunks = ndjson_chunks(f"{prefix}-raw{round_}", rows, args.per_request, args.versioned_raw)
            cpu, node, broker = time.process_time(), process_cpu(node_pid), process_cpu(broker_pid)
            raw_s = run_raw(client, f"{prefix}-raw{round_}", body, chunks, args.concurrency, args.via_rebuild)
            raw_cpu = time.process_time() - cpu
            # Outside the clock and inside the node's window, the same for both sides: the last
            # refresh (the segment of the documents indexed since the one before), the count, and
            # the index deleted at once, so that neither side's tail (that refresh, the merges it
            # starts) is done and counted in the other's window.
            settle(client, f"{prefix}-raw{round_}", count)
            raw_node, raw_broker = process_cpu(node_pid) - node, process_cpu(broker_pid) - broker
            del chunks
            name = f"{prefix}-ours{round_}"
            cpu, node, broker = time.process_time(), process_cpu(node_pid), process_cpu(broker_pid)
            ours_s, runner = run_ours(kafka, url, prefix, name, args.concurrency, args.per_request, args.batch,
                                      args.via_rebuild, args.writes_in_flight)
            ours_cpu = time.process_time() - cpu
            settle(client, f"{name}.orders", count, f"{name}.*")
            ours_node, ours_broker = process_cpu(node_pid) - node, process_cpu(broker_pid) - broker
            raw_rate, ours_rate = count / raw_s, count / ours_s
            label = f"round {round_}" if round_ > 0 else "warm-up"
            print(f"{label:>8}: raw bulk {raw_rate:>9,.0f} docs/s (client {us(raw_cpu)}, node {us(raw_node)})   "
                  f"sink path {ours_rate:>9,.0f} docs/s (client {us(ours_cpu)}, node {us(ours_node)}, "
                  f"broker {us(ours_broker)})   ratio {ours_rate / raw_rate:.2f}   load {os.getloadavg()[0]:.1f}",
                  flush=True)
            if round_ > 0:
                for key, value in (("raw", raw_rate), ("ours", ours_rate), ("ratio", ours_rate / raw_rate),
                                   ("raw_cpu", raw_cpu), ("ours_cpu", ours_cpu), ("raw_node", raw_node),
                                   ("ours_node", ours_node), ("raw_broker", raw_broker),
                                   ("ours_broker", ours_broker)):
                    figures[key].append(value)
            client.delete(index=STATE_INDEX, id=name, params={"ignore": 404})
        median = {key: statistics.median(values) for key, values in figures.items()}
        ratio = median["ours"] / median["raw"]
        print(f"  median: raw bulk {median['raw']:>9,.0f} docs/s (client {us(median['raw_cpu'])}, node "
              f"{us(median['raw_node'])})   sink path {median['ours']:>9,.0f} docs/s (client "
              f"{us(median['ours_cpu'])}, node {us(median['ours_node'])}, broker {us(median['ours_broker'])})")
        print(f"ratio of medians {ratio:.2f}, median ratio {median['ratio']:.2f} (target {TARGET:.0%}: "
              f"{'met' if ratio >= TARGET else 'NOT met'}); load after: {os.getloadavg()[0]:.2f}")
    finally:
        client.indices.delete(index=f"{prefix}-*", params={"ignore_unavailable": "true"})
        client.close()
        kafka.delete_topic(f"{prefix}.public.orders")
        kafka.delete_topic(f"{prefix}.schema-changes")
        kafka.close()

if __name__ == "__main__":
    main()
