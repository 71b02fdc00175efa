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


# --- one service at a time: its data and its port survive -------------------------------------

def _pg_rows(env: dict[str, str]) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(env["PG_DSN"], connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, note FROM kept ORDER BY id")
            return cur.fetchall()
    finally:
        conn.close()


def _row(name: str) -> stack.Status:
    [row] = [r for r in stack.status() if r.name == name]
    return row


@pytest.mark.postgres
def test_kill_stop_freeze_and_restart_keep_a_servers_data_and_port(private_home):
    import psycopg2

    env = stack.up(["postgres"])
    conn = psycopg2.connect(env["PG_DSN"])
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE kept (id int PRIMARY KEY, note text)")
        cur.execute("INSERT INTO kept VALUES (1, 'survives')")
    conn.close()
    port = _row("postgres").ports["port"]

    stack.kill("postgres")  # a crash: SIGKILL of the whole group
    assert not _row("postgres").running
    # `up` after a crash restarts the server on its data and its port: nothing is wiped.
    assert stack.up(["postgres"]) == env
    assert _row("postgres").ports["port"] == port and _row("postgres").answering
    assert _pg_rows(env) == [(1, "survives")]

    stack.freeze("postgres")
    row = _row("postgres")
    assert row.running and row.frozen and not row.answering
    stack.thaw("postgres")
    assert _row("postgres").answering

    stack.stop("postgres")
    assert not _row("postgres").running
    stack.start("postgres")
    stack.restart("postgres")
    row = _row("postgres")
    assert row.answering and row.ports["port"] == port
    assert _pg_rows(env) == [(1, "survives")]


@pytest.mark.postgres17
def test_postgres17_runs_from_the_fetched_binaries_and_restarts_on_its_data(private_home):
    import psycopg2

    env = stack.up(["postgres17"])
    assert set(env) == {"PG17_DSN", "PG17_BINDIR"}
    with psycopg2.connect(env["PG17_DSN"]) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int, current_setting('wal_level')")
        version, wal_level = cur.fetchone()
        cur.execute("CREATE TABLE kept (id int PRIMARY KEY, note text)")
        cur.execute("INSERT INTO kept VALUES (1, 'survives')")
    conn.close()
    assert version // 10000 == 17 and wal_level == "logical"
    assert os.path.isfile(os.path.join(env["PG17_BINDIR"], "postgres"))
    stack.kill("postgres17")
    assert stack.up(["postgres17"]) == env
    with psycopg2.connect(env["PG17_DSN"]) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, note FROM kept")
        assert cur.fetchall() == [(1, "survives")]
    conn.close()


def test_one_service_commands_refuse_a_service_not_in_the_stack(private_home):
    with pytest.raises(DevStackError, match="not part of the stack"):
        stack.kill("postgres")


# --- the server answering a port must be this stack's own -------------------------------------

def _stranger(name: str, ports: dict[str, int], tmp_path):
    """The service object another stack (another root directory) would have on the same ports."""
    from cdc.dev.services import SERVICES

    return SERVICES[name](tmp_path / "another-stack", ports)


@pytest.mark.postgres
@pytest.mark.mysql
@pytest.mark.kafka
@pytest.mark.parametrize("name", ["postgres", "mysql", "kafka"])
def test_a_probe_does_not_take_another_stacks_server_for_its_own(name, dev_env_for, tmp_path):
    dev_env_for(name)
    state = stack._load()
    entry = state["services"][name]
    ours = stack._service(state["root"], name, entry)
    assert ours.probe()
    (tmp_path / "another-stack" / name / "data").mkdir(parents=True)
    assert not _stranger(name, entry["ports"], tmp_path).probe()


def test_opensearch_probe_checks_the_cluster_name(tmp_path):
    """Two stacks once both got port 9201 and one's OPENSEARCH_URL reached the other's node."""
    import http.server
    import json
    import threading

    from cdc.dev.services import OpenSearch

    class OtherStacksNode(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"cluster_name": "cdc-dev-someone-else", "status": "green"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), OtherStacksNode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert not OpenSearch(tmp_path / "cdc-dev-mine", {"port": port}).probe()
        # The same answer with our own cluster name is ours.
        mine = OpenSearch(tmp_path / "cdc-dev-someone-else", {"port": port})
        assert mine.probe()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.mysql
@pytest.mark.postgres
def test_mariadb_probe_checks_that_its_tcp_port_is_its_own_server(dev_env_for):
    """Our MariaDB answers on its socket (in our directory), but its TCP port is another server's."""
    dev_env_for("mysql")
    dev_env_for("postgres")
    state = stack._load()
    ours = stack._service(state["root"], "mysql", state["services"]["mysql"])
    assert ours.probe()
    elsewhere = stack._service(state["root"], "mysql", {"ports": state["services"]["postgres"]["ports"]})
    assert not elsewhere.probe()


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


@pytest.mark.registry
def test_registry_speaks_confluents_api_with_backward_compatibility(private_home):
    """The stack's registry registers Avro schemas under Confluent's API, refuses a change its
    BACKWARD compatibility forbids, keeps its schemas over a restart, and stops whole."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    env = stack.up(["registry"])
    assert env["REGISTRY_URL"].endswith("/apis/ccompat/v7")
    client = SchemaRegistryClient({"url": env["REGISTRY_URL"]})
    first = Schema('{"type":"record","name":"V","fields":[{"name":"id","type":"int"}]}', "AVRO")
    added = Schema('{"type":"record","name":"V","fields":[{"name":"id","type":"int"},'
                   '{"name":"n","type":["null","string"],"default":null}]}', "AVRO")
    retyped = Schema('{"type":"record","name":"V","fields":[{"name":"id","type":"string"}]}', "AVRO")
    first_id = client.register_schema("t-value", first)
    assert client.register_schema("t-value", first) == first_id
    second_id = client.register_schema("t-value", added)
    assert second_id != first_id
    assert client.get_latest_version("t-value").version == 2
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("t-value", retyped)
    assert refused.value.http_status_code == 409
    stack.restart("registry")  # its schemas and ids survive: records written before still read
    again = SchemaRegistryClient({"url": env["REGISTRY_URL"]})
    assert again.get_schema(second_id).schema_str == added.schema_str
    assert again.get_latest_version("t-value").version == 2
    [row] = [r for r in stack.status() if r.name == "registry"]
    assert row.answering
    assert stack.down() == ["registry"]
    assert stack._group_members(row.pid) == []
