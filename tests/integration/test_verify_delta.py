"""``cdc verify`` of a Delta sink (spark_sinks/reading.py) under a live writer.

The daemon runs the PostgreSQL source into Kafka (and answers ``--repair``'s snapshot request);
the Delta sink's query runs in this process on the tests' Spark session, as ``cdc run-sink``
runs it: a daemon running the sink would start a second Spark JVM (a GB and most of two cores
for its first batches), for the same query on the same checkpoint. ``cdc verify`` runs in this
process too and reads through that session. Spark tests run in a phase of their own.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cdc.config import load_config
from tests import verifying
from tests.background import PgWriter
from tests.conftest import _fresh_database
from tests.contexts import attached
from tests.daemon import run_daemon, stop_daemon
from tests.integration.pg_capture import execute, wait_until
from tests.verifying import free_port, keys_of

pytestmark = [pytest.mark.spark]

ROWS = 1000
RESERVED = 100  # keys below it are never touched by the writer: those the side job edits


class Writer(PgWriter):
    """Slow changes above ``RESERVED`` (a Delta batch takes seconds: a key changed at every
    look would be reported unsettled, rightly); ``hold`` set: nothing new is committed."""

    per_commit = 1
    pause = 0.2

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(dsn, seed)
        self.hold = threading.Event()

    def change(self, cur) -> None:
        if self.hold.is_set():
            return
        roll = self.rng.random()
        if roll < 0.6:
            cur.execute("UPDATE items SET qty = qty + 1, note = %s WHERE id = %s",
                        (f"w{self.changes}", self.rng.randrange(RESERVED, ROWS)))
        elif roll < 0.8:
            cur.execute("INSERT INTO items VALUES (%s, 1, 2.50, 'new', now(), '{\"n\": 1}')", (self.new_id(),))
        else:
            cur.execute("DELETE FROM items WHERE id = %s", (self.rng.randrange(RESERVED, self.next_id),))


class SinkThread:
    """The Delta sink's ``run`` on ``spark``, in a thread, until ``stop``."""

    def __init__(self, config: Path, spark) -> None:
        from spark_sinks.delta import DeltaSink

        app = load_config(str(config))
        self.log = app.log
        self.sink = attached(DeltaSink(app.sink("lake")), log_config=app.log)
        self.spark = spark
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.sink.run(self.stopping, log=self.log, session=self.spark)
        except BaseException as err:  # noqa: BLE001 - the test asserts on it
            self.error = err

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)
        assert self.error is None, self.error


def verify(config: Path, *args: str) -> tuple[int, dict]:
    return verifying.verify(config, "lake", *args, settle_timeout=180)


def delta_rows(spark, path: Path) -> int:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, str(path)):
        return 0
    return spark.read.format("delta").load(str(path)).count()


@pytest.mark.postgres
@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_a_side_jobs_edits_of_a_delta_table_are_reported_exactly_and_repaired(
        pg_admin_dsn, kafka_bootstrap, kafka_topic, spark, tmp_path):
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    database = _fresh_database(pg_admin_dsn)
    dsn = next(database)
    execute(dsn, "CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, price numeric(10,2), note text, "
                 "at timestamptz, doc jsonb)",
            f"INSERT INTO items SELECT g, g % 7, 9.90, 'seed', '2026-01-01T00:00:00Z', "
            f"jsonb_build_object('k', g, 'a', array[1, 2]) FROM generate_series(1, {ROWS}) g")
    lake = tmp_path / "lake"
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {kafka_topic}, partitions: 2}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{dsn}', tables: ['public.items'], state_dir: ./state, "
        f"heartbeat_interval: 1, status_interval: 1, signal_table: public.cdc_signal}}\n"
        f"sinks:\n  - {{name: lake, type: delta, topics: ['{kafka_topic}.public.*'], path: '{lake}', "
        f"checkpoint: '{tmp_path / 'checkpoint'}', trigger_seconds: 1}}\n"
        f"http: '127.0.0.1:{free_port()}'\n")
    daemon = run_daemon(config, "src", log="daemon.log")
    sink = None
    try:
        sink = SinkThread(config, spark)
        table = lake / "public" / "items"
        wait_until(lambda: delta_rows(spark, table) == ROWS, timeout=240, what="the Delta table's first rows")
        with Writer(dsn, seed=7) as writer:
            wait_until(lambda: writer.changes > 20, timeout=60, what="the writer to write")
            # A side job edits the table while no batch runs (Delta would make one of two
            # concurrent writers to a file fail: a conflict, not what this test is about).
            writer.hold.set()
            wait_until(lambda: _caught_up(config, dsn), timeout=120, what="the sink to apply every change")
            delta = DeltaTable.forPath(spark, str(table))
            delta.update(F.col("id") == 5, {"qty": F.lit(999)})
            delta.delete(F.col("id") == 6)
            writer.hold.clear()

            code, answer = verify(config, "--chunk", "400")
            assert code == 1, answer
            assert (keys_of(answer, "missing"), keys_of(answer, "different"), keys_of(answer, "extra")) == \
                (["6"], ["5"], [])
            assert answer["tables"][0]["chunks"] >= 3
            [different] = answer["tables"][0]["different"]
            assert (different["source"]["qty"], different["store"]["qty"]) == ("5", "999")
            assert different["source"]["doc"] == different["store"]["doc"]  # jsonb compared as the table holds it

            code, answer = verify(config, "--repair", "--repair-timeout", "120")
            assert code == 0, answer
            assert answer["repair"] and all(r["equal"] for r in answer["repair"])
            written = writer.changes
            code, answer = verify(config)  # healed, and clean under the writer
            [clean] = answer["tables"]
            assert (code, clean["counts"]) == (0, {"missing": 0, "extra": 0, "different": 0, "unsettled": 0}), clean
            assert clean["rows"] >= ROWS - 50 and clean["table"] == "public.items"
            assert writer.changes > written

            writer.hold.set()
            wait_until(lambda: _caught_up(config, dsn), timeout=120, what="the sink to apply every change")
        sink.stop()
        # A verify of a stopped sink's tables writes nothing: no Delta commit, no checkpoint file.
        before = (DeltaTable.forPath(spark, str(table)).history(1).collect()[0]["version"],
                  sorted(p.relative_to(tmp_path) for p in (tmp_path / "checkpoint").rglob("*")))
        assert verify(config)[0] == 0
        assert (DeltaTable.forPath(spark, str(table)).history(1).collect()[0]["version"],
                sorted(p.relative_to(tmp_path) for p in (tmp_path / "checkpoint").rglob("*"))) == before
    finally:
        if sink is not None:
            sink.stopping.set()
            sink.thread.join(60)
        stop_daemon(daemon)
        next(database, None)


