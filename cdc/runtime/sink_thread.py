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

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from cdc.log.base import TopicPartition


class SinkThread:
    """One worker thread for every call on one sink."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sink-{name}")

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the sink's thread and wait for it; its exception is raised here."""
        return self._executor.submit(fn, *args).result()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._executor.submit(fn, *args)

    def close(self) -> None:
        """Wait for what was submitted (a write in flight ends, or fails, before the sink stops)."""
        self._executor.shutdown(wait=True)


@dataclass
class PendingWrite:
    """A batch handed to the sink's thread: the offsets to commit once its write succeeded.
    ``future``: the write itself, or, pipelined, its submission (a ``write_pipeline.Submitted``
    whose completions are waited for next); ``batch``: pipelined, the events, kept to write them
    again if the completion fails."""

    future: Future
    ends: dict[TopicPartition, int]
    events: int
    batch: list | None = None
    settled: bool = False  # waited for (and committed, if it succeeded): by the loop or a revocation
