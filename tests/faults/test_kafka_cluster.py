"""The pipeline through a replicated Kafka's failures: three KRaft nodes (``cdc dev up --profile
cluster``), every topic at replication factor 3 and ``min.insync.replicas`` 2 (the cluster's
defaults, which the framework takes when the config sets neither), producers at ``acks=all``
with idempotence.

PostgreSQL and MariaDB (one daemon, a live writer on each) -> the three-node Kafka -> SQL sinks
(a PostgreSQL target per source); PostgreSQL's table also into OpenSearch, into a Redis Cluster of
three masters with a replica each (``redis-ha``) and into OpenSearch.
Struck in a shuffled order, each after evidence of progress at both ends (``harness.Campaign``):

* kill -9 of the node leading the most partitions; progress with two nodes; then its restart;
* a rolling restart of the three nodes (each clean, one at a time, the next once the partitions
  are fully replicated again, as an operator does it);
* two nodes killed: with one replica left no write can reach ``min.insync.replicas``, so the
  source must block, its stored position must not move (no position past undelivered data),
  and it resumes when one node returns;
* kill -9 of a Redis master: its replica takes its slots over (the master comes back 10 s later,
  as a replica);
* kill -9 of a member of a SQL sink's consumer group (``scale_out: group``, two processes, each
  connecting to the brokers from a loopback address of its own, 127.0.0.2 and 127.0.0.3, which
  the coordinator reports as their hosts: tests/faults/hosts.py) once it owns partitions and has
  committed; the other takes its partitions over; then it comes back.

At the end: each target and each topic equals its source, and a reader of every topic, whole,
finds no record out of order per key (tests/topic_order.py). A Spark worker killed mid-batch is
tests/integration/test_spark_cluster.py's (a cluster of its own: the cluster profile's Spark
beside these servers overloads two cores).
"""

from __future__ import annotations

import random
import re
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.daemon import kill_daemon, run_daemon, stop_daemon
from tests.faults import databases
from tests.faults.harness import Campaign, Daemon, Fault, Writer, big_text, delete_topics, dev, wait_for
from tests.faults.hosts import as_host
from tests.faults.test_pipeline_faults import KAFKA_TROUBLE, _assert_equal_everywhere, _bytes_blobs, psycopg2_admin
from tests.integration.test_sink_group import Group, _wait_for_evidence
from tests.topic_order import topic_order

pytestmark = [pytest.mark.cluster, pytest.mark.faults, pytest.mark.kafka, pytest.mark.postgres,
              pytest.mark.mysql, pytest.mark.redis, pytest.mark.opensearch, pytest.mark.timeout(1500)]

NODES = ("kafka1", "kafka2", "kafka3")


@pytest.fixture(scope="module")
def cluster(dev_env_for) -> str:
    """The bootstrap servers of the three-node Kafka (started if it is not running: naming one
    node starts the three)."""
    return dev_env_for("kafka1")["KAFKA_CLUSTER_BOOTSTRAP"]


@pytest.fixture(scope="module")
def redis_ha(dev_env_for):
    """A client of the Redis Cluster with a replica per master (service ``redis-ha``)."""
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(dev_env_for("redis-ha")["REDIS_HA_URL"])
    yield client
    client.close()


def _redis_rows(client, prefix: str, fields=("seq", "small", "big")) -> dict[int, dict]:
    """The Redis sink's hashes of ``public.docs`` (every non-NULL column as text), by id."""
    head = f"{prefix}:public.docs:"
    keys = [k.decode() for k in client.scan_iter(match=head + "*", count=1000) if b"{" not in k]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, *fields)
    return {int(key[len(head):]): dict(zip(fields, (v.decode() if v is not None else None for v in values)))
            for key, values in zip(keys, pipe.execute() if keys else []) if any(v is not None for v in values)}


def _kill_a_redis_master(client) -> str:
    """SIGKILL one master's process; returns once a replica serves its slots (its loop starts it
    again 10 s later, as a replica)."""
    import os
    import signal

    import redis

    node = random.choice(client.get_primaries())
    pid = client.get_redis_connection(node).info("server")["process_id"]
    os.kill(pid, signal.SIGKILL)

    def failed_over() -> bool:
        try:
            client.nodes_manager.initialize()
            primaries = {(n.host, n.port) for n in client.get_primaries()}
            return (node.host, node.port) not in primaries and len(primaries) == 3 and all(
                client.get_redis_connection(n).cluster("info").get("cluster_state") == "ok"
                for n in client.get_primaries())
        except (redis.RedisError, OSError):
            return False

    wait_for(failed_over, timeout=60, what="a replica to take the killed master's slots")
    return f"{node.host}:{node.port}"


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})


