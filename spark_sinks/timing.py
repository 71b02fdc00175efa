"""Where a micro-batch's time goes: wall seconds per named phase.

A micro-batch is a handful of Spark jobs and driver-side metadata reads; on a small or busy
machine the fixed cost of each dominates. ``PhaseClock`` adds up the wall time spent in each
named phase of one batch, so ``BatchReport.phases`` (and ``bench/spark_merge.py``) can say
which one it was. Only the foreachBatch thread uses a clock (see ``job.py``'s threading note).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseClock:
    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + time.monotonic() - began

    def take(self) -> dict[str, float]:
        """The phases timed since the last ``take``, in the order they first ran; resets."""
        seconds, self._seconds = self._seconds, {}
        return seconds
