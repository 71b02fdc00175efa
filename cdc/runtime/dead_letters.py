"""Dead letters that are all kept, and that always fit in the dead-letter topic.

A record a sink cannot write even alone is set aside in ``<prefix>.dead-letter.<sink>`` so the
sink can go on. That topic is a queue, not a table: it is **not compacted** (``cleanup.policy=
delete``) and keeps every letter until it is older than the sink's ``dead_letter_retention_hours``
(default 30 days), and each letter is keyed by where its record came from (topic, partition,
offset), so two letters never share a key. It used to be compacted and keyed by the source row's
key, so two bad records of one key (at two offsets, or in two tables) left one letter.
``ensure_topic`` changes a compacted dead-letter topic left by an earlier version to ``delete``
(nothing is lost by that; the retention applies from then on) and logs that it did.

Setting a letter aside must never fail for the record's own size: a record of a few MB (legal in
its source topic, whose limit the operator raised) used to be copied whole into a dead-letter
topic created with the broker's ~1 MB default, the delivery failed with MSG_SIZE_TOO_LARGE
(permanent), and the sink stopped for good.

So every dead letter is a small JSON document (its value)::

    {"sink": "...", "topic": "...", "partition": 0, "offset": 42,   where the record is
     "key": "{\\"id\\": 7}" | null, "size": 3145728,                 its key as text, value bytes
     "reason": "PermanentError: ...",                                 why it failed (capped)
     "value_stored": "inline" | "reference" | "missing",
     "value": "<the record's value as text>" | null}

``inline``: the value is in the letter (when the letter stays within ``LETTER_LIMIT``, half the
topic's limit). ``reference``: it is too large to copy; it stays at topic[partition]@offset, where
``cdc tail`` or any consumer can read it while that offset is retained (a compacted topic keeps it
until a newer record of the same key supersedes it). ``missing``: the record could not be read
back (already compacted away).

The dead-letter topic is created with ``max.message.bytes`` = ``TOPIC_MAX_MESSAGE_BYTES``, and
every letter is kept well under it, whatever the broker's default; the embedded log has no size
limit, but gets the same letters, so a consumer of dead letters reads one format everywhere.

``DeadLetters`` is a sink's topic and writer: a letter returns only once it is durable (flushed),
so the runner commits past the record it replaces only after that.
"""

from __future__ import annotations

import logging
import threading

import orjson

from cdc.log.base import Log, LogWriter, TopicSettings, internal_settings
from cdc.serde import Record

log = logging.getLogger(__name__)

TOPIC_MAX_MESSAGE_BYTES = 1_048_576   # set on the dead-letter topic when it is created
LETTER_LIMIT = TOPIC_MAX_MESSAGE_BYTES // 2  # key + value of a letter, with room for the framing
REASON_LIMIT = 8 * 1024               # an error message can quote the value: capped
KEY_LIMIT = 16 * 1024                 # a key larger than this is replaced by the location


def topic_settings(retention_ms: int | None, log_: object = None) -> TopicSettings:
    """The dead-letter topic: one partition, every letter kept for ``retention_ms`` (None: for
    ever), and a size limit that every letter fits (see the module docstring); replicated as the
    log's topics are."""
    return internal_settings(log_, partitions=1, cleanup_policy="delete", retention_ms=retention_ms,
                             extra={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)})


def ensure_topic(log_: Log, topic: str, retention_ms: int | None) -> None:
    """Make the dead-letter topic, or bring an existing one to the ``delete`` policy and the
    configured retention (an earlier version made it compacted: letters overwrote each other)."""
    current = log_.cleanup_policy(topic)
    if current is None:
        log_.ensure_topic(topic, topic_settings(retention_ms, log_))
        return
    policy, retention = current
    if "compact" in policy.split(","):
        log.warning("dead-letter topic %s was compacted (cleanup.policy=%s), so letters of one key overwrote "
                    "each other; it now keeps every letter (cleanup.policy=delete, retention %s)", topic, policy,
                    "for ever" if retention_ms is None else f"{retention_ms / 3_600_000:g} h")
    elif retention == retention_ms:
        return
    log_.set_cleanup_policy(topic, "delete", retention_ms)


def _capped(text: str, limit: int) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f"... ({len(data):,} bytes, cut)"


def location_key(topic: str, partition: int, offset: int) -> bytes:
    """A letter's key: ``{"topic": ..., "partition": ..., "offset": ...}``."""
    return orjson.dumps({"topic": topic, "partition": partition, "offset": offset})


def dead_letter(dead_letter_topic: str, *, sink: str, topic: str, partition: int, offset: int,
                reason: str, key: bytes | None, value: bytes | None, missing: bool = False) -> Record:
    """The record to publish to ``dead_letter_topic`` for the record (``key``, ``value``) at
    topic[partition]@offset, which failed for ``reason``; ``missing``: it could not be read back.

    Its key and value together never exceed ``LETTER_LIMIT`` bytes: the value is copied only
    when the whole letter, JSON escaping included, stays within it."""
    # Keyed by where the record is, never by its row's key: two letters never share a key.
    letter_key = location_key(topic, partition, offset)
    letter = {
        "sink": sink, "topic": topic, "partition": partition, "offset": offset,
        "key": None if key is None else _capped(key.decode("utf-8", "replace"), KEY_LIMIT),
        "size": 0 if value is None else len(value),
        "reason": _capped(reason, REASON_LIMIT),
        "value_stored": "missing" if missing else "inline",
        "value": None,
    }
    if value is not None and len(value) < LETTER_LIMIT:
        inline = orjson.dumps({**letter, "value": value.decode("utf-8", "replace")})
        if len(letter_key) + len(inline) <= LETTER_LIMIT:
            return Record(dead_letter_topic, letter_key, inline)
    if value is not None:
        letter["value_stored"] = "reference"
    return Record(dead_letter_topic, letter_key, orjson.dumps(letter))


class DeadLetters:
    """One sink's dead-letter topic, made (or brought to ``delete``) at its first letter, and the
    writer of its letters. Letters may come from any thread (the runner's, the sink's): one at a
    time."""

    def __init__(self, log_: Log, topic: str, sink: str, retention_hours: float | None) -> None:
        self.log = log_
        self.topic = topic
        self.sink = sink
        self.retention_ms = None if retention_hours is None else int(retention_hours * 3_600_000)
        self._writer: LogWriter | None = None
        self._lock = threading.Lock()

    def send(self, topic: str, partition: int, offset: int, reason: str, key: bytes | None,
             value: bytes | None, *, missing: bool = False) -> None:
        """The letter for the record at topic[partition]@offset, durably (see ``dead_letter``)."""
        with self._lock:
            if self._writer is None:
                ensure_topic(self.log, self.topic, self.retention_ms)
                self._writer = self.log.writer()
            try:
                self._writer.publish([dead_letter(self.topic, sink=self.sink, topic=topic, partition=partition,
                                                  offset=offset, reason=reason, key=key, value=value,
                                                  missing=missing)])
                self._writer.flush(30)
            except BaseException:
                # A writer keeps its first delivery error for good; a sink that retries the letter
                # (the broker was away a moment) needs a fresh one, or it fails forever.
                writer, self._writer = self._writer, None
                try:
                    if writer is not None:  # always: made above
                        writer.close()
                except Exception:  # noqa: BLE001 - the delivery error is the one worth raising
                    log.debug("closing the failed dead-letter writer", exc_info=True)
                raise

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
