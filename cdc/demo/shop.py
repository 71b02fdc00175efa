"""The demo's shop: its tables in PostgreSQL and MariaDB, and the live changes made to them.

PostgreSQL (database ``shop_demo``): ``customers`` and ``orders``. MariaDB (database
``shop_inventory``): ``products``. Both are recreated from scratch at every run, so a second run
starts where the first did.
"""

from __future__ import annotations

import random
from urllib.parse import urlparse

import orjson

PG_DATABASE = "shop_demo"
MARIA_DATABASE = "shop_inventory"

PG_SCHEMA = """
CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, email text UNIQUE, tier integer NOT NULL,
                        joined timestamptz NOT NULL DEFAULT now());
CREATE TABLE orders (id serial PRIMARY KEY, customer_id int REFERENCES customers(id) ON DELETE CASCADE,
                     total numeric(10,2) NOT NULL, status text NOT NULL DEFAULT 'new', items jsonb);
INSERT INTO customers (name, email, tier) SELECT 'customer ' || g, 'c' || g || '@example.com', 1 + g % 3
  FROM generate_series(1, 50) g;
INSERT INTO orders (customer_id, total, items) SELECT 1 + g % 50, (g * 7 % 1000) / 10.0,
  jsonb_build_array(jsonb_build_object('sku', 'A' || g, 'qty', 1 + g % 3)) FROM generate_series(1, 200) g;
"""

MARIA_SCHEMA = [
    """CREATE TABLE products (id int PRIMARY KEY AUTO_INCREMENT, sku varchar(32) NOT NULL UNIQUE,
       name varchar(100) NOT NULL, stock int NOT NULL, price decimal(10,2) NOT NULL)""",
    """INSERT INTO products (sku, name, stock, price)
       SELECT CONCAT('SKU-', seq), CONCAT('product ', seq), seq * 3 % 40, seq * 1.25
       FROM seq_1_to_40""",
]

# The schema change: the tier becomes a name. An integer field cannot become text in an existing
# OpenSearch index, so the search sink rebuilds the index (and the warehouse its table).
SCHEMA_CHANGE = "ALTER TABLE customers ALTER COLUMN tier TYPE text USING tier::text"
TIERS = ("bronze", "silver", "gold")


def reset_postgres(admin_dsn: str) -> str:
    """Recreate the database (dropping the slots of an earlier run); returns its DSN."""
    import psycopg2

    admin = psycopg2.connect(admin_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s AND NOT active", (PG_DATABASE,))
        cur.execute(f'DROP DATABASE IF EXISTS "{PG_DATABASE}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{PG_DATABASE}"')
    admin.close()
    dsn = admin_dsn.rsplit("/", 1)[0] + "/" + PG_DATABASE
    db = psycopg2.connect(dsn)
    db.autocommit = True
    with db.cursor() as cur:
        cur.execute(PG_SCHEMA)
    db.close()
    return dsn


def wait_slots_released(dsn: str, timeout: float) -> None:
    """Until no walsender holds a slot of the database of ``dsn`` (at most ``timeout`` seconds)."""
    import time

    import psycopg2

    conn = psycopg2.connect(dsn, connect_timeout=5)
    conn.autocommit = True
    deadline = time.monotonic() + timeout
    try:
        with conn.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database() AND active")
                row = cur.fetchone()
                assert row is not None  # an aggregate without GROUP BY returns exactly one row
                if row[0] == 0:
                    return
                time.sleep(0.2)
    finally:
        conn.close()


def maria_connect(url: str, database: str | None = None):
    import pymysql

    parsed = urlparse(url)
    return pymysql.connect(host=parsed.hostname, port=parsed.port or 3306, user=parsed.username or "root",
                           password=parsed.password or "", database=database, autocommit=True)


def reset_mariadb(url: str) -> None:
    conn = maria_connect(url)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{MARIA_DATABASE}`")
        cur.execute(f"CREATE DATABASE `{MARIA_DATABASE}`")
        cur.execute(f"USE `{MARIA_DATABASE}`")
        for statement in MARIA_SCHEMA:
            cur.execute(statement)
    conn.close()


def pg_change(cur, rng: random.Random, i: int, tier_is_text: bool) -> None:
    """One live change of the PostgreSQL shop: an insert, an update, a delete or a key change."""
    choice = rng.random()
    if choice < 0.3:
        cur.execute("INSERT INTO orders (customer_id, total, items) VALUES (%s, %s, %s)",
                    (rng.randrange(1, 51), rng.randrange(100, 99_999) / 100,
                     orjson.dumps([{"sku": f"B{i}", "qty": 1}]).decode()))
    elif choice < 0.6:
        cur.execute("UPDATE orders SET status = %s WHERE id = (SELECT id FROM orders ORDER BY random() LIMIT 1)",
                    (rng.choice(["paid", "shipped", "delivered"]),))
    elif choice < 0.72:
        cur.execute("DELETE FROM orders WHERE id = (SELECT id FROM orders ORDER BY random() LIMIT 1)")
    elif choice < 0.95:
        tier = rng.choice(TIERS) if tier_is_text else rng.randrange(1, 4)
        cur.execute("UPDATE customers SET email = %s, tier = %s WHERE id = %s",
                    (f"vip{i}@example.com", tier, rng.randrange(1, 51)))
    else:
        cur.execute("UPDATE orders SET id = id + 100000 WHERE id = (SELECT min(id) FROM orders WHERE id < 100000)")


def maria_change(cur, rng: random.Random, i: int) -> None:
    """One live change of the MariaDB inventory."""
    choice = rng.random()
    if choice < 0.25:
        cur.execute("INSERT INTO products (sku, name, stock, price) VALUES (%s, %s, %s, %s)",
                    (f"NEW-{i}", f"new product {i}", rng.randrange(0, 50), rng.randrange(100, 9_999) / 100))
    elif choice < 0.85:
        cur.execute("UPDATE products SET stock = %s WHERE id = (SELECT id FROM (SELECT id FROM products "
                    "ORDER BY RAND() LIMIT 1) AS pick)", (rng.randrange(0, 100),))
    else:
        cur.execute("DELETE FROM products WHERE id = (SELECT id FROM (SELECT id FROM products "
                    "ORDER BY RAND() LIMIT 1) AS pick)")
