"""``cdc status FILE`` wall time while the daemon runs FILE, beside ``python -c pass``.

    .venv/bin/cdc dev up --only postgres
    .venv/bin/python -m bench.status_latency [--runs 15]

Starts the real daemon (``cdc run``) on a small pipeline: a PostgreSQL source (so ``cdc status``
lists a replication slot), a generator, an SQL sink into SQLite, the embedded log. Once every
connector streams or has finished, it times, round after round, three commands as a user types
them, each a fresh process:

  baseline  ``python -c pass``: the interpreter's own start-up, the floor for any command;
  status    ``cdc status FILE``: answered by the daemon (``GET /status/report``);
  slow      ``cdc -v status FILE``: ``-v`` takes the path that loads the config and the plugins
            itself (the way every ``cdc status`` went before the daemon answered it), for
            comparison; its debug log is discarded.

Prints median and max of each, and the machine's load (two shared cores: figures vary).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from bench.pg_stream import drop_slots, execute, with_dbname
from bench.side_by_side import stop_group

LABELS = {"baseline": "python -c pass", "status": "cdc status FILE", "slow": "cdc -v status FILE"}


def _pg_dsn() -> str:
    from cdc.dev.stack import read_env

    dsn = os.environ.get("PG_DSN") or read_env().get("PG_DSN")
    if not dsn:
        raise SystemExit("no PG_DSN: run `.venv/bin/cdc dev up --only postgres`")
    return dsn


def _free_port() -> int:
    from cdc.dev.services import free_port

    return free_port()


def _timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {done.returncode}")
    return elapsed, done.stdout


def _wait_until_running(port: int, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the daemon exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as response:
                rows = json.load(response)
            if rows and all(r["phase"] in ("streaming", "finished") for r in rows):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the pipeline did not reach streaming in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="rounds of the three commands")
    args = parser.parse_args()
    admin = _pg_dsn()
    database = f"bench_status_{uuid.uuid4().hex[:8]}"
    execute(admin, f'CREATE DATABASE "{database}"')
    dsn = with_dbname(admin, database)
    execute(dsn, "CREATE TABLE items (id int PRIMARY KEY, name text)",
            "INSERT INTO items SELECT g, 'x' FROM generate_series(1, 100) g")
    work = Path(tempfile.mkdtemp(prefix="bench-status-"))
    port = _free_port()
    config = work / "cdc.yaml"
    config.write_text(
        "log:\n  embedded: {path: ./data, topic_prefix: bench}\n"
        f"sources:\n  - {{name: pg, type: postgres, dsn: '{dsn}', tables: [public.items], state_dir: ./state}}\n"
        "  - {name: gen, type: generator, keys: 50, events: 200, rate: 1000, table: generated}\n"
        "sinks:\n  - {name: warehouse, type: sql, url: 'sqlite:///target.db', topics: ['bench.*']}\n"
        f"http: \"127.0.0.1:{port}\"\n")
    cdc = [sys.executable, "-m", "cdc.cli"]
    daemon = subprocess.Popen([*cdc, "run", str(config)], cwd=work, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_running(port, daemon)
        commands = {"baseline": [sys.executable, "-c", "pass"],
                    "status": [*cdc, "status", str(config)],
                    "slow": [*cdc, "-v", "status", str(config)]}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, cmd in commands.items():
                elapsed, out = _timed(cmd, work)
                if name != "baseline" and "slot " not in out:
                    raise SystemExit(f"`{' '.join(cmd)}` printed no slot line:\n{out}")
                times[name].append(elapsed)
        load = os.getloadavg()
        print(f"cdc status while the daemon runs, {args.runs} runs each "
              f"(load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores)")
        for name, samples in times.items():
            print(f"  {name:<9} median {statistics.median(samples) * 1000:7.0f} ms   "
                  f"max {max(samples) * 1000:7.0f} ms   {LABELS[name]}")
    finally:
        stop_group(daemon)
        drop_slots(admin, database)
        execute(admin, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
