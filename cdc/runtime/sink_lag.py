"""How far each sink is behind each topic it reads, measured from the log itself.

The supervisor measures this, not the sink's worker: a sink that is paused, failed or stuck
cannot report its own lag, and that is when the figure matters. Every ``interval`` seconds a
thread reads, per sink and topic, the end offsets and the sink's committed offsets (its consumer
group): ``records`` is their difference. ``seconds`` is the age of the oldest record not yet
written (now minus the log timestamp of the record at the committed offset), 0 when caught up.
A record compacted away meanwhile only makes the figure younger, never older.

The figures also say whether a sink is stalled: ``stalled_since(sink)`` is the time since which
it has been behind (records > 0) without its committed offsets moving, None when it is caught
up or they moved at the last look. The supervisor turns that into health (a sink that has data
to read and commits nothing for ``unhealthy_after`` is unhealthy, whatever its worker reports:
a reader that reads nothing believes it is caught up).

Sinks that read the topics with their own machinery (``SelfDrivenSink``: Spark keeps its offsets
in its checkpoint) have no consumer group to measure and are left out.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cdc.errors import CdcError
from cdc.topics import table_topics

log = logging.getLogger(__name__)

FETCH_TIMEOUT = 2.0  # seconds to read the oldest unwritten records of a sink's lagging partitions


class SinkLagMonitor:
    """``figures()``: {sink: {topic: {"records": int, "seconds": float}}}, refreshed on a thread."""

    def __init__(self, config_path: str, names: list[str], interval: float = 5.0) -> None:
        self.config_path = config_path
        self.names = names
        self.interval = interval
        self._figures: dict[str, dict[str, dict]] = {}
        self._committed: dict[str, int] = {}  # per sink: the sum of its committed offsets, last look
        self._stalled_since: dict[str, float] = {}  # per sink: behind, and no commit moved since
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cdc-sink-lag", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def figures(self) -> dict[str, dict[str, dict]]:
        with self._lock:
            return dict(self._figures)

    def stalled_since(self, sink: str) -> float | None:
        """Unix time since which ``sink`` has been behind with its committed offsets still."""
        with self._lock:
            return self._stalled_since.get(sink)

    def _note(self, measured: dict[str, dict[str, dict]], now: float) -> None:
        """Under the lock: the new figures, and which sinks are behind without moving."""
        for name, topics in measured.items():
            committed = sum(t.get("committed", 0) for t in topics.values())
            behind = any(t["records"] > 0 for t in topics.values())
            moved = self._committed.get(name) != committed
            self._committed[name] = committed
            if not behind or moved:
                self._stalled_since.pop(name, None)
            else:
                self._stalled_since.setdefault(name, now)
        self._figures = measured

    def _loop(self) -> None:
        try:
            log_, sinks = self._open()
        except CdcError as err:
            log.warning("sink lag is not measured: %s", err)
            return
        if not sinks:
            return
        try:
            while not self._stop.is_set():
                try:
                    measured = {name: measure(log_, group, globs) for name, (group, globs) in sinks.items()}
                    with self._lock:
                        self._note(measured, time.time())
                except CdcError as err:  # the log is away for now: the figures keep their age
                    log.debug("sink lag not measured this time: %s", err)
                self._stop.wait(self.interval)
        finally:
            log_.close()

    def _open(self):
        from cdc.api import SelfDrivenSink
        from cdc.config import load_config
        from cdc.log.open import open_log
        from cdc.plugins import sink_class

        config = load_config(self.config_path, only=self.names)
        sinks = {s.name: (reading_group(sink_class(s), s), list(s.topics)) for s in config.sinks
                 if s.name in self.names and not issubclass(sink_class(s), SelfDrivenSink)}
        return open_log(config.log), sinks


def reading_group(cls: type, config: Any) -> str:
    """The consumer group whose commits say where a sink stands: its name, or a shared sink's
    member's own group (cdc/runtime/sink_shares.py)."""
    from cdc.api import SharedSink

    if getattr(config, "scale_out", "single") == "group" and issubclass(cls, SharedSink):
        return cls.reading_group(config)
    return config.name


def measure(log_, group: str, globs: list[str]) -> dict[str, dict]:
    """{topic: {"records": ..., "seconds": ...}} for the consumer group ``group``."""
    out: dict[str, dict] = {}
    reader = log_.reader(group)
    try:
        behind: dict[tuple[str, int], int] = {}
        for topic in table_topics(log_.topics(), globs):  # as the sink runner chooses them
            ends = log_.end_offsets(topic)
            committed = reader.committed(list(ends))
            records = total = 0
            for tp, end in ends.items():
                at = committed.get(tp) or 0
                total += at
                if end > at:
                    records += end - at
                    behind[tp] = at
            out[topic] = {"records": records, "seconds": 0.0, "committed": total}
    finally:
        reader.close()
    for (topic, _), timestamp_ms in _oldest_unwritten(log_, behind).items():
        age = max(0.0, round(time.time() - timestamp_ms / 1000, 3))
        out[topic]["seconds"] = max(out[topic]["seconds"], age)
    return out


def _oldest_unwritten(log_, behind: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """The log timestamp of the first record at or after each given offset."""
    if not behind:
        return {}
    found: dict[tuple[str, int], int] = {}
    reader = log_.reader()
    try:
        reader.assign(dict(behind))
        deadline = time.monotonic() + FETCH_TIMEOUT
        while len(found) < len(behind) and time.monotonic() < deadline:
            for record in reader.poll(len(behind) * 50, 0.2):
                found.setdefault((record.topic, record.partition), record.timestamp_ms)
    finally:
        reader.close()
    return found
