"""``cdc verify`` at scale: a table whose stores equal it, verified beside a plain ``COPY`` of it.

    .venv/bin/cdc dev up --only postgres kafka opensearch
    .venv/bin/python -m bench.verify_scale [--rows 5000000] [--runs 3] [--chunk N] [--keep] [--reuse FOLDER]

One run, on this machine (issue #30's bench; target: verify at 40% of the COPY rate against a
PostgreSQL warehouse, 20% against OpenSearch):

1. a fresh source database with ``items (id int PRIMARY KEY, qty int, price numeric(10,2), note
   text, at timestamptz)`` of ``--rows`` rows, vacuumed;
2. the real pipeline fills the stores: ``cdc run`` of a config with the PostgreSQL source
   (its initial snapshot into Kafka) and two sinks of its topic, a PostgreSQL warehouse (a fresh
   database) and an OpenSearch index; once both hold every row the daemon is stopped, so nothing
   writes while the runs below read;
3. ``--runs`` times, in turns: the baseline ``COPY (SELECT * FROM items) TO STDOUT`` read through
   psycopg2 into a sink that drops the bytes, then ``cdc verify FILE wh --json`` and ``cdc verify
   FILE search --json``, each a process of its own. Every verify must exit 0 (equal) and count
   every row, else the bench exits 1.

Printed per run: rows/s of each and each verify's ratio to the COPY just before it (the process's
wall time, its start included; then the tables' own seconds, as its report gives them); CPU seconds
of the source's PostgreSQL backends (the backends of the source database, read from /proc: for
COPY the one backend's utime+stime before and after; for a verify sampled every 0.2 s while it
runs, bench.bootstrap.ServerCpu, so the last fraction of a second of a backend may be missed),
of the warehouse's backends (the SQL verify) or of the OpenSearch nodes (their node stats), and
of the verify process itself
(``os.wait4``'s rusage); and the load average. The source CPU per row is the figure the load
does not inflate.

``--keep`` leaves the databases, topics and index in place and prints their folder;
``--reuse FOLDER`` runs step 3 again on them (for iterating on the verify path), after the rest
of step 2 if that was interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import psycopg2
from opensearchpy import ConnectionTimeout, OpenSearch, TransportError

from bench.bootstrap import ServerCpu
from tests.daemon import cdc_process, stop_daemon, wait_beside

TABLE = ("CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, price numeric(10,2), note text, "
         "at timestamptz)")
FILL = ("INSERT INTO items SELECT g, g %% 97, (g %% 100000) / 100.0, 'note ' || (g::bigint * 7919 %% 1000003), "
        "timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second' FROM generate_series(1, %s) g")


class Devnull:
    def write(self, data) -> int:
        return len(data)


def backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def copy_run(dsn: str) -> tuple[float, float]:
    """Seconds of the baseline COPY, and the CPU seconds its backend spent."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SET TimeZone = 'UTC'")
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
            before, began = backend_cpu(pid), time.perf_counter()
            cur.copy_expert("COPY (SELECT * FROM items) TO STDOUT", Devnull(), size=1 << 20)
            seconds = time.perf_counter() - began
            return seconds, backend_cpu(pid) - before
    finally:
        conn.close()


def verify_run(folder: Path, sink: str, extra: list[str]) -> tuple[dict, float]:
    """``cdc verify``'s JSON answer (with its exit code) and its wall seconds."""
    began = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "cdc.cli", "verify", "cdc.yaml", sink, "--json", *extra],
                               cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate()
    seconds = time.perf_counter() - began
    return {"code": process.returncode, **(json.loads(out) if out.strip() else {"error": err[-800:]})}, seconds


def opensearch_cpu(url: str) -> float:
    """CPU seconds the OpenSearch nodes' processes spent so far (their node stats)."""
    client = OpenSearch(url, timeout=30)
    try:
        nodes = client.nodes.stats(metric="process")["nodes"].values()
        return sum(node["process"]["cpu"]["total_in_millis"] for node in nodes) / 1000
    finally:
        client.close()


def children_cpu() -> float:
    """CPU seconds of the reaped children (a verify, once communicate() reaped it)."""
    times = os.times()
    return times.children_user + times.children_system