def leaders(bootstrap: str, prefix: str) -> Counter:
    """Partitions of the run's topics each node leads."""
    metadata = _admin(bootstrap).list_topics(timeout=10)
    counts: Counter = Counter()
    for name, topic in metadata.topics.items():
        if name.startswith(prefix + "."):
            for partition in topic.partitions.values():
                if partition.leader >= 0:
                    counts[partition.leader] += 1
    return counts


def fully_replicated(bootstrap: str) -> bool:
    """Every partition of the cluster (its internal topics too) has all its replicas in sync."""
    try:
        metadata = _admin(bootstrap).list_topics(timeout=10)
    except Exception:  # noqa: BLE001 - a node is on its way up
        return False
    return all(p.leader >= 0 and len(p.isrs) == len(p.replicas)
               for topic in metadata.topics.values() for p in topic.partitions.values())


def _search_rows(client, alias: str, fields=("seq", "small", "big")) -> dict[int, dict]:
    """The OpenSearch sink's documents of ``public.docs`` read through its alias, by id."""
    if not client.indices.exists_alias(name=alias):
        return {}
    client.indices.refresh(index=alias)
    hits = client.search(index=alias, body={"size": 10_000, "query": {"match_all": {}}})["hits"]["hits"]
    return {int(h["_source"]["id"]): {c: h["_source"].get(c) for c in fields} for h in hits}


def _search_progress(client, alias: str) -> int:
    """The highest ``seq`` the OpenSearch sink holds."""
    if not client.indices.exists_alias(name=alias):
        return 0
    client.indices.refresh(index=alias)
    found = client.search(index=alias, body={"size": 0, "aggs": {"m": {"max": {"field": "seq"}}}})
    return int(found["aggregations"]["m"]["value"] or 0)


def _config(tmp_path: Path, sources: list[str], sinks: list[str], bootstrap: str, prefix: str) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{bootstrap}', topic_prefix: {prefix}, partitions: 3}}\n"
        "sources:\n" + "".join(f"  - {s}\n" for s in sources) +
        "sinks:\n" + "".join(f"  - {s}\n" for s in sinks) + "http: null\n")
    return path


