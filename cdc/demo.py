"""``cdc demo``: a small shop schema in the local PostgreSQL, live changes, and what the WAL says.

This shows the part of the pipeline that exists so far, for real: a logical replication slot on a
running server, a writer making live changes, and a replication connection reading those changes
back as they commit. It grows into the full pipeline (source -> embedded log -> sink) as the
framework lands.
"""

from __future__ import annotations

import argparse
import threading
import time

SCHEMA = """
CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, email text UNIQUE);
CREATE TABLE orders (id serial PRIMARY KEY, customer_id int REFERENCES customers(id),
                     total numeric(10,2) NOT NULL, status text NOT NULL DEFAULT 'new');
"""

WORKLOAD = [
    "INSERT INTO customers (name, email) VALUES ('Ada', 'ada@example.com'), ('Linus', 'linus@example.com')",
    "INSERT INTO orders (customer_id, total) VALUES (1, 19.99), (2, 5.00), (1, 42.50)",
    "UPDATE orders SET status = 'paid' WHERE id = 1",
    "UPDATE customers SET email = 'ada@lovelace.dev' WHERE id = 1",
    "DELETE FROM orders WHERE id = 2",
]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="run the demo pipeline on the local stack")
    demo.add_argument("--database", default="shop_demo")
    demo.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import psycopg2
    import psycopg2.extras

    from cdc.dev import stack

    env = stack.up(["postgres"])
    admin = psycopg2.connect(env["PG_DSN"])
    admin.autocommit = True
    slot = f"{args.database}_demo"
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s", (slot,))
        cur.execute(f'DROP DATABASE IF EXISTS "{args.database}"')
        cur.execute(f'CREATE DATABASE "{args.database}"')
    admin.close()
    dsn = env["PG_DSN"].rsplit("/", 1)[0] + "/" + args.database
    db = psycopg2.connect(dsn)
    db.autocommit = True
    with db.cursor() as cur:
        cur.execute(SCHEMA)
        cur.execute("SELECT lsn FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
        print(f"created slot {slot} at {cur.fetchone()[0]} in database {args.database}")

    def write() -> None:
        with db.cursor() as cur:
            for statement in WORKLOAD:
                time.sleep(0.3)
                cur.execute(statement)
                print(f"  writer: {statement}")

    writer = threading.Thread(target=write)
    writer.start()
    repl = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    seen = commits = 0
    deadline = time.monotonic() + 30
    with repl.cursor() as cur:
        cur.start_replication(slot_name=slot, decode=True, options={"include-xids": "0"})
        while commits < len(WORKLOAD) and time.monotonic() < deadline:  # one transaction each
            message = cur.read_message()
            if message is None:
                time.sleep(0.05)
                continue
            seen += 1
            commits += message.payload.startswith("COMMIT")
            print(f"  wal @{message.data_start:>10}: {message.payload}")
            cur.send_feedback(flush_lsn=message.data_start)
    writer.join()
    repl.close()
    with db.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        cur.execute("SELECT count(*) FROM customers"), print(f"customers: {cur.fetchone()[0]} rows")
        cur.execute("SELECT id, status, total FROM orders ORDER BY id")
        print("orders:", cur.fetchall())
    db.close()
    print(f"read {seen} WAL messages for {len(WORKLOAD)} statements")
    return 0 if commits == len(WORKLOAD) else 1
