"""The Spark sink on a standalone cluster (a master and a worker on loopback) with the static
settings a cluster takes in its ``spark.conf`` (``spark.executor.memory``, ``spark.executor.cores``,
``spark.cores.max``, given to the session's builder: once CANNOT_MODIFY_CONFIG), for Delta and
Iceberg, both on the cluster at once. The worker is killed with the executors while each sink has
a micro-batch running (its checkpoint holds that batch's offsets and no commit of it yet); a new
worker takes over, the batches run again, and each table, read by delta-rs or PyIceberg, ends
equal to the newest version of every key."""

from __future__ import annotations

import json
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

pytestmark = [pytest.mark.spark, pytest.mark.spark_processes, pytest.mark.iceberg, pytest.mark.kafka,
              pytest.mark.timeout(1200)]

KEYS = 400
AFTER_STRIKE = 4000   # changes published after the worker is killed


def _in_flight(checkpoint: Path) -> int | None:
    """The id of a micro-batch past the first whose offsets are written and whose commit is not."""
    offsets = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}
    commits = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
    running = [b for b in offsets - commits if b >= 1]
    return max(running) if running else None


def _read_to(checkpoint: Path, topic: str, ends: dict[str, int]) -> bool:
    """Whether the newest committed micro-batch's end offsets of ``topic`` reach ``ends``."""
    batch = _committed(checkpoint)
    if batch < 0:
        return False
    *_, last = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    read = json.loads(last).get(topic, {})
    return all(read.get(partition, -1) >= end for partition, end in ends.items())


def _committed(checkpoint: Path) -> int:
    return max((int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")), default=-1)


def _difference(found: dict | None, expected: dict) -> str:
    """What keeps ``found`` from equal to ``expected``, a few keys of each kind."""
    if found is None:
        return "no table"
    missing = sorted(expected.keys() - found.keys())
    extra = sorted(found.keys() - expected.keys())
    wrong = sorted(k for k in expected.keys() & found.keys() if found[k] != expected[k])
    return (f"{len(found)} rows, {len(expected)} expected; missing {len(missing)} {missing[:5]}, "
            f"extra {len(extra)} {[(k, found[k]) for k in extra[:5]]}, "
            f"wrong {len(wrong)} {[(k, found[k], expected[k]) for k in wrong[:5]]}")


def test_a_worker_killed_mid_batch_loses_nothing(kafka_bootstrap, kafka_topic, dev_env_for, tmp_path):
    """Two sinks on the cluster at once, one per table format, each with one core of the worker;
    the worker is killed once both have a batch in flight."""
    cluster = SparkCluster(tmp_path / "spark").start(cores=2)
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

    stop, struck_at = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def writer() -> None:
        """Changes until the strike, and AFTER_STRIKE more: the backlog the sinks catch up on
        is bounded by what was published, not by how long the recovery took."""
        after = 0
        try:
            while not stop.is_set() and after < AFTER_STRIKE:
                publish(200)
                if struck_at.is_set():
                    after += 200
                time.sleep(0.2)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            failed.append(error)

    jars = dev_env_for("spark")["SPARK_JARS"]
    spark = (f"spark: {{master: '{cluster.url}', driver_memory: 1g, jars: [{jars}], conf: {{"
             f"spark.executor.memory: 1g, spark.executor.cores: '1', spark.cores.max: '1', "
             f"spark.sql.shuffle.partitions: '2'}}}}")
    common = (f"topics: ['{topics.prefix}.public.*'], trigger_seconds: 1, max_offsets_per_trigger: 3000, {spark}")
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {topics.prefix}}}\n"
        f"sources: []\n"
        f"sinks:\n  - {{name: delta, type: delta, path: ./delta, checkpoint: ./delta-checkpoint, {common}}}\n"
        f"  - {{name: iceberg, type: delta, table_format: iceberg, iceberg: {{catalog: {{type: hadoop}}}}, "
        f"path: ./iceberg, checkpoint: ./iceberg-checkpoint, {common}}}\n"
        f"http: null\n")
    tables = IcebergTables({"type": "hadoop"}, str(tmp_path / "iceberg"))

    def table(name: str) -> dict | None:
        if name == "iceberg":
            try:
                return {r[0]: (r[1], r[2]) for r in tables.rows("public.items", "id", "name", "qty")}
            except Exception:  # noqa: BLE001 - no table yet
                return None
        found = _delta_rows(tmp_path / "delta" / "public" / "items", ["id", "name", "qty"])
        return None if found is None else {k: (v[0], int(v[1])) for k, v in found.items()}

    def alive(sinks: dict) -> None:
        for name, process in sinks.items():
            assert process.poll() is None, (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]

    topics.schema(ITEMS, ITEM_COLUMNS, 1)
    publish(2000)
    sinks = {name: run_daemon(config, name, log=f"{name}.log") for name in ("delta", "iceberg")}
    checkpoints = {name: tmp_path / f"{name}-checkpoint" for name in sinks}
    feeder = threading.Thread(target=writer, daemon=True)
    try:
        for name in sinks:
            wait_until(lambda name=name: _committed(checkpoints[name]) >= 0 or sinks[name].poll() is not None,
                       timeout=300, what=f"the {name} sink's first batch on the cluster")
        alive(sinks)
        feeder.start()
        def in_flight() -> dict[str, int] | None:
            found = {n: _in_flight(c) for n, c in checkpoints.items()}
            return found if all(b is not None for b in found.values()) else None  # type: ignore[return-value]

        struck = wait_until(in_flight, timeout=300, what="a micro-batch in flight in each sink")
        kill_daemon(cluster.workers[0])     # the worker and both executors, mid-batch
        struck_at.set()
        assert all(_committed(checkpoints[n]) < b for n, b in struck.items()), struck
        cluster.add_worker(cores=2)
        for name, batch in struck.items():
            wait_until(lambda name=name, batch=batch: _committed(checkpoints[name]) > batch
                       or sinks[name].poll() is not None, timeout=300,
                       what=f"the {name} sink's batch after the one struck committed on the new worker")
        alive(sinks)
        feeder.join(timeout=600)
        assert not feeder.is_alive() and not failed, failed    # what the test expects was all published
        ends = {str(p): o for (_, p), o in topics.log.end_offsets(topics.topic(ITEMS)).items()}
        expected = {k: v for k, v in newest.items() if v is not None}
        for name in sinks:
            # Evidence first: a batch committed that read to the end of the topic. Its table is
            # then final, and compared once.
            wait_until(lambda name=name: _read_to(checkpoints[name], topics.topic(ITEMS), ends)
                       or sinks[name].poll() is not None, timeout=900,
                       what=f"the {name} sink's commit of a batch read to the end of the topic")
            alive(sinks)
            found = table(name)
            assert found == expected, f"the {name} table: {_difference(found, expected)}"
            assert "CANNOT_MODIFY_CONFIG" not in (tmp_path / f"{name}.log").read_text(errors="replace")
    finally:
        stop.set()
        for process in sinks.values():
            stop_daemon(process)
        cluster.stop()
        topics.close()