def test_the_pipeline_through_a_node_killed_a_rolling_restart_and_two_nodes_down(
        cluster, redis_ha, opensearch_url, dev_env_for, pg_admin_dsn, mysql_url, tmp_path):
    from opensearchpy import OpenSearch

    admin = psycopg2_admin(pg_admin_dsn)
    my_db = f"c_{uuid.uuid4().hex[:10]}"
    conn = databases.mysql_connect(mysql_url, None)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{my_db}`")
    conn.close()
    prefix, slot = f"c_{uuid.uuid4().hex[:8]}", f"c_{uuid.uuid4().hex[:8]}"
    daemon = None
    members: dict = {}
    try:
        rng = random.Random(21)
        pg_dsn = admin.create_database("source")
        pg = databases.PostgresDocs(pg_dsn)
        pg.create(100, lambda: big_text(rng))
        my = databases.MariaDbDocs(mysql_url, my_db)
        my.create(100, lambda: big_text(rng))
        targets = {"pg": admin.create_database("target"), "my": admin.create_database("target")}
        sources = [
            f"{{name: pg, type: postgres, dsn: '{pg_dsn}', slot: {slot}, tables: ['public.docs'], "
            f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}",
            f"{{name: my, type: mysql, url: '{mysql_url}', server_id: {random.randrange(1000, 2**31)}, "
            f"tables: ['{my_db}.docs']}}"]
        topics = {"pg": f"{prefix}.public.docs", "my": f"{prefix}.{my_db}.docs"}
        sinks = [f"{{name: wh_{name}, type: sql, url: '{targets[name].replace('postgresql://', 'postgresql+psycopg2://', 1)}', "
                 f"topics: ['{topics[name]}'], batch_wait_ms: 50}}" for name in targets]
        # PostgreSQL's changes into the Redis Cluster with replicas and into OpenSearch.
        sinks.append(f"{{name: cache, type: redis, url: '{dev_env_for('redis-ha')['REDIS_HA_URL']}', cluster: true, "
                     f"key_prefix: {prefix}, topics: ['{topics['pg']}'], batch_wait_ms: 50}}")
        sinks.append(f"{{name: search, type: opensearch, hosts: ['{opensearch_url}'], topics: ['{topics['pg']}'], "
                     f"batch_wait_ms: 50}}")
        search, alias = OpenSearch(opensearch_url), topics["pg"].lower()
        config = _config(tmp_path, sources, sinks, cluster, prefix)
        daemon = Daemon(config)
        # A SQL sink of its own whose two members are other hosts to Kafka (not in the daemon).
        group_target, member_hosts = admin.create_database("target"), {"member-a": "127.0.0.2", "member-b": "127.0.0.3"}
        group = Group(cluster, "grp")

        def start_member(client_id: str) -> None:
            path = tmp_path / f"{client_id}.yaml"
            consumer = f"{{client.id: {client_id}, session.timeout.ms: 6000, heartbeat.interval.ms: 1000}}"
            url = group_target.replace("postgresql://", "postgresql+psycopg2://", 1)
            path.write_text(
                f"log:\n  kafka: {{bootstrap_servers: '{cluster}', topic_prefix: {prefix}, partitions: 3, "
                f"consumer: {consumer}}}\nsources: []\n"
                f"sinks:\n  - {{name: grp, type: sql, url: '{url}', topics: ['{topics['pg']}'], batch_wait_ms: 50, "
                f"scale_out: group}}\nhttp: null\n")
            members[client_id] = run_daemon(path, "grp", log=f"{client_id}.log",
                                            env=as_host(member_hosts[client_id], cluster))

        def pg_position():
            return admin.scalar("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                (slot,))

        def kill_leader() -> None:
            node = f"kafka{leaders(cluster, prefix).most_common(1)[0][0]}"   # node.id n is service kafka<n>
            dev("kill", node)
            struck.append(node)

        def back_after_progress() -> None:
            campaign.wait_for_progress(f"more changes with {struck[-1]} down")
            dev("start", struck[-1])

        def rolling_restart() -> None:
            for node in NODES:
                wait_for(lambda: fully_replicated(cluster), timeout=120, what=f"every replica in sync before {node}")
                dev("restart", node)

        def two_down() -> None:
            down = rng.sample(NODES, 2)
            for node in down:
                dev("kill", node)
            struck.extend(down)
            # With one replica of three in sync no write is acknowledged: the source stops where
            # its last delivered change is. Its stored position must not move while they are down.
            time.sleep(3)
            held = pg_position()
            time.sleep(12)
            assert pg_position() == held, "the source stored a position while no write could be acknowledged"
            blocked.append(held)

        def one_back_then_the_other() -> None:
            dev("start", struck[-2])
            campaign.wait_for_progress(f"more changes with {struck[-1]} still down")
            dev("start", struck[-1])

        def kill_a_group_member() -> None:
            _wait_for_evidence(group, "member-a", members["member-a"])
            hosts = {client: host.lstrip("/") for client, host in group.hosts().items()}
            assert hosts == member_hosts, f"the coordinator sees the members on their own hosts: {hosts}"
            kill_daemon(members.pop("member-a"))
            members_killed.append(hosts)

        def member_back_after_the_other_took_over() -> None:
            wait_for(lambda: set(group.owned_by()) == {"member-b"} and len(group.owned_by()["member-b"]) == 3,
                     timeout=120, what="member-b to own every partition of the group's topic")
            start_member("member-a")

        struck: list[str] = []
        blocked: list[str] = []
        faults = [Fault("kill -9 the node leading the most partitions", kill_leader, back_after_progress,
                        detected=KAFKA_TROUBLE),
                  Fault("rolling restart of the three nodes", rolling_restart, detected=KAFKA_TROUBLE),
                  Fault("two nodes killed, one back, then the other", two_down, one_back_then_the_other,
                        detected=KAFKA_TROUBLE),
                  Fault("kill -9 a Redis master (its replica takes over)", lambda: masters.append(
                      _kill_a_redis_master(redis_ha)), detected=r"\[cache/.*(ConnectionError|retrying)")]
        faults.append(Fault("kill -9 a consumer-group member on host 127.0.0.2", kill_a_group_member,
                            member_back_after_the_other_took_over))
        members_killed: list[dict] = []
        masters: list[str] = []
        rng.shuffle(faults)
        daemon.start()
        with Writer(pg, seed=7) as pg_writer, Writer(my, seed=8) as my_writer:
            wait_for(lambda: databases.max_seq_pg(targets["pg"]), timeout=240, what="changes in the warehouse")
            for client_id in member_hosts:   # the topic exists now
                start_member(client_id)
            progress = {name: (lambda dsn=dsn: databases.max_seq_pg(dsn)) for name, dsn in targets.items()}
            progress["cache"] = lambda: max((int(r["seq"]) for r in _redis_rows(redis_ha, prefix, fields=("seq",))
                                             .values()), default=0)
            progress["search"] = lambda: _search_progress(search, alias)
            progress["grp"] = lambda: databases.max_seq_pg(group_target)
            campaign = Campaign(daemon, pg_position, progress, rng, timeout=240)
            for fault in faults:
                campaign.strike(fault)
                assert daemon.alive(), f"the daemon exited after {fault.name}:\n{daemon.log_since()[-3000:]}"
                for client_id, member in members.items():
                    assert member.poll() is None, f"{client_id} exited after {fault.name}"
        assert blocked and masters and members_killed, "a strike did not run"
        expected = {k: {c: None if v is None else str(v) for c, v in row.items() if c in ("seq", "small", "big")}
                    for k, row in pg.rows().items()}
        wait_for(lambda: _redis_rows(redis_ha, prefix) == expected, timeout=120,
                 what="the Redis Cluster's hashes equal to the PostgreSQL source")
        documents = {k: {c: row[c] for c in ("seq", "small", "big")} for k, row in pg.rows().items()}
        wait_for(lambda: _search_rows(search, alias) == documents, timeout=120,
                 what="the OpenSearch documents equal to the PostgreSQL source")
        for name, db, writer, rows in (("pg", pg, pg_writer, lambda rows: rows),
                                       ("my", my, my_writer, _bytes_blobs)):
            stores = {f"wh_{name}": lambda dsn=targets[name], db=db, rows=rows: rows(databases.pg_rows(dsn, db.columns))}
            if name == "pg":
                stores["grp"] = lambda: databases.pg_rows(group_target, pg.columns)
            _assert_equal_everywhere(db, writer, cluster, topics[name], stores, daemon)
        from cdc.log.kafka import KafkaLog

        log = KafkaLog(cluster)
        try:
            for name, topic in topics.items():
                order = topic_order(log, topic)
                assert order.records > 0 and not order.out_of_order and not order.keys_in_two_partitions, (
                    name, order.out_of_order[:10], order.keys_in_two_partitions[:10])
                print(f"{topic}: {order.records} records, {order.duplicates} duplicates, {order.replayed} "
                      f"replayed below a snapshot row, none out of order")
        finally:
            log.close()
        for record in campaign.records:
            print(f"{record.fault}: {record.seconds:.1f}s, noticed: {record.detected_line}")
    finally:
        for member in members.values():
            stop_daemon(member)
        if daemon is not None:
            daemon.stop()
        for node in NODES:
            dev("start", node)
        delete_topics(cluster, prefix)
        admin.drop_databases()
        conn = databases.mysql_connect(mysql_url, None)
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{my_db}`")
        conn.close()


