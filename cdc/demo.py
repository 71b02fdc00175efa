"""``cdc demo``: a shop in the local PostgreSQL, captured live into the embedded log.

1. Starts PostgreSQL from the local stack and creates a small ``shop`` database with rows.
2. Writes a config file (embedded log, one ``postgres`` source) and starts ``cdc run`` on it.
3. Makes live changes (inserts, updates, a key change, deletes) while the daemon captures.
4. Shows the result: the topics replayed side by side with the tables, ``cdc status``, and the
   last events of a topic as ``cdc tail`` prints them. Then stops the daemon with SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

SCHEMA = """
CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, email text UNIQUE,
                        joined timestamptz NOT NULL DEFAULT now());
CREATE TABLE orders (id serial PRIMARY KEY, customer_id int REFERENCES customers(id) ON DELETE CASCADE,
                     total numeric(10,2) NOT NULL, status text NOT NULL DEFAULT 'new', items jsonb);
INSERT INTO customers (name, email) SELECT 'customer ' || g, 'c' || g || '@example.com'
  FROM generate_series(1, 50) g;
INSERT INTO orders (customer_id, total, items) SELECT 1 + g % 50, (g * 7 % 1000) / 10.0,
  jsonb_build_array(jsonb_build_object('sku', 'A' || g, 'qty', 1 + g % 3)) FROM generate_series(1, 200) g;
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="capture a live demo shop from PostgreSQL into the embedded log")
    demo.add_argument("--database", default="shop_demo")
    demo.add_argument("--changes", type=int, default=300, help="live changes to make")
    demo.set_defaults(handler=run)


# Columns compared between tables and topics (the others are typed differently by row_to_json:
# numeric as a number, timestamptz with "+00:00"; the events follow the contract's forms).
SHOWN = {"customers": ("id", "name", "email"), "orders": ("id", "customer_id", "status")}


def _replay(log_, topic: str, columns: tuple[str, ...]) -> dict:
    state: dict = {}
    for record in log_.read_all(topic):
        value = None if record.value is None else orjson.loads(record.value)
        if value is None or value["op"] == "d":
            state.pop(record.key, None)
        elif value["op"] != "t":
            state[record.key] = tuple(value["after"][c] for c in columns)
    return state


def _table(cur, table: str) -> dict:
    columns = SHOWN[table]
    cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
    return {orjson.dumps({"id": row[0]}): tuple(row) for row in cur.fetchall()}


def run(args: argparse.Namespace) -> int:
    import psycopg2

    from cdc.config import load_config
    from cdc.dev import stack
    from cdc.dev.paths import dev_home
    from cdc.dev.services import free_port
    from cdc.log.open import open_log

    env = stack.up(["postgres"])
    admin = psycopg2.connect(env["PG_DSN"])
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s AND NOT active", (args.database,))
        cur.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{args.database}"')
    admin.close()
    dsn = env["PG_DSN"].rsplit("/", 1)[0] + "/" + args.database
    db = psycopg2.connect(dsn)
    db.autocommit = True
    with db.cursor() as cur:
        cur.execute(SCHEMA)
    print(f"1. created database {args.database}: 50 customers, 200 orders")

    home = dev_home() / "demo"
    for stale in ("cdc-data", "cdc-state"):
        subprocess.run(["rm", "-rf", str(home / stale)], check=False)
    home.mkdir(parents=True, exist_ok=True)
    config = home / "cdc.yaml"
    http = f"127.0.0.1:{free_port()}"
    config.write_text(f"""# written by `cdc demo`
log:
  embedded: {{path: ./cdc-data, topic_prefix: shop}}
sources:
  - name: shop_pg
    type: postgres
    dsn: "{dsn}"
    tables: ["public.*"]
    snapshot: initial
    state_dir: ./cdc-state
http: "{http}"
""")
    print(f"2. starting `cdc run {config}` (embedded log in {home / 'cdc-data'})")
    daemon = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=home,
                              stdout=open(home / "daemon.log", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        rng = random.Random(42)
        with db.cursor() as cur:
            for i in range(args.changes):
                choice = rng.random()
                if choice < 0.35:
                    cur.execute("INSERT INTO orders (customer_id, total, items) VALUES (%s, %s, %s)",
                                (rng.randrange(1, 51), rng.randrange(100, 99_999) / 100,
                                 orjson.dumps([{"sku": f"B{i}", "qty": 1}]).decode()))
                elif choice < 0.75:
                    cur.execute("UPDATE orders SET status = %s WHERE id = (SELECT id FROM orders ORDER BY random() LIMIT 1)",
                                (rng.choice(["paid", "shipped", "delivered"]),))
                elif choice < 0.9:
                    cur.execute("DELETE FROM orders WHERE id = (SELECT id FROM orders ORDER BY random() LIMIT 1)")
                elif choice < 0.97:
                    cur.execute("UPDATE customers SET email = %s WHERE id = %s",
                                (f"vip{i}@example.com", rng.randrange(1, 51)))
                else:
                    cur.execute("UPDATE orders SET id = id + 100000 WHERE id = (SELECT min(id) FROM orders WHERE id < 100000)")
                time.sleep(0.005)
        print(f"3. made {args.changes} live changes while capturing")

        loaded = load_config(str(config))
        log_ = open_log(loaded.log)
        deadline = time.monotonic() + 120
        with db.cursor() as cur:
            while True:
                tables = {"customers": _table(cur, "customers"), "orders": _table(cur, "orders")}
                topics = {name: _replay(log_, f"shop.public.{name}", SHOWN[name])
                          if f"shop.public.{name}" in log_.topics() else {} for name in tables}
                if topics == tables:
                    break
                if daemon.poll() is not None or time.monotonic() > deadline:
                    print((home / "daemon.log").read_text()[-3000:])
                    print("the topics did not catch up with the tables")
                    return 1
                time.sleep(0.3)
        print("4. the topics, replayed, equal the tables:")
        for name in tables:
            print(f"     shop.public.{name:<10} {len(topics[name]):>4} keys  ==  table {name} {len(tables[name]):>4} rows")
        log_.close()
        print("\n$ cdc status")
        subprocess.run([sys.executable, "-m", "cdc.cli", "status", str(config)], cwd=home)
        print("\n$ cdc tail ... shop.public.orders (the last 3 records)")
        ends = open_log(loaded.log).end_offsets("shop.public.orders")
        total = sum(ends.values())
        out = subprocess.run([sys.executable, "-m", "cdc.cli", "tail", str(config), "shop.public.orders",
                              "--from-beginning", "--max", str(total)], cwd=home, capture_output=True, text=True)
        records = [block for block in out.stdout.split("\nshop.") if block.strip()]
        for block in records[-3:]:
            print(("shop." + block) if not block.startswith("shop.") else block)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        code = daemon.wait(30)
        db.close()
    print(f"\nthe daemon drained and exited with {code}; config and data are in {home}")
    return 0 if code == 0 else 1
