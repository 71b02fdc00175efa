"""The bulk loads' Kafka reader (cdc/_rdconsume.c over the system's librdkafka, cdc.log.kafka_bulk)
in the same process as confluent-kafka's own librdkafka: it opens with the log's consumer settings,
reads what confluent-kafka wrote exactly as confluent-kafka's reader reads it (headers included),
sees each partition's end, and turns a broker's refusal into the same typed error."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Producer

from cdc.errors import PermanentError
from cdc.log import kafka_bulk
from cdc.log.base import TopicSettings
from tests.integration.pg_capture import kafka_log  # noqa: F401 - the fixture ``log``

pytestmark = pytest.mark.kafka


def _read_all(reader, ends: dict) -> list:
    records, deadline = [], time.monotonic() + 60
    while not all(reader.ends.get(tp, 0) >= end for tp, end in ends.items()):
        assert time.monotonic() < deadline, f"read {len(records)} records; ends seen {reader.ends}, wanted {ends}"
        records += reader.poll(1000, 0.5).records()
    return records


def test_it_reads_what_confluent_kafka_wrote_as_confluent_kafkas_reader_does(log, kafka_topic):
    """Both librdkafka copies in one process: confluent-kafka's writes, the system's reads."""
    assert kafka_bulk.available(), "cdc._rdconsume was not built (scripts/setup installs librdkafka-dev)"
    log.ensure_topic(kafka_topic, TopicSettings(partitions=3))
    producer = Producer({"bootstrap.servers": log.bootstrap_servers, "compression.type": "lz4"})
    failed = []
    for i in range(3000):  # tombstones among them (a compacted topic takes no record without a key)
        value = None if i % 13 == 0 else b'{"n":%d,"pad":"%s"}' % (i, b"x" * (i % 50))
        # headers or none; a null value, a repeated name, bytes that are no text among them
        headers = None if i % 5 == 0 else [("cdc.version", b"%d" % i), ("cdc.source", b"pg")] + (
            [("x", None), ("cdc.version", b"\xff\x00"), ("\u00e9", b"")] if i % 7 == 0 else [])
        producer.produce(kafka_topic, value, b'{"id":%d}' % (i % 700), partition=i % 3, headers=headers,
                         on_delivery=lambda err, msg: err is None or failed.append(err))
    assert producer.flush(30) == 0 and failed == []
    ends = log.end_offsets(kafka_topic)

    reader = log.bulk_reader()
    assert reader is not None, "the bulk reader refused the log's consumer settings (see the warning)"
    try:
        reader.assign({tp: 0 for tp in ends})
        packed = _read_all(reader, ends)
        assert reader.ends == ends
    finally:
        reader.close()
    expected = log.read_all(kafka_topic)  # confluent-kafka's reader, LogRecords
    assert len(expected) == 3000
    assert sorted(packed, key=lambda r: (r.partition, r.offset)) == expected
    assert sum(r.headers is not None for r in expected) == 2400 and expected[0].headers is None


def test_a_topic_the_broker_does_not_have_is_a_typed_error_naming_it(log, kafka_topic):
    reader = log.bulk_reader()
    assert reader is not None
    try:
        reader.assign({(kafka_topic, 0): 0})  # never created (no auto-creation)
        deadline = time.monotonic() + 60
        with pytest.raises(PermanentError) as caught:
            while time.monotonic() < deadline:
                assert reader.poll(100, 0.5).count == 0
        assert kafka_topic in str(caught.value) and "UNKNOWN_TOPIC" in str(caught.value)
    finally:
        reader.close()


def test_a_setting_the_linked_librdkafka_does_not_know_falls_back_to_confluent_kafka(caplog):
    with caplog.at_level(logging.WARNING, logger="cdc.log.kafka_bulk"):
        assert kafka_bulk.open_bulk_reader({"bootstrap.servers": "127.0.0.1:9", "no.such.setting": 1}, "g") is None
    assert "no.such.setting" in caplog.text
