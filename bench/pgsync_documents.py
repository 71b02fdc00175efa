"""Joined documents beside pgsync (issue 29): the same shop kept as order documents in the same
OpenSearch node from the same PostgreSQL server, by ``cdc run`` and by pgsync, in one run.

    .venv/bin/cdc dev up --only postgres opensearch redis
    .venv/bin/python -m bench.pgsync_documents [--orders 1000000] [--items 5] [--updates 100000]
                                               [--contenders ours,pgsync] [--timeout 3600]
                                               [--sink-setting writes_in_flight=1]

pgsync (PyPI ``pgsync``, pinned to PGSYNC_VERSION) runs from a virtualenv of its own, made on
first use in ``.cdc/bench/pgsync-venv`` (``python -m venv`` and ``pip install``: its SQLAlchemy,
Elasticsearch and OpenSearch clients stay out of the project's ``.venv``).

The shop, loaded with ``INSERT ... SELECT generate_series`` into a fresh database per contender
before its process starts (then ``VACUUM ANALYZE``): 10,000 ``customers``, 2,000 ``products``,
``--orders`` ``orders`` (the root; ``customer_id``) and ``--items`` ``order_items`` per order
(key ``(order_id, line_no)``; ``product_id``, ``qty``). No foreign-key constraints: both tools
are told the relations. A document: an order with its customer (an object) and its items (an
array of objects, each item with its product as an object); both index the items as plain
``object`` arrays (the default of both; neither ``nested``).

Each contender in turn:

  ours    ``python -m cdc.cli run`` of a config with a ``postgres`` source (its defaults: an
          initial snapshot, then the slot) into the embedded log (no Kafka) and an ``opensearch``
          sink with a ``documents:`` section (alias ``<run>-orders``), started in a session of its
          own and ended with its whole process group, as bench/side_by_side.py does.
  pgsync  ``pgsync --config schema.json --daemon --bootstrap`` (``OPENSEARCH=true``, the stack's
          node as ``ELASTICSEARCH_URL``, the stack's Redis as ``REDIS_URL`` with database
          REDIS_DB, its checkpoint file in the run's folder, everything else its defaults: two
          Redis workers, bulk chunks of 5,000, parallel bulk with 4 threads). ``--bootstrap``
          makes its triggers, function, materialized view and replication slot in the same
          process, then it pulls every document with one query and listens.

Figures, per contender:

  build    from the start of its process until the index holds ``--orders`` complete documents:
           after a refresh, every second, through the alias / index, the count of documents and
           the values of ``items.line_no`` and ``customer.id`` in them (``value_count``; an array's
           repeats count) must be ``--orders``, ``--orders`` x ``--items`` and ``--orders``. A
           count alone is not enough: ours writes an order's document as soon as its row arrives
           and again as its items follow, so the count is reached while items are still coming.
           Documents/s. Start-up counts on both sides (imports; ours its snapshot through the
           log, pgsync its bootstrap).
  updates  then ``--updates`` item updates, each of a different random order (one item each, its
           ``qty`` set to MARKER, which no loaded item has), committed in transactions of
           ``--txn-rows``: the seconds from the first commit until every updated document shows
           it (a ``term`` count on ``items.qty`` equal to ``--updates``, after a refresh, every
           0.2 s), and updates/s. The writer's own time is printed beside it (pgsync's row
           triggers run inside these commits).
  CPU      seconds of the contender's process tree (from /proc: every live process of the tree,
           and the children it reaped) and of the PostgreSQL server, the OpenSearch node and
           Redis (their process trees), per phase: the figures the machine's load inflates least.
Each with the load average, then ours/pgsync for both (issue 29's target: at least 3x on both).

Equal work: before its index is dropped, each contender's documents for a sample of ids (the
first 50 updated orders and 50 others) are read back and compared field by field (the order's
columns, the customer, the items by ``line_no`` with their products); a difference is printed
and the run exits 1. Where the shapes differ (not compared): pgsync adds ``_meta`` (the keys of
every row in the document, which it searches to find the documents a changed row belongs to) and
orders the items as its ``JSON_AGG`` returns them (ours sorts them by ``line_no``); its mapping is
OpenSearch's dynamic one (text with a keyword sub-field for strings), ours typed from the columns;
ours keeps each document's version as its external version and reads through an alias.

At the end of each contender, even on failure: its index (and our sink's record in
``cdc-sink-state``), its database (with its slots, triggers, function and view), pgsync's Redis
keys and the run's folder are removed.

Measured on the shared 2-core machine (each run, its load and the code of ours it ran in
bench/results/pgsync_documents.md): at 1,000,000 orders (commit b69a77c) ours built 4,869
documents/s (205 s), pgsync 3,990/s (251 s): 1.22x; 100,000 item updates took ours 20.0 s
(5,011/s), pgsync 40.9 s (2,445/s): 2.05x. Issue 29's 3x holds on neither. Ours' build is its
sink's CPU (the rows loaded into its state, then each document assembled once, in Python); for
updates pgsync pays a trigger per row in the writer's commits, then a search and its document
query again per chunk of changed rows.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg2
from psycopg2.extensions import parse_dsn

from bench.pg_stream import execute, fresh_database
from bench.side_by_side import load, stop_group

PGSYNC_VERSION = "7.3.0"
PGSYNC_VENV = Path(__file__).resolve().parent.parent / ".cdc" / "bench" / "pgsync-venv"
REDIS_DB = 13  # pgsync's queue and metadata keys, apart from the stack's db 0
CUSTOMERS, PRODUCTS, MARKER = 10_000, 2_000, 1000
SAMPLE = 50

DDL = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text NOT NULL);
CREATE TABLE products (id int PRIMARY KEY, sku text NOT NULL, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, status text NOT NULL, note text);
CREATE TABLE order_items (order_id int NOT NULL, line_no int NOT NULL, product_id int NOT NULL,
                          qty int NOT NULL, PRIMARY KEY (order_id, line_no));
"""


