"""Read a snapshot with several workers at once, handing the rows over in bounded batches.

A snapshot is a list of tasks (a table, or a range of one). Each worker owns a connection that
is already inside the consistent snapshot (the caller opens them all *before* the snapshot's
exporter goes away), takes tasks from a shared list, and puts batches of events on a bounded
queue: when the consumer is slower than the readers, they wait, so memory stays bounded.

Threading: workers are threads (the database does the work in its own processes, and the
drivers release the GIL while waiting); ``next_batch`` and ``close`` are for one consumer thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")
Ctx = TypeVar("Ctx")

log = logging.getLogger(__name__)

_DONE = object()


class SnapshotCancelled(Exception):
    """Raised inside a worker's emit() once the reader is closed: stop reading."""


class ParallelSnapshot(Generic[Ctx, T]):
    def __init__(self, contexts: list[Ctx], tasks: Iterable[T],
                 read: Callable[[Ctx, T, Callable[[list], None]], None], *,
                 queue_batches: int = 8, name: str = "snapshot") -> None:
        self._tasks = list(tasks)
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_batches)
        self._closed = threading.Event()
        self._running = len(contexts)
        self._error: BaseException | None = None
        self.tasks_total = len(self._tasks)
        self.tasks_done = 0
        self._threads = [threading.Thread(target=self._work, args=(ctx, read), name=f"{name}-{i}", daemon=True)
                         for i, ctx in enumerate(contexts)]
        for thread in self._threads:
            thread.start()

    def _emit(self, events: list) -> None:
        while not self._closed.is_set():
            try:
                self._queue.put(events, timeout=0.2)
                return
            except queue.Full:
                continue
        raise SnapshotCancelled()

    def _work(self, ctx: Ctx, read) -> None:
        try:
            while not self._closed.is_set():
                with self._lock:
                    if not self._tasks:
                        break
                    task = self._tasks.pop(0)
                read(ctx, task, self._emit)
                with self._lock:
                    self.tasks_done += 1
        except SnapshotCancelled:
            pass
        except BaseException as err:  # handed to the consumer, which raises it
            with self._lock:
                if self._error is None:
                    self._error = err
            self._closed.set()
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
                self._queue.put(_DONE)

    def next_batch(self, timeout: float) -> list | None:
        """The next batch of events; ``None`` if none came within ``timeout``; raises a worker's
        error; ``StopIteration`` once every task is read."""
        if self._error is not None:
            raise self._error
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _DONE:
            if self._error is not None:
                raise self._error
            raise StopIteration
        return item

    def close(self) -> None:
        self._closed.set()
        while True:  # unblock workers waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for thread in self._threads:
            thread.join(timeout=10)
