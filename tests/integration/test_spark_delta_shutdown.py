"""The delta sink stopped by SIGTERM in the middle of a micro-batch, as a service manager stops it:
the signal goes to the whole process group. It must stop its query itself and exit cleanly, not
let the JVM's shutdown hooks tear the SparkContext down under the batch (which printed pages of
InterruptedException and StackOverflowError), and the batch it cut short re-runs from the
checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cdc.events import Op
from spark_sinks.config import DeltaSinkConfig
from tests.integration.pg_capture import wait_until
from tests.integration.test_spark_delta_sink import ITEM_COLUMNS, ITEMS, Topics, catch_up, rows, upsert

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

KEYS = 6000
NOISE = ("InterruptedException", "StackOverflowError", "Traceback", "Py4JError", "Py4JNetworkError")


def commits(table: Path) -> int:
    log = table / "_delta_log"
    return len(list(log.glob("*.json"))) if log.is_dir() else 0


def submit_config(tmp_path: Path, jars: str, kafka_bootstrap: str, kafka_topic: str,
                  **settings) -> tuple[Path, dict]:
    """A config file with one delta sink ``lake`` over ``<kafka_topic>.*`` (tables and checkpoint
    under ``tmp_path``, a small local Spark) plus ``settings``, for ``cdc.runtime.submit``;
    returns (the file, the sink's settings)."""
    sink = {"name": "lake", "type": "delta", "topics": [f"{kafka_topic}.*"], "path": str(tmp_path / "lake"),
            "checkpoint": str(tmp_path / "checkpoint"), "topic_prefix": kafka_topic, **settings,
            "spark": {"master": "local[2]", "driver_memory": "1g", "jars": jars.split(","),
                      "conf": {"spark.sql.shuffle.partitions": "2"}}}
    config_file = tmp_path / "cdc.yaml"
    config_file.write_text(yaml.safe_dump({"log": {"kafka": {"bootstrap_servers": kafka_bootstrap,
                                                             "topic_prefix": kafka_topic}},
                                           "sinks": [sink]}))
    return config_file, sink


def test_sigterm_to_the_process_group_mid_batch_stops_cleanly(spark, dev_env_for, kafka_bootstrap,
                                                              kafka_topic, tmp_path):
    topics = Topics(kafka_bootstrap, kafka_topic)
    try:
        topics.schema(ITEMS, ITEM_COLUMNS, 1)
        topics.publish(*[upsert(k, k, op=Op.CREATE, name=f"n{k}", qty=k) for k in range(1, KEYS + 1)])
    finally:
        topics.close()
    # Small batches one right after another: whenever the signal comes, one is running.
    config_file, sink = submit_config(tmp_path, dev_env_for("spark")["SPARK_JARS"], kafka_bootstrap, kafka_topic,
                                      trigger_seconds=0, max_offsets_per_trigger=300)
    output = tmp_path / "output.txt"
    table = tmp_path / "lake" / "public" / "items"
    with output.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "cdc.runtime.submit", str(config_file), "lake"],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   cwd=Path(__file__).resolve().parents[2])
        try:
            # Evidence that batches are flowing: the table's creation and two MERGE commits.
            wait_until(lambda: commits(table) >= 3 or process.poll() is not None, timeout=300,
                       what="the sink's first batches")
            assert process.poll() is None, output.read_text()
            os.killpg(process.pid, signal.SIGTERM)
            code = process.wait(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    text = output.read_text(errors="replace")
    assert code == 0, text
    assert not [line for line in text.splitlines() if any(word in line for word in NOISE)], text
    assert len(text.splitlines()) < 40, text
    assert rows(spark, str(table), "id") != [(k,) for k in range(1, KEYS + 1)], \
        "the sink caught up before the signal: this test needs it stopped mid-stream"

    # Nothing lost: a restart on the same checkpoint writes the rest, the cut batch included.
    config = DeltaSinkConfig.model_validate(
        {**sink, "kafka": {"bootstrap_servers": kafka_bootstrap}, "trigger_seconds": 0.5,
         "max_offsets_per_trigger": None})
    catch_up(spark, config)
    assert rows(spark, str(table), "id", "name") == [(k, f"n{k}") for k in range(1, KEYS + 1)]
