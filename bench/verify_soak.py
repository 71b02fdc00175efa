"""Soak of the daemon's background verify: no false alarm in ``--minutes`` of a writer that never stops.

    .venv/bin/cdc dev up --only postgres kafka redis opensearch
    .venv/bin/python -m bench.verify_soak [--minutes 20] [--rows 5000] [--every 60]

One run, on this machine, with the real daemon (issue #30's "no false positives"):

1. a fresh source database with ``items (id int PRIMARY KEY, qty int, price numeric(10,2), note
   text, at timestamptz)`` of ``--rows`` rows;
2. a config file with the PostgreSQL source (Kafka as the log) and three sinks of its topic, each
   with ``verify: {every: --every s, rows_per_s: 20000}``: a PostgreSQL warehouse (a fresh
   database), a Redis cache and an OpenSearch index; ``cdc run`` of it in a session of its own;
3. once the three stores hold the table, a writer that never stops (updates, inserts of new keys
   and of deleted ones, deletes; ~100-200 changes/s) for ``--minutes``;
4. every 10 s a scrape of ``/metrics`` (``cdc_verify_mismatched_rows``,
   ``cdc_verify_last_pass_timestamp_seconds``, ``cdc_verify_failed``), a line printed every 30 s:
   elapsed, passes seen per sink, mismatched rows per sink/table, failures, the load;
   a pass that reported a mismatch is followed at once by a ``cdc verify --json`` of its sink
   (does a verify right after still see it?), its counts printed;
5. at the end the writer stops and ``cdc verify --json`` of each sink (which waits for the store
   to apply the log) must find it equal.

Prints the passes per sink and the mismatched rows of all passes (the target is 0), and exits 1
when a pass reported a mismatch or failed, or the final verify found a difference. The daemon's
log stays in the printed folder; its warnings are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg2
import redis
from opensearchpy import OpenSearch

from tests.background import PgWriter
from tests.conftest import _fresh_database
from tests.daemon import cdc_process, stop_daemon, wait_beside
from tests.integration.test_verify import _count as count

SINKS = ("wh", "cache", "search")
SERIES = re.compile(r'^(cdc_verify_\w+)\{sink="(\w+)"(?:,table="([^"]+)")?\} (\S+)$')


class Writer(PgWriter):
    """Updates (60%), inserts (20%: a new key, or a seeded key again) and deletes (20%: a seeded
    key or a new one) on ``items``, so the table keeps its size and keys come and go."""

    per_commit = 5
    pause = 0.03

    def __init__(self, dsn: str, rows: int) -> None:
        super().__init__(dsn, seed=30)
        self.rows = rows

    def _some(self) -> int:
        if self.rng.random() < 0.5 or self.next_id == 100_000:
            return self.rng.randrange(1, self.rows + 1)
        return self.rng.randrange(100_001, self.next_id + 1)

    def change(self, cur) -> None:
        roll = self.rng.random()
        if roll < 0.6:
            cur.execute("UPDATE items SET qty = qty + 1, price = price + 0.01, note = %s, at = now() WHERE id = %s",
                        (f"w{self.changes}", self._some()))
        elif roll < 0.8:
            key = self.new_id() if self.rng.random() < 0.5 else self.rng.randrange(1, self.rows + 1)
            cur.execute("INSERT INTO items VALUES (%s, 1, 2.50, 'new', now()) ON CONFLICT (id) DO NOTHING", (key,))
        else:
            cur.execute("DELETE FROM items WHERE id = %s", (self._some(),))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, str, str | None], float]:
    """The verify series of /metrics: (name, sink, table) -> value; {} when the daemon does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {(m[1], m[2], m[3]): float(m[4]) for line in text.splitlines() if (m := SERIES.match(line))}


def filled(dsn: str, redis_url: str, cache: str, search_url: str, alias: str, rows: int) -> bool:
    client, search = redis.Redis.from_url(redis_url), OpenSearch(search_url)
    try:
        cached = sum(1 for _ in client.scan_iter(match=f"{cache}:public.items:*", count=1000))
        indexed = search.indices.exists_alias(name=alias) and (
            search.indices.refresh(index=alias) and search.count(index=alias)["count"])
        return count(dsn) == cached == indexed == rows
    finally:
        client.close()
        search.close()


