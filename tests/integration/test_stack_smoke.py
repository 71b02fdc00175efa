"""One smoke test per server of the local stack: each really talks to it."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.conftest import mysql_connect


@pytest.mark.postgres
def test_postgres_logical_slot_streams_a_change_over_pgoutput(pg_dsn):
    import psycopg2
    import psycopg2.extras

    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SHOW wal_level")
        assert cur.fetchone()[0] == "logical"
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("CREATE PUBLICATION smoke FOR TABLE items")
        cur.execute("SELECT pg_create_logical_replication_slot('smoke_slot', 'pgoutput')")
        cur.execute("INSERT INTO items VALUES (7, 'seven')")
    repl = psycopg2.connect(pg_dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    kinds = []
    with repl.cursor() as cur:
        cur.start_replication(slot_name="smoke_slot", decode=False,
                              options={"proto_version": "1", "publication_names": "smoke"})
        deadline = time.monotonic() + 20
        while b"C" not in kinds and time.monotonic() < deadline:
            message = cur.read_message()
            if message is None:
                time.sleep(0.02)
                continue
            kinds.append(message.payload[:1])
            if message.payload[:1] == b"I":
                insert = message.payload
    repl.close()
    conn.close()
    # Begin, Relation, Insert, Commit: the pgoutput message types of one INSERT transaction.
    assert kinds == [b"B", b"R", b"I", b"C"]
    # The new tuple carries both columns as text: 'seven' must be in it.
    assert b"seven" in insert and b"7" in insert


@pytest.mark.mysql
def test_mariadb_binlog_row_event_has_column_names_and_values(mysql_url, mysql_db):
    from urllib.parse import urlparse

    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    conn = mysql_connect(mysql_url, mysql_db)
    with conn.cursor() as cur:
        for variable, expected in (("binlog_format", "ROW"), ("binlog_row_image", "FULL"),
                                   ("binlog_row_metadata", "FULL"), ("log_bin", "ON")):
            cur.execute("SHOW GLOBAL VARIABLES LIKE %s", (variable,))
            assert cur.fetchone()[1] == expected, variable
        cur.execute("SHOW MASTER STATUS")
        log_file, log_pos = cur.fetchone()[:2]
        cur.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))")
        cur.execute("INSERT INTO items VALUES (7, 'seven')")
    parsed = urlparse(mysql_url)
    reader = BinLogStreamReader(
        connection_settings={"host": parsed.hostname, "port": parsed.port, "user": "root", "passwd": ""},
        server_id=int(uuid.uuid4().int % 1_000_000) + 1000, log_file=log_file, log_pos=log_pos,
        only_events=[WriteRowsEvent], only_schemas=[mysql_db], blocking=False, resume_stream=True)
    rows = [row["values"] for event in reader for row in event.rows]
    reader.close()
    conn.close()
    assert rows == [{"id": 7, "name": "seven"}]


@pytest.mark.kafka
def test_kafka_compacted_topic_round_trip(kafka_bootstrap, kafka_topic):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created = admin.create_topics([NewTopic(kafka_topic, num_partitions=1, replication_factor=1,
                                            config={"cleanup.policy": "compact"})])
    created[kafka_topic].result(timeout=30)
    resource = ConfigResource(ConfigResource.Type.TOPIC, kafka_topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["cleanup.policy"].value == "compact"

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(3):
        producer.produce(kafka_topic, key=b'{"id": 1}', value=f'{{"v": {i}}}'.encode())
    producer.produce(kafka_topic, key=b'{"id": 2}', value=None)  # a tombstone
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": kafka_topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([kafka_topic])
    received = []
    deadline = time.monotonic() + 30
    while len(received) < 4 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            received.append((message.key(), message.value()))
    consumer.close()
    assert received == [(b'{"id": 1}', b'{"v": 0}'), (b'{"id": 1}', b'{"v": 1}'),
                        (b'{"id": 1}', b'{"v": 2}'), (b'{"id": 2}', None)]


@pytest.mark.redis
def test_redis_set_get(redis_url, redis_prefix):
    import redis

    client = redis.Redis.from_url(redis_url)
    assert client.set(redis_prefix + "k", "v") is True
    assert client.get(redis_prefix + "k") == b"v"
    assert client.get(redis_prefix + "missing") is None
    client.close()


@pytest.mark.opensearch
def test_opensearch_index_and_search(opensearch_url, opensearch_index):
    from opensearchpy import OpenSearch

    client = OpenSearch(opensearch_url)
    client.index(index=opensearch_index, id="1", body={"title": "change data capture"}, refresh=True)
    client.index(index=opensearch_index, id="2", body={"title": "something else"}, refresh=True)
    hits = client.search(index=opensearch_index, body={"query": {"match": {"title": "capture"}}})
    assert [h["_id"] for h in hits["hits"]["hits"]] == ["1"]
    client.close()


@pytest.mark.spark
@pytest.mark.kafka
def test_spark_reads_kafka_and_writes_delta(spark, kafka_bootstrap, kafka_topic, tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(kafka_topic, num_partitions=2, replication_factor=1)])[kafka_topic].result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce(kafka_topic, key=str(i).encode(), value=f'{{"id": {i}, "sq": {i * i}}}'.encode())
    assert producer.flush(30) == 0

    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
           .option("subscribe", kafka_topic).option("startingOffsets", "earliest").load())
    parsed = raw.selectExpr("CAST(value AS STRING) AS json").selectExpr(
        "from_json(json, 'id INT, sq INT') AS r").select("r.*")
    path = str(tmp_path / "delta")
    parsed.write.format("delta").save(path)

    back = spark.read.format("delta").load(path)
    assert sorted((r.id, r.sq) for r in back.collect()) == [(i, i * i) for i in range(10)]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert history[0].operation == "WRITE"
