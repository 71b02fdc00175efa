"""When the runner stores offsets: the embedded log, the generator source, no server."""

from __future__ import annotations

import threading
import time

from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.offsets import OffsetStore
from cdc.positions import Counter
from cdc.runtime.runner import SourceRunner
from sources.generator import GeneratorConfig, GeneratorSource


class CaughtUp(GeneratorSource):
    """The generator's first ``events`` events, then nothing new, without finishing (a database
    with no more writes)."""

    @property
    def finished(self) -> bool:
        return False

    def poll(self, timeout: float):
        if self.next_seq > self.cfg.events:
            self._stopping.wait(timeout)
            return None
        return super().poll(timeout)


def test_a_caught_up_source_has_its_position_stored_without_waiting_for_the_interval(tmp_path):
    log = EmbeddedLog(tmp_path / "log")
    offsets = OffsetStore(log, "t")
    source = CaughtUp(GeneratorConfig(name="gen", events=95, transaction_size=10, max_batch_events=40), None)
    runner = SourceRunner(source, log, offsets, "t", TopicSettings(), offset_interval=3600)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while offsets.load("gen") != Counter(95) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Stored while running (the interval is an hour), and passed on to the source.
        assert offsets.load("gen") == Counter(95)
        assert source.committed == Counter(95)
        assert len(log.read_all("t.public.items")) == 95
    finally:
        stop.set()
        thread.join(30)
        log.close()
