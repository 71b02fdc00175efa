"""The Redis sink over TLS (``rediss://``) against a redis-server of the test's own that requires
TLS, a client certificate and a password: PostgreSQL -> Kafka -> `cdc run` keeps it in sync,
deletes leave tombstones, read-your-writes works, a replay writes nothing; a wrong CA is a
ConfigError naming the URL (without its password), not endless retries."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import psycopg2
import pytest

from cdc.api import ConfigError
from sinks.redis import pg_version, row_key, wait_for
from sinks.redis.config import RedisSinkConfig
from sinks.redis.keys import companion, stats_key
from sinks.redis.sink import RedisSink
from tests.integration.pg_capture import execute, wait_until
from tests.integration.redis_tls import TlsRedis, make_tls_files
from tests.integration.test_redis_pipeline import _cache_rows, _cli, _source_rows, _stop
from tests.integration.test_sql_pipeline import _seed

PASSWORD = "tls-secret-7Qx"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("redis-tls")
    server = TlsRedis(directory, make_tls_files(directory / "certs"), PASSWORD)
    server.start()
    yield server
    server.stop()


def _config(tmp_path: Path, pg_dsn: str, kafka: str, server: TlsRedis, prefix: str) -> Path:
    secret = tmp_path / "redis.secret"
    secret.write_text(PASSWORD + "\n")
    files = server.files
    topics = f"t_{uuid.uuid4().hex[:8]}"
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {topics}, partitions: 2}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{pg_dsn}', tables: ['public.*'], "
        f"slot: s_{uuid.uuid4().hex[:12]}, state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, "
        f"status_interval: 1}}\n"
        f"sinks:\n  - {{name: cache, type: redis, url: '{server.url}', password_file: redis.secret, "
        f"tls_ca_file: '{files.ca}', tls_cert_file: '{files.client_cert}', tls_key_file: '{files.client_key}', "
        f"key_prefix: {prefix}, topics: ['{topics}.public.*'], batch_wait_ms: 50}}\n"
        f"http: null\n")
    return path


def _counts(client, prefix: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(stats_key(prefix)).items()}


@pytest.mark.postgres
@pytest.mark.kafka
@pytest.mark.redis
def test_the_sink_keeps_a_tls_server_in_sync_and_a_replay_writes_nothing(pg_dsn, kafka_bootstrap, tls_server,
                                                                         tmp_path):
    _seed(pg_dsn, rows=50)
    prefix = f"tls{uuid.uuid4().hex[:8]}"
    config = _config(tmp_path, pg_dsn, kafka_bootstrap, tls_server, prefix)
    client = tls_server.client()
    source = _cli(config, "run", "--only", "src")
    sink = _cli(config, "run", "--only", "cache")
    app = psycopg2.connect(pg_dsn)
    try:
        wait_until(lambda: len(_cache_rows(client, prefix)) == 50, timeout=120, what="the first fill over TLS")
        execute(pg_dsn, "UPDATE accounts SET balance = balance + id, note = 'changed' WHERE id <= 5",
                "DELETE FROM accounts WHERE id IN (6, 7)",
                "INSERT INTO accounts VALUES (51, 9, 'new')")
        expected = _source_rows(pg_dsn)
        wait_until(lambda: _cache_rows(client, prefix) == expected, timeout=120, what="cache == source")
        deleted = row_key(client, prefix, "public", "accounts", {"id": 6})
        assert client.get(companion(deleted)).startswith(b"D")  # a tombstone holds the delete's version

        # Read-your-writes over TLS: the publisher thread raises the applied key on this connection too.
        with app.cursor() as cur:
            cur.execute("UPDATE accounts SET note = 'mine' WHERE id = 3")
        app.commit()
        with app.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            position = pg_version(cur.fetchone()[0])
        wait_for(client, prefix, "src", position, timeout=60)
        assert client.hget(row_key(client, prefix, "public", "accounts", {"id": 3}), "note") == b"mine"

        _stop(sink)
        expected = _source_rows(pg_dsn)
        before = _counts(client, prefix)
        replay = subprocess.run([sys.executable, "-m", "cdc.cli", "bootstrap", str(config), "cache", "--no-follow"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert replay.returncode == 0, replay.stderr[-3000:]
        assert _cache_rows(client, prefix) == expected          # nothing resurrected, nothing regressed
        after = _counts(client, prefix)
        assert (after["written"], after["deleted"]) == (before["written"], before["deleted"])
        assert after["skipped"] > before["skipped"]             # it read the topic again, over TLS
    finally:
        app.close()
        _stop(sink)
        _stop(source)
        for key in client.scan_iter(match=f"{prefix}*"):
            client.unlink(key)
        client.close()


@pytest.mark.redis
def test_a_wrong_ca_is_a_config_error_naming_the_url_without_its_password(tls_server):
    files = tls_server.files
    url = tls_server.url.replace("rediss://", f"rediss://:{PASSWORD}@")

    def sink(ca: Path, **client_certificate) -> RedisSink:
        return RedisSink(RedisSinkConfig(name="cache", url=url, topics=["shop.*"], key_prefix=f"ca{uuid.uuid4().hex[:6]}",
                                         tls_ca_file=str(ca), **client_certificate))

    # The client checks the server's certificate before it shows its own: none is needed to fail.
    wrong = sink(files.other_ca)
    with pytest.raises(ConfigError) as caught:
        wrong.start()
    message = str(caught.value)
    assert f"redis sink cache: connecting to rediss://:***@127.0.0.1:{tls_server.port}/0" in message
    assert "tls_ca_file" in message and "certificate" in message
    assert PASSWORD not in message
    assert not caught.value.retriable

    # With the right CA (and the client certificate this server requires) the same URL connects.
    right = sink(files.ca, tls_cert_file=str(files.client_cert), tls_key_file=str(files.client_key))
    right.start()
    right.stop()
