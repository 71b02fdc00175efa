"""Snapshot rows to Kafka a block per call, over our own librdkafka binding (cdc/_rdproduce.c).

Through confluent-kafka a snapshot row cost the publishing process about 0.9 us of CPU before
librdkafka's own threads did anything: ``Producer.produce`` per record (argument parsing, a
per-message state) and a GIL-taking delivery trampoline per acknowledged record. A ``RowBlock``
(cdc/events.py) has its keys and values in its lines already, so ``produce_rows`` makes every
record of a block in C and hands it to ``rd_kafka_producev`` with the block's headers (its rows
share a version), the whole block with the GIL released, and delivery reports are counted in C. ``KafkaWriter`` sends RowBlocks through it (cdc/log/kafka_writer.py).

The records are the ones confluent-kafka would produce: the same bytes (the encoder's
``row_block_parts``, also what cdc/_encode.c ``emit_rows`` makes), the same topic, and the same
partition per key, because the producer gets the log's producer settings (``partitioner=
murmur2_random``, idempotence, acks, compression, the bootstrap and security settings) as given.
Settings only confluent-kafka's Python layer understands are left out (``logger``, ``error_cb``:
served here by our own callables; ``on_delivery``, ``delivery.report.only.error``); any other
setting whose value is a Python callable (``oauth_cb``, ``stats_cb`` ...) cannot be handed to C, so
``open_block_producer`` then returns None and the writer keeps confluent-kafka for every record.

This process then holds two librdkafka copies (confluent-kafka's bundled one, and the system's
linked here): each extension resolves its own, tests/integration/test_block_producer.py uses both.
"""

from __future__ import annotations

import logging
from typing import Any

from cdc import native
from cdc.errors import DeliveryError
from cdc.headers import Headers
from cdc.log.kafka_errors import TRANSIENT
from cdc.log.kafka_logs import LOGGER as LIBRDKAFKA_LOGGER
from cdc.log.kafka_logs import on_error

_rdproduce = native.load("cdc._rdproduce")  # built where librdkafka's headers are (apt's librdkafka-dev)

log = logging.getLogger(__name__)

# librdkafka reports failed records only (``delivery.report.only.error``): successes are freed on
# its own threads rather than served on the publishing one. bench/snapshot_produce.py compares.
ONLY_FAILURES = False
PYTHON_ONLY = frozenset({"logger", "error_cb", "on_delivery", "delivery.report.only.error"})
# syslog levels (librdkafka's) -> logging levels
LEVELS = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR, 4: logging.WARNING,
          5: logging.INFO, 6: logging.INFO, 7: logging.DEBUG}


def available() -> bool:
    """Whether block producers can be opened now (built, and ``cdc.native`` on); otherwise
    confluent-kafka produces every record (tests/integration/test_block_producer.py compares)."""
    return _rdproduce is not None and native.enabled()


def c_settings(config: dict[str, Any]) -> dict[str, str] | None:
    """``config`` (confluent-kafka's form) as librdkafka's strings; None when a setting is a Python
    callable that only confluent-kafka can serve."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if key in PYTHON_ONLY:
            continue
        if callable(value):
            return None
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _log_line(level: int, facility: str, message: str) -> None:
    LIBRDKAFKA_LOGGER.log(LEVELS.get(level, logging.DEBUG), "%s [block producer] %s", facility, message)


def _error_event(code: int, reason: str) -> None:
    from confluent_kafka import KafkaError  # the codes are librdkafka's, the same in both copies

    on_error(KafkaError(code, reason))


class BlockProducer:
    """One librdkafka producer for RowBlocks. Single-threaded, like ``KafkaWriter``."""

    def __init__(self, settings: dict[str, str]) -> None:
        self._producer = _rdproduce.Producer(settings, _log_line, _error_event)

    def produce_rows(self, topic: str, block: bytes, value_head: bytes, value_tail: bytes, key_head: bytes,
                     key_tail: bytes, headers: Headers | None = None) -> int:
        """Produce one record per line of ``block`` (see cdc/_rdproduce.c), each with ``headers``;
        the bytes of values made. A record librdkafka refuses outright raises ``DeliveryError``."""
        try:
            return self._producer.produce_rows(topic, block, value_head, value_tail, key_head, key_tail, headers)
        except _rdproduce.ProduceError as exc:
            code, name, text = exc.args
            raise DeliveryError(f"delivery to {topic} failed: {name}: {text}", retriable=_transient(code)) from None

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every record produced; how many are still out."""
        return self._producer.flush(timeout)

    @property
    def outstanding(self) -> int:
        return self._producer.outstanding

    @property
    def acked(self) -> int:
        return self._producer.acked

    def error(self) -> DeliveryError | None:
        """The first record not acknowledged, as the error the writer reports; None if none."""
        first = self._producer.first_error()
        if first is None:
            return None
        code, name, text, topic, partition = first
        where = topic if partition < 0 else f"{topic}[{partition}]"
        return DeliveryError(f"delivery to {where} failed: {name}: {text} ({self._producer.failed} snapshot "
                             "records not acknowledged)", retriable=_transient(code))

    def close(self, timeout: float) -> int:
        return self._producer.close(timeout)


def _transient(code: int) -> bool:
    return code in TRANSIENT


def open_block_producer(config: dict[str, Any]) -> BlockProducer | None:
    """A block producer with the writer's producer ``config``; None where there is none to have
    (not built, turned off, or a setting only confluent-kafka can serve)."""
    if not available():
        return None
    settings = c_settings(config)
    if settings is None:
        log.info("snapshot rows go through confluent-kafka: a producer setting is a Python callable")
        return None
    if ONLY_FAILURES:
        settings["delivery.report.only.error"] = "true"
    try:
        return BlockProducer(settings)
    except ValueError as exc:  # a setting the system's (older) librdkafka does not know
        log.warning("snapshot rows go through confluent-kafka: the block producer (librdkafka %s) refused the "
                    "producer settings: %s", _rdproduce.version(), exc)
        return None
