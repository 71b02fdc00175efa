"""Snapshot readers in processes: the same hand-over as ``snapshot/parallel.py``, without the GIL.

A reader thread shares the interpreter lock with the thread that encodes and produces the rows,
so in threads two readers read no faster than one. Here each reader is a process:

* ``open_reader()`` runs in the child and gives its reader (a connection inside the consistent
  snapshot). The child reports ``ready`` once it is open; the constructor returns only when every
  child did, so the caller may then let the snapshot's exporter go (PostgreSQL's exported
  snapshot lives only as long as the exporting transaction).
* ``submit(tasks)`` hands out the tasks; each child takes them from a shared queue and calls
  ``read(reader, task, emit)``; ``emit(item)`` puts the item on a bounded queue (readers wait when
  the consumer is slower, so memory stays bounded). Items cross the process boundary pickled, so
  they should be a few large bytes objects, not many small ones.

Children die with the parent: they are in its process group (``os.killpg`` of the daemon takes
them, SIGKILL; they ignore SIGTERM and SIGINT, which are the parent's to act on), they ask the kernel for SIGKILL when the parent dies (Linux ``PR_SET_PDEATHSIG``), and they
stop when the parent's pid changes (any other platform). ``open_reader``, ``read`` and the tasks
must be picklable (module-level functions, plain data).

Threading: ``next_batch``, ``submit`` and ``close`` are for one consumer thread.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from cdc.errors import RetriableError
from snapshot.parallel import SnapshotCancelled

log = logging.getLogger(__name__)

_READY, _ITEM, _TASK_DONE, _DONE, _ERROR = "ready", "item", "task", "done", "error"
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl: the pid check in _child_main still ends it
            pass


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling (it is raised again in the parent), else a RetriableError
    that names it."""
    import pickle

    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return RetriableError(f"snapshot reader process failed: {type(err).__name__}: {err}")


def _child_main(index: int, parent: int, open_reader: Callable[[], Any], read, tasks, results, stopping) -> None:
    _die_with_parent()
    # The parent decides when to stop: a stop sent to the process group (Ctrl-C, systemd's SIGTERM)
    # reaches the readers too, and the parent drains what they read before it ends them.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    reader = None

    def emit(item) -> None:
        while not stopping.is_set():
            if os.getppid() != parent:
                raise SnapshotCancelled()
            try:
                results.put((_ITEM, item), timeout=0.2)
                return
            except queue.Full:
                continue
        raise SnapshotCancelled()

    try:
        reader = open_reader()
        results.put((_READY, index))
        while not stopping.is_set():
            try:
                task = tasks.get(timeout=0.2)
            except queue.Empty:
                if os.getppid() != parent:
                    break
                continue
            if task is None:
                break
            read(reader, task, emit)
            results.put((_TASK_DONE, index))
        results.put((_DONE, index))
    except SnapshotCancelled:
        pass
    except BaseException as err:  # handed to the parent, which raises it
        results.put((_ERROR, _portable(err)))
    finally:
        if reader is not None:
            try:
                reader.close()
            except Exception:  # noqa: BLE001 - closing on the way out
                pass
        if stopping.is_set():
            results.cancel_join_thread()  # the parent no longer reads: do not wait to flush


class ProcessSnapshot:
    """``count`` reader processes; the interface of ``ParallelSnapshot`` plus ``submit``."""

    def __init__(self, open_reader: Callable[[], Any], read: Callable[[Any, Any, Callable], None], count: int, *,
                 queue_batches: int = 8, name: str = "snapshot", ready_timeout: float = 60.0) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process with a producer's threads
        self._tasks = context.Queue()
        self._results = context.Queue(maxsize=queue_batches)
        self._stopping = context.Event()
        self.count = count
        self._finished = 0
        self._error: BaseException | None = None
        self.tasks_total = 0
        self.tasks_done = 0
        self._processes = [context.Process(target=_child_main, name=f"{name}-{i}", daemon=True,
                                           args=(i, os.getpid(), open_reader, read, self._tasks, self._results,
                                                 self._stopping))
                           for i in range(count)]
        # Closed at exit if nobody did: multiprocessing's own exit hook, which runs after this one,
        # ends daemon children with SIGTERM, which readers ignore, then waits for them.
        atexit.register(self.close)
        try:
            for process in self._processes:
                process.start()
            self._wait_ready(ready_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ready = 0
        while ready < self.count:
            try:
                kind, value = self._results.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                dead = [p.name for p in self._processes if not p.is_alive()]
                if dead or time.monotonic() >= deadline:
                    raise RetriableError(f"snapshot reader processes did not open their snapshot "
                                         f"({', '.join(dead) or 'timed out'})") from None
                continue
            if kind == _ERROR:
                raise value
            ready += 1

    def submit(self, tasks: Iterable) -> None:
        tasks = list(tasks)
        self.tasks_total = len(tasks)
        for task in tasks:
            self._tasks.put(task)
        for _ in self._processes:
            self._tasks.put(None)

    def next_batch(self, timeout: float) -> Any:
        """The next item; ``None`` if none came within ``timeout``; raises a reader's error;
        ``StopIteration`` once every task is read."""
        if self._error is not None:
            raise self._error
        deadline = time.monotonic() + timeout
        while True:
            try:
                kind, value = self._results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in self._processes):
                    self._error = RetriableError("a snapshot reader process died "
                                                 f"(exit codes {[p.exitcode for p in self._processes]})")
                    raise self._error from None
                return None
            if kind == _ITEM:
                return value
            if kind == _TASK_DONE:
                self.tasks_done += 1
            elif kind == _DONE:
                self._finished += 1
                if self._finished == self.count:
                    raise StopIteration
            elif kind == _ERROR:
                self._error = value
                raise value

    def close(self) -> None:
        atexit.unregister(self.close)
        self._stopping.set()
        deadline = time.monotonic() + 10
        while any(p.is_alive() for p in self._processes) and time.monotonic() < deadline:
            try:  # unblock children waiting on a full queue
                self._results.get(timeout=0.05)
            except (queue.Empty, OSError, ValueError):
                pass
        for process in self._processes:
            if process.is_alive():
                process.kill()
            if process.pid is not None:
                process.join(timeout=5)
        for q in (self._tasks, self._results):
            q.cancel_join_thread()
            q.close()