def plan(env: dict[str, str], rows: int, folder: Path) -> dict[str, Any]:
    """The databases of a run, made, and the names of everything it makes (bench.json: what a
    reuse, and the cleanup, need)."""
    admin = psycopg2.connect(env["PG_DSN"])
    admin.autocommit = True
    names = {"source": f"vs_src_{uuid.uuid4().hex[:6]}", "target": f"vs_wh_{uuid.uuid4().hex[:6]}"}
    with admin.cursor() as cur:
        for name in names.values():
            cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    base = env["PG_DSN"].rsplit("/", 1)[0]
    state: dict[str, Any] = {"rows": rows, "prefix": f"vs{uuid.uuid4().hex[:6]}",
             **{k: f"{base}/{v}" for k, v in names.items()}, "databases": list(names.values())}
    state["alias"] = f"{state['prefix']}-items"
    (folder / "bench.json").write_text(json.dumps(state))
    return state


def fill(env: dict[str, str], state: dict[str, Any], folder: Path) -> None:
    """Steps 1 and 2: the source table, and the stores filled by the daemon."""
    rows = state["rows"]
    began = time.monotonic()
    conn = psycopg2.connect(state["source"])
    with conn.cursor() as cur:
        cur.execute(TABLE)
        cur.execute(FILL, (rows,))
    conn.commit()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE items")
    conn.close()
    print(f"source table: {rows:,} rows in {time.monotonic() - began:.0f}s", flush=True)
    write_config(env, state, folder)
    run_until_filled(env, state, folder)


def write_config(env: dict[str, str], state: dict[str, Any], folder: Path) -> None:
    topics = f"topics: ['{state['prefix']}.public.*']"
    (folder / "cdc.yaml").write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{env['KAFKA_BOOTSTRAP']}', topic_prefix: {state['prefix']}, "
        f"partitions: 3}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{state['source']}', tables: ['public.items'], "
        f"state_dir: ./state}}\n"
        f"sinks:\n"
        f"  - {{name: wh, type: sql, url: '{state['target'].replace('postgresql://', 'postgresql+psycopg2://', 1)}', "
        f"{topics}}}\n"
        f"  - {{name: search, type: opensearch, hosts: ['{env['OPENSEARCH_URL']}'], "
        f"index_name: '{state['prefix']}-{{table}}', {topics}}}\n")


def run_until_filled(env: dict[str, str], state: dict[str, Any], folder: Path) -> None:
    """``cdc run`` until both stores hold every row (again after an interrupted fill: it resumes)."""
    began = time.monotonic()
    daemon = cdc_process(folder / "cdc.yaml", "run", log="daemon.log")
    try:
        wait_beside("both stores hold every row", lambda: filled(state, env), daemon, 4 * 3600, 5)
    finally:
        stop_daemon(daemon)
    print(f"stores filled by cdc run in {time.monotonic() - began:.0f}s", flush=True)


def filled(state: dict, env: dict[str, str]) -> bool:
    search = OpenSearch(env["OPENSEARCH_URL"], timeout=120)
    try:  # what a refresh made visible: the sink's index refreshes every second
        if not search.indices.exists_alias(name=state["alias"]):
            return False
        if search.count(index=state["alias"])["count"] != state["rows"]:
            return False
    except (ConnectionTimeout, TransportError):  # a node busy indexing: ask again
        return False
    finally:
        search.close()
    conn = psycopg2.connect(state["target"])
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                        "AND table_name LIKE '%%items%%'")
            tables = [row[0] for row in cur.fetchall()]
            for table in tables:
                cur.execute(f'SELECT count(*) FROM "{table}"')
                if cur.fetchone()[0] == state["rows"]:
                    return True
        return False
    finally:
        conn.close()