def test_validate_and_status_warn_of_topics_with_one_replica_on_the_cluster(cluster, tmp_path):
    import subprocess
    import sys

    from confluent_kafka.admin import NewTopic

    prefix = f"w_{uuid.uuid4().hex[:8]}"

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "cdc.cli", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    source = "{name: gen, type: generator, table: t, rate: 10}"
    risky = tmp_path / "risky.yaml"
    risky.write_text(f"log:\n  kafka: {{bootstrap_servers: '{cluster}', topic_prefix: {prefix}, replication_factor: 1}}\n"
                     f"sources:\n  - {source}\nhttp: null\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"log:\n  kafka: {{bootstrap_servers: '{cluster}', topic_prefix: {prefix}x}}\n"
                     f"sources:\n  - {source}\nhttp: null\n")
    admin = _admin(cluster)
    try:
        admin.create_topics([NewTopic(f"{prefix}.public.lone", 1, 1)])[f"{prefix}.public.lone"].result(30)
        for said in (run("validate", str(risky)), run("status", str(risky))):
            assert "replication_factor is 1 on a cluster of 3 brokers" in said, said
            # (status made the offsets topic, at the factor the file says: warned of as well)
            lone = re.search(r"topic\(s\) have one replica on a cluster of 3 brokers, so losing that broker loses "
                             r"their records: (.*) \(add replicas", said)
            assert lone and f"{prefix}.public.lone" in lone.group(1).split(", "), said
        assert "warning" not in run("validate", str(plain))
    finally:
        delete_topics(cluster, prefix)
