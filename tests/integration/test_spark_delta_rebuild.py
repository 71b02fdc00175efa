"""`cdc rebuild` of the Delta sink (a self-driven sink) while the daemon runs, under a live writer.

Before, the daemon refused it ("cannot rebuild: only a sink the daemon drives has generations"),
and `cdc rebuild` without a daemon ran the sink through a runner that cannot drive it. Now the
daemon drains the sink and starts it in rebuild mode: every table is built again from its
compacted topic into a staging table and swapped in by one overwrite commit before the query
resumes from its checkpoint. Two rebuilds in a row (the second after a finished one) while a
writer changes the source; after each, a marker row updated on the source must reach the table,
each rebuild must be one overwrite commit of the table, and at the end the table equals the source.
Then one more without the daemon.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import psycopg2
import pytest

from cdc.dev.services import free_port
from tests.background import ItemsWriter
from tests.daemon import cdc_process, kill_daemon, wait_beside
from tests.integration.pg_capture import execute
from tests.integration.test_daemon_control import _rows
from tests.integration.test_spark_delta_schema_live import delta_state

pytestmark = [pytest.mark.spark, pytest.mark.spark_processes, pytest.mark.kafka, pytest.mark.postgres,
              pytest.mark.timeout(2400)]

ROWS = 300
REBUILDS = 2  # through the daemon; each costs a minute or more of Spark
COLUMNS = ["id", "qty", "note"]


class Writer(ItemsWriter):
    rows = ROWS
    pause = 0.05


def _config(tmp_path: Path, dsn: str, kafka: str, jars: str, port: int) -> Path:
    prefix = f"r_{uuid.uuid4().hex[:8]}"
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"sinks:\n  - {{name: lake, type: delta, topics: ['{prefix}.public.*'], path: ./lake, "
        f"checkpoint: ./checkpoint, trigger_seconds: 0.5, "
        f"spark: {{master: 'local[2]', driver_memory: 1g, jars: [{jars}], "
        f"conf: {{spark.sql.shuffle.partitions: '2'}}}}}}\n"
        f"http: '127.0.0.1:{port}'\n")
    return path


def _source(dsn: str) -> dict:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, qty, note FROM items")
        return {r[0]: tuple(r[1:]) for r in cur.fetchall()}


def test_delta_rebuilds_again_and_again_under_a_writer_and_every_later_change_arrives(
        spark, pg_dsn, kafka_bootstrap, dev_env_for, tmp_path):
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note text)",
            f"INSERT INTO items SELECT g, 0, 'seed' FROM generate_series(1, {ROWS}) g")
    port = free_port()
    config = _config(tmp_path, pg_dsn, kafka_bootstrap, dev_env_for("spark")["SPARK_JARS"], port)
    table = str(tmp_path / "lake" / "public" / "items")

    def lake() -> dict:
        return {k: (v[0], v[1]) for k, v in delta_state(spark, table, COLUMNS).items()}

    def overwrites() -> int:
        history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
        return sum(1 for h in history if h["operation"] == "WRITE"
                   and (h["operationParameters"] or {}).get("mode") == "Overwrite")

    daemon = cdc_process(config, "run", log="daemon.log")
    try:
        wait_beside("the table holds the snapshot", lambda: len(lake()) >= ROWS, daemon, 600)
        assert overwrites() == 0
        with Writer(pg_dsn, seed=5):
            for round_ in range(1, REBUILDS + 1):
                result = subprocess.run([sys.executable, "-m", "cdc.cli", "rebuild", str(config), "lake"],
                                        cwd=tmp_path, capture_output=True, text=True, timeout=900)
                assert result.returncode == 0, f"rebuild #{round_}: {result.stderr[-2000:]}"
                assert overwrites() == round_, f"rebuild #{round_} swapped no table in"
                marker = f"after-{round_}"
                execute(pg_dsn, f"UPDATE items SET note = '{marker}' WHERE id = 1")
                wait_beside(f"round {round_}: the change made after the rebuild reaches the table",
                            lambda: (lake().get(1) or (None, None))[1] == marker, daemon, 300)
        expected = _source(pg_dsn)
        wait_beside("the table equals the source", lambda: lake() == expected, daemon, 300)
        status = _rows(port)
        assert status["lake"]["healthy"] and status["lake"]["phase"] == "streaming", status["lake"]
    finally:
        kill_daemon(daemon)
    log = (tmp_path / "daemon.log").read_text(errors="replace")
    assert log.count("rebuilt 1 table(s)") == REBUILDS, log[-3000:]

    # Without a daemon the command rebuilds, and returns once the query streams again.
    result = subprocess.run([sys.executable, "-m", "cdc.cli", "rebuild", str(config), "lake"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and "rebuilt lake" in result.stderr, result.stderr[-2000:]
    assert overwrites() == REBUILDS + 1
    assert lake() == expected
