"""A rebuild requested through the daemon ends only when the process started to rebuild says it
streams again: the process being drained for it still reports ``streaming`` after the command."""
import dataclasses
import multiprocessing
import threading

from cdc.api.stats import ConnectorStats
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


def test_a_second_rebuild_is_not_finished_by_the_first_rebuilds_process():
    """`cdc rebuild` twice in a row: the process that did the first rebuild streams on, and is
    the one drained for the second. Its "streaming" used to end the second rebuild at once (the
    command returned, nothing was rebuilt)."""
    worker = Worker("wh", ConnectorStats("wh", "sink", phase="streaming"), process=_Process(200))
    worker.mode, worker.rebuild_pid = "rebuild", 200
    _report(worker, "streaming")
    first = worker.rebuilt_at
    assert first is not None and worker.mode == "run"
    worker.mode = "rebuild"  # the second command; pid 200 is being drained
    _report(worker, "streaming")
    assert worker.rebuilt_at == first and worker.mode == "rebuild"


def _sink_lag(figures: list[tuple[float, int, int]]):
    """A SinkLagMonitor fed (time, records behind, committed) looks of one sink, "s"."""
    from cdc.runtime.sink_lag import SinkLagMonitor

    monitor = SinkLagMonitor("unused.yaml", ["s"])
    for now, records, committed in figures:
        monitor._note({"s": {"t": {"records": records, "seconds": 0.0, "committed": committed}}}, now)
    return monitor


def test_a_sink_behind_whose_commits_do_not_move_is_stalled_since_the_first_look():
    monitor = _sink_lag([(100.0, 5, 10), (105.0, 7, 10), (110.0, 9, 10)])
    assert monitor.stalled_since("s") == 105.0  # the first look at which the commits had not moved


def test_moving_commits_or_no_lag_is_no_stall():
    assert _sink_lag([(100.0, 5, 10), (105.0, 7, 12)]).stalled_since("s") is None
    assert _sink_lag([(100.0, 0, 10), (105.0, 0, 10)]).stalled_since("s") is None
    assert _sink_lag([(100.0, 5, 10), (105.0, 5, 10), (110.0, 0, 10)]).stalled_since("s") is None


def test_a_stalled_streaming_sink_is_unhealthy_whatever_it_reports():
    worker = Worker("s", ConnectorStats("s", "sink", phase="streaming"), unhealthy_after=30.0)
    worker.phase_since = 0.0
    worker.last_progress = 1000.0  # its worker says it is caught up
    assert not worker.unhealthy(1000.0, stalled_since=980.0)
    assert worker.unhealthy(1000.0, stalled_since=960.0)
    assert worker.stalled_for(1000.0, 960.0) == 40.0


def test_a_rebuild_is_not_a_stall_and_the_count_starts_at_the_phase_change():
    worker = Worker("s", ConnectorStats("s", "sink", phase="rebuilding"), unhealthy_after=30.0)
    worker.last_progress = 1000.0
    assert not worker.unhealthy(1000.0, stalled_since=0.0)  # commits move only at the switch
    worker.stats.phase, worker.phase_since = "streaming", 990.0
    assert worker.stalled_for(1000.0, 0.0) == 10.0 and not worker.unhealthy(1000.0, stalled_since=0.0)


def test_the_same_error_again_is_said_once_per_incident():
    """Restarts in a row that fail alike print the error once; a process that ran healthily in
    between makes its failure a new incident, said in full and retried after the first backoff."""
    from cdc.runtime.supervisor import BACKOFF_FIRST, HEALTHY_AFTER

    worker = Worker("src", ConnectorStats("src", "source", last_error="OperationalError: server closed"))
    worker.started_at = 0.0
    assert worker.retry(1.0) == (False, BACKOFF_FIRST)
    worker.started_at = 3.0
    assert worker.retry(4.0) == (True, BACKOFF_FIRST * 2)
    worker.started_at = 10.0
    assert worker.retry(10.0 + HEALTHY_AFTER + 1) == (False, BACKOFF_FIRST)
    worker.stats.last_error = "OperationalError: connection refused"
    worker.started_at = 100.0
    assert worker.retry(101.0)[0] is False
