"""Which checkpoint is safe: everything published before it has been acknowledged by the log.

Acknowledgements are taken in bulk, at *drain points*: moments when the producer holds nothing
unacknowledged (librdkafka's out-queue is empty and every error report has been served). At such
a moment every record published so far is either delivered or its failure was reported, so the
newest checkpoint published becomes safe unless a failure was. The writer reaches a drain point by
itself whenever the stream pauses, and forces one (a flush) when the safe checkpoint has not moved
for ``barrier_interval`` seconds under a stream that never pauses.

Why not count each record's acknowledgement: a delivery report per record made librdkafka build a
Python message (copying its key and value) and call back into Python for every record, about
0.2 µs of the publishing thread's time per record (bench/publish.py). With reports for failures
only, a success makes no Python object and no Python call. It is not free: confluent-kafka gives
every message a state of its own and its delivery trampoline takes the GIL to free it, report or
not, about 0.3 µs per record in the thread that runs ``poll``/``flush`` (``deliveries`` in
bench/snapshot_produce.py; the same with no ``on_delivery`` at all), which its public API offers
no way around.

One failure poisons everything after it: nothing past it is ever reported safe. Not thread-safe:
the producer's error reports run inside ``poll``/``flush`` on the publishing thread.
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

from cdc.errors import DeliveryError

P = TypeVar("P")


class DeliveryTracker(Generic[P]):
    def __init__(self, barrier_interval: float = 1.0) -> None:
        self.barrier_interval = barrier_interval
        self._latest: P | None = None  # newest checkpoint published
        self._safe: P | None = None
        self._error: DeliveryError | None = None
        self._drained_at = time.monotonic()

    def published(self, checkpoint: P | None) -> None:
        """A publish ended: every one of its records is with the producer."""
        if checkpoint is not None:
            self._latest = checkpoint

    def failed(self, error: DeliveryError) -> None:
        """A record was not delivered (the first failure is the one reported)."""
        if self._error is None:
            self._error = error

    def drained(self) -> None:
        """Nothing is unacknowledged and every failure report has been served."""
        self._drained_at = time.monotonic()
        if self._error is None:
            self._safe = self._latest

    def barrier_due(self) -> bool:
        """The safe checkpoint has waited ``barrier_interval`` for a drain point."""
        return (self._latest != self._safe
                and time.monotonic() - self._drained_at >= self.barrier_interval)

    def safe(self) -> P | None:
        """The newest checkpoint all of whose records, and all earlier ones, are acknowledged.

        Raises the first delivery error once one happened: the caller must stop and resume from
        the last safe checkpoint it stored.
        """
        if self._error is not None:
            raise self._error
        return self._safe
