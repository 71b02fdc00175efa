"""A bulk rebuild into PostgreSQL (cdc.bulk_window, sinks/sql/bulk_load.py) through the real runtime.

A history larger than a small window (several windows: the first loaded by plain COPY, the later
ones through the guarded writes), with updates, deletes, re-inserts, awkward values, a poison
record and replays of older versions at later offsets, must end equal to the source's final state
and to what the batch-by-batch path makes of the same topic, remembered deletes included; and a
live event older than a delete must not bring the row back afterwards.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

import pytest

from cdc import bulk_window
from cdc.events import ChangeEvent, Op, TableId
from cdc.log.base import TopicSettings
from cdc.log.kafka import KafkaLog
from cdc.positions import Counter
from cdc.runtime import window_fill
from cdc.runtime.sink_runner import SinkRunner
from cdc.serde import EnvelopeEncoder, Record
from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink
from tests.daemon import cdc_process, kill_daemon
from tests.integration.pg_capture import execute, wait_until
from tests.sql import query

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]
# These count the windows loaded: without cdc._window (or with CDC_NATIVE=0) a rebuild writes batches.
needs_windows = pytest.mark.skipif(not bulk_window.available(), reason="cdc._window not built, or CDC_NATIVE=0")

TABLE = TableId("shop", "public", "things")
VALUES = ["plain", "tab\there", "new\nline\r", "back\\slash \\N", 'quote"', "é 日本 😀", ""]
KEYS = 12000


def _row(key: int, n: int) -> dict:
    return {"id": key, "name": VALUES[(key + n) % len(VALUES)] + "x" * (n % 90), "amount": f"{key * 1.25 + n:.2f}",
            "doc": {"n": n, "k": [key, None]} if key % 3 else None}


def _history() -> tuple[list[ChangeEvent], list[ChangeEvent], dict[int, tuple[int, dict | None]]]:
    """(events in log order, older events replayed at the end, key -> (newest version, row or None))."""
    rng = random.Random(18)
    events: list[ChangeEvent] = []
    final: dict[int, tuple[int, dict | None]] = {}
    version = 0
    for n in range(4 * KEYS):
        key = rng.randrange(KEYS) if n >= KEYS else n  # every key created, then random changes
        version += 1
        if key in final and final[key][1] is not None and rng.random() < 0.15:
            events.append(ChangeEvent(Op.DELETE, TABLE, {"id": key}, {"id": key}, None, version, 0))
            final[key] = (version, None)
        else:  # an update, or a re-insert of a deleted key
            row = _row(key, n)
            events.append(ChangeEvent(Op.UPDATE if key in final else Op.CREATE, TABLE, {"id": key}, None, row,
                                      version, 0))
            final[key] = (version, row)
    # A replay after a crash: older versions again, at later offsets (of deleted keys and live ones).
    # Not deletes: the tombstone after a delete removes a key's row whatever its version, by contract.
    replays = [event for event in rng.sample(events, 800)
               if event.version < final[event.key["id"]][0] and event.op is not Op.DELETE]
    return events, replays, final


def _schema_record() -> dict:
    columns = [("id", "bigint", True), ("name", "text", False), ("amount", "numeric(14,2)", False),
               ("doc", "jsonb", False)]
    return {"source": "src", "db": "shop", "schema": "public", "table": "things", "version": 1, "ts_ms": 0,
            "ddl": None, "columns": [{"name": n, "type": t, "key": k, "nullable": not k} for n, t, k in columns]}


def _table(dsn: str) -> list[tuple]:
    return query(dsn, "SELECT id, name, amount::text, doc::text, __cdc_version FROM things ORDER BY id")


def _deletes(dsn: str) -> dict[str, int]:
    return dict(query(dsn, "SELECT key_json, version FROM cdc_sink_deletes"))


def _runner(kafka, prefix: str, url: str, group: str, **settings) -> SinkRunner:
    sink = SqlSink(SqlSinkConfig(name="bulk", type="sql", url=url, topics=[f"{prefix}.*"], **settings))
    runner = SinkRunner(sink, kafka, prefix, group=group)
    runner.schema_for = lambda topic, version=None: _schema_record()
    return runner


@needs_windows
def test_a_history_larger_than_the_window_rebuilds_equal_to_its_final_state(pg_admin_dsn, kafka_bootstrap):
    run = uuid.uuid4().hex[:8]
    prefix = f"bulk_{run}"
    kafka = KafkaLog(kafka_bootstrap)
    topic = TABLE.topic(prefix)
    databases = []
    events, replays, final = _history()
    try:
        kafka.ensure_topic(topic, TopicSettings(partitions=2))
        writer = kafka.writer()
        encoder = EnvelopeEncoder("postgresql", "src", prefix)
        for at in range(0, len(events), 5000):
            writer.publish_events(encoder, events[at:at + 5000], None)
            writer.poll()
        writer.publish([Record(topic, b'{"id":3}', b'{"before":null,"after":{"id":3,"name":"x"},"op":"u",')])
        writer.publish_events(encoder, replays, Counter(1))
        writer.flush(60)
        urls = {}
        for path in ("bulk", "batches"):
            name = f"bulk_{run}_{path}"
            execute(pg_admin_dsn, f'CREATE DATABASE "{name}"')
            databases.append(name)
            urls[path] = pg_admin_dsn.rsplit("/", 1)[0] + "/" + name
        # The bulk rebuild in 1 MiB windows: the history holds several.
        runner = _runner(kafka, prefix, urls["bulk"].replace("postgresql://", "postgresql+psycopg2://", 1),
                         f"bulk-{run}", bulk_window_mb=1)
        loads: list[bool] = []
        load_window = runner.rebuilds.windows.load_window

        def counting(window, first, generation):
            loads.append(first)
            load_window(window, first, generation)
        runner.rebuilds.windows.load_window = counting
        runner.rebuild(threading.Event())
        # In bulk: the first window, and a later one only where it holds no key loaded before (the
        # first window of the other partition); the windows cut from a partition after its first
        # one go through the guarded writes.
        assert loads[0] is True and len(loads) >= 3 and not all(loads), loads
        assert runner.stats.errors == 1  # the cut-off record went to the dead-letter topic
        # The same topic batch by batch, into the generation readers see.
        batches = _runner(kafka, prefix, urls["batches"].replace("postgresql://", "postgresql+psycopg2://", 1),
                          f"batches-{run}", batch_size=500)
        batches.run(threading.Event(), from_start=True, until_caught_up=True)

        expected = sorted((key, row["name"], row["amount"], None if row["doc"] is None else row["doc"], version)
                          for key, (version, row) in final.items() if row is not None)
        bulk = _table(urls["bulk"])
        assert [(k, name, amount, version) for k, name, amount, _, version in bulk] == \
            [(k, name, amount, version) for k, name, amount, _, version in expected]
        assert bulk == _table(urls["batches"])
        # Every key deleted now is remembered at its delete's version (so an older event cannot bring
        # it back), in both; the bulk path remembers only deletes the history has.
        deleted = {f'{{"id":{key}}}': version for key, (version, row) in final.items() if row is None}
        remembered = _deletes(urls["bulk"])
        assert deleted and deleted.items() <= remembered.items() and deleted.items() <= _deletes(urls["batches"]).items()
        history = {(f'{{"id":{e.key["id"]}}}', e.version) for e in events if e.op is Op.DELETE}
        assert set(remembered.items()) <= history

        # Live, after the switch: an event older than a key's delete leaves the key deleted.
        key = next(k for k, (_, row) in final.items() if row is None)
        older = ChangeEvent(Op.UPDATE, TABLE, {"id": key}, None, _row(key, 1), final[key][0] - 1, 0)
        writer.publish_events(encoder, [older], Counter(2))
        writer.flush(30)
        live = _runner(kafka, prefix, urls["bulk"].replace("postgresql://", "postgresql+psycopg2://", 1),
                       f"bulk-{run}")
        live.run(threading.Event(), until_caught_up=True)
        assert live.stats.events == 1  # only the new event: the rebuild committed the offsets it covered
        assert _table(urls["bulk"]) == bulk
        writer.close()
    finally:
        kafka.delete_topic(topic)
        kafka.close()
        for name in databases:
            execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _publish(kafka: KafkaLog, prefix: str, events: list[ChangeEvent]) -> None:
    writer = kafka.writer()
    encoder = EnvelopeEncoder("postgresql", "src", prefix)
    for at in range(0, len(events), 5000):
        writer.publish_events(encoder, events[at:at + 5000], None)
        writer.poll()
    writer.publish_events(encoder, [], Counter(1))
    writer.flush(60)
    writer.close()


def test_a_bulk_rebuild_killed_once_a_window_landed_leaves_readers_on_the_old_generation_and_starts_over(
        pg_admin_dsn, kafka_bootstrap, tmp_path: Path):
    """kill -9 of `cdc rebuild` (bulk, 1 MiB windows) once rows of its first window are in the
    open generation and later windows are being read and written: readers keep the complete
    generation the bootstrap made, and the rebuild run again ends equal to the source."""
    run = uuid.uuid4().hex[:8]
    prefix, name = f"bulkkill_{run}", f"bulkkill_{run}"
    kafka = KafkaLog(kafka_bootstrap)
    topic = TABLE.topic(prefix)
    events, replays, final = _history()
    execute(pg_admin_dsn, f'CREATE DATABASE "{name}"')
    dsn = pg_admin_dsn.rsplit("/", 1)[0] + "/" + name
    url = dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {prefix}}}\n"
                      f"sources: []\n"
                      f"sinks:\n  - {{name: wh, type: sql, url: '{url}', topics: ['{prefix}.*'], bulk_window_mb: 1}}\n"
                      f"http: null\n")
    expected = {key: (row["name"], version) for key, (version, row) in final.items() if row is not None}

    def table(physical: str = "things") -> dict[int, tuple]:
        return {key: (text, version) for key, text, version in query(dsn, f"SELECT id, name, __cdc_version FROM {physical}")}

    try:
        kafka.ensure_topic(topic, TopicSettings(partitions=2))
        _publish(kafka, prefix, events + replays)
        bootstrap = cdc_process(config, "bootstrap", "wh", "--no-follow", log="bootstrap.log")
        assert bootstrap.wait(300) == 0, (tmp_path / "bootstrap.log").read_text()[-3000:]
        assert table() == expected
        current = query(dsn, "SELECT generation FROM cdc_sink_generations WHERE state = 'current'")[0][0]

        rebuild = cdc_process(config, "rebuild", "wh", log="rebuild.log")
        try:
            landed = f"things__g{current + 1}"
            deadline = time.monotonic() + 120
            while not (query(dsn, "SELECT 1 FROM cdc_sink_generations WHERE state = 'open'")
                       and query(dsn, f"SELECT to_regclass('{landed}') IS NOT NULL")[0][0]
                       and query(dsn, f"SELECT count(*) FROM {landed}")[0][0] > 0):
                assert rebuild.poll() is None, (tmp_path / "rebuild.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no window landed in the open generation"
                time.sleep(0.01)
        finally:
            kill_daemon(rebuild)
        # Struck in the middle: the generation is still open, readers on the bootstrap's.
        assert query(dsn, "SELECT state FROM cdc_sink_generations WHERE generation = %s", (current + 1,)) == [("open",)]
        assert query(dsn, "SELECT generation FROM cdc_sink_generations WHERE state = 'current'") == [(current,)]
        assert table() == expected
        assert len(table(landed)) < len(expected)

        again = cdc_process(config, "rebuild", "wh", log="rebuild.log")
        assert again.wait(300) == 0, (tmp_path / "rebuild.log").read_text()[-3000:]
        wait_until(lambda: query(dsn, "SELECT state FROM cdc_sink_generations") == [("current",)], timeout=30,
                   what="one generation left")
        assert table() == expected
    finally:
        kafka.delete_topic(topic)
        kafka.close()
        execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@needs_windows
def test_a_key_in_two_partitions_of_a_grown_topic_goes_through_the_guarded_writes(pg_admin_dsn, kafka_bootstrap,
                                                                                   caplog, monkeypatch):
    """A topic whose partition count grew holds some keys' older records in partition 0 and their
    newer ones in partition 1. The bulk rebuild reads partition after partition and loads each one
    as soon as it is read; the second partition's window shares keys with the first's, which is
    in the generation already, so it must go through the version-guarded writes (a plain COPY
    would leave the rows its deletes and tombstones remove): the rebuild ends equal to the source."""
    from confluent_kafka.admin import AdminClient, NewPartitions
    run = uuid.uuid4().hex[:8]
    prefix, name = f"bulkgrow_{run}", f"bulkgrow_{run}"
    kafka = KafkaLog(kafka_bootstrap)
    topic = TABLE.topic(prefix)
    rng = random.Random(7)
    keys, version = 2000, 0
    final: dict[int, tuple[int, dict | None]] = {}
    before, after = [], []
    for n in range(2 * keys):  # every key created and updated, all in partition 0
        key, version = n % keys, version + 1
        before.append(ChangeEvent(Op.UPDATE if key in final else Op.CREATE, TABLE, {"id": key}, None,
                                  _row(key, n), version, 0))
        final[key] = (version, before[-1].after)
    # After the topic grew: deletes of half the keys and new keys. (An older key's update in partition 1
    # would make a plain COPY fail on the key and the part be written the guarded way anyway; a delete
    # and its tombstone would not: the row would stay.)
    for key in range(keys + keys // 2):
        version = version + 1
        if key >= keys:
            after.append(ChangeEvent(Op.CREATE, TABLE, {"id": key}, None, _row(key, version), version, 0))
            final[key] = (version, after[-1].after)
        elif rng.random() < 0.5:
            after.append(ChangeEvent(Op.DELETE, TABLE, {"id": key}, {"id": key}, None, version, 0))
            final[key] = (version, None)
    execute(pg_admin_dsn, f'CREATE DATABASE "{name}"')
    dsn = pg_admin_dsn.rsplit("/", 1)[0] + "/" + name
    try:
        kafka.ensure_topic(topic, TopicSettings(partitions=1))
        _publish(kafka, prefix, before)
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
        kafka.close()
        kafka = KafkaLog(kafka_bootstrap)  # a new process's view: the log caches partition counts
        wait_until(lambda: len(kafka.end_offsets(topic)) == 2, timeout=30, what="the topic's second partition")
        _publish(kafka, prefix, after)
        assert kafka.end_offsets(topic)[(topic, 1)] > 0  # some keys' newer records are in partition 1 now

        monkeypatch.setattr(window_fill, "BULK_STAGE_RECORDS", 1)  # a stage per partition, however small
        runner = _runner(kafka, prefix, dsn.replace("postgresql://", "postgresql+psycopg2://", 1), f"grow-{run}")
        loads: list[bool] = []
        load_window = runner.rebuilds.windows.load_window

        def counting(window, bulk, generation):
            loads.append(bulk)
            load_window(window, bulk, generation)
        runner.rebuilds.windows.load_window = counting
        with caplog.at_level("WARNING", logger="cdc.runtime.window_loads"):
            runner.rebuild(threading.Event())
        expected = sorted((key, row["name"], row["amount"], version)
                          for key, (version, row) in final.items() if row is not None)
        assert [(k, text, amount, v) for k, text, amount, _, v in _table(dsn)] == expected
        assert loads == [True, False]  # partition 0 in bulk, partition 1 through the guard
        assert "a key in two partitions" in caplog.text
        deleted = {f'{{"id":{key}}}': version for key, (version, row) in final.items() if row is None}
        assert deleted and deleted.items() <= _deletes(dsn).items()
    finally:
        kafka.delete_topic(topic)
        kafka.close()
        execute(pg_admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
