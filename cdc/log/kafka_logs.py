"""librdkafka's log, through Python logging, without the floods.

Every Kafka handle logs through ``LOGGER`` (confluent-kafka's ``logger`` setting), and its error
events come through ``on_error`` (``error_cb``). librdkafka queues its log lines until the next
``poll``, and retries a broker it cannot reach every few tens of milliseconds on each of its
threads: a metadata call against an unreachable broker used to print ~580 identical ``Connect to
... failed`` lines at once. ``RepeatFilter`` lets the first line of a kind through and holds back
its repeats (the same text once digits are ignored: handles, ports and "after 0ms" differ) for
``window`` seconds; the next one after that says how many were held back.
"""

from __future__ import annotations

import logging
import re
import threading
import time

from confluent_kafka import KafkaError

LOGGER = logging.getLogger("cdc.log.kafka.librdkafka")
_DIGITS = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Passes a record whose kind (its text with the digits taken out) was not seen within
    ``window`` seconds; counts the others and reports the count on the next one passed."""

    def __init__(self, window: float = 30.0, max_kinds: int = 1000) -> None:
        super().__init__()
        self.window = window
        self.max_kinds = max_kinds
        self._seen: dict[str, tuple[float, int]] = {}  # kind -> (when passed, held back since)
        self._lock = threading.Lock()  # librdkafka may log from the threads that call poll

    def filter(self, record: logging.LogRecord) -> bool:
        kind = f"{record.levelno} {_DIGITS.sub('#', record.getMessage())}"
        now = time.monotonic()
        with self._lock:
            passed, held = self._seen.get(kind, (None, 0))
            if passed is not None and now - passed < self.window:
                self._seen[kind] = (passed, held + 1)
                return False
            if len(self._seen) >= self.max_kinds:
                self._seen.clear()
            self._seen[kind] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} (and {held} more like it in the last {now - passed:.0f}s)"
            record.args = ()
        return True


REPEATS = RepeatFilter()
LOGGER.addFilter(REPEATS)


def on_error(err: KafkaError) -> None:
    """``error_cb``: a client-level error (all brokers down, authentication, a fatal error).
    librdkafka goes on retrying the transient ones by itself; the calls that wait on them fail
    with a typed error where they are made, so here it is only logged (through the filter)."""
    if err.fatal():
        level = logging.ERROR
    elif err.code() == KafkaError._TRANSPORT:
        level = logging.DEBUG  # the same text as librdkafka's own log line about it
    else:
        level = logging.WARNING
    LOGGER.log(level, "kafka client: %s: %s", err.name(), err.str())
