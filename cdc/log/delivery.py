"""Which checkpoint is safe: everything published before it has been acknowledged by the log.

Publishes are numbered in order. Each carries the count of its records and, optionally, a
checkpoint (a source position). Acknowledgements arrive in any order (Kafka partitions complete
independently); the safe checkpoint is the one of the latest publish such that it and every
earlier publish are fully acknowledged. One failed delivery poisons everything after it: nothing
past the failure is ever reported safe.

Not thread-safe: the producer's delivery callbacks run inside ``poll``/``flush`` on the caller's
thread (confluent-kafka's rule), the same thread that publishes.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from cdc.errors import DeliveryError

P = TypeVar("P")


class Pending(Generic[P]):
    """One publish: ``total`` records counted so far, ``remaining`` of them not yet acknowledged.

    A delivery callback on the hot path only does ``entry.remaining -= 1``; the totals are
    derived from the entries when asked.
    """

    __slots__ = ("remaining", "total", "checkpoint")

    def __init__(self, remaining: int, checkpoint: P | None) -> None:
        self.remaining = remaining
        self.total = remaining
        self.checkpoint = checkpoint

    def add(self, count: int) -> None:
        """``count`` more records belong to this publish (counted as they are produced)."""
        self.remaining += count
        self.total += count


class DeliveryTracker(Generic[P]):
    def __init__(self) -> None:
        self._pending: deque[Pending[P]] = deque()
        self._safe: P | None = None
        self._error: DeliveryError | None = None
        self._delivered = 0  # records of the entries already retired

    def begin(self, count: int, checkpoint: P | None) -> Pending[P]:
        entry = Pending(count, checkpoint)
        self._pending.append(entry)
        return entry

    def ack(self, entry: Pending[P], error: DeliveryError | None = None) -> None:
        entry.remaining -= 1
        if error is not None:
            entry.total -= 1  # not delivered
            if self._error is None:
                self._error = error

    def safe(self) -> P | None:
        """The newest checkpoint all of whose records, and all earlier ones, are acknowledged.

        Raises the first delivery error once one happened: the caller must stop and resume from
        the last safe checkpoint it stored.
        """
        if self._error is not None:
            raise self._error
        pending = self._pending
        while pending and pending[0].remaining == 0:
            entry = pending.popleft()
            self._delivered += entry.total
            if entry.checkpoint is not None:
                self._safe = entry.checkpoint
        return self._safe

    @property
    def outstanding(self) -> int:
        """Records counted and not yet acknowledged."""
        return sum(entry.remaining for entry in self._pending)

    @property
    def delivered(self) -> int:
        """Records acknowledged (of retired entries, and of those still pending)."""
        return self._delivered + sum(e.total - e.remaining for e in self._pending)

    @property
    def idle(self) -> bool:
        return self.outstanding == 0
