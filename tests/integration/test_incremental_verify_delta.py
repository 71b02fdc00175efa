"""bench/incremental_verify.py with the Delta sink at a CI size: the real daemon (PostgreSQL into
Kafka, the Delta sink of the topic, Spark in the daemon), a writer of updates, deletes,
primary-key changes and inserts on the table, ``cdc snapshot`` of it, and a sampler that reads
every version the sink commits. No row ever went back in any version; afterwards the compacted
topic and the Delta table equal the table. The 1M-row runs of the same code are in
bench/README.md. Spark tests run in a phase of their own (one JVM at a time)."""

from __future__ import annotations

import pytest

from bench.incremental_verify import DeltaTarget, PostgresSide, Sampler, Writer, verify

pytestmark = [pytest.mark.spark]

ROWS = 20_000


@pytest.mark.postgres
@pytest.mark.kafka
@pytest.mark.timeout(1200)  # the daemon's Spark and the sampler's start, each batch: minutes on a loaded machine
def test_postgres_incremental_snapshot_never_regresses_the_delta_sink(pg_dsn, tmp_path, kafka_bootstrap,
                                                                     kafka_topic, spark):
    side = PostgresSide(pg_dsn)
    side.fill(ROWS)
    target = DeltaTarget(tmp_path / "lake", "public", spark)
    # A slow writer: until the sink's first batch shows (Spark's first batch is its slowest) its
    # changes pile up for the sink to catch up with.
    result = verify(side, target, tmp_path, ROWS,
                    f"kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {kafka_topic}, partitions: 3}}",
                    kafka_topic, chunk_rows=1000, rate=50, startup=600, timeout=600)
    print("\n".join(result.lines()))
    assert result.check.regressions == []
    assert result.topic_equal, "the compacted topic differs from the table"
    assert result.sink_equal, "the Delta table differs from the table"
    assert result.view.reads >= ROWS // 2 and result.view.reread == 0  # read once each (no crash here)
    # The sampler read every version the sink committed, rows in them, and rows deleted.
    assert target.read_up_to == target.committed()[-1] and target.versions == len(target.committed()) > 2
    assert result.check.present and result.check.deleted


def test_the_sampler_reports_a_row_a_delta_version_shows_going_back(spark, tmp_path):
    """The sampler's wiring to a real Delta table: it reads every committed version in order, so
    a row set back (an older value, an older version) or a deleted row put back is reported even
    when a later commit set it right again before the sampler looked."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    target = DeltaTarget(tmp_path / "lake", "public", spark)
    path = str(target.path)
    columns = "id bigint, v bigint, note string, __cdc_version bigint"
    writer = Writer(PostgresSide("unused"), rows=3, rate=1, seed=0)  # not started: only its key lists are read
    sampler = Sampler(target, writer, sample_keys=3, watch_cap=3, seed=0)
    spark.createDataFrame([(1, 5, "a", 50), (2, 5, "b", 50), (3, 5, "c", 50)], columns) \
        .write.format("delta").save(path)
    sampler._round()  # version 0
    table = DeltaTable.forPath(spark, path)
    table.update(F.col("id") == 1, {"v": F.lit(4)})                 # 1: key 1's value goes back
    table.update(F.col("id") == 1, {"v": F.lit(6)})                 # 2: ... and on again
    table.update(F.col("id") == 2, {"__cdc_version": F.lit(40)})    # 3: key 2's version goes back
    table.delete(F.col("id") == 3)                                  # 4
    spark.createDataFrame([(3, 5, "c", 50)], columns).write.format("delta").mode("append").save(path)  # 5
    table.update(F.col("id") == 2, {"__cdc_version": F.lit(60)})    # 6: key 2 on again
    sampler._round()  # versions 1-6 in one round, each read
    found = sampler.check.regressions
    assert target.versions == 7 and target.read_up_to == 6 and sampler.rounds == 7
    assert len(found) == 3, found
    assert found[0].startswith("key 1 went back") and found[1].startswith("key 2 went back"), found
    assert found[2].startswith("key 3 came back after the sink deleted it"), found
    # The newest version alone shows nothing wrong: only the versions between did.
    assert {k: (s.version, s.value) for k, s in target.sample([1, 2, 3]).items()} == \
        {1: (50, 6), 2: (60, 5), 3: (50, 5)}
