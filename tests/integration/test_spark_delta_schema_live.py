"""The DDL script of tests/live_ddl.py against the Delta sink, for each source and each
``schema_policy``: PostgreSQL or MariaDB -> capture -> Kafka -> three delta sinks on the same
topics (``rebuild``, ``evolve``, ``fail``), a writer writing while each DDL runs. After each step,
per policy, either the Delta tables equal the source on the source's columns, with the types the
README's table says (a widened decimal in place; int -> text and numeric -> double rebuilt), or
the sink stopped with a ``SchemaChangeError`` naming the table, the column and the fix, before it
wrote a single row of the new shape (the policy's table is exactly as it was before the step).
A stopped sink stays stopped for the rest of the script, as a stopped daemon's sink would.

While the ``rebuild`` sink rebuilds ``orders``, a reader counts its rows all along (a Spark read
of the table's current version, as any reader of the table would) and once more between the
staging table's write and the swap: it never sees the table missing, emptier than before the
step (the writer deletes nothing), or shrinking. A read planned before the swap's commit and run
after it is planned again, as Delta asks of any reader across a column's type change
(``STALE_PLAN``); a second failure counts as the table unreadable.

One Spark session for the whole script (the ``spark`` fixture); the three sinks' queries run
side by side on it."""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException

from cdc.errors import SchemaChangeError
from cdc.log.kafka import KafkaLog
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from tests.contexts import attached
from tests.integration.pg_capture import capturing, pg_config, topic_state, wait_until
from tests.integration.test_mysql_source import mysql_config
from tests.live_ddl import (
    STEPS,
    Writer,
    rows_of,
    source_columns,
    source_db,  # noqa: F401 - the fixture
)

# Up to three sinks' micro-batches per step on two shared cores: past the default timeout when
# the machine is loaded (a run at load 30-48 passed step 6 of the PostgreSQL script at 1500 s).
pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(2400)]

POLICIES = ("rebuild", "evolve", "fail")

# Delta's error for a read planned before a commit that changed a column's type (or its physical
# name) and run after it: the table is readable, the plan is stale. Any reader can meet it across
# a type change at the table's path, however that change is committed.
STALE_PLAN = "DELTA_SCHEMA_CHANGE_SINCE_ANALYSIS"

# spark_sinks/README.md (types.py): both sources' types of the changed columns after each step,
# for the policies that follow it.
DELTA_TYPES = {"widen a numeric": {"amount": "decimal(14,4)"}, "int to text": {"qty": "string"},
               "numeric to double": {"amount": "double"}}

# spark_sinks/README.md's table: where ``fail`` and ``evolve`` stop, and what the message names.
STOPS = {"fail": ("rename a column", ["column c1 renamed to c1r", "schema_policy: evolve"]),
         "evolve": ("int to text", ["column qty:", "int", "string", "set it to rebuild"])}


def _norm(value):
    if value is None or isinstance(value, (str, bool)):
        return value
    return Decimal(str(value)).normalize()


def delta_state(spark, path: str, columns: list[str]) -> dict:
    try:
        frame = spark.read.format("delta").load(path)
    except Exception:  # noqa: BLE001 - no table yet
        return {}
    present = [c for c in columns if c in frame.columns]
    if present != columns:
        return {}
    return {r[0]: tuple(_norm(v) for v in r[1:]) for r in frame.select(*columns).collect()}


def capture_config(db, tmp_path, prefix: str):
    """(the source's config, the namespace of its topics: ``<prefix>.<namespace>.<table>``)."""
    if db.kind == "postgres":
        return pg_config(db.dsn, tmp_path, slot=f"dl_{prefix}"), "public"
    return mysql_config(db.base, db.db, heartbeat_interval=1.0), db.db


def commits(table: Path) -> int:
    """How many commits the Delta table at ``table`` has (its log's JSON files)."""
    return len(list((table / "_delta_log").glob("*.json")))


class DeltaReader:
    """Counts the rows of the Delta table at ``path`` again and again from a thread of the
    test's session, as a reader of the table would, until closed; ``seen`` keeps every count
    (-1: the table could not be read)."""

    def __init__(self, spark, path: str) -> None:
        self.spark, self.path = spark, path
        self.seen: list[int] = []
        self.errors: list[str] = []  # why a count was -1: said in the assertion that fails on it
        self.replanned = 0   # reads planned again after Delta's STALE_PLAN error (see count)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def count(self) -> int:
        for attempt in (1, 2):
            try:
                return self.spark.read.format("delta").load(self.path).count()
            except AnalysisException as err:
                if attempt == 1 and err.getCondition() == STALE_PLAN:
                    # Planned before the swap's commit, run after it: Delta refuses a plan made
                    # for a column type the table no longer has, and says to plan it again.
                    self.replanned += 1
                    continue
                self.errors.append(f"{type(err).__name__}: {str(err)[:2000]}")
                return -1
            except Exception as err:  # noqa: BLE001 - a table that cannot be read is what the test looks for
                self.errors.append(f"{type(err).__name__}: {str(err)[:2000]}")
                return -1
        raise AssertionError("unreachable")

    def _run(self) -> None:
        while not self.stop.is_set():
            self.seen.append(self.count())
            time.sleep(0.5)   # each count is a Spark job beside the rebuild's, on two cores

    def __enter__(self) -> DeltaReader:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def _watch_the_swap(sink: DeltaSink, reader: DeltaReader, inside: list[int]) -> None:
    """Once a rebuild wrote its staging table (the job's ``after_table`` hook, before the swap),
    read the live table there too: the most likely moment to see it half-replaced."""
    staging = Path(reader.path).parent.parent / "_cdc_rebuild" / Path(reader.path).parent.name / "orders"

    def after_table(batch_id: int, table: str) -> None:
        if staging.is_dir() and table.endswith(".orders"):
            inside.append(reader.count())
    sink.job.after_table = after_table