def load_statements(orders: int, items: int) -> list[str]:
    """The shop's rows, deterministic so that both databases hold the same; qty 1..9, below MARKER."""
    return [
        f"INSERT INTO customers SELECT i, 'customer ' || i, 'c' || i || '@example.com' "
        f"FROM generate_series(1, {CUSTOMERS}) i",
        f"INSERT INTO products SELECT i, 'SKU-' || lpad(i::text, 6, '0'), 'product ' || i "
        f"FROM generate_series(1, {PRODUCTS}) i",
        f"INSERT INTO orders SELECT i, 1 + (i::bigint * 7919) % {CUSTOMERS}, 'new', 'order ' || i "
        f"FROM generate_series(1, {orders}) i",
        f"INSERT INTO order_items SELECT o, l, 1 + (o * 31 + l * 17) % {PRODUCTS}, 1 + (o + l) % 9 "
        f"FROM generate_series(1, {orders}) o, generate_series(1, {items}) l ORDER BY o, l",
    ]


OURS_CONFIG = """\
log:
  embedded: {{path: ./data, topic_prefix: {prefix}}}
sources:
  - {{name: shop, type: postgres, dsn: '{dsn}', state_dir: ./state,
     tables: [public.customers, public.products, public.orders, public.order_items]}}
sinks:
  - name: {prefix}-docs
    type: opensearch
    hosts: ['{url}']
    topics: ['{prefix}.public.*']
    state_dir: ./docstate
    documents:
      - name: {prefix}-orders
        table: public.orders
        settings: {{index: {{number_of_replicas: 0}}}}
        lookups:
          - {{table: public.customers, as: customer, foreign_key: [customer_id]}}
        children:
          - table: public.order_items
            as: items
            foreign_key: [order_id]
            order_by: [line_no]
            lookups:
              - {{table: public.products, as: product, foreign_key: [product_id]}}
http: null
"""


