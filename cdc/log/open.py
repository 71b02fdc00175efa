"""Open the log a config file's ``log:`` section describes."""

from __future__ import annotations

from cdc.log.base import Log


def open_log(section) -> Log:
    """``section``: a ``cdc.config.model.LogConfig``. Kafka when configured, else the embedded log.
    Its schema registry, if any, is where this process reads ``avro`` records' schemas."""
    registry = getattr(section, "schema_registry", None)
    if registry is not None:
        from cdc.formats import avro

        avro.use_registry(registry.url)
    settings = section.topic_settings()
    if section.kafka is not None:
        from cdc.log.kafka import KafkaLog

        kafka = section.kafka
        return KafkaLog(kafka.bootstrap_servers, settings, producer_config=dict(kafka.producer),
                        consumer_config=dict(kafka.consumer), timeout=kafka.request_timeout)
    from cdc.log.embedded import EmbeddedLog

    embedded = section.backend
    return EmbeddedLog(embedded.path, settings, fsync=embedded.fsync)
