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
        if held and passed is not None:  # held: a record of this kind passed before
            record.msg = f"{record.getMessage()} (and {held} more like it in the last {now - passed:.0f}s)"
            record.args = ()
        return True


REPEATS = RepeatFilter()

# librdkafka's "<broker>/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after
# 1ms in state CONNECT)", in its log lines and its _TRANSPORT error events alike.
_CONNECT_FAILED = re.compile(r"Connect to (\S+) failed: (.*?)(?: \(after \d+ms in state \w+\))?$")


class Unreachable(logging.Filter):
    """Folds librdkafka's lines about brokers it cannot connect to into the typed error of the
    call that waited on them: the newest address tried and why are kept (``last``), and the lines
    themselves go down to DEBUG, so a log that cannot be reached is said once, in one line that
    also names the setting (``describe``; cdc.log.kafka's errors), not three times."""

    def __init__(self) -> None:
        super().__init__()
        self.last: tuple[str, str, float] | None = None  # (address tried, why, when)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        found = _CONNECT_FAILED.search(text)
        if found is not None:
            self.last = (found.group(1), found.group(2), time.monotonic())
        if found is not None or "_ALL_BROKERS_DOWN" in text:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return LOGGER.isEnabledFor(logging.DEBUG)
        return True

    def describe(self, within: float = 120.0) -> str | None:
        """``tried <address>: <why>`` of the newest connect failure, if recent."""
        last = self.last
        if last is None or time.monotonic() - last[2] > within:
            return None
        return f"tried {last[0]}: {last[1]}"


UNREACHABLE = Unreachable()
LOGGER.addFilter(UNREACHABLE)  # before the repeat filter: a folded line counts as no repeat
LOGGER.addFilter(REPEATS)


def on_error(err: KafkaError) -> None:
    """``error_cb``: a client-level error (all brokers down, authentication, a fatal error).
    librdkafka goes on retrying the transient ones by itself; the calls that wait on them fail
    with a typed error where they are made, so here it is only logged (through the filter)."""
    if err.fatal():
        level = logging.ERROR
    elif err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
        level = logging.DEBUG  # said by the typed error of the call that waits on the brokers
        UNREACHABLE.filter(logging.makeLogRecord({"msg": err.str()}))
    else:
        level = logging.WARNING
    LOGGER.log(level, "kafka client: %s: %s", err.name(), err.str())
