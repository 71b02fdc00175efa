"""`cdc dev up/down/status` on a private dev home, with Redis (the quickest server to start)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cdc.dev import stack
from cdc.dev.services import free_port
from cdc.errors import DevStackError


@pytest.fixture
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_DEV_HOME", str(tmp_path / "home"))
    yield tmp_path / "home"
    stack.down()


@pytest.mark.redis
def test_up_is_idempotent_and_down_leaves_no_process(private_home):
    env = stack.up(["redis"])
    assert env["REDIS_URL"].startswith("redis://127.0.0.1:")
    assert (private_home / "dev.env").read_text().strip() == f"REDIS_URL={env['REDIS_URL']}"
    [row] = [r for r in stack.status() if r.name == "redis"]
    assert row.running and row.answering
    pid = row.pid

    assert stack.up(["redis"]) == env  # the running server is kept, not restarted
    assert [r.pid for r in stack.status() if r.name == "redis"] == [pid]

    assert stack.down() == ["redis"]
    assert stack._group_members(pid) == []
    assert not (private_home / "dev.env").exists()
    assert all(not r.running for r in stack.status())


@pytest.mark.redis
def test_up_replaces_a_server_that_died(private_home):
    stack.up(["redis"])
    [before] = [r for r in stack.status() if r.name == "redis"]
    os.killpg(before.pid, signal.SIGKILL)
    stack.up(["redis"])
    [after] = [r for r in stack.status() if r.name == "redis"]
    assert after.pid != before.pid and after.answering


def test_unknown_service_is_refused(private_home):
    with pytest.raises(DevStackError, match="unknown service"):
        stack.up(["cassandra"])


def test_free_port_in_range_skips_taken_ports():
    import socket

    low = free_port(20000, 20100)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", low))
        assert free_port(low, low + 50) != low


@pytest.mark.redis
def test_redis_cluster_forms_keeps_a_killed_node_with_its_data_and_stops_whole(private_home):
    import redis as redis_py
    from redis.cluster import RedisCluster

    env = stack.up(["redis-cluster"])
    client = RedisCluster.from_url(env["REDIS_CLUSTER_URL"])
    try:
        assert len(client.get_primaries()) == 3
        client.set("k", "v")
        node = client.get_node_from_key("k")
        pid = client.get_redis_connection(node).info("server")["process_id"]
        os.kill(pid, signal.SIGKILL)
        single = redis_py.Redis(host=node.host, port=node.port)

        def back() -> bool:
            try:
                return single.info("server")["process_id"] != pid and single.cluster("info")["cluster_state"] == "ok"
            except redis_py.RedisError:
                return False

        deadline = time.monotonic() + 60
        while not back():
            assert time.monotonic() < deadline, "the killed node did not come back"
            time.sleep(0.2)
        assert single.get("k") == b"v"  # its AOF, fsynced at every write
        single.close()
    finally:
        client.close()
    [row] = [r for r in stack.status() if r.name == "redis-cluster"]
    assert stack.down() == ["redis-cluster"]
    assert stack._group_members(row.pid) == []
