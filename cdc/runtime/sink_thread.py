"""The sink's own thread, so that the runner can read the next batch while the sink writes one.

Why: a sink's write mostly waits on its store (a database statement, a bulk request), and the
runner's reading mostly costs CPU (consuming records, decoding JSON). Done one after the other,
each waits for the other; overlapped, a batch is read and decoded while the previous one is
written. With the GIL this pays because the store's side runs elsewhere (another process, or C
code that releases the GIL while it waits).

Every call on the sink (``start``, ``write``, the generation methods, ``stop``) runs on this one
thread, so the plugin API's rule holds as written: one thread, one call at a time. The runner
keeps the log reader on its own thread (readers are single-threaded) and commits a batch's
offsets there, only after the write's future has succeeded: at most one write is in flight and
at most one batch is read ahead of it, so memory stays at about two batches. A ``PipelinedSink``
(cdc.api) keeps up to its ``writes_in_flight`` (2-3) submitted writes uncompleted, each holding
its events and its encoded requests until its completion returned: memory stays at about
``writes_in_flight`` + 1 batches (cdc/runtime/write_pipeline.py).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class SinkThread:
    """One worker thread for every call on one sink, from ``open`` to ``close`` (once per run)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None

    def open(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sink-{self.name}")

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the sink's thread and wait for it; its exception is raised here.
        Not open (outside a run): on the calling thread."""
        if self._executor is None:
            return fn(*args)
        return self._executor.submit(fn, *args).result()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        assert self._executor is not None, "the sink's thread is not open"
        return self._executor.submit(fn, *args)

    def close(self) -> None:
        """Wait for what was submitted (a write in flight ends, or fails, before the sink stops)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