def final_verify(config: Path, sink: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "cdc.cli", "verify", str(config), sink, "--json"],
                          capture_output=True, cwd=config.parent, text=True)
    answer = json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr.strip()[-500:]}
    return {"code": done.returncode, **answer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--every", type=int, default=60, help="seconds between a sink's verify passes")
    args = parser.parse_args()
    from cdc.dev.stack import read_env

    env = {**read_env(), **{k: v for k, v in os.environ.items() if k.endswith(("_DSN", "_URL", "_BOOTSTRAP"))}}
    wanted = ("PG_DSN", "KAFKA_BOOTSTRAP", "REDIS_URL", "OPENSEARCH_URL")
    if not all(env.get(k) for k in wanted):
        raise SystemExit("run `.venv/bin/cdc dev up --only postgres kafka redis opensearch` first")
    databases = [_fresh_database(env["PG_DSN"]), _fresh_database(env["PG_DSN"])]
    source, target = (next(d) for d in databases)
    tmp = Path(tempfile.mkdtemp(prefix="verify-soak-"))
    prefix, cache, port = f"soak{uuid.uuid4().hex[:6]}", f"s{uuid.uuid4().hex[:6]}", free_port()
    with psycopg2.connect(source) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, price numeric(10,2), note text, "
                    "at timestamptz)")
        cur.execute("INSERT INTO items SELECT g, g %% 7, 9.90, 'seed', '2026-01-01T00:00:00Z' "
                    "FROM generate_series(1, %s) g", (args.rows,))
    verify = f"verify: {{every: {args.every}s, rows_per_s: 20000}}"
    topics = f"topics: ['{prefix}.public.*'], batch_wait_ms: 50, {verify}"
    config = tmp / "cdc.yaml"
    config.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{env['KAFKA_BOOTSTRAP']}', topic_prefix: {prefix}, partitions: 3}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{source}', tables: ['public.items'], state_dir: ./state, "
        f"heartbeat_interval: 1, status_interval: 1, signal_table: public.cdc_signal}}\n"
        f"sinks:\n"
        f"  - {{name: wh, type: sql, url: '{target.replace('postgresql://', 'postgresql+psycopg2://', 1)}', "
        f"{topics}}}\n"
        f"  - {{name: cache, type: redis, url: '{env['REDIS_URL']}', key_prefix: {cache}, {topics}}}\n"
        f"  - {{name: search, type: opensearch, hosts: ['{env['OPENSEARCH_URL']}'], index_name: '{prefix}-{{table}}', "
        f"{topics}}}\n"
        f"http: '127.0.0.1:{port}'\n")
    print(f"verify soak: {args.rows} rows, {args.minutes:g} min, verify every {args.every}s; folder {tmp}", flush=True)
    daemon = cdc_process(config, "run", log="daemon.log")
    passes: dict[str, set[float]] = {s: set() for s in SINKS}
    mismatched: dict[tuple[str, str], int] = {}
    failed: dict[str, int] = {s: 0 for s in SINKS}
    bad = False
    try:
        wait_beside("the three stores' first fill", lambda: filled(
            target, env["REDIS_URL"], cache, env["OPENSEARCH_URL"], f"{prefix}-items", args.rows), daemon, 300, 2)
        began = time.monotonic()
        with Writer(source, args.rows) as writer:
            printed = 0.0
            while (elapsed := time.monotonic() - began) < args.minutes * 60:
                assert daemon.poll() is None, f"the daemon exited ({daemon.returncode})"
                series = scrape(port)
                for sink in SINKS:
                    stamp = series.get(("cdc_verify_last_pass_timestamp_seconds", sink, None))
                    if stamp and stamp not in passes[sink]:  # a new pass: count what it found once
                        passes[sink].add(stamp)
                        failed[sink] += int(series.get(("cdc_verify_failed", sink, None), 0))
                        for (name, s, table), value in series.items():
                            if name == "cdc_verify_mismatched_rows" and s == sink:
                                mismatched[(sink, table)] = mismatched.get((sink, table), 0) + int(value)
                                if value:
                                    print(f"  MISMATCH {sink} {table}: {int(value)} at {time.ctime(stamp)}")
                        if any(v for (n, s, _), v in series.items() if n == "cdc_verify_mismatched_rows" and s == sink):
                            again = final_verify(config, sink)  # does a verify right after still see it?
                            print(f"  verify of {sink} again: exit {again['code']}, "
                                  f"{[t['counts'] for t in again.get('tables', [])] or again.get('error')}", flush=True)
                if elapsed - printed >= 30 or not printed:
                    printed = elapsed
                    now = {(s, t): int(v) for (n, s, t), v in series.items() if n == "cdc_verify_mismatched_rows"}
                    print(f"{elapsed / 60:5.1f} min  passes {' '.join(f'{s}={len(passes[s])}' for s in SINKS)}  "
                          f"mismatched {' '.join(f'{s}/{t}={v}' for (s, t), v in sorted(now.items())) or '-'}  "
                          f"failed {sum(failed.values())}  writer {writer.changes}  "
                          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
                time.sleep(10)
            changes = writer.changes
        finals = {sink: final_verify(config, sink) for sink in SINKS}
        total = sum(mismatched.values())
        print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.minutes:g} min, {changes} writer "
              f"changes ({changes / (args.minutes * 60):.0f}/s), load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"passes: {', '.join(f'{s} {len(passes[s])}' for s in SINKS)}; failed passes: "
              f"{sum(failed.values())}; mismatched rows over all passes: {total} (target 0)")
        for sink, answer in finals.items():
            tables = {t["table"]: (t["rows"], t["counts"]) for t in answer.get("tables", [])}
            print(f"final cdc verify {sink}: exit {answer['code']}, {tables or answer.get('error')}")
        bad = total > 0 or sum(failed.values()) > 0 or any(a["code"] != 0 for a in finals.values())
    finally:
        stop_daemon(daemon)
        warnings = [line for line in (tmp / "daemon.log").read_text(errors="replace").splitlines()
                    if "WARNING" in line or "ERROR" in line]
        print(f"daemon log: {len(warnings)} warnings/errors" + "".join(f"\n  {w}" for w in warnings[-20:]))
        client = redis.Redis.from_url(env["REDIS_URL"])
        if names := list(client.scan_iter(match=f"{cache}*")):
            client.delete(*names)
        client.close()
        search = OpenSearch(env["OPENSEARCH_URL"])
        search.indices.delete(index=f"{prefix}-*", ignore_unavailable=True)
        search.close()
        for generator in databases:
            next(generator, None)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
