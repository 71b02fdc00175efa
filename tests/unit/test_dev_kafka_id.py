"""The dev stack's Kafka cluster id never starts with ``-`` (``kafka-storage -t`` reads it as an option)."""
import uuid

from cdc.dev import brokers


def test_cluster_id_redrawn_when_it_would_start_with_a_dash(monkeypatch):
    drawn = iter([uuid.UUID(bytes=b"\xf8" + b"\x00" * 15), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr(brokers.uuid, "uuid4", lambda: next(drawn))
    cluster_id = brokers._kafka_cluster_id()
    assert cluster_id == "AQEBAQEBAQEBAQEBAQEBAQ"
    assert len(cluster_id) == 22


def test_cluster_ids_never_start_with_a_dash():
    assert not any(brokers._kafka_cluster_id().startswith("-") for _ in range(2000))


def test_the_nodes_of_the_replicated_kafka_share_their_ports_and_cluster_id(tmp_path):
    from cdc.dev import stack

    state = {"root": str(tmp_path), "services": {}}
    first = stack._new_services(state, ["kafka1", "kafka2"])
    assert first["kafka1"].ports == first["kafka2"].ports
    assert first["kafka1"].port != first["kafka2"].port
    state["services"]["kafka1"] = {"ports": first["kafka1"].ports}
    # A node started later (its peer's entry already in the state) joins the same group.
    later = stack._new_services(state, ["kafka3"])["kafka3"]
    assert later.ports == first["kafka1"].ports
    ids = {s.shared_cluster_id() for s in (*first.values(), later)}
    assert len(ids) == 1 and len(ids.pop()) == 22
    assert stack._new_services(state, ["kafka"])["kafka"].ports != first["kafka1"].ports


def test_the_spark_cluster_shares_the_masters_ports_and_comes_whole_with_the_cluster_profile(tmp_path):
    from cdc.dev import stack

    state = {"root": str(tmp_path), "services": {}}
    nodes = stack._new_services(state, ["spark-master", "spark-worker1", "spark-worker2"])
    master, one, two = nodes["spark-master"], nodes["spark-worker1"], nodes["spark-worker2"]
    assert master.ports == one.ports == two.ports and len({master.port, one.port, two.port}) == 3
    # Each worker registers with the master's URL and serves its own web UI, which its probe
    # looks for among the master's alive workers.
    for worker in (one, two):
        command = worker.command()
        arguments = command[command.index(worker.main_class) + 1:]
        assert arguments[:3] == [master.master_url, "--host", "127.0.0.1"] and str(worker.port) in arguments
        assert worker.environment()["SPARK_HOME"] and worker.environment()["SPARK_WORKER_DIR"].startswith(str(tmp_path))
    assert {"spark-master", "spark-worker1", "spark-worker2"} <= set(stack.PROFILES["cluster"])
    assert not {"spark-master", "spark-worker1", "spark-worker2"} & set(stack.DEFAULT)
