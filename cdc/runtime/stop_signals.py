"""SIGTERM and SIGINT as a stop request (a ``threading.Event``), for every process of the framework.

    stop = stop_on_signals()              # the worker, spark-submit's launcher, a CLI command
    with StopSignals(event) as stop:      # the supervisor: the previous handlers come back after
        runner.run(stop)

Why not ``signal.signal(SIGTERM, lambda *_: stop.set())``: Python runs a handler on the main
thread between two of its bytecodes, wherever that thread is, inside another handler too.
``Event.set``, ``wait`` and ``clear`` hold the event's lock (a plain, non-reentrant lock) for a few
bytecodes. A signal that lands there runs a handler that waits for that lock, on the thread that
holds it: the process hangs for good. Two signals in a burst do it (a stop sent to the process
group, Ctrl-C or systemd, followed by the supervisor's own SIGTERM to its worker: the second
handler runs inside the first one's ``set``), and so does a single one landing while the main
loop waits on the event (the supervisor's loop does).

So the handler takes no lock: it writes one byte to a pipe (a system call; a full pipe already
holds a byte, which is all the watcher needs) and returns. A watcher thread reads the pipe and
sets the event, outside any handler, so whatever the main thread was doing with the event goes on
and lets the lock go. Any number of signals, nested or not, come to the same set event.

A second signal changes nothing: a stop is not escalated. The process drains as it would after
one (the worker within its drain bound, see ``worker_main``); SIGKILL is the way to force an
exit, and is as safe as a crash (a stored position is never ahead of what the log holds).

The main thread must never block without a timeout while the handlers are installed (a ``join()``,
an ``Event.wait()``, a lock). The kernel hands a process's signal to any of its threads that
does not block it, and may do so even after it woke the main thread for it (another thread took
it first on its way back from a system call: a Py4J or Kafka thread of a busy process). Python's
C handler then runs on that thread: it only notes the signal, and the Python handler runs when
the main thread next runs bytecode. A main thread asleep in a lock wait is not woken by that, and
sleeps on: the Delta sink's process, its main thread in ``thread.join()``, ignored a burst for
good (tests/faults/test_spark_stop_storm.py, on a loaded machine). Waiting in slices (``join(0.25)``,
``wait(0.2)``, ``join_in_slices``) bounds the delay to one slice.

Install and uninstall on the main thread (``signal.signal`` requires it).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """While installed, SIGTERM and SIGINT set ``event`` (a new one if not given)."""

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event if event is not None else threading.Event()
        self._previous: dict[int, Any] = {}  # what signal.signal returned: a handler, SIG_DFL, SIG_IGN or None
        self._wake = -1  # the pipe's write end: all a handler touches (-1: none yet)
        self._watcher: threading.Thread | None = None
        self._owner = 0

    def install(self) -> threading.Event:
        if self._watcher is not None:
            return self.event
        read, self._wake = os.pipe()
        os.set_blocking(self._wake, False)  # a handler never waits, even on a full pipe
        self._owner = os.getpid()
        self._watcher = threading.Thread(target=self._watch, args=(read,), name="cdc-stop-signals", daemon=True)
        self._watcher.start()
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self.event

    def _handle(self, signum: int, _frame: object) -> None:
        if os.getpid() != self._owner:
            # A child forked without exec kept this handler, but not the watcher, and shares the
            # pipe with its parent: the signal is the child's, with its default action.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        try:
            os.write(self._wake, b"\x00")
        except OSError:  # full: a byte already waits for the watcher
            pass

    def _watch(self, read: int) -> None:
        try:
            while os.read(read, 512):  # b"": the write end closed (uninstalled)
                self.event.set()
        finally:
            os.close(read)

    def uninstall(self, then: Any = None) -> None:
        """The previous handlers again (``then``: that handler instead, such as ``SIG_IGN`` for
        a process about to exit, which a late signal of a burst must not kill with SIGINT's
        default); a signal that came before still sets the event."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if then is None else then)
        self._previous.clear()
        if self._watcher is not None:
            os.close(self._wake)  # the watcher reads what is left, then the end of the pipe
            self._watcher.join()
            self._watcher, self._wake = None, -1

    def __enter__(self) -> threading.Event:
        return self.install()

    def __exit__(self, *_: object) -> None:
        self.uninstall()


def stop_on_signals(event: threading.Event | None = None) -> threading.Event:
    """SIGTERM and SIGINT set the returned event (``event`` if given) until the process ends."""
    return StopSignals(event).install()


JOIN_SLICE_S = 0.25


def join_in_slices(thread: threading.Thread, slice_s: float = JOIN_SLICE_S) -> None:
    """``thread.join()`` for a main thread with the handlers installed: in slices, so that a stop
    signal another thread took is handled within one (see "The main thread" above)."""
    while thread.is_alive():
        thread.join(slice_s)


def stacks_on_sigusr1() -> None:
    """From now on SIGUSR1 prints every thread's Python stack to stderr and changes nothing else
    (faulthandler, from C: no lock, no handler on the main thread): what an operator, or a test,
    asks of a process whose stop takes long."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
