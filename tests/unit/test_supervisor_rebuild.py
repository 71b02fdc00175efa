"""A rebuild requested through the daemon ends only when the process started to rebuild says it
streams again: the process being drained for it still reports ``streaming`` after the command."""
import dataclasses
import multiprocessing
import threading

from cdc.runtime.stats import ConnectorStats
from cdc.runtime.supervisor import Supervisor, Worker


class _Process:  # only what _drain_reports looks at
    def __init__(self, pid: int) -> None:
        self.pid = pid


def _report(worker: Worker, phase: str) -> None:
    parent, child = multiprocessing.Pipe(duplex=False)
    child.send(dataclasses.asdict(ConnectorStats(worker.name, "sink", phase=phase)))
    worker.conn = parent
    Supervisor._drain_reports(type("S", (), {"lock": threading.Lock()})(), worker)


def test_the_drained_process_streaming_does_not_finish_the_rebuild():
    worker = Worker("wh", ConnectorStats("wh", "sink", phase="streaming"), process=_Process(100))
    worker.mode = "rebuild"  # the command came; pid 100 is being drained
    _report(worker, "streaming")
    assert worker.rebuilt_at is None and worker.mode == "rebuild"

    worker.process, worker.rebuild_pid = _Process(200), 200  # started in rebuild mode
    _report(worker, "rebuilding")
    assert worker.rebuilt_at is None
    _report(worker, "streaming")
    assert worker.rebuilt_at is not None and worker.mode == "run"
