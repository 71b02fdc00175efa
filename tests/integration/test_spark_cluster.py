"""The Spark sink on a standalone cluster (a master and a worker on loopback) with the static
settings a cluster takes in its ``spark.conf`` (``spark.executor.memory``, ``spark.executor.cores``,
``spark.cores.max``, given to the session's builder: once CANNOT_MODIFY_CONFIG), for Delta and
Iceberg. The worker is killed with its executor while a micro-batch runs (the checkpoint holds
that batch's offsets and no commit of it yet); a new worker takes over, the batch runs again, and
the table, read by delta-rs or PyIceberg, ends equal to the newest version of every key."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cdc.events import Op
from tests.daemon import kill_daemon, run_daemon, stop_daemon
from tests.iceberg_tables import IcebergTables
from tests.integration.pg_capture import wait_until
from tests.integration.test_spark_delta_sink import ITEM_COLUMNS, ITEMS, Topics, delete, upsert
from tests.integration.test_spark_lake_live import _delta_rows
from tests.spark_cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(1200)]

KEYS = 400


def _in_flight(checkpoint: Path) -> int | None:
    """The id of a micro-batch past the first whose offsets are written and whose commit is not."""
    offsets = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}
    commits = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
    running = [b for b in offsets - commits if b >= 1]
    return max(running) if running else None


def _committed(checkpoint: Path) -> int:
    return max((int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")), default=-1)


@pytest.mark.parametrize("table_format", ["delta", pytest.param("iceberg", marks=pytest.mark.iceberg)])
def test_a_worker_killed_mid_batch_loses_nothing(kafka_bootstrap, kafka_topic, dev_env_for, tmp_path, table_format):
    cluster = SparkCluster(tmp_path / "spark").start()
    topics = Topics(kafka_bootstrap, kafka_topic)
    newest: dict[int, tuple | None] = {}
    version = [0]

    def publish(count: int) -> None:
        events = []
        for _ in range(count):
            version[0] += 1
            key = version[0] % KEYS + 1
            if version[0] % 13 == 0:
                events.append(delete(key, version[0]))
                newest[key] = None
            else:
                events.append(upsert(key, version[0], op=Op.UPDATE, name=f"n{version[0]}", qty=version[0]))
                newest[key] = (f"n{version[0]}", version[0])
        topics.publish(*events)

    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            publish(200)
            time.sleep(0.2)

    jars = dev_env_for("spark")["SPARK_JARS"]
    lake = ("table_format: iceberg, iceberg: {catalog: {type: hadoop}}, " if table_format == "iceberg" else "")
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {topics.prefix}}}\n"
        f"sources: []\n"
        f"sinks:\n  - {{name: lake, type: delta, {lake}topics: ['{topics.prefix}.public.*'], path: ./lake, "
        f"checkpoint: ./checkpoint, trigger_seconds: 1, max_offsets_per_trigger: 3000, "
        f"spark: {{master: '{cluster.url}', driver_memory: 1g, jars: [{jars}], conf: {{"
        f"spark.executor.memory: 1g, spark.executor.cores: '1', spark.cores.max: '1', "
        f"spark.sql.shuffle.partitions: '2'}}}}}}\n"
        f"http: null\n")
    checkpoint = tmp_path / "checkpoint"
    tables = IcebergTables({"type": "hadoop"}, str(tmp_path / "lake"))

    def table() -> dict | None:
        if table_format == "iceberg":
            try:
                return {r[0]: (r[1], r[2]) for r in tables.rows("public.items", "id", "name", "qty")}
            except Exception:  # noqa: BLE001 - no table yet
                return None
        found = _delta_rows(tmp_path / "lake" / "public" / "items", ["id", "name", "qty"])
        return None if found is None else {k: (v[0], int(v[1])) for k, v in found.items()}

    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    publish(2000)
    sink = run_daemon(config, "lake", log="lake.log")
    feeder = threading.Thread(target=writer, daemon=True)
    try:
        wait_until(lambda: _committed(checkpoint) >= 0 or sink.poll() is not None, timeout=300,
                   what="the sink's first batch on the cluster")
        assert sink.poll() is None, (tmp_path / "lake.log").read_text(errors="replace")[-3000:]
        feeder.start()
        struck = wait_until(lambda: _in_flight(checkpoint), timeout=300, what="a micro-batch in flight")
        kill_daemon(cluster.workers[0])     # the worker and its executor, mid-batch
        assert _committed(checkpoint) < struck
        cluster.add_worker()
        wait_until(lambda: _committed(checkpoint) >= struck + 1 or sink.poll() is not None, timeout=300,
                   what="the batch after the one struck committed on the new worker")
        assert sink.poll() is None, (tmp_path / "lake.log").read_text(errors="replace")[-3000:]
        stop.set()
        feeder.join()
        expected = {k: v for k, v in newest.items() if v is not None}
        wait_until(lambda: table() == expected, timeout=300, what=f"the {table_format} table equal to the events")
        assert "CANNOT_MODIFY_CONFIG" not in (tmp_path / "lake.log").read_text(errors="replace")
    finally:
        stop.set()
        stop_daemon(sink)
        cluster.stop()
        topics.close()
