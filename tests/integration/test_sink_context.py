"""The sink contract of cdc.api: what the runtime hands a sink, and the capabilities it asks for
(on the embedded log, with small sinks that only record what they were given)."""

from __future__ import annotations

import logging
import threading

import orjson
import pytest

from cdc.api import PermanentError, RebuildableSink, SelfDrivenSink, Sink, SinkConfig
from cdc.events import ChangeEvent, Column, Op, SchemaChange, TableId
from cdc.log.base import TopicSettings
from cdc.positions import Counter
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import EnvelopeEncoder, encode_schema_change
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``

TABLE = TableId("db", "public", "items")


class ContextSink(Sink):
    """Asks its context, from write, what a search or cache sink would ask."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.seen: dict = {}
        self.written = 0

    def start(self) -> None:
        self.seen["attached_before_start"] = self.context.log is not None

    def write(self, events) -> None:
        for event in events:
            self.seen["schema"] = self.context.schema_for(event.topic)
            self.seen["retention"] = self.context.delete_retention_ms(event.topic)
            if event.key.get("id") == 3:  # this sink decides to skip the record itself
                self.context.dead_letter(event.topic, event.partition, event.offset, "id 3 is not wanted",
                                         orjson.dumps(event.key), None)
            self.written += 1
        self.context.stats.bytes += 100 * len(events)  # the counters the runtime reports (on top of its own)
        self.context.logger.info("wrote %d", len(events))

    def stop(self) -> None:
        pass


def _publish(log, n: int) -> None:
    log.ensure_topic(TABLE.topic("p"), TopicSettings(partitions=1, delete_retention_ms=123_000))
    log.ensure_topic("p.schema-changes", TopicSettings(partitions=1))
    shape = SchemaChange(TABLE, (Column("id", "integer", key=True, nullable=False), Column("v", "text")), 1, 0)
    writer = log.writer()
    writer.publish([encode_schema_change(shape, "src", "p")])
    writer.publish(EnvelopeEncoder("test", "src", "p").encode(
        [ChangeEvent(Op.CREATE, TABLE, {"id": i}, None, {"id": i, "v": str(i)}, i + 1, 0) for i in range(n)]),
        Counter(1))
    writer.flush(30)
    writer.close()


def _config() -> SinkConfig:
    return SinkConfig(name="ctx", type="ctx", topics=["p.*"], batch_size=50, batch_wait_ms=10)


def test_the_runtime_hands_the_sink_its_context_before_start(log, caplog):
    _publish(log, 10)
    sink = ContextSink(_config())
    runner = SinkRunner(sink, log, "p")
    with caplog.at_level(logging.INFO, logger="cdc.sink.ctx"):
        runner.run(threading.Event(), until_caught_up=True)
    assert sink.seen["attached_before_start"]
    assert sink.context.topic_prefix == "p" and sink.context.stats is runner.stats
    assert [(c["name"], c["type"], c["key"]) for c in sink.seen["schema"]["columns"]] == \
        [("id", "integer", True), ("v", "text", False)]
    assert sink.seen["retention"] == 123_000
    # The runtime counts the bytes of the records it wrote; what the sink adds is counted as well.
    written = sum(len(r.value) for r in log.read_all(TABLE.topic("p")) if r.value is not None)
    assert runner.stats.bytes == written + 1000 and runner.stats.events == 10
    # The sink's own dead letter lands where the runtime's go, with the reason and the key.
    [dead] = log.read_all("p.dead-letter.ctx")
    letter = orjson.loads(dead.value)
    assert orjson.loads(dead.key) == {"topic": letter["topic"], "partition": letter["partition"],
                                      "offset": letter["offset"]}  # where it was: letters never share a key
    assert orjson.loads(letter["key"]) == {"id": 3} and letter["reason"] == "id 3 is not wanted"
    assert sink.context.dead_letter_topic == "p.dead-letter.ctx"
    assert any(getattr(r, "connector", None) == "ctx" and r.getMessage().startswith("wrote")
               for r in caplog.records)


def test_a_sink_built_alone_has_a_usable_context():
    sink = ContextSink(_config())
    assert sink.context.schema_for("p.public.items") is None
    assert sink.context.delete_retention_ms("p.public.items") is None
    assert sink.context.stats.name == "ctx" and sink.context.dead_letter_topic == "cdc.dead-letter.ctx"
    with pytest.raises(PermanentError, match="no dead-letter writer"):
        sink.context.dead_letter("t", 0, 1, "bad")
    sink.schema_for = {"t": {"columns": []}}.get  # tools and tests set the accessor directly
    assert sink.context.schema_for("t") == {"columns": []}


def test_capabilities_are_types_not_methods_that_raise():
    assert not isinstance(ContextSink(_config()), RebuildableSink)
    assert not isinstance(ContextSink(_config()), SelfDrivenSink)
    assert not any(hasattr(Sink, m) for m in ("current_generation", "open_generation", "switch_generation",
                                              "drop_generation", "runs_itself"))


def test_a_rebuild_of_a_sink_without_generations_is_refused_by_name(log):
    _publish(log, 5)
    runner = SinkRunner(ContextSink(_config()), log, "p")
    with pytest.raises(PermanentError, match=r"sink ctx \(ctx\) cannot rebuild"):
        runner.rebuild(threading.Event())


def test_the_worker_runs_a_self_driven_sink_with_a_context(tmp_path):
    from cdc.runtime.worker import SelfRunningSink

    class Driven(SelfDrivenSink):
        def start(self): ...
        def stop(self): ...

        def run(self, stop_event, *, report=None):
            self.ran_with = (self.context.log_config, self.context.topic_prefix)
            report(self.context.stats)

    class LogSection:
        topic_prefix = "lake"

    sink = Driven(_config())
    reports = []
    runner = SelfRunningSink(sink, reports.append, LogSection)
    runner.run(threading.Event())
    assert sink.ran_with == (LogSection, "lake") and reports == [runner.stats]
    with pytest.raises(PermanentError, match="reads its topics itself"):
        sink.write([])