def drop(state: dict, env: dict[str, str]) -> None:
    search = OpenSearch(env["OPENSEARCH_URL"])
    search.indices.delete(index=f"{state['prefix']}-*", ignore_unavailable=True)
    search.close()
    from confluent_kafka.admin import AdminClient

    admin_kafka = AdminClient({"bootstrap.servers": env["KAFKA_BOOTSTRAP"]})
    topics = [t for t in admin_kafka.list_topics(timeout=10).topics if t.startswith(state["prefix"] + ".")]
    if topics:
        for future in admin_kafka.delete_topics(topics).values():
            future.result()
    admin = psycopg2.connect(env["PG_DSN"])
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = ANY(%s)",
                    (state["databases"],))
        for name in state["databases"]:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=None, help="cdc verify --chunk (default: its own)")
    parser.add_argument("--sinks", default="wh,search", help="which sinks to verify (wh, search)")
    parser.add_argument("--keep", action="store_true", help="leave the databases, topics and index in place")
    parser.add_argument("--reuse", type=Path, default=None, help="the folder of a --keep run: verify its stores")
    args = parser.parse_args()
    from cdc.dev.stack import read_env

    env = read_env()
    if not all(env.get(k) for k in ("PG_DSN", "KAFKA_BOOTSTRAP", "OPENSEARCH_URL")):
        raise SystemExit("run `.venv/bin/cdc dev up --only postgres kafka opensearch` first")
    if args.reuse:
        folder = args.reuse.resolve()
        state = json.loads((folder / "bench.json").read_text())
        if not filled(state, env):
            run_until_filled(env, state, folder)
    else:
        folder = Path(tempfile.mkdtemp(prefix="verify-scale-"))
        state = plan(env, args.rows, folder)
    keep = args.keep or args.reuse is not None
    extra = ["--chunk", str(args.chunk)] if args.chunk else []
    sinks = [s for s in args.sinks.split(",") if s]
    bad = False
    try:
        if not args.reuse:
            fill(env, state, folder)
        rows = state["rows"]
        source_db = state["databases"][0]
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {rows:,} rows, {args.runs} runs, "
              f"verify {' '.join(extra) or 'with its default chunk'}; load {load()}", flush=True)
        for run in range(1, args.runs + 1):
            seconds, copy_cpu = copy_run(state["source"])
            copy_rate = rows / seconds
            print(f"run {run}  COPY            {copy_rate:>10,.0f} rows/s  {seconds:6.1f}s  "
                  f"source CPU {copy_cpu:5.1f}s ({copy_cpu / rows * 1e6:.2f} us/row)  load {load()}", flush=True)
            for sink in sinks:
                target_db = state["databases"][1] if sink == "wh" else None
                store_cpu = ServerCpu(env["PG_DSN"], target_db) if target_db else nullcontext(None)
                with ServerCpu(env["PG_DSN"], source_db) as source_cpu, store_cpu as store:
                    ours, searched = children_cpu(), opensearch_cpu(env["OPENSEARCH_URL"]) if sink == "search" else 0.0
                    answer, took = verify_run(folder, sink, extra)
                    ours = children_cpu() - ours
                    if sink == "search":
                        searched = opensearch_cpu(env["OPENSEARCH_URL"]) - searched
                source_s, store_s = source_cpu.total() or 0.0, None if store is None else store.total()
                if sink == "search":
                    store_s = searched
                own = sum(t.get("seconds", 0.0) for t in answer.get("tables", []))  # without the process's start
                digested = sum(t.get("chunks_digested", 0) for t in answer.get("tables", []))
                chunks = sum(t.get("chunks", 0) for t in answer.get("tables", []))
                counted = sum(t.get("rows", 0) for t in answer.get("tables", []))
                ok = answer["code"] == 0 and counted == rows
                bad |= not ok
                rate = rows / took
                print(f"run {run}  verify {sink:<8} {rate:>10,.0f} rows/s  {took:6.1f}s  {rate / copy_rate:5.1%} of COPY  "
                      f"(the tables alone {own:.1f}s: {rows / own / copy_rate if own else 0:.1%})  "
                      f"source CPU {source_s:5.1f}s ({source_s / rows * 1e6:.2f} us/row)  "
                      + (f"{'warehouse' if sink == 'wh' else 'OpenSearch'} CPU {store_s:5.1f}s "
                         f"({store_s / rows * 1e6:.2f} us/row)  " if store_s is not None else "")
                      + f"{digested}/{chunks} chunks by digest  "
                      + f"verify process CPU {ours:5.1f}s ({ours / rows * 1e6:.2f} us/row)  load {load()}"
                      + ("" if ok else f"  FAILED: exit {answer['code']}, {counted:,} rows, "
                                       f"{[t.get('counts') for t in answer.get('tables', [])] or answer.get('error')}"),
                      flush=True)
    finally:
        if keep:
            print(f"kept: {folder} (--reuse {folder})")
        else:
            drop(state, env)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
