"""Dead letters that always fit in the dead-letter topic.

A record a sink cannot write even alone is set aside in ``<prefix>.dead-letter.<sink>`` so the
sink can go on. Setting it aside must never fail for the record's own size: a record of a few MB
(legal in its source topic, whose limit the operator raised) used to be copied whole into a
dead-letter topic created with the broker's ~1 MB default, the delivery failed with
MSG_SIZE_TOO_LARGE (permanent), and the sink stopped for good.

So every dead letter is a small JSON document (its value)::

    {"sink": "...", "topic": "...", "partition": 0, "offset": 42,   where the record is
     "key": "{\\"id\\": 7}" | null, "size": 3145728,                 its key as text, value bytes
     "reason": "PermanentError: ...",                                 why it failed (capped)
     "value_stored": "inline" | "reference" | "missing",
     "value": "<the record's value as text>" | null}

``inline``: the value is in the letter (when the letter stays within ``LETTER_LIMIT``, half the
topic's limit). ``reference``: it is too large to copy; it stays at topic[partition]@offset, where ``cdc tail`` or any consumer can
read it while that offset is retained (a compacted topic keeps it until a newer record of the
same key supersedes it). ``missing``: the record could not be read back (already compacted away).

The dead-letter topic is created with ``max.message.bytes`` = ``TOPIC_MAX_MESSAGE_BYTES``, and
every letter is kept well under it, whatever the broker's default; the embedded log has no size
limit, but gets the same letters, so a consumer of dead letters reads one format everywhere.
"""

from __future__ import annotations

import orjson

from cdc.log.base import TopicSettings
from cdc.serde import Record

TOPIC_MAX_MESSAGE_BYTES = 1_048_576   # set on the dead-letter topic when it is created
LETTER_LIMIT = TOPIC_MAX_MESSAGE_BYTES // 2  # key + value of a letter, with room for the framing
REASON_LIMIT = 8 * 1024               # an error message can quote the value: capped
KEY_LIMIT = 16 * 1024                 # a key larger than this is replaced by the location


def topic_settings() -> TopicSettings:
    """The dead-letter topic: one partition, compacted like every topic, and a size limit that
    every letter fits (see the module docstring)."""
    return TopicSettings(partitions=1, extra={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)})


def _capped(text: str, limit: int) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f"... ({len(data):,} bytes, cut)"


def dead_letter(dead_letter_topic: str, *, sink: str, topic: str, partition: int, offset: int,
                reason: str, key: bytes | None, value: bytes | None, missing: bool = False) -> Record:
    """The record to publish to ``dead_letter_topic`` for the record (``key``, ``value``) at
    topic[partition]@offset, which failed for ``reason``; ``missing``: it could not be read back.

    Its key and value together never exceed ``LETTER_LIMIT`` bytes: the value is copied only
    when the whole letter, JSON escaping included, stays within it."""
    location = orjson.dumps({"topic": topic, "partition": partition, "offset": offset})
    letter_key = key if key and len(key) <= KEY_LIMIT else location
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
