"""kill -9 of the Delta sink between a schema change and its first row, and in the middle of a
rebuild, for each source: after a restart the Delta tables equal their sources (the renamed
column's values too).

PostgreSQL and MariaDB -> ``cdc run`` captures -> Kafka -> one delta sink over both sources'
topics (``schema_policy: rebuild``). The sink runs as ``cdc run``'s worker runs it, held at the
point to strike for one source's table (``tests/delta_held.py``: the job's ``after_shape`` and
``after_table`` hooks), and killed there with its Spark JVM once it wrote that it got there:

1. a rename and an added column: the column was renamed and the new one added in place, no row
   of the new shape written yet;
2. int -> text (the table is rebuilt): the staging table is written from the topic, readers still
   see the old table.

Each point is struck for PostgreSQL's table, then for MariaDB's (one sink for both: each held
run first re-runs the batch the previous kill cut short), and then the real daemon takes over
from the checkpoint.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from cdc.log.kafka import KafkaLog
from tests.daemon import kill_daemon, module_process, run_daemon, stop_daemon
from tests.integration.pg_capture import topic_state, wait_until
from tests.integration.test_spark_delta_schema_live import delta_state
from tests.live_ddl import MyDb, PgDb, rows_of, shape_version, source_columns

# Four held Spark processes and the daemon's, one after another beside the test's own session:
# minutes on two shared cores.
pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.postgres, pytest.mark.mysql,
              pytest.mark.timeout(2400)]

ROWS = 200

# Per source kind: the seed's series, text concatenation, and the type change.
SERIES = {"postgres": "generate_series(1, {n}) g", "mysql": "(SELECT seq AS g FROM seq_1_to_{n}) s"}
CONCAT = {"postgres": "'{p}' || {c}", "mysql": "CONCAT('{p}', {c})"}
TO_TEXT = {"postgres": "ALTER TABLE orders ALTER COLUMN qty TYPE text", "mysql": "ALTER TABLE orders MODIFY qty text"}


def _config(tmp_path: Path, pg: PgDb, my: MyDb, kafka: str, jars: str) -> tuple[Path, str]:
    prefix = f"k_{uuid.uuid4().hex[:8]}"
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: pg, type: postgres, dsn: '{pg.dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"  - {{name: my, type: mysql, url: '{my.base}', server_id: {random.randrange(10_000, 2**31)}, "
        f"tables: ['{my.db}.*'], heartbeat_interval: 1}}\n"
        f"sinks:\n  - {{name: lake, type: delta, topics: ['{prefix}.public.*', '{prefix}.{my.db}.*'], "
        f"path: ./lake, checkpoint: ./checkpoint, trigger_seconds: 0.5, schema_policy: rebuild, "
        f"spark: {{master: 'local[2]', driver_memory: 1g, jars: [{jars}], "
        f"conf: {{spark.sql.shuffle.partitions: '2'}}}}}}\n"
        f"http: null\n")
    return path, prefix


def _held(config: Path, point: str, table: str):
    marker = config.parent / f"held-{point}-{table}"
    return module_process(config, "tests.delta_held", str(config), "lake", point, str(marker), table,
                          log="lake.log"), marker


def test_delta_sink_killed_after_a_shape_change_and_inside_a_rebuild_ends_equal_to_the_source(
        spark, pg_dsn, mysql_url, mysql_db, kafka_bootstrap, dev_env_for, tmp_path):
    pg, my = PgDb(pg_dsn), MyDb(mysql_url, mysql_db)
    namespaces = {"pg": "public", "my": mysql_db}
    dbs = {"pg": pg, "my": my}
    for db in dbs.values():
        db.execute("CREATE TABLE orders (id integer PRIMARY KEY, qty integer, amount numeric(12,2), note text, "
                   "t integer DEFAULT 0, c1 text)")
        db.execute(f"INSERT INTO orders SELECT g, g, g * 1.25, 'seed', 0, {CONCAT[db.kind].format(p='v', c='g')} "
                   f"FROM {SERIES[db.kind].format(n=ROWS)}")
    config, prefix = _config(tmp_path, pg, my, kafka_bootstrap, dev_env_for("spark")["SPARK_JARS"])
    tables = {name: str(tmp_path / "lake" / ns / "orders") for name, ns in namespaces.items()}
    log = KafkaLog(kafka_bootstrap)
    marker = [0]

    def settle(name: str) -> None:
        """Wait until the topic holds everything the source committed so far (a marker row)."""
        marker[0] -= 1
        dbs[name].execute(f"INSERT INTO orders (id) VALUES ({marker[0]})")
        topic = f"{prefix}.{namespaces[name]}.orders"
        wait_until(lambda: f'{{"id":{marker[0]}}}' in topic_state(log, topic), timeout=120,
                   what=f"the capture of {name} to catch up")

    def equal_to_source(timeout: float = 600) -> None:
        def same() -> bool:
            from pyspark.errors import AnalysisException

            for name, db in dbs.items():
                columns = source_columns(db.url, "orders")
                try:
                    held = delta_state(spark, tables[name], columns)
                except AnalysisException as err:  # the sink swapped the table in between this read's two steps
                    if "DELTA_SCHEMA_CHANGE_SINCE_ANALYSIS" not in str(err):
                        raise
                    return False  # read again
                if held != rows_of(db.url, "orders", columns):
                    return False
            return True
        wait_until(same, timeout=timeout, what="the Delta tables equal to their sources")

    def held(point: str, name: str):
        """A sink held at ``point`` of source ``name``'s table (reached: its marker file)."""
        processes["lake"], reached = _held(config, point, f"{namespaces[name]}.orders")
        return reached

    def strike(reached: Path, point: str, name: str) -> None:
        """Kill the held sink once it reached its point."""
        wait_until(lambda: reached.exists() or processes["lake"].poll() is not None, timeout=600,
                   what=f"the sink at {point} of {name}'s table")
        assert reached.exists(), (tmp_path / "lake.log").read_text()[-3000:]
        kill_daemon(processes["lake"])

    processes = {name: run_daemon(config, name, log=f"{name}.log") for name in dbs}
    try:
        # The first held sink also loads both tables (a table's first shape is no change of it).
        reached = held("shape", "pg")
        for name in dbs:
            settle(name)
        equal_to_source()
        qty_types = {}
        for name, db in dbs.items():
            # 1. A rename and a new column; rows of the new shape. The held sink renames and adds
            # in place, then stops before its first row: killed there.
            if name != "pg":
                reached = held("shape", name)   # re-runs the batch the last kill cut short first
            db.execute("ALTER TABLE orders RENAME COLUMN c1 TO c1r; ALTER TABLE orders ADD COLUMN c5 integer")
            db.execute("UPDATE orders SET t = t + 1, c5 = id WHERE id <= 50")
            strike(reached, "shape", name)
            frame = spark.read.format("delta").load(tables[name])
            assert {"c1r", "c5"} <= set(frame.columns) and "c1" not in frame.columns, (name, frame.columns)
            qty_types[name] = dict(frame.dtypes)["qty"]
            newest = frame.agg({"__cdc_version": "max"}).first()[0]
            assert newest < shape_version(kafka_bootstrap, prefix, "orders", lambda cols: "c5" in cols, source=name)

        for name, db in dbs.items():
            # 2. int -> text: a rebuild. The held sink first re-runs the batch the last kill cut
            # short, then rebuilds; killed once the staging table is written, before the swap.
            db.execute(TO_TEXT[db.kind])
            db.execute(f"UPDATE orders SET t = t + 1, qty = {CONCAT[db.kind].format(p='q', c='id')} WHERE id > 150")
            settle(name)
            strike(held("rebuild", name), "rebuild", name)
            assert dict(spark.read.format("delta").load(tables[name]).dtypes)["qty"] == qty_types[name] != "string"
            assert Path(tmp_path / "lake" / "_cdc_rebuild" / namespaces[name] / "orders").is_dir()

        # The real daemon from the checkpoint: the tables end equal to their sources, in their types.
        processes["lake"] = run_daemon(config, "lake", log="lake.log")
        equal_to_source()
        for name, db in dbs.items():
            types = dict(spark.read.format("delta").load(tables[name]).dtypes)
            assert types["qty"] == "string" and "c1" not in types, (name, types)
            assert rows_of(db.url, "orders", ["id", "c1r"])[7] == ("v7",)   # never written since the rename
            assert delta_state(spark, tables[name], ["id", "c1r"])[7] == ("v7",)
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop_daemon(process)
        log.close()
    text = (tmp_path / "lake.log").read_text(errors="replace")
    assert text.count("rebuilt from") >= 2, text[-3000:]