def pgsync_schema(database: str, index: str) -> list[dict[str, Any]]:
    """pgsync's schema file for the same document."""
    def one_to_one(table: str, label: str, columns: list[str], parent_column: str) -> dict[str, Any]:
        return {"table": table, "label": label, "columns": columns,
                "relationship": {"variant": "object", "type": "one_to_one",
                                 "foreign_key": {"parent": [parent_column], "child": ["id"]}}}

    return [{"database": database, "index": index, "setting": {"number_of_replicas": 0},
             "nodes": {"table": "orders", "columns": ["id", "customer_id", "status", "note"],
                       "children": [
                           one_to_one("customers", "customer", ["id", "name", "email"], "customer_id"),
                           {"table": "order_items", "label": "items",
                            "columns": ["order_id", "line_no", "product_id", "qty"],
                            "relationship": {"variant": "object", "type": "one_to_many",
                                             "foreign_key": {"parent": ["id"], "child": ["order_id"]}},
                            "children": [one_to_one("products", "product", ["id", "sku", "name"],
                                                    "product_id")]}]}}]


def pgsync_bin() -> Path:
    """pgsync's command in its own virtualenv, made (and PGSYNC_VERSION installed) when missing."""
    command = PGSYNC_VENV / "bin" / "pgsync"
    marker = PGSYNC_VENV / f".pgsync-{PGSYNC_VERSION}"
    if not marker.exists():
        print(f"installing pgsync=={PGSYNC_VERSION} into {PGSYNC_VENV}", flush=True)
        if not (PGSYNC_VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(PGSYNC_VENV)], check=True)
        subprocess.run([str(PGSYNC_VENV / "bin" / "python"), "-m", "pip", "install", "-q",
                        f"pgsync=={PGSYNC_VERSION}"], check=True)
        marker.touch()
    return command


# --- CPU seconds of process trees, from /proc -------------------------------------------------------

def _stats() -> dict[int, tuple[int, float, float]]:
    """pid -> (parent pid, own CPU seconds, CPU seconds of the children it reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
                          (int(fields[13]) + int(fields[14])) / tick)
    return out


def tree_cpu(roots: dict[str, int | None]) -> dict[str, float]:
    """Per name, the CPU seconds of the process tree under its root pid so far: every live
    process's own and what each reaped from its ended children (0 for an unknown root)."""
    stats = _stats()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    out = {}
    for name, root in roots.items():
        total, todo = 0.0, [root] if root in stats else []
        while todo:
            pid = todo.pop()
            total += stats[pid][1] + stats[pid][2]
            todo.extend(children.get(pid, []))
        out[name] = total
    return out


def server_pids() -> dict[str, int | None]:
    from cdc.dev.stack import status

    pids = {row.name: row.pid for row in status() if row.running}
    return {name: pids.get(name) for name in ("postgres", "opensearch", "redis")}


# --- the contenders ---------------------------------------------------------------------------------

