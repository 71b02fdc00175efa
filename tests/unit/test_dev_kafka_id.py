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