def _caught_up(config: Path, dsn: str) -> bool:
    """The source's stored offset at the source's WAL end, and the sink's checkpoint at the
    topic's ends (what a second look waits for)."""
    import psycopg2

    from cdc.log.open import open_log
    from cdc.positions import PgLsn
    from cdc.runtime.verify import LogSettle
    from spark_sinks.delta import DeltaSink

    app = load_config(str(config))
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
            now = PgLsn(int(cur.fetchone()[0]))
    finally:
        conn.close()
    reader = attached(DeltaSink(app.sink("lake")), log_config=app.log)
    reader.start_reading()
    log_ = open_log(app.log)
    settle = LogSettle(log_, app.log.topic_prefix, "src", "lake", timeout=5, store=reader)
    try:
        return settle.wait(now, f"{app.log.topic_prefix}.public.items")
    finally:
        settle.close()
        log_.close()
        reader.stop()


def test_a_text_keys_chunks_hold_exactly_the_keys_between_their_bounds(spark, tmp_path):
    """The filter a chunk pushes to Spark keeps every key ``key_order`` puts in the range, the
    text that reads as a number (before all other text) included."""
    from pyspark.sql import types as T

    from cdc.api import in_range, key_order
    from spark_sinks.reading import DeltaReader
    from spark_sinks.schemas import TableShape
    from spark_sinks.tables import DeltaTarget

    target = DeltaTarget(str(tmp_path), "p.public.codes", "p", "type1")
    target.create(spark, TableShape((("code", T.StringType()), ("n", T.LongType())), ("code",), True), {})
    codes = ["007", "7.5", "-3", " 12", "1e2", "a", "B", "b-1", "Zeta", "é", "_x", "", "NaN", "Infinity", "10"]
    spark.createDataFrame([(c, i, f'"{c}"', 1, "r", 0) for i, c in enumerate(codes)],
                          "code string, n long, __cdc_key string, __cdc_version long, __cdc_op string, "
                          "__cdc_ts_ms long").write.format("delta").mode("append").save(target.path)
    reader = DeltaReader(spark, lambda topic, mode: DeltaTarget(str(tmp_path), topic, "p", mode), "type1",
                         str(tmp_path / "none"))
    every = reader.read_rows("p.public.codes")
    assert [r.key[0] for r in every] == sorted(codes, key=lambda c: key_order((c,)))
    # Bounds of each kind: none, a number's text, other text (empty, a letter's, a sign's).
    pairs = [(None, ("-3",)), (("10",), ("B",)), (("",), ("Zeta",)), (("a",), ("NaN",)), (("NaN",), None)]
    for after, upto in pairs:
        assert reader.read_range("p.public.codes", after, upto) == in_range(every, after, upto), (after, upto)
    assert [r.key for r in reader.read_keys("p.public.codes", [("007",), ("b-1",), ("missing",)])] == \
        [("007",), ("b-1",)]
