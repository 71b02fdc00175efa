"""kill -9 of the Delta sink between a schema change and its first row, and in the middle of a
rebuild: after a restart the Delta table equals the source (the renamed column's values too).

PostgreSQL -> ``cdc run`` capture -> Kafka -> the delta sink (``schema_policy: rebuild``). The
sink runs as ``cdc run``'s worker runs it, held at the point to strike (``tests/delta_held.py``:
the job's ``after_shape`` and ``after_table`` hooks), and killed there with its Spark JVM once
it wrote that it got there:

1. a rename and an added column: the column was renamed and the new one added in place, no row
   of the new shape written yet;
2. int -> text (the table is rebuilt): the staging table is written from the topic, readers still
   see the old table.

Then the real daemon takes over from the checkpoint.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cdc.log.kafka import KafkaLog
from tests.daemon import kill_daemon, module_process, run_daemon, stop_daemon
from tests.integration.pg_capture import execute, topic_state, wait_until
from tests.integration.test_spark_delta_schema_live import delta_state
from tests.live_ddl import PgDb, rows_of, shape_version, source_columns

# Three Spark processes one after another beside the test's own session: minutes on two
# shared cores.
pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.postgres, pytest.mark.timeout(1800)]

ROWS = 200


def _config(tmp_path: Path, dsn: str, kafka: str, jars: str) -> tuple[Path, str]:
    prefix = f"k_{uuid.uuid4().hex[:8]}"
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"sinks:\n  - {{name: lake, type: delta, topics: ['{prefix}.public.*'], path: ./lake, "
        f"checkpoint: ./checkpoint, trigger_seconds: 0.5, schema_policy: rebuild, "
        f"spark: {{master: 'local[2]', driver_memory: 1g, jars: [{jars}], "
        f"conf: {{spark.sql.shuffle.partitions: '2'}}}}}}\n"
        f"http: null\n")
    return path, prefix


def _held(config: Path, point: str):
    marker = config.parent / f"held-{point}"
    return module_process(config, "tests.delta_held", str(config), "lake", point, str(marker), log="lake.log"), marker


def test_delta_sink_killed_after_a_shape_change_and_inside_a_rebuild_ends_equal_to_the_source(
        spark, pg_dsn, kafka_bootstrap, dev_env_for, tmp_path):
    db = PgDb(pg_dsn)
    db.execute("CREATE TABLE orders (id integer PRIMARY KEY, qty integer, amount numeric(12,2), note text, "
               "t integer DEFAULT 0, c1 text)")
    db.execute(f"INSERT INTO orders SELECT g, g, g * 1.25, 'seed', 0, 'v' || g FROM generate_series(1, {ROWS}) g")
    config, prefix = _config(tmp_path, pg_dsn, kafka_bootstrap, dev_env_for("spark")["SPARK_JARS"])
    table, topic = str(tmp_path / "lake" / "public" / "orders"), f"{prefix}.public.orders"
    log = KafkaLog(kafka_bootstrap)
    marker = [0]

    def settle() -> None:
        """Wait until the topic holds everything the source committed so far (a marker row)."""
        marker[0] -= 1
        db.execute(f"INSERT INTO orders (id) VALUES ({marker[0]})")
        wait_until(lambda: f'{{"id":{marker[0]}}}' in topic_state(log, topic), timeout=120,
                   what="the capture to catch up")

    def equal_to_source(timeout: float = 600) -> None:
        def same() -> bool:
            columns = source_columns(db.url, "orders")
            return delta_state(spark, table, columns) == rows_of(db.url, "orders", columns)
        wait_until(same, timeout=timeout, what="the Delta table equal to the source")

    processes = {"src": run_daemon(config, "src", log="src.log")}
    try:
        processes["lake"], reached = _held(config, "shape")
        settle()
        equal_to_source()

        # 1. A rename and a new column; rows of the new shape. The held sink renames and adds in
        # place, then stops before its first row: killed there.
        db.execute("ALTER TABLE orders RENAME COLUMN c1 TO c1r; ALTER TABLE orders ADD COLUMN c5 integer")
        db.execute("UPDATE orders SET t = t + 1, c5 = id WHERE id <= 50")
        wait_until(lambda: reached.exists() or processes["lake"].poll() is not None, timeout=600,
                   what="the sink at its first row of the new shape")
        assert reached.exists(), (tmp_path / "lake.log").read_text()[-3000:]
        kill_daemon(processes["lake"])
        frame = spark.read.format("delta").load(table)
        assert {"c1r", "c5"} <= set(frame.columns) and "c1" not in frame.columns, frame.columns
        qty_type = dict(frame.dtypes)["qty"]
        newest = frame.agg({"__cdc_version": "max"}).first()[0]
        assert newest < shape_version(kafka_bootstrap, prefix, "orders", lambda cols: "c5" in cols)

        # 2. int -> text: a rebuild. The held sink first re-runs the batch it was killed in, then
        # rebuilds; killed once the staging table is written, before the swap.
        db.execute("ALTER TABLE orders ALTER COLUMN qty TYPE text")
        db.execute("UPDATE orders SET t = t + 1, qty = 'q' || id WHERE id > 150")
        settle()
        processes["lake"], reached = _held(config, "rebuild")
        wait_until(lambda: reached.exists() or processes["lake"].poll() is not None, timeout=600,
                   what="the sink inside its rebuild")
        assert reached.exists(), (tmp_path / "lake.log").read_text()[-3000:]
        kill_daemon(processes["lake"])
        assert dict(spark.read.format("delta").load(table).dtypes)["qty"] == qty_type != "string"  # not swapped yet
        assert Path(tmp_path / "lake" / "_cdc_rebuild" / "public" / "orders").is_dir()

        # The real daemon from the checkpoint: the table ends equal to the source, in its types.
        processes["lake"] = run_daemon(config, "lake", log="lake.log")
        equal_to_source()
        types = dict(spark.read.format("delta").load(table).dtypes)
        assert types["qty"] == "string" and "c1" not in types, types
        assert rows_of(db.url, "orders", ["id", "c1r"])[7] == ("v7",)   # never written since the rename
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop_daemon(process)
        log.close()
    text = (tmp_path / "lake.log").read_text(errors="replace")
    assert "rebuilt from" in text, text[-3000:]
