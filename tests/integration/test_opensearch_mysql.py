"""MariaDB -> Kafka -> OpenSearch sink under `cdc run`: a live writer, the sink killed (SIGKILL)
twice after evidence of progress, and in the end every document equals its source row."""

from __future__ import annotations

import random
import threading
import time

import pytest
from opensearchpy import OpenSearch

from tests.conftest import mysql_connect
from tests.integration.pg_capture import wait_until
from tests.integration.test_mysql_source import execute, table_rows
from tests.integration.test_opensearch_pipeline import Offsets, _documents, _kill, _run, _stop

pytestmark = [pytest.mark.mysql, pytest.mark.kafka, pytest.mark.opensearch]


class MySqlWriter(threading.Thread):
    def __init__(self, url: str, db: str) -> None:
        super().__init__(daemon=True)
        self.url, self.db = url, db
        self.stop = threading.Event()
        self.changes = 0

    def run(self) -> None:
        rng, next_id = random.Random(5), 10_000
        conn = mysql_connect(self.url, self.db)
        with conn.cursor() as cur:
            while not self.stop.is_set():
                for _ in range(10):
                    roll, some = rng.random(), rng.randrange(1, 500)
                    if roll < 0.4:
                        cur.execute("UPDATE products SET price = price + 1, name = %s WHERE id = %s",
                                    (f"n{self.changes}", some))
                    elif roll < 0.75:
                        next_id += 1
                        cur.execute("INSERT INTO products VALUES (%s, 'new', 9.99, 1)", (next_id,))
                    elif roll < 0.9:
                        cur.execute("DELETE FROM products WHERE id = %s", (rng.randrange(1, next_id),))
                    else:
                        next_id += 1
                        cur.execute("UPDATE products SET id = %s WHERE id = %s", (next_id, some))
                    self.changes += 1
                conn.commit()
                time.sleep(0.01)
        conn.close()


def test_mariadb_rows_end_equal_in_opensearch(mysql_url, mysql_db, kafka_bootstrap, opensearch_url,
                                              opensearch_index, tmp_path):
    execute(mysql_url, mysql_db, "CREATE TABLE products (id INT PRIMARY KEY, name VARCHAR(50), "
                                 "price DECIMAL(10,2), active TINYINT(1))",
            "INSERT INTO products SELECT seq, CONCAT('p', seq), seq / 100, seq % 2 FROM seq_1_to_500")
    prefix = opensearch_index
    alias = f"{prefix}.{mysql_db}.products".lower()
    config = tmp_path / "cdc.yaml"
    config.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {prefix}, partitions: 3}}\n"
        f"sources:\n  - {{name: my, type: mysql, url: '{mysql_url}', server_id: {random.randrange(10_000, 2**31)}, "
        f"tables: ['{mysql_db}.*'], heartbeat_interval: 0.5}}\n"
        f"sinks:\n  - {{name: {prefix}, type: opensearch, hosts: ['{opensearch_url}'], topics: ['{prefix}.*'], "
        f"batch_wait_ms: 50}}\nhttp: null\n")
    client = OpenSearch(opensearch_url)
    source = _run(config, "my")
    offsets = Offsets(kafka_bootstrap, prefix, f"{prefix}.{mysql_db}.products")
    writer = MySqlWriter(mysql_url, mysql_db)
    writer.start()
    try:
        for cycle in range(2):
            before = offsets.committed()
            sink = _run(config, prefix)
            wait_until(lambda: offsets.committed() > before, timeout=90, what=f"progress in cycle {cycle}")
            _kill(sink)
        writer.stop.set()
        writer.join()
        assert writer.changes > 100
        sink = _run(config, prefix)
        try:
            expected = {row["id"]: row for row in table_rows(mysql_url, mysql_db, "products").values()}
            wait_until(lambda: _documents(client, alias) == expected, timeout=120, what="alias == source")
        finally:
            _stop(sink)
    finally:
        writer.stop.set()
        offsets.close()
        _stop(source)
        client.delete(index="cdc-sink-state", id=prefix, params={"ignore": 404})
        client.close()
