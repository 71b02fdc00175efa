"""The fault proxy itself, against the real PostgreSQL server and Kafka broker of the local stack."""

from __future__ import annotations

import threading
import uuid

import psycopg2
import pytest

from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.faults


def _dsn_via(proxy: FaultProxy, pg_admin_dsn: str) -> str:
    return f"postgresql://postgres@{proxy.address}/{pg_admin_dsn.rsplit('/', 1)[1]}"


def _query(dsn: str) -> int:
    conn = psycopg2.connect(dsn, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 42")
            return cur.fetchone()[0]
    finally:
        conn.close()


@pytest.mark.postgres
@pytest.mark.parametrize("fault", ["cut", "reset"])
def test_cut_and_reset_break_open_connections_and_let_new_ones_in(pg_admin_dsn, fault):
    pg_port = pg_admin_dsn.split("@", 1)[1].split("/", 1)[0]
    with FaultProxy(pg_port, name="pg") as proxy:
        dsn = _dsn_via(proxy, pg_admin_dsn)
        conn = psycopg2.connect(dsn)
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
        assert getattr(proxy, fault)() == 1
        with pytest.raises(psycopg2.OperationalError):
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
        assert _query(dsn) == 42
        assert proxy.accepted == 2


@pytest.mark.postgres
def test_stall_holds_a_query_until_healed_and_refuse_turns_new_connections_away(pg_admin_dsn):
    pg_port = pg_admin_dsn.split("@", 1)[1].split("/", 1)[0]
    with FaultProxy(pg_port, name="pg") as proxy:
        dsn = _dsn_via(proxy, pg_admin_dsn)
        conn = psycopg2.connect(dsn)
        answered = threading.Event()

        def ask() -> None:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_sleep(0), 7")
                answered.set()

        proxy.stall()
        asking = threading.Thread(target=ask)
        asking.start()
        # Stalled, the answer never comes (a wait that can only fail if the stall leaks).
        assert not answered.wait(1.0)
        proxy.heal()
        assert answered.wait(30)
        asking.join()
        conn.close()

        proxy.refuse()
        with pytest.raises(psycopg2.OperationalError, match="refused"):
            _query(dsn)
        proxy.heal()
        assert _query(dsn) == 42


@pytest.mark.kafka
def test_kafka_clients_bootstrapped_at_the_proxy_never_bypass_it(dev_env_for):
    """The broker's FAULTS listener advertises the proxy's port: with the proxy refusing and its
    connections cut, a producer cannot deliver at all; healed, it delivers."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    env = dev_env_for("kafka")
    topic = f"t_{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": env["KAFKA_BOOTSTRAP"]})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    proxy = FaultProxy(env["KAFKA_FAULT_LISTENER"], listen_port=int(env["KAFKA_FAULT_PROXY"].rsplit(":", 1)[1]),
                       name="kafka").start()
    try:
        producer = Producer({"bootstrap.servers": proxy.address, "message.timeout.ms": 60000})
        producer.produce(topic, b"first")
        assert producer.flush(30) == 0
        proxy.refuse()
        proxy.cut()
        producer.produce(topic, b"second")
        assert producer.flush(2) == 1  # no path around the proxy
        proxy.heal()
        assert producer.flush(30) == 0
        assert proxy.accepted >= 2
    finally:
        proxy.close()
        admin.delete_topics([topic])
