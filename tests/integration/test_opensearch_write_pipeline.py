"""The OpenSearch sink's writes pipelined across batches (cdc.api.PipelinedSink, the runner's
cdc/runtime/write_pipeline.py) on Kafka and the stack's node: offsets are committed strictly in
batch order, a batch's only after its own completion succeeded; a failed completion with later
writes in flight commits nothing past it and the store still ends equal to the source; and a
kill -9 of the sink while writes are in flight ends equal."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest

from cdc.events import Op
from cdc.runtime.sink_runner import SinkRunner
from sinks.opensearch import OpenSearchSink, OpenSearchSinkConfig
from sinks.opensearch.generations import STATE_INDEX
from tests.daemon import kill_daemon, run_daemon, stop_daemon
from tests.integration.pg_capture import kafka_log, wait_until  # noqa: F401 - the fixture ``log``
from tests.integration.test_opensearch_pipeline import Offsets
from tests.integration.test_opensearch_sink import TABLE, _documents, _history, _publish, _upsert, client  # noqa: F401

pytestmark = [pytest.mark.kafka, pytest.mark.opensearch]

PARTITIONS = 3


class Watched(OpenSearchSink):
    """The OpenSearch sink, recording each submitted write (its first offset per partition, and
    whether it is settled: its completion returned, or a later ``write`` of all its events did)."""

    def __init__(self, config: OpenSearchSinkConfig) -> None:
        super().__init__(config)
        self.lock = threading.Lock()
        self.submitted: list[dict] = []  # {"first": {partition: offset}, "offsets": set, "ok": bool}
        self.failures: list[tuple[int, int]] = []  # (which submission failed, submissions made by then)
        self.most_unsettled = 0  # the most writes submitted and not settled at once

    def submit(self, events):
        completion = super().submit(events)
        if completion is None:
            return None
        first: dict[int, int] = {}
        for event in events:
            first[event.partition] = min(event.offset, first.get(event.partition, event.offset))
        entry = {"first": first, "offsets": {(e.partition, e.offset) for e in events}, "ok": False}
        with self.lock:
            self.submitted.append(entry)
            number = len(self.submitted)
            self.most_unsettled = max(self.most_unsettled, sum(not e["ok"] for e in self.submitted))
        return _Watch(self, completion, entry, number)

    def write(self, events):
        super().write(events)
        written = {(e.partition, e.offset) for e in events}
        with self.lock:
            for entry in self.submitted:
                if entry["offsets"] <= written:
                    entry["ok"] = True


class _Watch:
    def __init__(self, sink: Watched, completion, entry: dict, number: int) -> None:
        self.sink, self.completion, self.entry, self.number = sink, completion, entry, number

    def wait(self) -> None:
        try:
            self.completion.wait()
        except Exception:
            with self.sink.lock:
                self.sink.failures.append((self.number, len(self.sink.submitted)))
            raise
        with self.sink.lock:
            self.entry["ok"] = True


class CommitWatch:
    """A log whose group readers check every commit against the sink's writes: for each write not
    settled, neither it nor any write after it may be covered (offset past its first one)."""

    def __init__(self, log, sink: Watched) -> None:
        self._log, self.sink = log, sink
        self.commits = 0
        self.past_unsettled = 0  # commits made while a later write was submitted and not settled
        self.violations: list[str] = []

    def __getattr__(self, name):
        return getattr(self._log, name)

    def reader(self, group=None):
        reader = self._log.reader(group)
        commit = reader.commit

        def watched(offsets):
            with self.sink.lock:
                self.check(offsets)
            return commit(offsets)
        reader.commit = watched
        return reader

    def check(self, offsets: dict) -> None:
        self.commits += 1
        submitted = self.sink.submitted
        unsettled = [at for at, entry in enumerate(submitted) if not entry["ok"]]
        if unsettled:
            self.past_unsettled += 1
            for entry in submitted[unsettled[0]:]:
                for partition, first in entry["first"].items():
                    for (_, p), offset in offsets.items():
                        if p == partition and offset > first:
                            self.violations.append(f"commit {p}@{offset} past an unsettled write from {first}")


def _sink(opensearch_url: str, name: str, **overrides) -> Watched:
    settings = dict(name=name, hosts=[opensearch_url], topics=[f"{name}.*"], index_name=f"{name}.{{table}}",
                    batch_size=150, batch_wait_ms=10, bulk_max_docs=50, drop_old_generation_after_s=0)
    settings.update(overrides)
    return Watched(OpenSearchSinkConfig(**settings))


def _committed(log, group: str, prefix: str) -> tuple[dict, dict]:
    ends = log.end_offsets(TABLE.topic(prefix))
    reader = log.reader(group)
    try:
        return ends, reader.committed(list(ends))
    finally:
        reader.close()


@pytest.fixture
def prefix(kafka_topic, client):
    yield kafka_topic
    client.indices.delete(index=f"{kafka_topic}*", params={"ignore_unavailable": "true"})
    client.delete(index=STATE_INDEX, id=kafka_topic, params={"ignore": 404})


def _caught_up(runner: SinkRunner, how: str) -> None:
    if how == "rebuild":  # what `cdc bootstrap` and `cdc rebuild` run for this sink
        runner.rebuild(threading.Event())
    else:
        runner.run(threading.Event(), until_caught_up=True)


def test_offsets_are_never_committed_past_a_write_not_completed(log, prefix, client, opensearch_url):
    events, rows = _history(1500, 2)
    _publish(log, events, prefix=prefix, partitions=PARTITIONS)
    sink = _sink(opensearch_url, prefix, writes_in_flight=3)
    watch = CommitWatch(log, sink)
    SinkRunner(sink, watch, prefix, group=prefix).run(threading.Event(), until_caught_up=True)
    assert not watch.violations, watch.violations[:5]
    # Evidence that writes overlapped: commits came while later writes were submitted, unsettled.
    assert watch.past_unsettled >= 3, (watch.past_unsettled, watch.commits)
    assert sink.most_unsettled == 3
    assert not sink.failures
    assert _documents(client, f"{prefix}.items") == rows
    ends, committed = _committed(log, prefix, prefix)
    assert committed == ends


@pytest.mark.parametrize("how", ["run", "rebuild"])
def test_a_failed_write_with_later_ones_in_flight_commits_nothing_past_it_and_ends_equal(
        log, prefix, client, opensearch_url, how):
    """A document the index refuses (a mapping error) fails its write's completion while later
    writes are in flight: they end, nothing past the failed batch is committed until it is
    written again on its own (the refused document set aside), and the store equals the source."""
    events, rows = _history(1500, 2)
    # A document the mapping refuses, in the middle of the history (an insert of a new key).
    events.insert(len(events) // 2, _upsert(99_999, 10**6, Op.CREATE, price="not a number"))
    _publish(log, events, prefix=prefix, partitions=PARTITIONS)
    sink = _sink(opensearch_url, prefix, writes_in_flight=3)
    watch = CommitWatch(log, sink)
    _caught_up(SinkRunner(sink, watch, prefix, group=prefix), how)
    assert sink.most_unsettled >= 2, "the writes did not overlap"
    assert sink.failures, "no write's completion failed"
    failed, submitted_by_then = sink.failures[0]
    assert submitted_by_then > failed, "no later write was in flight when the completion failed"
    assert not watch.violations, watch.violations[:5]
    assert _documents(client, f"{prefix}.items") == rows
    [dead] = [orjson.loads(r.value) for r in log.read_all(f"{prefix}.dead-letter.{prefix}")]
    assert "mapper_parsing_exception" in dead["reason"] and orjson.loads(dead["value"])["after"]["id"] == 99_999
    ends, committed = _committed(log, prefix, prefix)
    assert committed == ends


def _config(tmp_path: Path, kafka: str, opensearch: str, prefix: str) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: {PARTITIONS}}}\n"
        f"sinks:\n  - {{name: {prefix}, type: opensearch, hosts: ['{opensearch}'], topics: ['{prefix}.*'], "
        f"index_name: '{prefix}.{{table}}', batch_size: 300, batch_wait_ms: 20, bulk_max_docs: 100, "
        f"writes_in_flight: 3, drop_old_generation_after_s: 0}}\n"
        f"http: null\n")
    return path


@pytest.mark.serial
def test_the_sink_killed_while_writes_are_in_flight_ends_equal(log, prefix, client, opensearch_url, kafka_bootstrap,
                                                               tmp_path):
    events, rows = _history(20_000, 3)
    _publish(log, events, prefix=prefix, partitions=PARTITIONS)
    config = _config(tmp_path, kafka_bootstrap, opensearch_url, prefix)
    offsets = Offsets(kafka_bootstrap, prefix, TABLE.topic(prefix))
    total = sum(log.end_offsets(TABLE.topic(prefix)).values())
    try:
        struck = 0
        for cycle in range(4):
            before = offsets.committed()
            sink = run_daemon(config, prefix)
            # Evidence first: the sink committed a write (so the ones after it were submitted).
            wait_until(lambda: offsets.committed() > before, timeout=120, what=f"a commit in cycle {cycle}")
            kill_daemon(sink)
            struck += offsets.committed() < total  # struck before the end, writes pending
        assert struck >= 3
        sink = run_daemon(config, prefix)
        try:
            wait_until(lambda: offsets.committed() >= total, timeout=300, what="the sink caught up")
        finally:
            stop_daemon(sink)
        assert _documents(client, f"{prefix}.items") == rows
    finally:
        offsets.close()
