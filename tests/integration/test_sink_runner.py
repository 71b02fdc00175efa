"""The sink runtime on the embedded log, with a recording sink (a fake store, real log)."""

from __future__ import annotations

import threading
import time

import orjson
import pytest

from cdc.api import Sink, SinkConfig
from cdc.errors import PermanentError, RebuildRequired, RetriableError
from cdc.events import ChangeEvent, Op, TableId
from cdc.log.base import TopicSettings
from cdc.positions import Counter
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import EnvelopeEncoder, Record
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``

TABLE = TableId("db", "public", "items")


class RecordingSink(Sink):
    """Generations of dicts: key -> (version, row); counts writes; fails on demand."""

    def __init__(self, config, fail_retriable=0, poison_ids=(), rebuild_once_at=None, rebuild_again_at=None):
        super().__init__(config)
        self.generations = {1: {}}
        self.current = 1
        self.writing = 1
        self.writes = 0
        self.fail_retriable = fail_retriable
        self.poison_ids = set(poison_ids)
        self.rebuild_once_at = rebuild_once_at
        self.rebuild_again_at = rebuild_again_at  # then once more, during the rebuild
        self.switched = []

    def start(self):
        pass

    def stop(self):
        pass

    def write(self, events):
        self.writes += 1
        if self.fail_retriable:
            self.fail_retriable -= 1
            raise RetriableError("the store is busy")
        if any(e.key.get("id") in self.poison_ids for e in events):
            raise PermanentError("cannot store id 13")
        if self.rebuild_once_at is not None and any(e.key.get("id") == self.rebuild_once_at for e in events):
            self.rebuild_once_at = self.rebuild_again_at
            self.rebuild_again_at = None
            raise RebuildRequired("a column changed type")
        store = self.generations[self.writing]
        for e in events:
            key = orjson.dumps(e.key)
            if e.op is None or e.op is Op.DELETE:
                store.pop(key, None)
            elif key not in store or store[key][0] < e.version:
                store[key] = (e.version, e.after)

    def current_generation(self):
        return self.current

    def open_generation(self, generation):
        self.generations[generation] = {}
        self.writing = generation

    def switch_generation(self, generation):
        self.current = generation
        self.switched.append(generation)

    def drop_generation(self, generation):
        del self.generations[generation]


def _publish(log, n: int, keys: int, prefix: str = "p", start: int = 0) -> None:
    topic = TABLE.topic(prefix)
    log.ensure_topic(topic, TopicSettings(partitions=2))
    events = [ChangeEvent(Op.UPDATE if i >= keys else Op.CREATE, TABLE, {"id": i % keys}, None,
                          {"id": i % keys, "v": i}, i + 1, 0) for i in range(start, start + n)]
    writer = log.writer()
    writer.publish(EnvelopeEncoder("test", "src", prefix).encode(events), Counter(1))
    writer.flush(30)
    writer.close()


def _config(**kw) -> SinkConfig:
    return SinkConfig(name="rec", type="recording", topics=["p.*"], batch_size=50, batch_wait_ms=10, **kw)


def _committed(log, topic: str = "p.public.items") -> tuple[dict, dict]:
    """The topic's end offsets and what group ``rec`` (the runners' here) committed of them."""
    ends = log.end_offsets(topic)
    reader = log.reader("rec")
    try:
        return ends, reader.committed(list(ends))
    finally:
        reader.close()


def _run_until_caught_up(runner) -> None:
    runner.run(threading.Event(), until_caught_up=True)


def test_everything_is_written_and_offsets_committed_after(log):
    _publish(log, 500, keys=40)
    sink = RecordingSink(_config())
    runner = SinkRunner(sink, log, "p")
    _run_until_caught_up(runner)
    assert {k: v[1]["v"] for k, v in sink.generations[1].items()} == \
        {orjson.dumps({"id": k}): max(i for i in range(500) if i % 40 == k) for k in range(40)}
    ends, committed = _committed(log)
    assert committed == ends
    # A second runner in the same group has nothing left to do.
    again = RecordingSink(_config())
    _run_until_caught_up(SinkRunner(again, log, "p"))
    assert again.writes == 0


def test_retriable_errors_retry_the_same_batch(log, monkeypatch):
    monkeypatch.setattr("cdc.runtime.sink_writing.BACKOFF_FIRST", 0.01)
    _publish(log, 120, keys=120)
    sink = RecordingSink(_config(), fail_retriable=3)
    runner = SinkRunner(sink, log, "p")
    _run_until_caught_up(runner)
    assert len(sink.generations[1]) == 120
    assert runner.stats.errors == 3


def test_a_poison_event_goes_to_the_dead_letter_topic_and_the_rest_is_written(log):
    _publish(log, 100, keys=100)
    sink = RecordingSink(_config(), poison_ids={13})
    runner = SinkRunner(sink, log, "p")
    _run_until_caught_up(runner)
    assert set(sink.generations[1]) == {orjson.dumps({"id": i}) for i in range(100) if i != 13}
    [dead] = [orjson.loads(r.value) for r in log.read_all("p.dead-letter.rec")]
    assert dead["topic"] == "p.public.items" and "cannot store id 13" in dead["reason"]
    assert orjson.loads(dead["value"])["after"]["id"] == 13


def test_on_poison_stop_stops_with_the_event_named(log):
    _publish(log, 30, keys=30)
    runner = SinkRunner(RecordingSink(_config(on_poison="stop"), poison_ids={13}), log, "p")
    with pytest.raises(PermanentError, match=r"p.public.items\[\d\]@\d+ fails even alone"):
        _run_until_caught_up(runner)


