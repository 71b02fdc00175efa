"""Signal storms: each kind of process stopped again and again (a worker 50 times), each time by a
burst of stop signals (``storms.burst``: SIGTERM to its process group, then SIGTERM/SIGINT to it,
back to back), each time once it showed progress, and each time it must exit within its grace
with its position stored (``storms.SourceLedger``, ``storms.SinkLedger``).

The burst is the stop that deadlocked workers in their own handler (cdc/runtime/stop_signals.py
says how): a signal to the process group followed by the supervisor's own SIGTERM. With that
handler, each worker storm below hung within its 50 stops. The kinds:

* a worker running a source (the generator, Kafka: its offsets in the offsets topic);
* a worker running a sink (the SQL sink on SQLite, the embedded log, a source daemon feeding it);
* the ``cdc run`` daemon running both (the embedded log): the burst goes to the supervisor, and
  its workers get the group's SIGTERM and the supervisor's;
* the Delta sink under ``cdc.runtime.submit`` (test_spark_stop_storm.py: each start is a JVM's).

Workers are forked from a preloaded forkserver (``storms.Workers``) rather than spawned, each in
a session of its own: the signal handling is ``worker_main``'s either way, and 100 spawns would
spend minutes importing the framework.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest

from cdc.config import load_config
from cdc.log.open import open_log
from cdc.runtime.worker import EXIT_OK
from tests.daemon import cdc_process, run_daemon, stop_daemon
from tests.faults.storms import (
    SinkLedger,
    SourceLedger,
    Workers,
    burst,
    keep_records,
    stop_within,
    tail_text,
    wait_while_alive,
)

pytestmark = pytest.mark.faults

STOPS = 50
# A daemon's stop costs a supervisor's start and two spawned workers' (seconds of imports each), so
# fewer: the worker kinds above take the 50 bursts each, and the supervisor's handler is the same
# code (stop_signals) that tests/unit/test_stop_signals.py storms with 30,000 signals.
DAEMON_STOPS = int(os.environ.get("CDC_DAEMON_STORM_STOPS", "20"))  # 50: bench/results/stop_storms.md
GRACE = 20.0  # cdc run's default --grace: how long the supervisor waits for a worker to drain
DRAIN = GRACE * 0.75  # the drain bound the supervisor gives its workers
# One partition, so a topic's offsets follow the generator's seqs; transactions of one event, so
# every batch ends on a checkpoint and a drain stores exactly what was published.
SOURCE = "{name: gen, type: generator, keys: 300, transaction_size: 1, max_batch_events: 200, rate: %d}"
SINK = "{name: lite, type: sql, url: 'sqlite:///lite.db', topics: ['%s.*']}"


def _config(tmp_path: Path, log_yaml: str, *, rate: int, sink_of: str | None = None) -> Path:
    path = tmp_path / "cdc.yaml"
    text = f"log:\n  {log_yaml}\nsources:\n  - {SOURCE % rate}\n"
    if sink_of:
        text += f"sinks:\n  - {SINK % sink_of}\n"
    path.write_text(text + "http: null\n")
    return path


def _embedded(prefix: str) -> str:
    return f"embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 1}}"


@pytest.mark.kafka
def test_a_worker_running_a_source_stops_drained_after_every_burst(kafka_bootstrap, kafka_topic, tmp_path):
    config = _config(tmp_path, f"kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {kafka_topic}, "
                               f"partitions: 1}}", rate=2000)
    log_path = tmp_path / "worker.log"
    log_ = open_log(load_config(str(config)).log)
    ledger = SourceLedger(log_, kafka_topic)
    workers, rng = Workers(), random.Random(27)
    try:
        for stop in range(1, STOPS + 1):
            process, reports = workers.start(config, "gen", log_path, DRAIN)
            before = ledger.published()
            wait_while_alive(lambda: ledger.published() > before, f"stop {stop}: the source publishing",
                             lambda: process.exitcode is None, log_path)
            what = f"stop {stop} ({', '.join(burst(process.pid, rng))})"
            code = stop_within(process, GRACE, what, log_path)
            assert code == EXIT_OK, f"{what}: exit {code}:\n{tail_text(log_path)}"
            ledger.check_stop(what)
            reports.close()
    finally:
        ledger.close()
        log_.close()


def test_a_worker_running_a_sink_stops_drained_after_every_burst(tmp_path):
    prefix = "storm"
    config = _config(tmp_path, _embedded(prefix), rate=3000, sink_of=prefix)
    log_path = tmp_path / "worker.log"
    log_ = open_log(load_config(str(config)).log)
    keep_records(log_, prefix)
    source = run_daemon(config, "gen", log="source.log")  # feeds the sink all along
    ledger = SinkLedger(log_, prefix, tmp_path / "lite.db")
    workers, rng = Workers(), random.Random(27)
    try:
        for stop in range(1, STOPS + 1):
            process, reports = workers.start(config, "lite", log_path, DRAIN)
            wait_while_alive(ledger.committed_moved, f"stop {stop}: the sink committing",
                             lambda: process.exitcode is None, log_path)
            what = f"stop {stop} ({', '.join(burst(process.pid, rng))})"
            code = stop_within(process, GRACE, what, log_path)
            assert code == EXIT_OK, f"{what}: exit {code}:\n{tail_text(log_path)}"
            ledger.check_stop(what)
            reports.close()
            assert source.poll() is None, f"the source daemon exited:\n{tail_text(tmp_path / 'source.log')}"
    finally:
        stop_daemon(source)
        ledger.close()
        log_.close()


def test_the_daemon_running_a_source_and_a_sink_stops_drained_after_every_burst(tmp_path):
    prefix = "storm"
    config = _config(tmp_path, _embedded(prefix), rate=3000, sink_of=prefix)
    log_path = tmp_path / "daemon.log"
    log_ = open_log(load_config(str(config)).log)
    keep_records(log_, prefix)
    source, sink = SourceLedger(log_, prefix), SinkLedger(log_, prefix, tmp_path / "lite.db")
    rng = random.Random(27)
    try:
        for stop in range(1, DAEMON_STOPS + 1):
            mark = log_path.stat().st_size if log_path.exists() else 0
            daemon = cdc_process(config, "run", "--grace", str(GRACE), log=log_path.name)
            try:
                wait_while_alive(lambda: source.stored_moved() and sink.committed_moved(),
                                 f"stop {stop}: the source storing and the sink committing",
                                 lambda: daemon.poll() is None, log_path)
                sent = burst(daemon.pid, rng)
                what = f"stop {stop} ({', '.join(sent)})"
                try:
                    code = daemon.wait(GRACE + 10)  # the supervisor kills a worker that outlasts its grace
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"{what}: the daemon still runs:\n{tail_text(log_path)}") from None
            finally:
                stop_daemon(daemon, grace=0)
            with log_path.open("rb") as f:
                f.seek(mark)
                since = f.read().decode(errors="replace")
            assert code == 0, f"{what}: exit {code}:\n{since[-4000:]}"
            assert "did not drain" not in since and "Traceback" not in since, f"{what}:\n{since[-4000:]}"
            source.check_stop(what)
            sink.check_stop(what)
    finally:
        source.close()
        sink.close()
        log_.close()
