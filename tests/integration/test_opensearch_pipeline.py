"""PostgreSQL -> Kafka -> OpenSearch sink, end to end under `cdc run`, with a live writer.

The sink's process group is killed (SIGKILL) again and again, each time right after evidence of
progress (its committed offsets moved), and the OpenSearch node is restarted (data kept) in the
middle. In the end every document read through the alias equals its source row (TOASTed values
included) and no deleted row is present.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg2
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from opensearchpy import OpenSearch
from opensearchpy.exceptions import TransportError

from cdc.dev import stack
from tests.background import PgWriter
from tests.daemon import kill_daemon as _kill
from tests.daemon import run_daemon as _run
from tests.daemon import stop_daemon as _stop
from tests.integration.pg_capture import execute, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.opensearch]

PARTITIONS = 3
BIG = 3000  # characters of the TOASTed column (stored out of line, uncompressed)


def _config(tmp_path: Path, dsn: str, kafka: str, opensearch: str, prefix: str, **sink) -> Path:
    extra = "".join(f", {k}: {v}" for k, v in sink.items())
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: {PARTITIONS}}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"sinks:\n  - {{name: {prefix}, type: opensearch, hosts: ['{opensearch}'], topics: ['{prefix}.public.*'], "
        f"batch_wait_ms: 50, drop_old_generation_after_s: 0{extra}}}\n"
        f"http: null\n")
    return path


def _source_rows(dsn: str) -> dict[int, dict]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, balance, note, big FROM accounts")
            return {r[0]: {"id": r[0], "balance": r[1], "note": r[2], "big": r[3]} for r in cur.fetchall()}
    finally:
        conn.close()


def _documents(client: OpenSearch, alias: str) -> dict[int, dict]:
    if not client.indices.exists_alias(name=alias):
        return {}
    client.indices.refresh(index=alias)
    docs = {}
    for hit in _scan(client, alias):
        source = hit["_source"]
        docs[source["id"]] = {k: v for k, v in source.items() if not k.startswith("__cdc")}
    return docs


def _scan(client: OpenSearch, alias: str):
    answer = client.search(index=alias, body={"size": 5000, "sort": ["_doc"]}, params={"scroll": "1m"})
    scroll = answer.get("_scroll_id")
    try:
        while answer["hits"]["hits"]:
            yield from answer["hits"]["hits"]
            answer = client.scroll(body={"scroll_id": scroll, "scroll": "1m"})
            scroll = answer.get("_scroll_id")
    finally:
        if scroll:
            client.clear_scroll(body={"scroll_id": scroll}, params={"ignore": 404})


class Writer(PgWriter):
    """Inserts, updates (some leave the TOASTed column alone, some change it), deletes and
    primary-key changes on ``accounts`` until stopped."""

    def change(self, cur) -> None:
        roll, some = self.rng.random(), self.rng.randrange(1, 1000)
        if roll < 0.35:    # the TOASTed column is unchanged: the WAL omits it
            cur.execute("UPDATE accounts SET balance = balance + 1, note = %s WHERE id = %s",
                        (f"n{self.changes}", some))
        elif roll < 0.45:
            cur.execute("UPDATE accounts SET big = %s WHERE id = %s", (_big(self.rng), some))
        elif roll < 0.7:
            cur.execute("INSERT INTO accounts VALUES (%s, 0, 'new', %s)", (self.new_id(), _big(self.rng)))
        elif roll < 0.9:
            cur.execute("DELETE FROM accounts WHERE id = %s", (self.rng.randrange(1, self.next_id),))
        else:
            cur.execute("UPDATE accounts SET id = %s WHERE id = %s", (self.new_id(), some))


def _big(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(BIG))


def _seed(dsn: str, rows: int) -> None:
    execute(dsn, "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, note text, big text)",
            "ALTER TABLE accounts ALTER COLUMN big SET STORAGE EXTERNAL",
            f"INSERT INTO accounts SELECT o.g, 100, 'seed', (SELECT string_agg(md5(s || '.' || o.g), '') "
            f"FROM generate_series(1, {BIG // 32}) s) FROM generate_series(1, {rows}) AS o(g)")


class Offsets:
    """The sink group's committed offsets, summed: the evidence that it made progress."""

    def __init__(self, kafka: str, group: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": kafka, "group.id": group, "enable.auto.commit": False})
        self.partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    def committed(self) -> int:
        for _ in range(30):  # the group coordinator may still be moving (NOT_COORDINATOR): ask again
            try:
                return sum(max(tp.offset, 0) for tp in self.consumer.committed(self.partitions, timeout=10))
            except KafkaException as err:
                if not err.args[0].retriable() and err.args[0].code() != KafkaError.NOT_COORDINATOR:
                    raise
                time.sleep(0.5)
        raise AssertionError("the sink group's committed offsets could not be read")

    def close(self) -> None:
        self.consumer.close()


@pytest.mark.serial
def test_sink_killed_again_and_again_and_a_node_restart_ends_equal_to_the_source(
        pg_dsn, kafka_bootstrap, opensearch_url, opensearch_index, tmp_path):
    prefix = opensearch_index
    alias = f"{prefix}.public.accounts"
    _seed(pg_dsn, rows=1000)
    config = _config(tmp_path, pg_dsn, kafka_bootstrap, opensearch_url, prefix)
    client = OpenSearch(opensearch_url)
    source = _run(config, "src")
    offsets = Offsets(kafka_bootstrap, prefix, alias)
    rng = random.Random(11)
    strikes = 0
    began = time.monotonic()
    try:
        with Writer(pg_dsn, seed=4) as writer:
            for cycle in range(21):
                before = offsets.committed()
                sink = _run(config, prefix)
                wait_until(lambda: offsets.committed() > before, timeout=90, what=f"progress in cycle {cycle}")
                time.sleep(rng.uniform(0, 0.4))
                _kill(sink)
                strikes += 1
                print(f"cycle {cycle}: struck at {time.monotonic() - began:.1f}s", file=sys.stderr)
                if cycle == 10:
                    stack.restart("opensearch")
        assert strikes >= 20 and writer.changes > 1000
        sink = _run(config, prefix)
        try:
            expected = _source_rows(pg_dsn)
            wait_until(lambda: _documents(client, alias) == expected, timeout=120, what="alias == source")
            print(f"converged at {time.monotonic() - began:.1f}s", file=sys.stderr)
        finally:
            _stop(sink)
    finally:
        offsets.close()
        _stop(source)
        client.delete(index="cdc-sink-state", id=prefix, params={"ignore": 404})
        client.close()


READER = """
import sys, time, urllib.request, urllib.error
url = sys.argv[1]
while True:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            print(answer.read().decode().split('"count":')[1].split(",")[0].rstrip("}"), flush=True)
    except urllib.error.HTTPError as err:
        print("missing" if err.code == 404 else f"error{err.code}", flush=True)
    time.sleep(0.05)
"""


class TypeChangeWriter(PgWriter):
    """Inserts, updates and deletes on ``items``; after ``alter`` is set, ``code`` is text."""

    per_commit = 5
    pause = 0.02

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(dsn, seed)
        self.altered = threading.Event()
        self.deletes = 0

    def change(self, cur) -> None:
        roll, some = self.rng.random(), self.rng.randrange(1, 3000)
        code = f"x{self.changes}" if self.altered.is_set() else self.changes
        if roll < 0.5:
            cur.execute("UPDATE items SET code = %s WHERE id = %s", (code, some))
        elif roll < 0.9:
            cur.execute("INSERT INTO items VALUES (%s, %s)", (self.new_id(), code))
        else:
            cur.execute("DELETE FROM items WHERE id = %s", (some,))
            self.deletes += cur.rowcount


@pytest.mark.parametrize("restart_sink", [pytest.param(False, id="live"),
                                          pytest.param(True, id="on-restart")])
def test_a_type_change_the_mapping_cannot_follow_rebuilds_while_readers_keep_a_full_index(
        pg_dsn, kafka_bootstrap, opensearch_url, opensearch_index, tmp_path, restart_sink):
    """live: the running sink sees the new shape and rebuilds by itself. on-restart: the sink is
    restarted after the ALTER (what a deploy does) and rebuilds when it reads the newest shape."""
    prefix = opensearch_index
    alias = f"{prefix}.public.items"
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, code int)",
            "INSERT INTO items SELECT g, g FROM generate_series(1, 3000) g")
    config = _config(tmp_path, pg_dsn, kafka_bootstrap, opensearch_url, prefix)
    client = OpenSearch(opensearch_url)
    source, sink = _run(config, "src"), _run(config, prefix)
    reader = None
    try:
        wait_until(lambda: _count(client, alias) == 3000, timeout=120, what="the first fill")
        reader = subprocess.Popen([sys.executable, "-c", READER, f"{opensearch_url}/{alias}/_count"],
                                  stdout=subprocess.PIPE, text=True)
        with TypeChangeWriter(pg_dsn, seed=9) as writer:
            wait_until(lambda: writer.changes > 300, timeout=60, what="live writes")
            execute(pg_dsn, "ALTER TABLE items ALTER COLUMN code TYPE text USING code::text")
            writer.altered.set()
            if restart_sink:
                wait_until(lambda: writer.changes > 300 + 200, timeout=60, what="writes in the new shape")
                _stop(sink)
                sink = _run(config, prefix)
            wait_until(lambda: _generation(client, alias) == 2, timeout=90, what="the rebuild's switch")
            wait_until(lambda: writer.changes > 600 + 300, timeout=60, what="writes after the switch")
        expected = {i: {"id": i, "code": str(row["code"])} for i, row in _rows(pg_dsn).items()}
        wait_until(lambda: _text_codes(_documents(client, alias)) == expected, timeout=120, what="alias == source")
        index = f"{alias}__g2"
        assert client.indices.get_mapping(index=index)[index]["mappings"]["properties"]["code"]["type"] == "text"
    finally:
        if reader is not None:
            reader.terminate()
        _stop(sink)
        _stop(source)
        client.delete(index="cdc-sink-state", id=prefix, params={"ignore": 404})
        client.close()
    seen = reader.communicate()[0].split()
    counts = [int(n) for n in seen if n.isdigit()]
    assert len(counts) == len(seen) and counts, f"the alias went missing or failed: {sorted(set(seen) - set(map(str, counts)))}"
    assert min(counts) >= 3000 - writer.deletes, f"readers saw {min(counts)} documents, fewer than the source had"


def _count(client: OpenSearch, alias: str) -> int | None:
    try:
        return client.count(index=alias)["count"]
    except TransportError:  # no alias yet (404), shards still starting (503)
        return None


def _generation(client: OpenSearch, alias: str) -> int | None:
    targets = client.indices.get_alias(name=alias, params={"ignore": 404})
    names = [name for name in targets if isinstance(targets[name], dict)]
    return int(names[0].rsplit("__g", 1)[1]) if len(names) == 1 else None


def _rows(dsn: str) -> dict[int, dict]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, code FROM items")
            return {r[0]: {"id": r[0], "code": r[1]} for r in cur.fetchall()}
    finally:
        conn.close()


def _text_codes(documents: dict[int, dict]) -> dict[int, dict]:
    # Rows the ALTER rewrote without a change event keep their integer in the topic (and so in the
    # document); the source prints them as text now.
    return {i: {"id": d["id"], "code": None if d.get("code") is None else str(d["code"])} for i, d in documents.items()}