@contextmanager
def launched(command: list[str], directory: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """``command`` in ``directory`` (its output in ``out.log`` there), in a session of its own,
    ended with its whole group at the end (bench.side_by_side.stop_group)."""
    with open(directory / "out.log", "wb") as out:
        process = subprocess.Popen(command, cwd=directory, stdout=out, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
    try:
        yield process
    finally:
        stop_group(process)


def log_tail(directory: Path, lines: int = 30) -> str:
    """The last ``lines`` of the process's output (without pgsync's status lines)."""
    text = [line for line in (directory / "out.log").read_text(errors="replace").splitlines()
            if not line.startswith("Sync ")]
    return "\n".join(text[-lines:]) or "(no output)"


class Search:
    def __init__(self, url: str) -> None:
        from opensearchpy import OpenSearch

        self.client = OpenSearch(url, timeout=120)

    def count(self, index: str, query: dict | None = None) -> int:
        from opensearchpy import NotFoundError

        try:
            self.client.indices.refresh(index=index)
            body = {"query": query} if query else None
            return int(self.client.count(index=index, body=body)["count"])
        except NotFoundError:
            return 0

    def totals(self, index: str) -> tuple[int, int, int]:
        """(documents, items, customers) readers see, after a refresh: the count, and the values of
        ``items.line_no`` and of ``customer.id`` in them (doc values keep an array's repeats)."""
        from opensearchpy import NotFoundError

        body = {"size": 0, "track_total_hits": True,
                "aggs": {"items": {"value_count": {"field": "items.line_no"}},
                         "customers": {"value_count": {"field": "customer.id"}}}}
        try:
            self.client.indices.refresh(index=index)
            answer = self.client.search(index=index, body=body)
        except NotFoundError:
            return 0, 0, 0
        aggs = answer["aggregations"]
        return (int(answer["hits"]["total"]["value"]), int(aggs["items"]["value"]),
                int(aggs["customers"]["value"]))

    def documents(self, index: str, ids: list[int]) -> dict[int, dict | None]:
        answer = self.client.mget(index=index, body={"ids": [str(i) for i in ids]})
        return {int(d["_id"]): d.get("_source") if d.get("found") else None for d in answer["docs"]}


def wait_for(probe: Callable[[], tuple[bool, str]], began: float, process: subprocess.Popen, directory: Path,
             timeout: float, interval: float) -> float:
    """Seconds from ``began`` until ``probe`` says done; an error with the log's tail when the
    process ends or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not (progress := probe())[0]:
        if process.poll() is not None:
            raise RuntimeError(f"it ended ({process.returncode}) at {progress[1]}:\n{log_tail(directory)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{progress[1]} after {timeout:g}s:\n{log_tail(directory)}")
        time.sleep(interval)
    return time.perf_counter() - began


def update_items(dsn: str, targets: list[tuple[int, int]], txn_rows: int) -> tuple[float, float]:
    """Each (order, line)'s qty set to MARKER in transactions of ``txn_rows``: (the perf_counter of
    the first commit's return, the seconds from it to the last's)."""
    conn = psycopg2.connect(dsn)
    first = 0.0
    try:
        with conn.cursor() as cur:
            for start in range(0, len(targets), txn_rows):
                chunk = targets[start:start + txn_rows]
                cur.execute("UPDATE order_items i SET qty = %s FROM unnest(%s::int[], %s::int[]) AS u(o, l) "
                            "WHERE i.order_id = u.o AND i.line_no = u.l",
                            (MARKER, [o for o, _ in chunk], [line for _, line in chunk]))
                assert cur.rowcount == len(chunk), cur.rowcount
                conn.commit()
                if not first:
                    first = time.perf_counter()
    finally:
        conn.close()
    return first, time.perf_counter() - first


def normal(doc: dict | None) -> Any:
    """What both contenders must agree on in a document."""
    if doc is None:
        return None
    customer = doc.get("customer") or {}
    items = sorted(doc.get("items") or [], key=lambda item: item["line_no"])
    return ((doc["id"], doc["customer_id"], doc["status"], doc["note"]),
            (customer.get("id"), customer.get("name"), customer.get("email")),
            [(i["line_no"], i["product_id"], i["qty"], (i.get("product") or {}).get("id"),
              (i.get("product") or {}).get("sku"), (i.get("product") or {}).get("name")) for i in items])


def run_contender(label: str, args, settings: dict[str, str], run_id: str,
                  targets: list[tuple[int, int]], sample_ids: list[int]) -> dict[str, Any]:
    admin_dsn, url = settings["PG_DSN"], settings["OPENSEARCH_URL"]
    search = Search(url)
    name = f"bench_pgsync_{run_id}_{label}"
    prefix = f"b{run_id}"
    index = f"{prefix}-orders" if label == "ours" else name
    directory = Path(tempfile.mkdtemp(prefix=f"bench-pgsync-{label}-"))
    figures: dict[str, Any] = {}
    redis_keys: list[str] = []
    try:
        with fresh_database(admin_dsn, name) as dsn:
            began = time.perf_counter()
            execute(dsn, DDL)
            for statement in load_statements(args.orders, args.items):
                execute(dsn, statement)
            execute(dsn, "VACUUM ANALYZE")
            print(f"{label}: loaded {args.orders:,} orders, {args.orders * args.items:,} items in "
                  f"{time.perf_counter() - began:.1f}s ({load()})", flush=True)
            if label == "ours":
                config = OURS_CONFIG.format(prefix=prefix, dsn=dsn, url=url)
                extra = "".join(f"    {k}: {v}\n" for k, v in (s.split("=", 1) for s in args.sink_setting))
                (directory / "cdc.yaml").write_text(config.replace("    documents:\n", extra + "    documents:\n", 1))
                command = [sys.executable, "-m", "cdc.cli", "run", str(directory / "cdc.yaml")]
                env = None
            else:
                import json

                (directory / "schema.json").write_text(json.dumps(pgsync_schema(name, index)))
                pg = parse_dsn(dsn)
                redis = settings["REDIS_URL"].rsplit("/", 1)[0] + f"/{REDIS_DB}"
                env = {**os.environ, "OPENSEARCH": "true", "ELASTICSEARCH_URL": url,
                       "PG_HOST": pg.get("host", "127.0.0.1"), "PG_PORT": pg.get("port", "5432"),
                       "PG_USER": pg.get("user", "postgres"), "REDIS_URL": redis,
                       "CHECKPOINT_PATH": str(directory)}
                if pg.get("password"):
                    env["PG_PASSWORD"] = pg["password"]
                # pgsync's queue: queue:<database>_<index> (its slot's name) and its ":meta" key.
                slot = "".join(c for c in f"{name.lower()}_{index}" if c.isalnum() or c == "_")
                redis_keys = [f"queue:{slot}", f"queue:{slot}:meta"]
                command = [str(pgsync_bin()), "--config", "schema.json", "--daemon", "--bootstrap"]
            servers = server_pids()
            print(f"{label}: running ({load()})", flush=True)
            cpu0 = tree_cpu(servers)
            began = time.perf_counter()
            with launched(command, directory, env) as process:
                roots = {**servers, label: process.pid}
                cpu0[label] = 0.0

                def built() -> tuple[bool, str]:
                    docs, items, customers = search.totals(index)
                    expected = (args.orders, args.orders * args.items, args.orders)
                    return ((docs, items, customers) == expected,
                            f"{docs:,} documents with {items:,} items and {customers:,} customers of {expected}")

                figures["build_s"] = wait_for(built, began, process, directory, args.timeout, 1.0)
                figures["build_load"] = os.getloadavg()[0]
                cpu1 = tree_cpu(roots)
                figures["build_cpu"] = {k: cpu1[k] - cpu0[k] for k in roots}
                print(f"{label}: built in {figures['build_s']:.1f}s ({load()})", flush=True)

                first, figures["writer_s"] = update_items(dsn, targets, args.txn_rows)

                def updated() -> tuple[bool, str]:
                    count = search.count(index, {"term": {"items.qty": MARKER}})
                    return count >= len(targets), f"{count:,} of {len(targets):,} updated documents"

                figures["updates_s"] = wait_for(updated, first, process, directory, args.timeout, 0.2)
                figures["updates_load"] = os.getloadavg()[0]
                cpu2 = tree_cpu(roots)
                figures["updates_cpu"] = {k: cpu2[k] - cpu1[k] for k in roots}
                figures["documents"] = {i: normal(d) for i, d in search.documents(index, sample_ids).items()}
                figures["count"] = search.count(index)
    finally:
        cleanup(search, label, index, prefix, redis_keys, settings)
        if args.logs and (directory / "out.log").exists():
            args.logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(directory / "out.log", args.logs / f"{label}.log")
        shutil.rmtree(directory, ignore_errors=True)
    return figures


def cleanup(search: Search, label: str, index: str, prefix: str, redis_keys: list[str],
            settings: dict[str, str]) -> None:
    try:
        if label == "ours":
            search.client.indices.delete(index=f"{index}*", params={"ignore_unavailable": "true"})
            search.client.delete(index="cdc-sink-state", id=f"{prefix}-docs", params={"ignore": 404})
        else:
            search.client.indices.delete(index=index, params={"ignore_unavailable": "true"})
    except Exception as exc:  # noqa: BLE001 - a cleanup error must not hide the run's own
        print(f"{label}: could not drop its index: {exc}", file=sys.stderr)
    if redis_keys:
        import redis

        client = redis.Redis.from_url(settings["REDIS_URL"].rsplit("/", 1)[0] + f"/{REDIS_DB}")
        try:
            client.delete(*redis_keys)
        finally:
            client.close()


def cpu_line(cpu: dict[str, float], label: str) -> str:
    return (f"CPU s: {label} {cpu[label]:.1f}, postgres {cpu['postgres']:.1f}, opensearch {cpu['opensearch']:.1f}, "
            f"redis {cpu['redis']:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=5, help="items per order")
    parser.add_argument("--updates", type=int, default=100_000, help="item updates, each of another order")
    parser.add_argument("--txn-rows", type=int, default=1000, help="updates per transaction")
    parser.add_argument("--contenders", default="ours,pgsync", help="which run, in this order")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds each phase may take at most")
    parser.add_argument("--sink-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of our sink (writes_in_flight=1 ...), repeatable")
    parser.add_argument("--logs", type=Path, help="a folder to copy each contender's output into")
    args = parser.parse_args()
    if args.updates > args.orders:
        parser.error("--updates must not exceed --orders (one update per order)")
    labels = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if not labels or set(labels) - {"ours", "pgsync"}:
        parser.error("--contenders: ours and/or pgsync")

    # SIGTERM (a timeout, a supervisor) unwinds through the finally blocks: nothing left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from cdc.dev.stack import read_env

    settings = read_env()
    missing = [k for k in ("PG_DSN", "OPENSEARCH_URL", "REDIS_URL") if not settings.get(k)]
    if missing:
        raise SystemExit(f"no {', '.join(missing)}: run `.venv/bin/cdc dev up --only postgres opensearch redis`")
    if "pgsync" in labels:
        pgsync_bin()
    rng = random.Random(29)
    targets = [(order, rng.randint(1, args.items)) for order in rng.sample(range(1, args.orders + 1), args.updates)]
    others = sorted(set(rng.sample(range(1, args.orders + 1), min(args.orders, 2 * SAMPLE))) -
                    {o for o, _ in targets[:SAMPLE]})[:SAMPLE]
    sample_ids = [o for o, _ in targets[:SAMPLE]] + others
    run_id = uuid.uuid4().hex[:6]
    print(f"{args.orders:,} orders x {args.items} items, {CUSTOMERS:,} customers, {PRODUCTS:,} products; "
          f"{args.updates:,} item updates in transactions of {args.txn_rows:,}; pgsync {PGSYNC_VERSION}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for label in labels:
        f = run_contender(label, args, settings, run_id, targets, sample_ids)
        results[label] = f
        print(f"{label:<7} build   {args.orders / f['build_s']:>9,.0f} docs/s    ({f['build_s']:.1f}s, "
              f"load {f['build_load']:.1f}; {cpu_line(f['build_cpu'], label)})", flush=True)
        print(f"{label:<7} updates {args.updates / f['updates_s']:>9,.0f} updates/s ({f['updates_s']:.1f}s from the "
              f"first commit, the writer's {f['writer_s']:.1f}s; load {f['updates_load']:.1f}; "
              f"{cpu_line(f['updates_cpu'], label)})", flush=True)
        wrong = [i for i, d in f["documents"].items() if d is None]
        if f["count"] != args.orders or wrong:
            print(f"{label}: {f['count']:,} documents at the end; missing in the sample: {wrong}")
    status = 0
    if len(results) == 2:
        ours, theirs = results["ours"], results["pgsync"]
        same = [i for i in sample_ids if ours["documents"][i] == theirs["documents"][i]]
        if len(same) == len(sample_ids):
            print(f"the same documents for the {len(sample_ids)} sampled ids ({SAMPLE} updated)")
        else:
            status = 1
            for i in sample_ids:
                if ours["documents"][i] != theirs["documents"][i]:
                    print(f"document {i} differs:\n  ours   {ours['documents'][i]}\n  pgsync {theirs['documents'][i]}")
                    break
            print(f"{len(sample_ids) - len(same)} of {len(sample_ids)} sampled documents differ")
        for phase, unit in (("build", "docs/s"), ("updates", "updates/s")):
            ratio = theirs[f"{phase}_s"] / ours[f"{phase}_s"]
            verdict = "" if ratio >= 3 else "  BELOW the 3x target"
            print(f"ours / pgsync {phase}: {ratio:.2f}x ({unit}){verdict}")
    print(f"load after: {load()}")
    sys.exit(status)


if __name__ == "__main__":
    main()
