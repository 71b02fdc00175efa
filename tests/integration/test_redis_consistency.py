"""PostgreSQL -> Kafka -> Redis sink: a replay from offset 0 into a live keyspace resurrects
nothing and writes nothing; an application that waits with ``wait_for`` reads its own writes."""

from __future__ import annotations

import subprocess
import sys
import uuid
from contextlib import closing, contextmanager

import psycopg2
import pytest
import redis

from sinks.redis import pg_version, row_key, wait_for
from sinks.redis.keys import stats_key
from tests.integration.pg_capture import execute, wait_until
from tests.integration.test_redis_pipeline import (
    RegressionWatch,
    _cache_rows,
    _clear,
    _cli,
    _config,
    _source_rows,
    _stop,
)
from tests.integration.test_sql_pipeline import _seed
from tests.integration.valkey_server import valkey_url  # noqa: F401 - a fixture

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.redis]


def _counts(client, prefix: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(stats_key(prefix)).items()}


@contextmanager
def _cached(pg_dsn: str, kafka_bootstrap: str, redis_url: str, tmp_path, rows: int, letter: str):
    """``accounts`` seeded with ``rows`` rows, captured by a source daemon into Kafka and cached by
    a sink daemon under a fresh key prefix starting with ``letter``: (client, prefix, config, sink)
    once the cache holds every row; both daemons stopped and the keys gone afterwards."""
    _seed(pg_dsn, rows=rows)
    client = redis.Redis.from_url(redis_url)
    prefix = f"{letter}{uuid.uuid4().hex[:8]}"
    config = _config(tmp_path, pg_dsn, kafka_bootstrap, redis_url, False, prefix, f"t_{uuid.uuid4().hex[:8]}")
    source = _cli(config, "run", "--only", "src")
    sink = _cli(config, "run", "--only", "cache")
    try:
        wait_until(lambda: len(_cache_rows(client, prefix)) == rows, timeout=120, what="the first fill")
        yield client, prefix, config, sink
    finally:
        _stop(sink)
        _stop(source)
        _clear(client, prefix)
        client.close()


@pytest.mark.parametrize("server", ["redis", "valkey"])
def test_a_replay_from_offset_0_after_deletes_resurrects_nothing(pg_dsn, kafka_bootstrap, server, request, tmp_path):
    redis_url = request.getfixturevalue("redis_url" if server == "redis" else "valkey_url")
    with _cached(pg_dsn, kafka_bootstrap, redis_url, tmp_path, 1000, "r") as (client, prefix, config, sink):
        # Updates, then deletes of half the rows (some updated first), then a few reinserts.
        execute(pg_dsn, "UPDATE accounts SET balance = balance + id, note = 'updated' WHERE id % 3 = 0",
                "DELETE FROM accounts WHERE id % 2 = 0",
                "INSERT INTO accounts SELECT g, 7, 'back' FROM generate_series(2, 40, 2) g")
        expected = _source_rows(pg_dsn)
        wait_until(lambda: _cache_rows(client, prefix) == expected, timeout=120, what="cache == source")
        _stop(sink)
        before = _counts(client, prefix)
        with RegressionWatch(client, prefix, range(1, 1001)) as watch:
            replay = subprocess.run([sys.executable, "-m", "cdc.cli", "bootstrap", str(config), "cache", "--no-follow"],
                                    cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert replay.returncode == 0, replay.stderr[-3000:]
        assert _cache_rows(client, prefix) == expected          # nothing resurrected, nothing regressed
        assert watch.regressions == []
        after = _counts(client, prefix)
        assert after["written"] == before["written"]            # a replay writes nothing...
        assert after["deleted"] == before["deleted"]
        assert after["skipped"] > before["skipped"]             # ...though it did read the topic again


def test_an_application_that_waits_reads_its_own_writes(pg_dsn, kafka_bootstrap, redis_url, tmp_path):
    with _cached(pg_dsn, kafka_bootstrap, redis_url, tmp_path, 200, "w") as (client, prefix, _, _), \
            closing(psycopg2.connect(pg_dsn)) as app:
        for attempt in range(30):
            account = 1 + attempt * 7 % 200
            note = f"write {attempt} {uuid.uuid4().hex[:6]}"
            with app.cursor() as cur:
                cur.execute("UPDATE accounts SET note = %s WHERE id = %s", (note, account))
            app.commit()
            with app.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn()::text")
                position = pg_version(cur.fetchone()[0])
            app.commit()
            wait_for(client, prefix, "src", position, timeout=60)
            key = row_key(client, prefix, "public", "accounts", {"id": account})
            assert client.hget(key, "note") == note.encode(), f"attempt {attempt}: a stale read after the wait"


def test_cdc_rebuild_writes_a_new_generation_switches_readers_and_drops_the_old(pg_dsn, kafka_bootstrap,
                                                                               redis_url, tmp_path):
    with _cached(pg_dsn, kafka_bootstrap, redis_url, tmp_path, 500, "b") as (client, prefix, config, sink):
        _stop(sink)
        execute(pg_dsn, "DELETE FROM accounts WHERE id > 400", "UPDATE accounts SET note = 'after' WHERE id < 10")
        rebuild = subprocess.run([sys.executable, "-m", "cdc.cli", "rebuild", str(config), "cache"],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert rebuild.returncode == 0, rebuild.stderr[-3000:]
        assert client.get(f"{prefix}.generation") == b"2"
        assert _cache_rows(client, f"{prefix}.g2") == _source_rows(pg_dsn)
        assert list(client.scan_iter(match=f"{prefix}:*")) == []  # generation 1 is gone, keys and all
