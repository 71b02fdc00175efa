"""Writing a batch into the sink's store: retries, poison isolation, dead letters.

``SinkWriter.write(batch)`` returns once every event of the batch is in the store or set aside;
only then may the runner commit the batch's offsets (sink_runner.py). Its rules:

1. A ``RetriableError`` retries the *same* batch after a backoff (``BACKOFF_FIRST`` s doubling
   to ``BACKOFF_MAX``): the offsets stay where they are, so nothing is skipped. The reader does
   not advance meanwhile: that is the backpressure. A stop during the backoff raises the error.
2. Any other error splits the batch in halves until the event that fails alone is found (a half
   that fails with a retriable error goes back to rule 1). That poison event goes to the
   dead-letter topic with the reason (``on_poison: dead_letter``; a letter always fits that
   topic, see dead_letters.py), or stops the sink (``stop``). The events around it are written.
3. More than ``POISON_RUN_LIMIT`` events failing alone in a row, none written between, is the
   sink or its store, not the events: the sink stops there rather than empty the topics into
   the dead letters. ``written`` (any write that succeeded) breaks the run.
4. A ``SchemaChangeError`` is never poison: the whole table needs a decision, so it is raised
   (``RebuildRequired``, one of them, makes the runner rebuild).

Threading: ``write`` and ``write_in_shape`` run on the sink's thread; ``poison`` also on the
runner's (records that cannot be decoded).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cdc.api import Sink
from cdc.api.stats import ConnectorStats
from cdc.errors import CdcError, PermanentError, SchemaChangeError
from cdc.log.base import LogRecord
from cdc.schema_order import split_by_schema
from cdc.sink_events import SinkEvent

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0
POISON_RUN_LIMIT = 50  # events failing alone in a row, none written between, before the sink stops

# (topic, partition, offset, reason, key, value, missing=...): a letter, durably (SinkRunner.dead_letter)
SetAside = Callable[..., None]


class SinkWriter:
    """``sink``'s writes with the rules above. ``stopping``: set by the runner at each run; a
    backoff ends early when it is set."""

    def __init__(self, sink: Sink, stats: ConnectorStats, report: Callable[[ConnectorStats], None], *,
                 set_aside: SetAside, fetch: Callable[[str, int, int], LogRecord | None],
                 dead_letter_topic: str) -> None:
        self.sink = sink
        self.stats = stats
        self.report = report
        self.name = sink.config.name
        self.on_poison = sink.config.on_poison
        self.dead_letter_topic = dead_letter_topic
        self.stopping: threading.Event | None = None
        self._set_aside = set_aside
        self._fetch = fetch
        self._poisons_in_row = 0  # events set aside since the last write that succeeded

    def _extra(self) -> dict:
        return {"connector": self.name, "phase": self.stats.phase}

    def _wait(self, seconds: float) -> bool:
        """Sleep unless stopping; True when the runner should stop."""
        if self.stopping is not None:
            return self.stopping.wait(seconds)
        time.sleep(seconds)
        return False

    def written(self) -> None:
        """A write succeeded (here or a pipelined one): the run of poison events is broken."""
        self._poisons_in_row = 0

    def write_in_shape(self, events: list[SinkEvent]) -> None:
        """One write per run of events with one shape per topic (cdc/schema_order.py)."""
        for part in split_by_schema(events):
            if part:
                self.write(part)

    def write(self, events: list[SinkEvent]) -> None:
        backoff = BACKOFF_FIRST
        phase = self.stats.phase if self.stats.phase != "retrying" else "streaming"
        while True:
            try:
                self.sink.write(events)
                self._poisons_in_row = 0
                if self.stats.phase == "retrying":
                    self.stats.progressed(phase)  # recovered: the health shows it at once
                    self.report(self.stats)
                return
            except SchemaChangeError:  # not the event's fault: the whole table needs a decision
                raise
            except CdcError as err:
                if not err.retriable:
                    break
                self.stats.failed_attempt(err)  # phase "retrying", with the error, its time, the count
                self.report(self.stats)
                log.warning("write failed (%s); retrying in %.1fs", err, backoff, extra=self._extra())
                if self._wait(backoff):
                    raise
                backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception:  # noqa: BLE001 - not retriable: look for the poison event below
                break
        self._isolate(events)

    def _isolate(self, events: list[SinkEvent]) -> None:
        """Write ``events``, setting aside (or stopping at) each one that fails even alone."""
        if len(events) > 1:
            middle = len(events) // 2
            for half in (events[:middle], events[middle:]):
                try:
                    self.sink.write(half)
                    self._poisons_in_row = 0
                except SchemaChangeError:
                    raise
                except CdcError as err:
                    if err.retriable:
                        self.write(half)  # back to retrying
                    else:
                        self._isolate(half)
                except Exception:  # noqa: BLE001
                    self._isolate(half)
            return
        [event] = events
        try:
            self.sink.write([event])
            self._poisons_in_row = 0
        except SchemaChangeError:
            raise
        except Exception as err:  # noqa: BLE001 - this one is the poison
            self.poison(event.topic, event.partition, event.offset, f"{type(err).__name__}: {err}")

    def poison(self, topic: str, partition: int, offset: int, reason: str, record: LogRecord | None = None) -> None:
        """The record at topic[partition]@offset fails even alone (or cannot be decoded): set it
        aside with ``reason``, or stop (``on_poison: stop``, or rule 3)."""
        where = f"{topic}[{partition}]@{offset}"
        self.stats.errors += 1
        self.stats.last_error = f"poison event at {where}: {reason}"
        self.stats.last_error_at = time.time()
        if self.on_poison == "stop":
            raise PermanentError(f"sink {self.name}: the event at {where} fails even alone: {reason}")
        self._poisons_in_row += 1
        if self._poisons_in_row > POISON_RUN_LIMIT:
            raise PermanentError(f"sink {self.name}: {self._poisons_in_row} events in a row failed even alone, "
                                 f"the last at {where}: {reason}. That is the sink or its store, not the events; "
                                 f"stopped here, nothing past {where} is committed")
        log.error("event at %s fails even alone (%s): sent to %s", where, reason, self.dead_letter_topic,
                  extra=self._extra())
        if record is None:
            record = self._fetch(topic, partition, offset)
        self._set_aside(topic, partition, offset, reason, record.key if record else None,
                        record.value if record else None, missing=record is None)
