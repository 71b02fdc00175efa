"""A Kafka reader for bulk loads: batches of records as one bytes object, no object per record.

A bulk rebuild (``cdc.runtime.window_fill``) reads whole topics from offset 0 into a window
that keeps the newest version per key (cdc.bulk_window). Through confluent-kafka each record
becomes a ``Message`` and then a ``LogRecord``, about 2.3 us a record on the one thread that holds
the GIL, most of a bulk load's reading. ``cdc/_rdconsume.c`` instead drains librdkafka's queue with
the GIL released and packs a batch into one bytes object (``PackedBatch``) that the window parses
in place (``NewestWindow.add_packed``).

It is a plain consumer with an assignment (no group: it commits nothing; the rebuild commits
through its confluent reader after the switch, as before). The sink runner fetches through it too
(``cdc.runtime.sink_reading``: a sink's live reads and rebuilds, ``decode_packed``), the group's
reader committing after each write. Its settings are the log's consumer
settings (``KafkaLog.consumer_config``: bootstrap, security, the user's ``consumer_config``);
over the bulk read's own prefetch bounds (``BULK_PREFETCH``; the user's ``consumer_config`` still
wins). librdkafka stops fetching a partition once its local queue holds ``queued.min.messages``
(100,000 by default) or ``queued.max.messages.kbytes`` (64 MB), and then waits up to a second
before it looks again, whatever the reader does meanwhile: a bulk read that drains the queue in
microseconds spent most of its time in that wait (3.19M records: 27 s of wall time for 6 s of
CPU, bench/bootstrap.py). With a million messages and 256 MB it keeps fetching, and the same read
took 7 s. The 256 MB bound the prefetched records (on top of the window, ``bulk_window_mb``). Larger
fetches (``max.partition.fetch.bytes`` 8 MB, ``fetch.max.bytes`` 64 MB) changed nothing. Python callables (the logger and error callback) are left out and
librdkafka's log lines and client errors go through the same logger and repeat filter instead.
It links the system's librdkafka (apt's librdkafka-dev), an older or newer one than confluent-
kafka's own: a setting that library does not know makes ``open_bulk_reader`` return None, and the
rebuild reads through confluent-kafka as before.

Errors are confluent-kafka's codes and are classified as ``KafkaReader.poll`` classifies them: a
partition's end is remembered (``ends``), transient ones are logged, any other is raised as a
typed error once the records before it are handed out.

Threading: one thread at a time.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from cdc import native
from cdc.errors import CdcError
from cdc.log.base import LogRecord, TopicPartition
from cdc.log.kafka_errors import TRANSIENT, wrap
from cdc.log.kafka_logs import LOGGER as LIBRDKAFKA_LOGGER
from cdc.log.kafka_logs import on_error
from cdc.log.packed_headers import pack as pack_headers
from cdc.log.packed_headers import unpack as unpack_headers

log = logging.getLogger(__name__)

_rdconsume = native.load("cdc._rdconsume")  # built where a compiler and librdkafka's headers are found


def available() -> bool:
    """Whether bulk readers can be opened now (built, and ``cdc.native`` on)."""
    return _rdconsume is not None and native.enabled()

# What a bulk read may prefetch (see the module docstring): enough that librdkafka never pauses
# fetching while the window takes records faster than the broker sends them.
BULK_PREFETCH = {"queued.min.messages": 1_000_000, "queued.max.messages.kbytes": 256 * 1024}
# confluent-kafka's own settings (Python objects, not librdkafka properties): left out here.
_PYTHON_ONLY = frozenset({"logger", "error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_commit",
                          "key.deserializer", "value.deserializer"})
# Consumer settings this reader does without: fetch.queue.backoff.ms (the log's consumers' default,
# unknown to the system's librdkafka 2.0) matters only when the queue bound is reached, which
# BULK_PREFETCH avoids.
_NOT_FOR_BULK = frozenset({"fetch.queue.backoff.ms"})
_HEADER = struct.Struct("=iiqqiii")  # topic index, partition, offset, timestamp, key/value/headers lengths
_SYSLOG = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR, 4: logging.WARNING,
           5: logging.INFO, 6: logging.INFO, 7: logging.DEBUG}


@dataclass(frozen=True, slots=True)  # not a NamedTuple: its field count would hide tuple.count
class PackedBatch:
    """``count`` records packed in ``data`` (see cdc/_rdconsume.c), topic indexes into ``topics``."""

    data: bytes
    count: int
    topics: list[str]

    def records(self) -> list[LogRecord]:
        """The records as LogRecords (for those the window's C loop does not take)."""
        out, at, data, unpack, size = [], 0, self.data, _HEADER.unpack_from, _HEADER.size
        for _ in range(self.count):
            topic, partition, offset, timestamp, key_len, value_len, headers_len = unpack(data, at)
            at += size
            key = None if key_len < 0 else data[at:at + key_len]
            at += max(key_len, 0)
            value = None if value_len < 0 else data[at:at + value_len]
            at += max(value_len, 0)
            headers = None if headers_len < 0 else unpack_headers(data[at:at + headers_len])
            at += max(headers_len, 0)
            out.append(LogRecord(self.topics[topic], partition, offset, key, value, timestamp, headers))
        return out

    @classmethod
    def of(cls, records: list[LogRecord]) -> PackedBatch:
        """``records`` packed as cdc/_rdconsume.c packs what it reads (for tests and benchmarks)."""
        topics = sorted({r.topic for r in records})
        parts = []
        for r in records:
            headers = pack_headers(r.headers)
            parts.append(_HEADER.pack(topics.index(r.topic), r.partition, r.offset, r.timestamp_ms,
                                      -1 if r.key is None else len(r.key), -1 if r.value is None else len(r.value),
                                      -1 if headers is None else len(headers)))
            parts += [r.key or b"", r.value or b"", headers or b""]
        return cls(b"".join(parts), len(records), topics)


def _setting(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def open_bulk_reader(consumer_config: dict[str, Any], group: str) -> KafkaBulkReader | None:
    """A bulk reader with these consumer settings, or None (not built, or the linked librdkafka
    refuses a setting: said in the log; or ``cdc.native`` is off)."""
    if not available():
        return None
    config = {name: _setting(value) for name, value in {**BULK_PREFETCH, **consumer_config, "group.id": group}.items()
              if name not in _PYTHON_ONLY and name not in _NOT_FOR_BULK and not callable(value)}
    try:
        return KafkaBulkReader(_rdconsume.Reader(config))
    except ValueError as err:
        log.warning("the bulk reader (librdkafka %s) refused the consumer settings (%s); reading through "
                    "confluent-kafka", _rdconsume.version(), err)
        return None


def _kafka_exception(code: int, reason: str, fatal: bool = False) -> KafkaException:
    return KafkaException(KafkaError(code, reason, fatal=fatal))


class KafkaBulkReader:
    """See the module docstring. ``assign`` the start offsets, then ``poll`` batches; ``ends``
    holds where each partition's end was seen."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.ends: dict[TopicPartition, int] = {}
        self._error: CdcError | None = None  # held back until the records before it are out

    def assign(self, start: dict[TopicPartition, int]) -> None:
        try:
            self._reader.assign([(t, p, offset) for (t, p), offset in start.items()])
        except _rdconsume.Failure as exc:
            raise wrap("assigning partitions", _kafka_exception(*exc.args[0])) from exc

    def poll(self, max_records: int, timeout: float) -> PackedBatch:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        data, count, topics, events, logs = self._reader.read(max_records, int(timeout * 1000))
        refused = self._log(logs)
        if refused is not None:  # an error of the client, not of a record: nothing of this batch is lost
            self._error = wrap("reading the log", refused)
        for index, code, reason, topic, partition, offset, fatal in events:
            if code == KafkaError._PARTITION_EOF:
                self.ends[(topic, partition)] = max(offset, self.ends.get((topic, partition), 0))
            elif code in TRANSIENT and not fatal:
                log.debug("kafka bulk reader: %s (librdkafka retries)", reason)
            else:
                error = wrap(f"reading {topic}[{partition}]", _kafka_exception(code, reason, bool(fatal)))
                if not index:
                    raise error
                self._error = error
                count = index  # what came after the error is read again by whoever starts over
                break
        return PackedBatch(data, count, list(topics))

    @staticmethod
    def _log(logs: list) -> KafkaException | None:
        """librdkafka's log lines and client errors through the log's logger; the first client
        error that retrying does not clear (a topic the broker does not have, authentication, a
        fatal error), to be raised. The librdkafka this links reports some of those (an unknown
        topic) only here, where confluent-kafka's reports them as a record's error."""
        refused = None
        for level, facility, text in logs:
            if level < 0:  # an error callback: (-1, or -2 for a fatal one; the error's name; text)
                code = getattr(KafkaError, facility, KafkaError.UNKNOWN)
                err = KafkaError(code if isinstance(code, int) else KafkaError.UNKNOWN, text, fatal=level == -2)
                on_error(err)
                if refused is None and (err.fatal() or err.code() not in TRANSIENT):
                    refused = KafkaException(err)
            else:
                LIBRDKAFKA_LOGGER.log(_SYSLOG.get(level, logging.DEBUG), "%s: %s", facility, text)
        return refused

    def close(self) -> None:
        began = time.monotonic()
        self._reader.close()
        log.debug("bulk reader closed in %.2fs", time.monotonic() - began)
