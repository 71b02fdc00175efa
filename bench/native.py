"""Does each compiled part pay? Its hot path against the reference code it mirrors, in one process.

Every path runs the same input twice per round, compiled and then under ``cdc.native.reference()``,
alternating for ``--rounds`` rounds; it prints the best CPU time (``time.process_time``) per item
of each and their ratio. No servers: the inputs are made here (a 10-column row per event, as
bench/publish.py's). The paths:

* ``_encode``: ``EnvelopeEncoder.emit`` of events (a capture's encoding);
* ``_decode``: ``decode_batch`` of their records (a sink's decoding), and ``split_by_schema``;
* ``_copytext`` (with ``_decode``): the SQL sink's COPY text of a batch, rows as JSON bytes in C
  against decoded rows through the Python formatter, decoding included on both sides;
* ``_records``: ``packed_headers.pack``/``unpack`` (the embedded log's per-record headers) and
  ``log_records`` of confluent-kafka Messages;
* ``_lines``: the OpenSearch sink's reduce and bulk lines;
* ``_copyjson``: a snapshot block's row JSON from COPY text.

Use: ``python -m bench.native [--events 20000] [--rounds 5]``; results go to bench/results/native.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable

import orjson

from cdc import native


def measure(name: str, items: int, fn: Callable[[], object], rounds: int) -> None:
    best = {True: float("inf"), False: float("inf")}
    for _ in range(rounds):
        for compiled in (True, False):
            with native.choose(compiled):
                gc.collect()
                began = time.process_time()
                fn()
                best[compiled] = min(best[compiled], time.process_time() - began)
    c, py = (best[k] / items * 1e6 for k in (True, False))
    print(f"| {name:<44} | {c:7.3f} | {py:7.3f} | {py / c:5.1f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n, rounds = args.events, args.rounds

    from cdc.events import ChangeEvent, Op, TableId
    from cdc.log import kafka_reader, packed_headers
    from cdc.log.base import LogRecord
    from cdc.runtime.contexts import native_codecs
    from cdc.schema_order import split_by_schema
    from cdc.serde import EnvelopeEncoder
    from cdc.sink_events import decode_batch
    from sinks.opensearch import documents, lines
    from sinks.sql import copy_rows
    from sinks.sql.plan import ColumnPlan
    from sinks.sql.types import Family
    from sources.postgres.copy_json import CopyJson
    from sources.postgres.types.server_json import BOOL, FLOAT, RAW, STRING, TIMESTAMP

    table = TableId("shop", "public", "orders")
    rows = [{"id": i, "customer": f"customer {i % 977}", "status": "shipped" if i % 3 else "open",
             "total": i * 1.25, "qty": i % 17, "note": f"order {i}, été", "paid": bool(i % 2),
             "created": "2024-01-02T03:04:05", "region": "eu-west", "score": i % 101} for i in range(n)]
    events = [ChangeEvent(Op.UPDATE if i % 4 else Op.CREATE, table, {"id": r["id"]}, None, r, 1000 + i, 1)
              for i, r in enumerate(rows)]
    encoder = EnvelopeEncoder("postgresql", "bench", "p")
    encoder.schema_versions[table] = 1
    made: list = []
    encoder.emit(events, lambda t, v, k, h: made.append((t, v, k, h)), None, None, now_ms=1)
    records = [LogRecord(t, i % 3, i, k, v, 0, h) for i, (t, v, k, h) in enumerate(made)]
    headers = [h for *_, h in made]
    packed = [packed_headers.pack(h) for h in headers]
    decoded = decode_batch(records, {})[0]

    print(f"{n:,} events of a 10-column row; load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    print("| path | C us/item | Python us/item | ratio |\n| --- | ---: | ---: | ---: |")
    measure("_encode: EnvelopeEncoder.emit", n, lambda: encoder.emit(events, lambda *a: None, None, None, now_ms=1),
            rounds)
    measure("_decode: decode_batch", n, lambda: decode_batch(records, {}), rounds)
    measure("_decode: split_by_schema", n, lambda: split_by_schema(decoded), rounds)

    def plan(name: str, family: Family) -> ColumnPlan:
        return ColumnPlan(name, family, None, "text", name == "id", False)
    columns = [plan("id", Family.INTEGER), plan("customer", Family.TEXT), plan("status", Family.TEXT),
               plan("total", Family.FLOAT), plan("qty", Family.INTEGER), plan("note", Family.TEXT),
               plan("paid", Family.BOOLEAN), plan("created", Family.TEXT), plan("region", Family.TEXT),
               plan("score", Family.INTEGER)]

    def copy_text() -> bytes:
        codecs = native_codecs()
        batch = decode_batch(records, {}, raw_rows=codecs.copy_rows is not None)[0]
        return copy_rows.formatter(columns, codecs.copy_rows)([(orjson.dumps(e.key), e) for e in batch])
    measure("_decode + _copytext: decode and COPY text", n, copy_text, rounds)

    measure("_records: packed_headers.pack", n, lambda: [packed_headers.pack(h) for h in headers], rounds)
    measure("_records: packed_headers.unpack", n, lambda: [packed_headers.unpack(p) for p in packed], rounds)
    from confluent_kafka import Message
    messages = [Message(topic=r.topic, partition=r.partition, offset=r.offset, key=r.key, value=r.value,
                        timestamp=(1, 0), headers=r.headers) for r in records]
    measure("_records: log_records", n, lambda: kafka_reader.log_records(messages, 0, []), rounds)

    measure("_lines: reduce", n, lambda: documents.reduce(decoded), rounds)
    actions = list(documents.reduce(decoded)[records[0].topic].actions.values())
    measure("_lines: items and NDJSON lines", len(actions),
            lambda: lines.encode(actions, "p.public.orders__g1", None, None, [], []), rounds)

    spec = CopyJson.of("public.orders", list(rows[0]), [RAW, STRING, STRING, FLOAT, RAW, STRING, BOOL, TIMESTAMP,
                                                        STRING, RAW], [0], [1, 2, 5, 8], 2000)
    block = b"".join(b"%d\t%s\tshipped\t%s\t%d\tnote %d\tt\t2024-01-02 03:04:05\teu\t%d\n"
                     % (r["id"], r["customer"].encode(), repr(r["total"]).encode(), r["qty"], r["id"], r["score"])
                     for r in rows)
    measure("_copyjson: a block's row JSON", n, lambda: spec(block), rounds)


if __name__ == "__main__":
    main()
