"""snapshot/processes.py with readers that read lists (the pool's logic; the PostgreSQL readers
are tested against the server in tests/integration)."""

from __future__ import annotations

import pytest

from cdc.errors import PermanentError
from snapshot.processes import ProcessSnapshot


class ListReader:
    def close(self) -> None:
        pass


def open_list_reader() -> ListReader:
    return ListReader()


def open_broken_reader() -> ListReader:
    raise PermanentError("no such snapshot")


def read_range(reader: ListReader, task: tuple[int, int], emit) -> None:
    first, count = task
    for start in range(first, first + count, 10):
        emit(list(range(start, min(first + count, start + 10))))


def read_failing(reader: ListReader, task: int, emit) -> None:
    if task == 3:
        raise PermanentError(f"chunk {task} is damaged")
    emit([task])


def _drain(pool: ProcessSnapshot) -> list:
    items = []
    while True:
        try:
            item = pool.next_batch(5)
        except StopIteration:
            return items
        if item is not None:
            items.extend(item)


def test_every_task_is_read_once_by_some_process():
    pool = ProcessSnapshot(open_list_reader, read_range, 3, queue_batches=2)
    try:
        pool.submit([(i * 100, 100) for i in range(7)])
        assert sorted(_drain(pool)) == list(range(700))
        assert pool.tasks_done == pool.tasks_total == 7
    finally:
        pool.close()


def test_a_readers_error_reaches_the_consumer():
    pool = ProcessSnapshot(open_list_reader, read_failing, 2)
    try:
        pool.submit(range(6))
        with pytest.raises(PermanentError, match="chunk 3 is damaged"):
            _drain(pool)
    finally:
        pool.close()


def test_a_reader_that_cannot_open_fails_the_constructor():
    with pytest.raises(PermanentError, match="no such snapshot"):
        ProcessSnapshot(open_broken_reader, read_range, 2)


def test_close_ends_readers_blocked_on_a_full_queue():
    pool = ProcessSnapshot(open_list_reader, read_range, 2, queue_batches=1)
    pool.submit([(0, 100_000), (100_000, 100_000)])
    assert pool.next_batch(30) is not None  # they are reading, and will block on the queue
    pool.close()
    assert not any(p.is_alive() for p in pool._processes)
    assert all(p.exitcode is not None for p in pool._processes)


def test_stop_signals_to_the_group_leave_the_readers_to_the_parent():
    """A stop sent to the process group (Ctrl-C, systemd's SIGTERM) reaches the readers too; they
    must go on until the parent, which drains what they read, ends them."""
    import os
    import signal

    pool = ProcessSnapshot(open_list_reader, read_range, 2, queue_batches=1)
    try:
        pool.submit([(0, 2_000), (2_000, 2_000)])
        items = list(pool.next_batch(30) or [])
        assert items, "the readers are reading (blocked on the full queue)"
        for pid in pool.pids:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
                os.kill(pid, signum)
        assert sorted(items + _drain(pool)) == list(range(4_000))
        assert all(p.is_alive() or p.exitcode == 0 for p in pool._processes)
    finally:
        pool.close()


def test_a_process_that_exits_without_closing_its_readers_does_not_hang():
    """multiprocessing's exit hook ends daemon children with SIGTERM, which readers ignore, and
    then waits for them: the pool closes itself first."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    script = ("from snapshot.processes import ProcessSnapshot\n"
              "from tests.unit.test_snapshot_processes import open_list_reader, read_range\n"
              "pool = ProcessSnapshot(open_list_reader, read_range, 2)\n"
              "print('open', flush=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                              start_new_session=True)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"the process hung at exit: {err.stdout!r}") from None
    assert (done.returncode, done.stdout.strip()) == (0, "open"), done.stderr
