"""A bulk rebuild's windows loaded on the sink's thread while the next ones are read.

A bulk rebuild (window_fill.py) reads the history into windows reduced to the newest version
per key (``cdc.bulk_window``). Once a window is closed (its partitions read to their ends, or it
filled its bound) it is handed here: loaded on the sink's thread, one window at a time and in the
order handed over, while the reading thread fills the next. Whether a window goes in without the
guard (``bulk_load``: plain COPY) or through ``write`` is decided on the sink's thread right before
it is loaded, from what the windows before it loaded (``LoadedKeys``): only if the generation
holds none of its keys.

Memory: the window in flight and the loaded keys' hashes count against the same bound as the
window being filled (``held``); the reader waits for the load (``wait``) before it grows past it.

Nothing here moves a position: the runner updates positions once every window is loaded, and
nothing is committed before the switch (sink_rebuild.py).

Threading: the reading thread calls everything; the loads run on the sink's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

from cdc.bulk_window import LoadedKeys, NewestWindow

log = logging.getLogger(__name__)


class WindowLoads:
    """``submit`` a closed window, ``wait`` for the one in flight; ``held`` bytes meanwhile."""

    def __init__(self, submit: Callable[..., Future] | None, load: Callable[[NewestWindow, bool], None],
                 extra: dict) -> None:
        self._submit = submit  # the sink thread's submit; None: load on the calling thread
        self._load = load      # load(window, bulk) on the sink's thread
        self._extra = extra
        self.loaded = LoadedKeys()  # touched on the sink's thread only (loads run one at a time)
        self._in_flight: Future | None = None
        self._in_flight_bytes = 0
        self.guarded: list[str] = []  # why each window that went the guarded way did

    def held(self) -> int:
        """Bytes held besides the window being filled: the window in flight and the loaded keys."""
        return self._in_flight_bytes + self.loaded.nbytes()

    def submit(self, window: NewestWindow, whole: bool) -> None:
        """Load ``window`` (closed: nothing more is added to it) after the one in flight;
        ``whole``: it holds its partitions up to their ends (not cut where it filled up)."""
        self.wait()
        nbytes = window.stats()[1]
        if self._submit is None:
            self._load_one(window, whole)
            return
        self._in_flight = self._submit(self._load_one, window, whole)
        self._in_flight_bytes = nbytes

    def wait(self) -> None:
        """Until the window in flight is loaded; its error is raised here."""
        future, self._in_flight = self._in_flight, None
        self._in_flight_bytes = 0
        if future is not None:
            future.result()

    def raise_failed(self) -> None:
        """The error of a load that already failed, raised now rather than after the next read."""
        if self._in_flight is not None and self._in_flight.done() and self._in_flight.exception() is not None:
            self.wait()

    def settle(self) -> None:
        """After an error of the reading thread: let the load in flight end (its own error is
        dropped: the first one is what is raised) before anything else runs on the sink."""
        future, self._in_flight = self._in_flight, None
        self._in_flight_bytes = 0
        if future is not None:
            future.exception()

    def _load_one(self, window: NewestWindow, whole: bool) -> None:
        began = time.thread_time()
        hashes = window.key_hashes()
        why = self.loaded.conflict(window, hashes)
        if why is not None:
            self.guarded.append(why)
            # Windows of whole partitions share keys only where a key is in two partitions (a
            # topic whose partition count grew): correct through the guard, only slower.
            log.log(logging.WARNING if whole else logging.INFO, "a window of %d keys goes in through the "
                    "version-guarded writes: %s%s", window.stats()[0], why,
                    " (a key in two partitions?)" if whole and why.startswith("it holds keys") else "",
                    extra=self._extra)
        self._load(window, why is None)
        self.loaded.add(window, hashes)
        window.clear()
        log.debug("window loaded with %.2fs of the sink thread's CPU", time.thread_time() - began, extra=self._extra)
