"""The Delta sink under ``cdc.runtime.submit`` (a process of its own), stopped by bursts of stop
signals (``storms.burst``) mid-stream, as test_stop_storms.py stops the framework's workers: each
time it must exit 0 within a service manager's stop timeout, quietly, with its checkpoint moved
on, and after the last stop a restart on the checkpoint writes the rest: nothing lost.

Two stops in the suite, not the workers' 50: each start is a JVM and a Spark session (a minute or
two on a busy machine); ``CDC_SPARK_STORM_STOPS`` sets another count. Their bursts hold SIGINTs, which reached PySpark's own handler here: made on the
main thread, a SparkContext installs one that calls the JVM from inside the handler and raises
KeyboardInterrupt (a Py4JNetworkError and exit 1), so ``cdc.runtime.submit`` now runs the sink
off the main thread.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cdc.events import Op
from spark_sinks.config import DeltaSinkConfig
from tests.daemon import module_process
from tests.faults.storms import burst, wait_while_alive
from tests.integration.test_spark_delta_shutdown import NOISE, commits, submit_config
from tests.integration.test_spark_delta_sink import ITEM_COLUMNS, ITEMS, Topics, catch_up, rows, upsert

# Two in the suite; CDC_SPARK_STORM_STOPS=50 runs the workers' 50 (about 45 s a stop on these
# machines: bench/results/stop_storms.md).
STOPS = int(os.environ.get("CDC_SPARK_STORM_STOPS", "2"))
KEYS = max(6000, STOPS * 3000)  # enough that the last burst still comes mid-stream
# A JVM's start and a Spark session per stop: minutes on a loaded machine.
pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(max(1800, STOPS * 150))]
STOP_TIMEOUT = 90.0  # systemd's default TimeoutStopSec: what a service manager waits before SIGKILL


def _committed_batches(checkpoint: Path) -> int:
    """Batches the query's checkpoint records as done (``commits/<batch id>``)."""
    done = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if (checkpoint / "commits").is_dir() else []
    return max(done, default=-1) + 1


def test_the_delta_sink_process_stops_cleanly_after_every_burst(spark, dev_env_for, kafka_bootstrap, kafka_topic,
                                                                tmp_path):
    topics = Topics(kafka_bootstrap, kafka_topic)
    try:
        topics.schema(ITEMS, ITEM_COLUMNS, 1)
        topics.publish(*[upsert(k, k, op=Op.CREATE, name=f"n{k}", qty=k) for k in range(1, KEYS + 1)])
    finally:
        topics.close()
    # Small batches one right after another: whenever the burst comes, one is running.
    config_file, sink = submit_config(tmp_path, dev_env_for("spark")["SPARK_JARS"], kafka_bootstrap, kafka_topic,
                                      trigger_seconds=0, max_offsets_per_trigger=300)
    table, checkpoint = tmp_path / "lake" / "public" / "items", tmp_path / "checkpoint"
    rng, done = random.Random(27), 0
    for stop in range(1, STOPS + 1):
        output = tmp_path / f"submit-{stop}.txt"
        before = commits(table)
        process = module_process(config_file, "cdc.runtime.submit", str(config_file), "lake", log=output.name)
        try:
            # Evidence that this run's batches flow: two MERGE commits of its own.
            wait_while_alive(lambda: commits(table) >= before + 2, f"stop {stop}: the sink's batches",
                             lambda: process.poll() is None, output, timeout=600)
            sent = burst(process.pid, rng)
            assert any("SIGINT" in signal_sent for signal_sent in sent), "the seed gives each burst a SIGINT"
            try:
                code = process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGUSR1)  # every thread's Python stack into its output
                time.sleep(2)
                raise AssertionError(f"stop {stop} ({', '.join(sent)}): still running after "
                                     f"{STOP_TIMEOUT:.0f}s:\n{output.read_text(errors='replace')[-12000:]}") from None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        text = output.read_text(errors="replace")
        what = f"stop {stop} ({', '.join(sent)})"
        assert code == 0, f"{what}: exit {code}:\n{text[-4000:]}"
        assert not [line for line in text.splitlines() if any(word in line for word in NOISE)], f"{what}:\n{text}"
        batches = _committed_batches(checkpoint)
        assert batches > done, f"{what}: the checkpoint's committed batches did not move ({batches})"
        done = batches
    assert rows(spark, str(table), "id") != [(k,) for k in range(1, KEYS + 1)], \
        "the sink caught up before the last burst: this test needs it stopped mid-stream"

    # Nothing lost: a restart on the same checkpoint writes the rest.
    config = DeltaSinkConfig.model_validate(
        {**sink, "kafka": {"bootstrap_servers": kafka_bootstrap}, "trigger_seconds": 0.5,
         "max_offsets_per_trigger": None})
    catch_up(spark, config)
    assert rows(spark, str(table), "id", "name") == [(k, f"n{k}") for k in range(1, KEYS + 1)]