def test_the_ddl_script_reaches_delta_in_order(spark, source_db, kafka_bootstrap, kafka_topic, tmp_path):
    db = source_db
    db.seed()
    source = db.url
    prefix = kafka_topic
    log = KafkaLog(kafka_bootstrap)
    capture, namespace = capture_config(db, tmp_path, prefix)
    configs = {policy: DeltaSinkConfig.model_validate(dict(
        name=f"lake_{policy}", type="delta", topics=[f"{prefix}.{namespace}.*"], path=str(tmp_path / policy),
        checkpoint=str(tmp_path / f"checkpoint_{policy}"), trigger_seconds=0.5, topic_prefix=prefix,
        schema_policy=policy, kafka={"bootstrap_servers": kafka_bootstrap},
        spark={"conf": {"spark.sql.shuffle.partitions": "2"}})) for policy in POLICIES}
    orders = f"{prefix}.{namespace}.orders"
    writer = Writer(db)
    marker = [0]
    stopped: dict[str, str] = {}     # policy -> the step it stopped at
    rebuilds_watched = 0
    try:
        # A binlog connection lost under load ends the source retriably: the daemon would start it
        # again from its stored position, and so does the capture here.
        with capturing(capture, log, prefix, restarts=True) as running:
            wait_until(lambda: len(topic_state(log, orders)) == 30, capture=running)
            writer.start()
            for step, ddl in zip(STEPS, db.script):
                writer.resume()
                db.execute(ddl)  # while the writer writes
                db.execute("UPDATE orders SET t = t + 1")
                writer.resume()
                writer.pause()
                # A marker row: once it is in the topic, everything before it is.
                marker[0] -= 1
                db.execute(f"INSERT INTO orders (id) VALUES ({marker[0]})")
                wait_until(lambda: f'{{"id":{marker[0]}}}' in topic_state(log, orders),
                           what="the capture to catch up", capture=running)
                live = [policy for policy in POLICIES if policy not in stopped]
                tables = {policy: Path(configs[policy].path) / namespace / "orders" for policy in live}
                before = {policy: commits(tables[policy]) for policy in live}
                rebuilding = step in ("int to text", "numeric to double")
                reader = DeltaReader(spark, str(tables["rebuild"]))
                # The rows before the step: the writer deletes nothing, so no read may see fewer.
                floor = reader.count() if rebuilding else 0
                inside: list[int] = []
                # The queries run from their checkpoints over what the step added (a few micro-
                # batches: a running query would make one per trigger while the writer writes).
                sinks = {policy: attached(DeltaSink(configs[policy])) for policy in live}
                failures = {}
                try:
                    for sink in sinks.values():
                        sink.start(session=spark)
                    if rebuilding:
                        _watch_the_swap(sinks["rebuild"], reader, inside)
                        reader.__enter__()
                    for policy, sink in sinks.items():
                        try:
                            sink.job.query.processAllAvailable()
                        except Exception:  # noqa: BLE001 - the typed error is the job's failure
                            pass
                        failures[policy] = sink.job.failure
                finally:
                    if rebuilding:
                        reader.__exit__()
                    for sink in sinks.values():
                        sink.stop()
                if rebuilding:
                    rebuilds_watched += 1
                    seen = [floor, *reader.seen]
                    assert floor > 0 and inside and all(n >= floor for n in inside), (step, floor, inside,
                                                                                      reader.errors)
                    assert all(n >= seen[i - 1] for i, n in enumerate(seen) if i), (step, seen, reader.errors)
                for policy in live:
                    failure = failures[policy]
                    stop_step, words = STOPS.get(policy, (None, []))
                    if step != stop_step:
                        assert failure is None, (policy, step, failure)
                        continue
                    # Stopped with the message, and nothing written: not a row of the new shape
                    # (nor of the old one in the same batches: all or nothing).
                    assert isinstance(failure, SchemaChangeError), (policy, step, failure)
                    text = str(failure)
                    assert "orders" in text and all(w in text for w in words), (policy, text)
                    assert commits(tables[policy]) == before[policy], (policy, step)
                    stopped[policy] = step
                for policy in (p for p in live if p not in stopped):
                    path = configs[policy].path
                    for table in ("orders", "items"):
                        columns = source_columns(source, table)
                        if columns:
                            expected = rows_of(source, table, columns)
                            actual = delta_state(spark, f"{path}/{namespace}/{table}", columns)
                            assert actual == expected, (policy, step, table, {
                                k: (expected.get(k), actual.get(k)) for k in set(expected) | set(actual)
                                if expected.get(k) != actual.get(k)})
                    types = dict(spark.read.format("delta").load(f"{path}/{namespace}/orders").dtypes)
                    for column, type_ in DELTA_TYPES.get(step, {}).items():
                        assert types[column] == type_, (policy, step, column, types[column])
                    if step == "rename a column":
                        assert "c1" not in types and "c1r" in types, (policy, step, types)
            assert writer.error is None, writer.error
    finally:
        writer.close()
        log.close()
    assert stopped == {policy: step for policy, (step, _) in STOPS.items()}, stopped
    assert rebuilds_watched == 2
