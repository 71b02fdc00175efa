"""The block producer's settings (cdc/log/block_producer.py): confluent-kafka's config as
librdkafka's strings, without the settings only confluent-kafka's Python layer serves."""

from __future__ import annotations

import pytest

from cdc.log import block_producer
from cdc.log.block_producer import c_settings, open_block_producer
from cdc.log.kafka import PRODUCER_DEFAULTS
from cdc.log.kafka_logs import LOGGER, on_error


def test_the_logs_settings_pass_as_librdkafkas_strings_and_python_only_ones_stay_behind():
    config = {"bootstrap.servers": "127.0.0.1:9092", **PRODUCER_DEFAULTS, "security.protocol": "SASL_SSL",
              "sasl.mechanism": "PLAIN", "logger": LOGGER, "error_cb": on_error, "delivery.report.only.error": True,
              "on_delivery": print}
    settings = c_settings(config)
    assert settings["enable.idempotence"] == "true" and settings["allow.auto.create.topics"] == "false"
    assert settings["partitioner"] == "murmur2_random" and settings["linger.ms"] == "10"
    assert settings["security.protocol"] == "SASL_SSL" and settings["sasl.mechanism"] == "PLAIN"
    assert not {"logger", "error_cb", "on_delivery", "delivery.report.only.error"} & set(settings)


def test_a_setting_only_python_can_serve_keeps_every_record_on_confluent_kafka():
    config = {"bootstrap.servers": "127.0.0.1:9092", "oauth_cb": lambda conf: ("token", 0.0)}
    assert c_settings(config) is None
    assert open_block_producer(config) is None


@pytest.mark.skipif(block_producer._rdproduce is None, reason="cdc/_rdproduce.c was not built")
def test_a_setting_the_systems_librdkafka_refuses_keeps_every_record_on_confluent_kafka():
    assert open_block_producer({"bootstrap.servers": "127.0.0.1:9092", "no.such.setting": "1"}) is None


@pytest.mark.skipif(block_producer._rdproduce is None, reason="cdc/_rdproduce.c was not built")
def test_a_record_librdkafka_refuses_at_once_is_a_typed_error_and_nothing_after_it_goes():
    from cdc.errors import DeliveryError

    producer = open_block_producer({"bootstrap.servers": "127.0.0.1:1", "message.max.bytes": 1000})
    try:
        block = b"1\t{}\n2\t" + b'"' + b"x" * 2000 + b'"\n3\t{}\n'
        with pytest.raises(DeliveryError) as caught:
            producer.produce_rows("some.topic", block, b"", b"", b"", b"")
        assert caught.value.retriable is False and "MSG_SIZE_TOO_LARGE" in str(caught.value)
        assert "some.topic" in str(caught.value)
        assert producer.outstanding == 1  # the record before it, queued; the one after it never made
        with pytest.raises(TypeError):  # a line without its key's tab: nothing of the block is produced
            producer.produce_rows("some.topic", b"1\t{}\n2{}\n", b"", b"", b"", b"")
        assert producer.outstanding == 1
    finally:
        assert producer.close(0) == 1  # dropped, as a writer's close drops what is left
