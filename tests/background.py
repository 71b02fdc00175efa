"""A test's helper thread (a writer, a watcher) that runs while a ``with`` block does."""

from __future__ import annotations

import random
import threading
import time

import psycopg2


class Background:
    """Runs ``_run`` in a thread from entering the ``with`` block; leaving it sets ``stop``, which
    ``_run`` checks to end, and joins the thread."""

    def __init__(self, daemon: bool = False) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=daemon)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


class PgWriter(Background):
    """Changes a PostgreSQL database until stopped: ``change(cur)`` makes one change,
    ``per_commit`` of them a transaction, ``pause`` seconds between transactions. ``changes``
    counts them; ``new_id()`` gives ids above 100000, for inserts and key changes."""

    per_commit = 10
    pause = 0.01

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__()
        self.dsn, self.rng = dsn, random.Random(seed)
        self.changes = 0
        self.next_id = 100_000

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def change(self, cur) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    for _ in range(self.per_commit):
                        self.change(cur)
                        self.changes += 1
                    conn.commit()
                    time.sleep(self.pause)
        finally:
            conn.close()


class ItemsWriter(PgWriter):
    """Changes ``items (id int PRIMARY KEY, qty int NOT NULL, note text)``, seeded with ids 1 to
    ``rows``: updates (qty and note), inserts and deletes, never of id 1 (a test's marker row)."""

    rows = 1000
    per_commit = 5
    pause = 0.02

    def change(self, cur) -> None:
        roll, some = self.rng.random(), self.rng.randrange(2, self.rows)
        if roll < 0.6:
            cur.execute("UPDATE items SET qty = qty + 1, note = %s WHERE id = %s", (f"w{self.changes}", some))
        elif roll < 0.8:
            cur.execute("INSERT INTO items VALUES (%s, 0, 'new')", (self.new_id(),))
        else:
            cur.execute("DELETE FROM items WHERE id = %s", (self.rng.randrange(2, self.next_id),))

