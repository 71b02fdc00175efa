"""The sink runtime on Kafka fetching through the bulk reader (cdc.log.kafka_bulk): the group's
reader only says where to start and commits, after each write, as when it fetched itself."""

from __future__ import annotations

import threading

import orjson
import pytest

from cdc.api import SinkConfig
from cdc.log import kafka_bulk
from cdc.runtime import sink_reading
from cdc.runtime.sink_runner import SinkRunner
from tests.integration.pg_capture import kafka_log  # noqa: F401 - the fixture ``log``
from tests.integration.test_sink_runner import TABLE, RecordingSink, _publish

pytestmark = pytest.mark.kafka




def test_the_runner_fetches_packed_and_commits_through_the_group_after_each_write(log, kafka_topic, monkeypatch):
    assert kafka_bulk.available(), "cdc._rdconsume was not built (scripts/setup installs librdkafka-dev)"
    prefix, group = kafka_topic, f"{kafka_topic}-sink"
    packed_batches = []
    decode = sink_reading.decode_packed
    monkeypatch.setattr(sink_reading, "decode_packed",
                        lambda batch, ends, raw: packed_batches.append(batch.count) or decode(batch, ends, raw))

    def config() -> SinkConfig:
        return SinkConfig(name="rec", type="recording", topics=[f"{prefix}.*"], batch_size=50, batch_wait_ms=10)

    def caught_up(sink: RecordingSink) -> None:
        SinkRunner(sink, log, prefix, group=group).run(threading.Event(), until_caught_up=True)

    _publish(log, 500, keys=40, prefix=prefix)
    sink = RecordingSink(config())
    caught_up(sink)
    assert sum(packed_batches) == 500 and sink.writes >= 10  # batches of 50, read packed
    assert {k: v[1]["v"] for k, v in sink.generations[1].items()} == \
        {orjson.dumps({"id": k}): max(i for i in range(500) if i % 40 == k) for k in range(40)}
    ends = log.end_offsets(TABLE.topic(prefix))
    reader = log.reader(group)
    assert reader.committed(list(ends)) == ends  # committed by a reader never assigned
    reader.close()

    # A restart in the same group starts from the commits: nothing again, then only what is new.
    again = RecordingSink(config())
    caught_up(again)
    assert again.writes == 0
    _publish(log, 100, keys=40, prefix=prefix, start=500)
    packed_batches.clear()
    caught_up(again)
    assert sum(packed_batches) == 100
    assert {k: v[1]["v"] for k, v in again.generations[1].items()} == \
        {orjson.dumps({"id": k}): max(i for i in range(500, 600) if i % 40 == k) for k in range(40)}
