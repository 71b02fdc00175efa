"""Capture pgoutput payloads from a real PostgreSQL server into ``tests/golden/pgoutput/``.

Run it again whenever the golden files should come from another server version::

    .venv/bin/python tests/golden/capture_pgoutput.py [--dsn postgresql://postgres@host:port/postgres]

(default DSN: ``PG_DSN`` from the environment or ``.cdc/dev.env``). It creates a scratch database,
tables covering what the decoder must handle, a publication and one pgoutput slot per capture, runs
the workload below, reads each slot through psycopg2's ``LogicalReplicationConnection``
(``decode=False``) and drops the database again. ``tests/unit/test_pgoutput_golden.py`` asserts on
values that come from this workload, so change both together.

Output, per capture ``<name>`` (``v1``, ``v2``, ``v3``, ``v2-binary``, as the server accepts them):

* ``<name>.bin``: the payloads in the order received, each framed as a 4-byte big-endian length
  followed by the payload bytes;
* ``manifest.json``: the server version, each capture's start options, message count and the
  sequence of message type letters, and the protocol versions/options the server refused.

Workload (each numbered item is one transaction unless noted):

1. inserts into every table (``all_types`` gets one full row and one row of NULLs);
2. updates: a plain one, a primary-key change, a composite-key change, a REPLICA IDENTITY FULL row,
   a TOASTed row updated on another column (its body comes back as "unchanged toast"), and a change
   of a REPLICA IDENTITY USING INDEX key;
3. deletes on the same tables;
4. a transactional logical message with an insert, then a non-transactional one (binary content);
5. ``TRUNCATE counters RESTART IDENTITY``; 6. ``TRUNCATE parent CASCADE`` (cascades to ``child``);
7. an insert in a session with replication origin ``golden_origin`` (origin LSN ``0/1234ABCD``,
   timestamp 2020-01-02 03:04:05 UTC);
8. a large transaction (streamed with protocol >= 2, ``logical_decoding_work_mem`` 64kB): 600 inserts,
   a non-transactional message, a transactional message, updates (one changing the key), a delete,
   an ``all_types`` insert (enum column: a Type message), ``TRUNCATE scratch``, a savepoint with 600
   inserts rolled back (a Stream Abort of the subtransaction), 100 more inserts, COMMIT;
9. a large transaction rolled back (a Stream Abort of the whole transaction);
10. the non-transactional message ``golden-end`` that ends the v1/v2/v3 captures;
11. for ``v2-binary`` only (its slot is created here): an ``all_types`` insert and a customer update
    changing the key, read with ``binary 'true'``, ended by the message ``golden-end-binary``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import struct
import sys
import time
from pathlib import Path

import psycopg2
import psycopg2.extras

HERE = Path(__file__).resolve().parent
OUT = HERE / "pgoutput"
DATABASE = "golden_pgoutput_capture"
PUBLICATION = "golden_pub"
END_PREFIX = b"golden-end\x00"
END_BINARY_PREFIX = b"golden-end-binary\x00"

# The walsender formats text values with its own settings: pin them so values do not depend on
# the server's defaults. A small logical_decoding_work_mem makes the large transactions stream.
SESSION_OPTIONS = ("-c logical_decoding_work_mem=64kB -c TimeZone=UTC -c DateStyle=ISO,MDY "
                   "-c IntervalStyle=postgres -c extra_float_digits=1")

TOAST_BODY = "toast:" + "".join(chr(ord("a") + i % 26) for i in range(3000))

SCHEMA = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text)",
    "CREATE TABLE order_lines (order_id int, line_no int, sku text NOT NULL, qty int NOT NULL,"
    " PRIMARY KEY (order_id, line_no))",
    "CREATE TABLE audit_log (id int, note text, at_ms bigint)",
    "ALTER TABLE audit_log REPLICA IDENTITY FULL",
    "CREATE TABLE documents (id int PRIMARY KEY, revision int NOT NULL, body text NOT NULL)",
    "ALTER TABLE documents ALTER COLUMN body SET STORAGE EXTERNAL",  # out of line, uncompressed
    "CREATE TABLE accounts (id int NOT NULL, code text NOT NULL, balance numeric(12,2))",
    "CREATE UNIQUE INDEX accounts_code ON accounts (code)",
    "ALTER TABLE accounts REPLICA IDENTITY USING INDEX accounts_code",
    """CREATE TABLE all_types (
        id int PRIMARY KEY, c_smallint int2, c_bigint int8, c_numeric numeric(10,2), c_real float4,
        c_double float8, c_bool bool, c_varchar varchar(20), c_char char(3), c_bytea bytea,
        c_date date, c_timestamp timestamp, c_timestamptz timestamptz, c_interval interval,
        c_uuid uuid, c_json json, c_jsonb jsonb, c_int_array int[], c_text_array text[],
        c_inet inet, c_mood mood, c_unicode text)""",
    "CREATE TABLE parent (id int PRIMARY KEY)",
    "CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent)",
    "CREATE TABLE counters (id serial PRIMARY KEY, n int)",
    "CREATE TABLE bulk (id int PRIMARY KEY, n int)",
    "CREATE TABLE scratch (id int PRIMARY KEY)",
    f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES",
]

ALL_TYPES_ROW = """INSERT INTO all_types VALUES (
    1, -32768, 9223372036854775807, 12345.67, 1.5, 2.25, true, 'varchar value', 'ab',
    '\\x00ff10'::bytea, '2024-02-29', '2024-02-29 13:14:15.123456', '2024-02-29 13:14:15.5+02',
    '1 day 02:03:04', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2]}', '{"b": {"c": null}}',
    '{1,NULL,3}', '{"x y",z}', '192.168.0.1/24', 'ok', 'żółw 🐢 naïve')"""

WORKLOAD = [
    # 1. inserts
    [
        "INSERT INTO customers VALUES (1, 'Ada', 'ada@example.com'), (2, 'Grace', NULL)",
        "INSERT INTO order_lines VALUES (10, 1, 'SKU-A', 2), (10, 2, 'SKU-B', 1)",
        "INSERT INTO audit_log VALUES (1, 'created', 1700000000000)",
        ("INSERT INTO documents VALUES (1, 1, %s)", (TOAST_BODY,)),
        "INSERT INTO accounts VALUES (1, 'ACC-1', 100.50)",
        ALL_TYPES_ROW,
        "INSERT INTO all_types (id) VALUES (2)",
        "INSERT INTO parent VALUES (1), (2)",
        "INSERT INTO child VALUES (1, 1)",
        "INSERT INTO counters (n) VALUES (7), (8)",
        "INSERT INTO scratch VALUES (1)",
    ],
    # 2. updates
    [
        "UPDATE customers SET email = 'ada@lovelace.dev' WHERE id = 1",
        "UPDATE customers SET id = 3 WHERE id = 2",
        "UPDATE order_lines SET qty = 5 WHERE order_id = 10 AND line_no = 1",
        "UPDATE order_lines SET line_no = 3 WHERE order_id = 10 AND line_no = 2",
        "UPDATE audit_log SET note = 'edited' WHERE id = 1",
        "UPDATE documents SET revision = 2 WHERE id = 1",
        "UPDATE accounts SET code = 'ACC-2', balance = 99.99 WHERE id = 1",
    ],
    # 3. deletes
    [
        "DELETE FROM customers WHERE id = 1",
        "DELETE FROM order_lines WHERE order_id = 10 AND line_no = 1",
        "DELETE FROM audit_log WHERE id = 1",
        "DELETE FROM documents WHERE id = 1",
        "DELETE FROM accounts WHERE id = 1",
    ],
    # 4. logical messages
    [
        "SELECT pg_logical_emit_message(true, 'golden-tx', 'inside a transaction')",
        "INSERT INTO customers VALUES (4, 'Linus', NULL)",
    ],
    ["SELECT pg_logical_emit_message(false, 'golden-nontx', '\\x0001ff'::bytea)"],
    # 5., 6. truncates
    ["TRUNCATE counters RESTART IDENTITY"],
    ["TRUNCATE parent CASCADE"],
]

ORIGIN_TRANSACTION = [
    "SELECT pg_replication_origin_xact_setup('0/1234ABCD', '2020-01-02 03:04:05+00')",
    "INSERT INTO customers VALUES (100, 'from-origin', NULL)",
]

STREAMED_COMMIT = [
    "INSERT INTO bulk SELECT g, g FROM generate_series(1, 600) g",
    "SELECT pg_logical_emit_message(false, 'golden-nontx-during-stream', 'between blocks')",
    "SELECT pg_logical_emit_message(true, 'golden-stream', 'in a streamed transaction')",
    "UPDATE bulk SET n = -n WHERE id <= 2",
    "UPDATE bulk SET id = 10000 WHERE id = 3",
    "DELETE FROM bulk WHERE id = 4",
    "INSERT INTO all_types (id, c_mood) VALUES (3, 'happy')",
    "TRUNCATE scratch",
    "SAVEPOINT s1",
    "INSERT INTO bulk SELECT g, g FROM generate_series(1001, 1600) g",
    "ROLLBACK TO SAVEPOINT s1",
    "INSERT INTO bulk SELECT g, g FROM generate_series(2001, 2100) g",
]

STREAMED_ABORT = ["INSERT INTO bulk SELECT g, g FROM generate_series(3001, 3600) g"]

BINARY_SECTION = [
    ALL_TYPES_ROW.replace("(\n    1,", "(\n    4,", 1),
    "UPDATE customers SET id = 5, name = 'Linus T.' WHERE id = 4",
]

# name -> (slot options, START_REPLICATION options); v4 needs PostgreSQL 16 or later.
CAPTURES = {
    "v1": ({}, {"proto_version": "1", "publication_names": PUBLICATION, "messages": "true"}),
    "v2": ({}, {"proto_version": "2", "publication_names": PUBLICATION, "messages": "true",
                "streaming": "on"}),
    "v3": ({"twophase": True}, {"proto_version": "3", "publication_names": PUBLICATION,
                                "messages": "true", "streaming": "on", "two_phase": "on"}),
    "v4": ({}, {"proto_version": "4", "publication_names": PUBLICATION, "messages": "true",
                "streaming": "parallel"}),
}
BINARY_CAPTURE = ("v2-binary", {"proto_version": "2", "publication_names": PUBLICATION,
                                "messages": "true", "binary": "true"})


def default_dsn() -> str:
    if os.environ.get("PG_DSN"):
        return os.environ["PG_DSN"]
    env_file = HERE.parent.parent / ".cdc" / "dev.env"
    for line in env_file.read_text().splitlines():
        if line.startswith("PG_DSN="):
            return line.split("=", 1)[1].strip()
    sys.exit(f"no --dsn given and no PG_DSN in the environment or {env_file}")


def run(conn, statements) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            sql, args = statement if isinstance(statement, tuple) else (statement, None)
            cur.execute(sql, args)
    conn.commit()


def create_slot(conn, name: str, twophase: bool = False) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)", (name, twophase))
    conn.commit()


def read_slot(dsn: str, slot: str, options: dict[str, str], end_marker: bytes,
              timeout: float = 60.0) -> list[bytes]:
    """Every payload from the slot's start up to and including the end-marker message."""
    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                            options=SESSION_OPTIONS)
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slot, decode=False, options=options)
        payloads: list[bytes] = []
        deadline = time.monotonic() + timeout
        while True:
            msg = cur.read_message()
            if msg is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"slot {slot}: no end marker after {len(payloads)} messages")
                select.select([cur], [], [], min(remaining, 1.0))
                continue
            payload = bytes(msg.payload)
            payloads.append(payload)
            if payload[:1] == b"M" and end_marker in payload[:64]:
                return payloads
    finally:
        conn.close()


