"""bench/incremental_verify.py at a CI size: the real daemon (a source into Kafka, an SQL sink into
PostgreSQL), a writer of updates, deletes, primary-key changes and inserts on the table, ``cdc
snapshot`` of it, and a sampler of the sink's table all along. No row ever went back in the sink;
afterwards the compacted topic and the sink equal the table. The 1M-row runs of the same code are
in bench/README.md."""

from __future__ import annotations

import pytest

from bench.incremental_verify import MariaDbSide, PostgresSide, SqlTarget, Verification, verify

ROWS = 10_000


def run(side, target_dsn: str, tmp_path, kafka_bootstrap: str, prefix: str) -> Verification:
    side.fill(ROWS)
    result = verify(side, SqlTarget(target_dsn), tmp_path, ROWS,
                    f"kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {prefix}, partitions: 3}}",
                    prefix, chunk_rows=500, rate=200, timeout=300)
    print("\n".join(result.lines()))
    assert result.check.regressions == []
    assert result.topic_equal, "the compacted topic differs from the table"
    assert result.sink_equal, "the sink's table differs from the table"
    assert result.view.reads >= ROWS // 2 and result.view.reread == 0  # read once each (no crash here)
    # The sampler watched the run: it saw rows in the sink, and rows the sink deleted.
    assert result.check.present and result.check.deleted and result.rounds > 1
    return result


@pytest.mark.postgres
@pytest.mark.kafka
def test_postgres_incremental_snapshot_never_regresses_the_sql_sink(pg_dsn, target_dsn, tmp_path, kafka_bootstrap,
                                                                   kafka_topic):
    run(PostgresSide(pg_dsn), target_dsn, tmp_path, kafka_bootstrap, kafka_topic)


@pytest.mark.mysql
@pytest.mark.postgres
@pytest.mark.kafka
def test_mariadb_incremental_snapshot_never_regresses_the_sql_sink(mysql_url, mysql_db, target_dsn, tmp_path,
                                                                  kafka_bootstrap, kafka_topic):
    run(MariaDbSide(mysql_url, mysql_db), target_dsn, tmp_path, kafka_bootstrap, kafka_topic)


@pytest.mark.postgres
def test_the_sampler_reports_a_row_the_sql_target_shows_going_back(pg_dsn):
    """The sampler's wiring to a real target table, not only its logic: a row set back by hand
    (an older value, an older version) and a deleted row put back are each reported."""
    import time

    from bench.incremental_verify import Sampler, SqlTarget, Writer
    from bench.pg_stream import execute

    execute(pg_dsn, "CREATE TABLE t (id bigint PRIMARY KEY, v bigint, note text, __cdc_version bigint NOT NULL)",
            "INSERT INTO t VALUES (1, 5, 'a', 50), (2, 5, 'b', 50), (3, 5, 'c', 50)")
    writer = Writer(PostgresSide(pg_dsn), rows=3, rate=1, seed=0)  # not started: only its key lists are read
    sampler = Sampler(SqlTarget(pg_dsn), writer, sample_keys=3, watch_cap=3, seed=0)
    sampler.start()
    try:
        def after_a_round(*statements: str) -> None:
            rounds = sampler.rounds
            while sampler.rounds < rounds + 2:  # a whole round read after the statements
                assert sampler.is_alive(), sampler.error
                time.sleep(0.01)
            execute(pg_dsn, *statements)

        after_a_round("UPDATE t SET v = 4 WHERE id = 1", "UPDATE t SET __cdc_version = 40 WHERE id = 2",
                      "DELETE FROM t WHERE id = 3")
        after_a_round("INSERT INTO t VALUES (3, 5, 'c', 50)")
        after_a_round()
    finally:
        sampler.finish()
    found = sampler.check.regressions
    assert len(found) == 3, found
    assert found[0].startswith("key 1 went back") and found[1].startswith("key 2 went back"), found
    assert found[2].startswith("key 3 came back after the sink deleted it"), found
