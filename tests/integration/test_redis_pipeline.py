"""PostgreSQL -> Kafka -> Redis sink, end to end with real daemons: kill -9 of the sink at random
moments (each after evidence of progress), a Redis restart or a killed cluster master in between,
a replay from offset 0 after deletes, and read-your-writes.

The single-server runs use a Redis server of their own with an append-only file fsynced at every
write, so that its restart keeps what it acknowledged (the stack's redis-server keeps nothing on
disk). The cluster runs use the stack's three-master cluster, whose nodes are started again by
their service when killed, with their AOF.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg2
import pytest
import redis
from redis.cluster import RedisCluster

from sinks.redis.keys import KeySpace, companion, stats_key
from tests.background import Background
from tests.integration.pg_capture import wait_until
from tests.integration.test_sql_pipeline import Writer, _seed, _stop

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.redis]

KILL_CYCLES = 20


def _cli(config: Path, command: str, *args: str) -> subprocess.Popen:
    """``cdc <command> <config> <args>`` in a session of its own (killed whole), its output kept
    in ``<command>-<last arg>.log`` beside the config for a failing test to show."""
    log = open(config.parent / f"{command}-{args[-1] if args else ''}.log", "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "cdc.cli", command, str(config), *args],
                                cwd=config.parent, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


class DurableRedis:
    """A redis-server of the test's own (AOF, fsync always) that can be killed and started again."""

    def __init__(self, directory: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no",
             "--loglevel", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        client = redis.Redis(port=self.port)
        wait_until(lambda: _answers(client), timeout=30, what="the test's redis-server")
        client.close()

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _answers(client) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.exceptions.BusyLoadingError):
        return False


def _config(tmp_path: Path, source_dsn: str, kafka: str, redis_url: str, cluster: bool, prefix: str,
            topic_prefix: str) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {topic_prefix}, partitions: 3}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{source_dsn}', tables: ['public.*'], "
        f"slot: s_{uuid.uuid4().hex[:12]}, "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"sinks:\n  - {{name: cache, type: redis, url: '{redis_url}', cluster: {str(cluster).lower()}, "
        f"key_prefix: {prefix}, topics: ['{topic_prefix}.public.*'], batch_wait_ms: 50}}\n"
        f"http: null\n")
    return path


