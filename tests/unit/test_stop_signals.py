"""Stop signals cannot deadlock: a storm of SIGTERM/SIGINT at a process whose threads use the stop
event all the while (cdc/runtime/stop_signals.py).

Each case runs a child process that installs the handlers the framework's processes install,
keeps its main thread busy with the event as one of them does (the worker waits in a join loop,
the supervisor in ``Event.wait``; ``clear`` holds the event's lock longest), has threads waiting
on it too, and takes tens of thousands of signals from another process. A handler that took the
event's lock (``lambda *_: stop.set()``) deadlocks here within a few thousand signals: a signal
lands while the main thread holds the lock, in ``wait`` or in the previous handler's ``set``. The
child then hangs; the test sees no "ok" and the stacks that faulthandler prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cdc.runtime.stop_signals import StopSignals

ROOT = Path(__file__).resolve().parents[2]
SIGNALS = 30_000
HANG_S = 60  # far above the storm's length on a loaded machine: only a deadlock lasts this long

CHILD = textwrap.dedent("""
    import faulthandler, os, signal, subprocess, sys, threading, time
    from cdc.runtime.stop_signals import stop_on_signals

    main_does, signals, hang_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    faulthandler.dump_traceback_later(hang_s, exit=True)  # a deadlock prints every stack, then exits 1
    stop = stop_on_signals()
    done = threading.Event()

    def waiter():
        while not done.is_set():
            stop.wait(0.0005)

    for _ in range(4):
        threading.Thread(target=waiter, daemon=True).start()
    storm = subprocess.Popen([sys.executable, "-c",
                              "import os, signal, sys\\n"
                              "for i in range(int(sys.argv[2])):\\n"
                              "    os.kill(int(sys.argv[1]), signal.SIGINT if i % 3 == 0 else signal.SIGTERM)\\n",
                              str(os.getpid()), str(signals)])
    while storm.poll() is None:
        if main_does == "wait":  # the supervisor's main loop
            stop.wait(0.001)
        elif main_does == "clear":
            stop.clear()
        else:  # "join": the worker's main loop, waiting on something else
            time.sleep(0.001)
    done.set()
    assert storm.returncode == 0, storm.returncode
    # The handlers still work after the storm: one more signal sets the event.
    stop.clear()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.wait(hang_s), "the event was not set after the storm"
    print("ok", flush=True)
""")


@pytest.mark.parametrize("main_does", ["join", "wait", "clear"])
def test_a_storm_of_stop_signals_never_deadlocks(main_does):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run([sys.executable, "-c", CHILD, main_does, str(SIGNALS), str(HANG_S)], env=env,
                           capture_output=True, text=True, timeout=HANG_S * 3)
    assert child.returncode == 0 and child.stdout.strip() == "ok", \
        f"exit {child.returncode}; stdout {child.stdout!r}; stderr:\n{child.stderr[-6000:]}"


def test_signals_set_the_event_and_the_previous_handlers_come_back():
    import signal

    assert threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    event = threading.Event()
    with StopSignals(event) as stop:
        assert stop is event and not stop.is_set()
        os.kill(os.getpid(), signal.SIGINT)  # not a KeyboardInterrupt: a stop request
        assert stop.wait(10)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing
        assert stop.wait(10)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_process_about_to_exit_ignores_a_late_signal_of_the_burst():
    """The supervisor's end (``uninstall(then=SIG_IGN)``): a SIGINT arriving after its drain, a
    burst's last one delayed on a busy machine, is ignored rather than killing it with -2."""
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signals = StopSignals()
    signals.install()
    signals.uninstall(then=signal.SIG_IGN)
    try:
        assert {s: signal.getsignal(s) for s in before} == {s: signal.SIG_IGN for s in before}
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt
        time.sleep(0.05)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


FORKED = textwrap.dedent("""
    import os, signal, sys, time
    from cdc.runtime.stop_signals import stop_on_signals

    stop = stop_on_signals()
    ready, tell = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(tell, b"r")  # a signal before Python's own after-fork reset would be lost
        time.sleep(60)  # until the signal
        os._exit(0)
    os.read(ready, 1)
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status), stop.wait(1), flush=True)
""")


def test_a_child_forked_with_the_handlers_takes_its_own_signals():
    """A child forked without exec keeps the handler but not the watcher thread, and shares the
    pipe: its SIGTERM must end it as by default, not stop its parent."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run([sys.executable, "-c", FORKED], env=env, capture_output=True, text=True, timeout=120)
    assert child.stdout.split() == ["-15", "False"], child.stdout + child.stderr


def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on():
    child = textwrap.dedent("""
        import os, signal, sys, threading, time
        from cdc.runtime.stop_signals import stacks_on_sigusr1, stop_on_signals

        stacks_on_sigusr1()
        stop = stop_on_signals()

        def a_busy_sink_thread():
            stop.wait()

        threading.Thread(target=a_busy_sink_thread, name="sink").start()
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGUSR1)  # as an operator would: the stacks, nothing else
        time.sleep(0.2)
        print("still running", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        stop.wait(30)
        print("stopped" if stop.is_set() else "not stopped", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ready", "still", "running", "stopped"], done.stdout
    assert "a_busy_sink_thread" in done.stderr and done.stderr.count("Thread 0x") >= 2, done.stderr


TAKEN_ELSEWHERE = textwrap.dedent("""
    import faulthandler, signal, sys, threading, time
    from cdc.runtime.stop_signals import join_in_slices, stop_on_signals

    main_does, hang_s = sys.argv[1], float(sys.argv[2])
    faulthandler.dump_traceback_later(hang_s, exit=True)  # a main thread that never wakes: stacks, exit 1
    stop = stop_on_signals()
    sink = threading.Thread(target=lambda: stop.wait(hang_s * 2), name="sink")  # runs until the stop
    main = threading.main_thread().ident

    def library_thread():
        # Once the main thread waits for the sink (its frame shows it), the signal goes to this
        # thread, as the kernel may hand a process's signal to a Py4J or librdkafka thread.
        while sys._current_frames()[main].f_code.co_name != "_wait_for_tstate_lock":
            time.sleep(0.01)
        time.sleep(0.1)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    sink.start()
    threading.Thread(target=library_thread, daemon=True).start()
    if main_does == "join_in_slices":
        join_in_slices(sink)
    else:
        sink.join()
    print("stopped" if stop.is_set() else "not stopped", flush=True)
""")


@pytest.mark.parametrize(("main_does", "stops"), [("join_in_slices", True), ("join", False)])
def test_a_signal_another_thread_took_stops_a_main_thread_waiting_for_the_sink(main_does, stops):
    """The Delta sink's process once hung in a burst: its main thread in ``sink.join()``, the
    signal taken by another thread. ``join_in_slices`` wakes to run the handler; the plain
    ``join`` case shows the hazard is real here (it sleeps on until the child's bound)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    bound = 30 if stops else 3
    child = subprocess.run([sys.executable, "-c", TAKEN_ELSEWHERE, main_does, str(bound)], env=env,
                           capture_output=True, text=True, timeout=120)
    if stops:
        assert child.returncode == 0 and child.stdout.strip() == "stopped", \
            f"exit {child.returncode}; stdout {child.stdout!r}; stderr:\n{child.stderr[-4000:]}"
    else:  # faulthandler's bound ended it, the main thread still in the join
        assert child.returncode == 1 and child.stdout == "" and "_wait_for_tstate_lock" in child.stderr, child.stderr