def test_a_sink_failing_every_event_alone_stops_instead_of_setting_the_topics_aside(log):
    """A sink broken as a whole (once: its request threads shut down) fails each event alone;
    past 50 in a row that is the sink, not the events, and it stops with nothing past it committed."""
    from cdc.runtime.sink_writing import POISON_RUN_LIMIT

    _publish(log, 200, keys=200)
    sink = RecordingSink(_config(), poison_ids=set(range(200)))
    runner = SinkRunner(sink, log, "p")
    with pytest.raises(PermanentError, match="events in a row failed even alone"):
        _run_until_caught_up(runner)
    letters = log.read_all("p.dead-letter.rec")
    assert len(letters) == POISON_RUN_LIMIT
    ends, committed = _committed(log)
    assert sum(o or 0 for o in committed.values()) <= POISON_RUN_LIMIT


def test_a_record_that_is_not_an_envelope_is_set_aside(log):
    _publish(log, 10, keys=10)
    writer = log.writer()
    writer.publish([Record("p.public.items", b'{"id": 99}', b"not json at all")])
    writer.flush(30)
    writer.close()
    sink = RecordingSink(_config())
    _run_until_caught_up(SinkRunner(sink, log, "p"))
    assert len(sink.generations[1]) == 10
    [dead] = [orjson.loads(r.value) for r in log.read_all("p.dead-letter.rec")]
    assert "not a change event envelope" in dead["reason"] and dead["value"] == "not json at all"


def test_rebuild_required_builds_a_new_generation_and_switches(log):
    _publish(log, 300, keys=30)
    sink = RecordingSink(_config(), rebuild_once_at=7)
    runner = SinkRunner(sink, log, "p")
    _run_until_caught_up(runner)
    assert sink.switched == [2] and set(sink.generations) == {2}
    assert {k: v[1]["v"] for k, v in sink.generations[2].items()} == \
        {orjson.dumps({"id": i}): 270 + i for i in range(30)}


def test_a_switch_that_fails_retriably_is_called_again_showing_retrying_and_a_stop_ends_it(log):
    """The switch of a rebuild (a document sink writes every document then) meets a store that is
    briefly away: it is called again, the phase ``retrying`` meanwhile, and the fill is kept. A
    stop during those retries ends the run at once, readers still on the old generation."""
    _publish(log, 300, keys=30)
    sink = RecordingSink(_config(), rebuild_once_at=7)
    switch, failures = sink.switch_generation, [2]

    def switching(generation):
        if failures[0]:
            failures[0] -= 1
            raise RetriableError("the store is away")
        switch(generation)
    sink.switch_generation = switching
    phases: list[str] = []
    runner = SinkRunner(sink, log, "p", report=lambda stats: phases.append(stats.phase))
    _run_until_caught_up(runner)
    assert sink.switched == [2] and set(sink.generations) == {2}
    assert "retrying" in phases and phases.index("retrying") < len(phases) - 1 and phases[-1] != "retrying"
    assert runner.stats.attempts == 0 and runner.stats.last_error is None

    _publish(log, 30, keys=30, prefix="q")
    stuck = RecordingSink(SinkConfig(name="stuck", type="recording", topics=["q.*"], batch_size=50,
                                     batch_wait_ms=10), rebuild_once_at=7)
    stop, tried = threading.Event(), []

    def away(generation):
        tried.append(generation)
        stop.set()  # a stop comes while the switch waits to be tried again
        raise RetriableError("the store is away")
    stuck.switch_generation = away
    began = time.monotonic()
    with pytest.raises(PermanentError, match="stopped while switching to generation 2; readers still see 1"):
        SinkRunner(stuck, log, "q").run(stop)
    assert tried == [2] and stuck.current == 1 and time.monotonic() - began < 30


def test_a_rebuild_goes_on_to_the_ends_the_topics_grew_to_meanwhile(log):
    """Records published during the fill (many: a snapshot under way) are filled too before the
    switch, not applied one batch at a time after it."""
    _publish(log, 300, keys=30)
    sink = RecordingSink(_config(), rebuild_once_at=7)
    write, switch = sink.write, sink.switch_generation
    grown: list[int] = []
    at_switch: dict[bytes, int] = {}

    def writing(events):
        if sink.writing == 2 and not grown:
            grown.append(1)
            _publish(log, 25_000, keys=30, start=300)
        return write(events)

    def switching(generation):
        at_switch.update({k: v[0] for k, v in sink.generations[generation].items()})
        switch(generation)

    sink.write, sink.switch_generation = writing, switching
    _run_until_caught_up(SinkRunner(sink, log, "p"))
    newest = {orjson.dumps({"id": k}): max(i for i in range(25_300) if i % 30 == k) + 1 for k in range(30)}
    assert grown and sink.switched == [2]
    assert at_switch == newest  # the generation readers switched to held the records published meanwhile


def test_a_rebuild_asked_for_again_during_a_rebuild_begins_again_and_completes(log):
    _publish(log, 300, keys=30)
    sink = RecordingSink(_config(), rebuild_once_at=7, rebuild_again_at=20)
    opened = []
    open_generation = sink.open_generation
    sink.open_generation = lambda generation: (opened.append(generation), open_generation(generation))
    _run_until_caught_up(SinkRunner(sink, log, "p"))
    assert opened == [2, 2] and sink.switched == [2] and set(sink.generations) == {2}
    assert {k: v[1]["v"] for k, v in sink.generations[2].items()} == \
        {orjson.dumps({"id": i}): 270 + i for i in range(30)}
