"""A shared sink's member that stalled hears of its shares before it writes again (the lease of
cdc/runtime/sink_shares.py, checked by SinkRunner._step). The runner's parts around one step are
fakes that record the order of what happens: pure logic, the group and the store are not needed.
"""

from __future__ import annotations

from cdc.api.stats import ConnectorStats
from cdc.runtime.sink_runner import SinkRunner
from cdc.runtime.sink_shares import SESSION_MS, Shares


class _Reading:
    batch_bytes = 10

    def __init__(self, events: list) -> None:
        self.events = events

    def batch(self):
        return self.events, {("t", 0): len(self.events)}

    def not_idle(self) -> None:
        pass

    def drop_ahead(self) -> None:
        pass


class _Writes:
    def __init__(self, done: list[str], settled: list) -> None:
        self.done, self.settled = done, settled

    def make_room(self, everything: bool = False) -> list:
        self.done.append("settled the oldest write")
        return self.settled

    def hand(self, events, ends, nbytes) -> None:
        self.done.append("handed the batch")

    def drain(self) -> None:
        pass


class _Shares:
    def __init__(self, done: list[str], stale: bool) -> None:
        self.done, self._stale = done, stale

    def stale(self) -> bool:
        return self._stale

    def poll(self) -> None:
        self.done.append("polled the group")


class _Pending:
    settled = False
    ends = {("t", 0): 1}
    events = 1
    nbytes = 1


def _step(stale: bool) -> list[str]:
    done: list[str] = []
    runner = object.__new__(SinkRunner)  # only what _step touches
    runner.reading = _Reading(["an event"])
    runner._writes = _Writes(done, [_Pending()])
    runner.shares = _Shares(done, stale)
    runner._commit = lambda ends, events: done.append("committed the oldest write")

    class _Stats:
        bytes = 0

    runner.stats = _Stats()
    runner._step()
    return done


def test_a_stale_lease_commits_what_settled_then_polls_the_group_before_handing_the_batch():
    assert _step(stale=True) == ["settled the oldest write", "committed the oldest write", "polled the group",
                                 "handed the batch"]


def test_a_fresh_lease_hands_the_batch_before_committing_and_polls_nothing():
    assert _step(stale=False) == ["settled the oldest write", "handed the batch", "committed the oldest write"]


class _GroupLog:
    def __init__(self, consumer_config: dict) -> None:
        self.consumer_config = consumer_config


def test_the_lease_is_a_third_of_the_session_and_runs_from_the_last_poll(monkeypatch):
    import cdc.runtime.sink_shares as sink_shares

    monkeypatch.setattr(sink_shares, "GroupLog", _GroupLog)
    now = [1000.0]
    monkeypatch.setattr(sink_shares.time, "monotonic", lambda: now[0])

    def made(consumer_config: dict) -> Shares:
        return Shares(_GroupLog(consumer_config), "t", 2, "g", ConnectorStats("docs", "sink"),  # type: ignore[arg-type]
                      settle=lambda: None, own=lambda s: False, ends=dict, reached=lambda e: True)

    shares = made({"session.timeout.ms": 6000})
    assert shares.lease_s == 2.0
    now[0] += 1.9
    assert not shares.stale()
    now[0] += 0.2
    assert shares.stale()

    class _Reader:
        def poll(self, n, timeout):
            return []

    shares.reader = _Reader()  # type: ignore[assignment]
    shares.poll()  # served the group: the lease runs again from now
    assert not shares.stale()
    now[0] += 2.1
    assert shares.stale()
    assert made({}).lease_s == SESSION_MS / 3000