def probe(dsn: str, slot: str, options: dict[str, str]) -> str | None:
    """None if the server starts replication with these options, else its error."""
    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                            options=SESSION_OPTIONS)
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slot, decode=False, options=options)
        # Options are checked when decoding starts: wait for the first message or an error.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if cur.read_message() is not None:
                return None
            select.select([cur], [], [], 0.5)
        return None
    except psycopg2.Error as err:
        return str(err).strip().splitlines()[0]
    finally:
        conn.close()


def write_frames(path: Path, payloads: list[bytes]) -> None:
    path.write_bytes(b"".join(struct.pack("!I", len(p)) + p for p in payloads))


def read_frames(name: str) -> list[bytes]:
    """The payloads of capture ``name`` (``"v1"``, ``"v2"``, ...), in the order received."""
    data = (OUT / f"{name}.bin").read_bytes()
    payloads, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("!I", data, pos)
        payloads.append(data[pos + 4:pos + 4 + length])
        pos += 4 + length
    return payloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="an admin DSN (default: PG_DSN of .cdc/dev.env)")
    args = parser.parse_args()
    admin_dsn = args.dsn or default_dsn()
    dsn = admin_dsn.rsplit("/", 1)[0] + "/" + DATABASE

    admin = psycopg2.connect(admin_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s AND NOT active", (DATABASE,))
        cur.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        cur.execute("SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin "
                    "WHERE roname = 'golden_origin'")
        cur.execute(f"CREATE DATABASE {DATABASE}")
        cur.execute("SHOW server_version")
        server_version = cur.fetchone()[0]
    try:
        conn = psycopg2.connect(dsn)
        run(conn, SCHEMA)
        for name, (slot_options, _) in CAPTURES.items():
            create_slot(conn, f"golden_{name}", **slot_options)

        for transaction in WORKLOAD:
            run(conn, transaction)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_replication_origin_create('golden_origin')")
            cur.execute("SELECT pg_replication_origin_session_setup('golden_origin')")
        conn.commit()
        run(conn, ORIGIN_TRANSACTION)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_replication_origin_session_reset()")
        conn.commit()
        run(conn, STREAMED_COMMIT)
        with conn.cursor() as cur:
            for statement in STREAMED_ABORT:
                cur.execute(statement)
        conn.rollback()
        run(conn, ["SELECT pg_logical_emit_message(false, 'golden-end', '')"])

        binary_name, binary_options = BINARY_CAPTURE
        create_slot(conn, "golden_binary")
        run(conn, BINARY_SECTION)
        run(conn, ["SELECT pg_logical_emit_message(false, 'golden-end-binary', '')"])
        conn.close()

        manifest = {"server_version": server_version, "session_options": SESSION_OPTIONS,
                    "frame_format": "4-byte big-endian length, then the payload", "captures": {},
                    "refused": {}}
        for name, (_, options) in CAPTURES.items():
            refusal = probe(dsn, f"golden_{name}", options)
            if refusal:
                # Also ask with the protocol version alone, to tell which part was refused.
                minimal = {"proto_version": options["proto_version"], "publication_names": PUBLICATION}
                manifest["refused"][name] = {"options": options, "error": refusal,
                                             "error_with_proto_version_only": probe(dsn, f"golden_{name}", minimal)}
                print(f"{name}: refused by the server: {manifest['refused'][name]}")
                continue
            payloads = read_slot(dsn, f"golden_{name}", options, END_PREFIX)
            _record(manifest, name, options, payloads)
        payloads = read_slot(dsn, "golden_binary", binary_options, END_BINARY_PREFIX)
        _record(manifest, binary_name, binary_options, payloads)
        (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    finally:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                        "AND pid <> pg_backend_pid()", (DATABASE,))
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE database = %s", (DATABASE,))
            cur.execute("SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin "
                        "WHERE roname = 'golden_origin'")
            cur.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.close()


def _record(manifest: dict, name: str, options: dict[str, str], payloads: list[bytes]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write_frames(OUT / f"{name}.bin", payloads)
    manifest["captures"][name] = {
        "file": f"{name}.bin", "options": options, "messages": len(payloads),
        "bytes": sum(len(p) for p in payloads),
        "types": _run_lengths(chr(p[0]) for p in payloads),
    }
    print(f"{name}: {len(payloads)} messages, {sum(len(p) for p in payloads)} bytes")


def _run_lengths(letters) -> str:
    """``"BIIIC"`` -> ``"B I*3 C"``: the message sequence, short enough to read."""
    runs: list[list] = []
    for letter in letters:
        if runs and runs[-1][0] == letter:
            runs[-1][1] += 1
        else:
            runs.append([letter, 1])
    return " ".join(letter if count == 1 else f"{letter}*{count}" for letter, count in runs)


if __name__ == "__main__":
    main()
