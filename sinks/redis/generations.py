"""Generations for ``cdc rebuild``: each one a key namespace, a pointer key naming the current one.

Generation 1 writes under ``<prefix>:``, generation N under ``<prefix>.g<N>:`` (keys.py). Readers
(and ``wait.row_key``/``wait.wait_for``) read ``<prefix>.generation`` first and use that namespace;
absent means 1. A rebuild writes generation N+1 from offset 0 while readers keep N, then
``switch`` sets the pointer (one SET: readers move at once), then ``drop`` deletes N's keys in a
background thread with SCAN and UNLINK in small pipelines (never KEYS, never a blocking DEL of a
big value). A drop in progress is listed in ``<prefix>.dropping``, so a process that dies during it
finishes it at its next start.
"""

from __future__ import annotations

import logging
import threading

from sinks.redis.keys import generation_pointer, namespace

log = logging.getLogger(__name__)

SCAN_COUNT = 1000


def dropping_key(prefix: str) -> str:
    return f"{prefix}.dropping"


class Generations:
    """Threading: the sink's thread calls everything; ``drop`` returns at once and deletes in a
    thread of its own, which ``wait`` joins."""

    def __init__(self, client, prefix: str, name: str) -> None:
        self.client = client
        self.prefix = prefix
        self.name = name
        self._threads: list[threading.Thread] = []

    def current(self) -> int:
        stored = self.client.get(generation_pointer(self.prefix))
        return int(stored) if stored is not None else 1

    def open(self, generation: int) -> None:
        """An empty namespace for ``generation`` (leftovers of an unfinished rebuild are removed)."""
        removed = delete_namespace(self.client, namespace(self.prefix, generation))
        if removed:
            log.info("redis sink %s: removed %d leftover keys of generation %d", self.name, removed, generation)

    def switch(self, generation: int) -> None:
        self.client.set(generation_pointer(self.prefix), generation)

    def drop(self, generation: int) -> None:
        self.client.sadd(dropping_key(self.prefix), generation)
        self._start_drop(generation)

    def resume_drops(self) -> None:
        current = self.current()
        for member in self.client.smembers(dropping_key(self.prefix)):
            generation = int(member)
            if generation != current:
                self._start_drop(generation)

    def _start_drop(self, generation: int) -> None:
        thread = threading.Thread(target=self._drop, args=(generation,), name=f"drop-g{generation}")
        thread.start()
        self._threads.append(thread)

    def _drop(self, generation: int) -> None:
        try:
            removed = delete_namespace(self.client, namespace(self.prefix, generation))
            self.client.srem(dropping_key(self.prefix), generation)
            log.info("redis sink %s: generation %d dropped (%d keys)", self.name, generation, removed)
        except Exception as err:  # noqa: BLE001 - finished at the next start (listed in .dropping)
            log.warning("redis sink %s: dropping generation %d failed (%s); the next start resumes it",
                        self.name, generation, err)

    def wait(self) -> None:
        for thread in self._threads:
            thread.join()
        self._threads.clear()


def delete_namespace(client, ns: str) -> int:
    """UNLINK every key under ``<ns>:`` found by SCAN; the number of keys removed."""
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in ns) + ":*"
    removed = 0
    batch: list = []
    for key in client.scan_iter(match=pattern, count=SCAN_COUNT):
        batch.append(key)
        if len(batch) >= SCAN_COUNT:
            removed += _unlink(client, batch)
            batch = []
    if batch:
        removed += _unlink(client, batch)
    return removed


def _unlink(client, keys: list) -> int:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    return sum(pipe.execute())