def _source_rows(dsn: str) -> dict[str, dict[str, str]]:
    """What each row's hash must hold: every non-NULL column as text."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, balance, note FROM accounts")
            return {str(i): {k: str(v) for k, v in (("id", i), ("balance", b), ("note", n)) if v is not None}
                    for i, b, n in cur.fetchall()}
    finally:
        conn.close()


def _cache_rows(client, prefix: str) -> dict[str, dict[str, str]]:
    head = KeySpace("{prefix}:{schema}.{table}:{key}", prefix).table_prefix("public", "accounts")
    keys = [k.decode() for k in client.scan_iter(match=head + "*", count=1000) if b"{" not in k]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    rows = {}
    for key, stored in zip(keys, pipe.execute() if keys else []):
        if stored:
            rows[key[len(head):]] = {k.decode(): v.decode() for k, v in stored.items()}
    return rows


def _clear(client, prefix: str) -> None:
    pipe = client.pipeline(transaction=False)
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        pipe.unlink(key)
    pipe.execute()


def _progress(client, prefix: str) -> int:
    try:
        counts = client.hgetall(stats_key(prefix))
    except redis.RedisError:
        return -1
    return sum(int(v) for v in counts.values())


class RegressionWatch(Background):
    """Reads the version companions of some keys over and over; records any that went down."""

    def __init__(self, client, prefix: str, ids: range) -> None:
        space = KeySpace("{prefix}:{schema}.{table}:{key}", prefix)
        self.keys = [companion(space.row_key("public", "accounts", {"id": i})) for i in ids]
        self.client = client
        self.seen: dict[str, int] = {}
        self.regressions: list[tuple[str, int, int]] = []
        super().__init__(daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            for key in self.keys:
                try:
                    stored = self.client.get(key)
                except redis.RedisError:
                    continue
                if stored is None:
                    continue
                version = int(stored.lstrip(b"D"))
                if version < self.seen.get(key, version):
                    self.regressions.append((key, self.seen[key], version))
                self.seen[key] = max(version, self.seen.get(key, version))


def _kill_cycles(config: Path, client, prefix: str, rng: random.Random, cycles: int, midway) -> None:
    """Start the sink, wait for evidence that it wrote something, kill -9 its process group."""
    for cycle in range(cycles):
        began = time.monotonic()
        before = _progress(client, prefix)
        sink = _cli(config, "run", "--only", "cache")
        try:
            wait_until(lambda: _progress(client, prefix) > before, timeout=60,
                       what=f"the sink's progress in cycle {cycle}")
            time.sleep(rng.uniform(0, 0.5))  # somewhere inside the next batches, not always right after one
        finally:
            os.killpg(sink.pid, signal.SIGKILL)
            sink.wait()
        print(f"cycle {cycle}: progress after {time.monotonic() - began:.1f}s")
        if cycle == cycles // 2:
            midway()


def _run_crash_test(pg_dsn, kafka_bootstrap, tmp_path, redis_url, cluster, client, midway):
    _seed(pg_dsn)
    prefix = f"c{uuid.uuid4().hex[:8]}"
    config = _config(tmp_path, pg_dsn, kafka_bootstrap, redis_url, cluster, prefix, f"t_{uuid.uuid4().hex[:8]}")
    source = _cli(config, "run", "--only", "src")
    rng = random.Random(11)
    try:
        with RegressionWatch(client, prefix, range(1, 300)) as watch:
            with Writer(pg_dsn, seed=4) as writer:
                _kill_cycles(config, client, prefix, rng, KILL_CYCLES, midway)
            assert writer.changes > 500
            sink = _cli(config, "run", "--only", "cache")
            try:
                expected = _source_rows(pg_dsn)
                wait_until(lambda: _cache_rows(client, prefix) == expected, timeout=120, what="cache == source")
            finally:
                _stop(sink)
        assert watch.regressions == []
        assert len(watch.seen) > 100  # the watch did see the keys
    finally:
        _stop(source)
        _clear(client, prefix)


def test_single_server_sink_killed_at_random_moments_and_redis_restarted(pg_dsn, kafka_bootstrap, tmp_path):
    server = DurableRedis(tmp_path / "redis")
    server.start()
    client = redis.Redis(port=server.port)
    try:
        def restart_redis() -> None:
            server.kill()
            server.start()

        _run_crash_test(pg_dsn, kafka_bootstrap, tmp_path, server.url, False, client, restart_redis)
    finally:
        client.close()
        server.kill()


def _kill_a_master(client: RedisCluster) -> None:
    node = random.Random(3).choice(client.get_primaries())
    pid = client.get_redis_connection(node).info("server")["process_id"]
    os.kill(pid, signal.SIGKILL)
    # Its service starts it again on its port with its AOF; wait until the cluster serves every slot.
    wait_until(lambda: _cluster_ok(client), timeout=60, what="the cluster back to ok")


def _cluster_ok(client: RedisCluster) -> bool:
    try:
        return all(client.get_redis_connection(n).cluster("info").get("cluster_state") == "ok"
                   for n in client.get_primaries())
    except redis.RedisError:
        return False


@pytest.mark.serial
def test_cluster_sink_killed_at_random_moments_and_a_master_killed(pg_dsn, kafka_bootstrap, redis_cluster_url,
                                                                  tmp_path):
    client = RedisCluster.from_url(redis_cluster_url)
    try:
        _run_crash_test(pg_dsn, kafka_bootstrap, tmp_path, redis_cluster_url, True, client,
                        lambda: _kill_a_master(client))
    finally:
        client.close()
