"""SIGTERM and SIGINT as a stop request (a ``threading.Event``): every process of the framework.

    stop = stop_on_signals()              # for the rest of the process's life
    with StopSignals(event) as stop:      # installed for the block, then the previous handlers
        runner.run(stop)
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """SIGTERM and SIGINT set ``event``. Install and uninstall on the main thread."""

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event if event is not None else threading.Event()
        self._previous: dict[int, object] = {}

    def install(self) -> threading.Event:
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, lambda *_: self.event.set())
        return self.event

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def __enter__(self) -> threading.Event:
        return self.install()

    def __exit__(self, *_: object) -> None:
        self.uninstall()


def stop_on_signals(event: threading.Event | None = None) -> threading.Event:
    """SIGTERM and SIGINT set the returned event from now until the process ends."""
    return StopSignals(event).install()
