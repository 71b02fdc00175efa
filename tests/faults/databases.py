"""The captured table in each source database: its statements for the writer, and its rows.

Both have ``docs (id, seq, small, big)`` with ``big`` a ~12 kB incompressible text (PostgreSQL
keeps it out of line in TOAST; an UPDATE that leaves it alone does not log it, the case of #12
item 1); the MariaDB table also has ``blob`` (a ~6 kB random MEDIUMBLOB).
"""

from __future__ import annotations

import base64
import sqlite3
from urllib.parse import urlparse

import psycopg2
import pymysql


def mysql_connect(url: str, database: str | None, **kwargs):
    parsed = urlparse(url)
    kwargs.setdefault("autocommit", True)
    return pymysql.connect(host=parsed.hostname, port=parsed.port or 3306, user=parsed.username or "root",
                           password=parsed.password or "", database=database, **kwargs)


class _DocsStatements:
    """The writer's statements that read the same in both databases (``%s`` placeholders in both
    drivers); each database's class adds its ``insert`` and ``update_big``."""

    @staticmethod
    def ids(conn) -> list[int]:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM docs")
            ids = [r[0] for r in cur.fetchall()]
        conn.commit()
        return ids

    @staticmethod
    def update_small(conn, id_: int, seq: int) -> None:
        with conn.cursor() as cur:
            cur.execute("UPDATE docs SET seq = %s, small = %s WHERE id = %s", (seq, f"upd {seq}", id_))

    @staticmethod
    def update_key(conn, old: int, new: int, seq: int) -> None:
        with conn.cursor() as cur:
            cur.execute("UPDATE docs SET id = %s, seq = %s WHERE id = %s", (new, seq, old))

    @staticmethod
    def delete(conn, id_: int) -> None:
        with conn.cursor() as cur:
            cur.execute("DELETE FROM docs WHERE id = %s", (id_,))


class PostgresDocs(_DocsStatements):
    columns = ("id", "seq", "small", "big")

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def create(self, seed_rows: int, big) -> None:
        conn = self.connect()
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE docs (id bigint PRIMARY KEY, seq bigint NOT NULL, small text, big text)")
            for i in range(1, seed_rows + 1):
                cur.execute("INSERT INTO docs VALUES (%s, 0, %s, %s)", (i, f"seed {i}", big()))
        conn.commit()
        conn.close()

    def connect(self):
        return psycopg2.connect(self.dsn, connect_timeout=5)

    @staticmethod
    def is_disconnect(err: BaseException) -> bool:
        return isinstance(err, (psycopg2.OperationalError, psycopg2.InterfaceError))

    @staticmethod
    def insert(conn, id_: int, seq: int, small: str, big: str) -> None:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO docs VALUES (%s, %s, %s, %s)", (id_, seq, small, big))

    @staticmethod
    def update_big(conn, id_: int, seq: int, big: str) -> None:
        with conn.cursor() as cur:
            cur.execute("UPDATE docs SET seq = %s, big = %s WHERE id = %s", (seq, big, id_))

    def rows(self) -> dict[int, dict]:
        return pg_rows(self.dsn, self.columns)

    @staticmethod
    def from_topic(row: dict) -> dict:
        return row


class MariaDbDocs(_DocsStatements):
    columns = ("id", "seq", "small", "big", "blob")

    def __init__(self, url: str, database: str) -> None:
        self.url, self.database = url, database

    def create(self, seed_rows: int, big) -> None:
        conn = self.connect()
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE docs (id bigint PRIMARY KEY, seq bigint NOT NULL, small varchar(100), "
                        "big longtext, `blob` mediumblob)")
            for i in range(1, seed_rows + 1):
                text = big()
                cur.execute("INSERT INTO docs VALUES (%s, 0, %s, %s, %s)",
                            (i, f"seed {i}", text, _blob(text)))
        conn.commit()
        conn.close()

    def connect(self):
        return mysql_connect(self.url, self.database, connect_timeout=5, read_timeout=30, write_timeout=30,
                             autocommit=False)

    @staticmethod
    def is_disconnect(err: BaseException) -> bool:
        return isinstance(err, (pymysql.err.OperationalError, pymysql.err.InterfaceError))

    @staticmethod
    def insert(conn, id_: int, seq: int, small: str, big: str) -> None:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO docs VALUES (%s, %s, %s, %s, %s)", (id_, seq, small, big, _blob(big)))

    @staticmethod
    def update_big(conn, id_: int, seq: int, big: str) -> None:
        with conn.cursor() as cur:
            cur.execute("UPDATE docs SET seq = %s, big = %s, `blob` = %s WHERE id = %s", (seq, big, _blob(big), id_))

    def rows(self) -> dict[int, dict]:
        conn = mysql_connect(self.url, self.database)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id, seq, small, big, `blob` FROM docs")
                return {r[0]: dict(zip(self.columns, (r[0], r[1], r[2], r[3], bytes(r[4])))) for r in cur.fetchall()}
        finally:
            conn.close()

    @staticmethod
    def from_topic(row: dict) -> dict:
        return {**row, "blob": base64.b64decode(row["blob"])}


def _blob(text: str) -> bytes:
    """~6 kB of binary (random, as the text is) with every byte value, NUL included."""
    return base64.b64decode(text)[: len(text) // 2]


def pg_rows(dsn: str, columns: tuple[str, ...]) -> dict[int, dict]:
    conn = psycopg2.connect(dsn, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(_quote(c) for c in columns)} FROM docs")
            return {r[0]: dict(zip(columns, (bytes(v) if isinstance(v, memoryview) else v for v in r)))
                    for r in cur.fetchall()}
    finally:
        conn.close()


def sqlite_rows(path: str, columns: tuple[str, ...]) -> dict[int, dict]:
    conn = sqlite3.connect(path, timeout=30)
    try:
        rows = conn.execute(f"SELECT {', '.join(_quote(c) for c in columns)} FROM docs").fetchall()
        return {r[0]: dict(zip(columns, r)) for r in rows}
    finally:
        conn.close()


def max_seq_pg(dsn: str) -> int:
    conn = psycopg2.connect(dsn, connect_timeout=3)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT coalesce(max(seq), 0) FROM docs")
            return cur.fetchone()[0]
    finally:
        conn.close()


def max_seq_sqlite(path: str) -> int:
    conn = sqlite3.connect(path, timeout=5)
    try:
        return conn.execute("SELECT coalesce(max(seq), 0) FROM docs").fetchone()[0]
    finally:
        conn.close()


def _quote(column: str) -> str:
    return f'"{column}"'
