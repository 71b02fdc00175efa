"""Pure logic of dead letters: whatever the poison record holds, its letter fits the topic."""

from __future__ import annotations

import orjson

from cdc.runtime import dead_letters


def _letter(key: bytes | None, value: bytes | None, reason: str = "PermanentError: no"):
    return dead_letters.dead_letter("p.dead-letter.s", sink="s", topic="p.public.t", partition=2,
                                    offset=41, reason=reason, key=key, value=value)


def _size(letter) -> int:
    return len(letter.key) + len(letter.value)


def test_worst_case_contents_still_fit_the_letter_limit():
    # Bytes that grow most when made JSON text: invalid UTF-8 (3 bytes each as U+FFFD), quotes
    # and control characters (escaped), in the key, the value and the reason.
    nasty = (b'"\\\x01\xff' * 200_000)
    letter = _letter(nasty[:40_000], nasty, reason=nasty.decode("latin-1"))
    assert _size(letter) <= dead_letters.LETTER_LIMIT
    body = orjson.loads(letter.value)
    assert body["value_stored"] == "reference" and body["value"] is None
    assert body["size"] == len(nasty) and body["offset"] == 41 and body["partition"] == 2


def test_a_value_just_under_the_limit_that_grows_when_escaped_is_referenced():
    value = b'"' * (dead_letters.LETTER_LIMIT - 100)  # each quote becomes \" in the letter
    letter = _letter(b'{"id": 1}', value)
    assert _size(letter) <= dead_letters.LETTER_LIMIT
    assert orjson.loads(letter.value)["value_stored"] == "reference"


def test_a_small_value_is_inline_and_keeps_its_key_in_the_letter():
    letter = _letter(b'{"id": 1}', b'{"after": {"id": 1}}')
    body = orjson.loads(letter.value)
    assert body["key"] == '{"id": 1}'
    assert body["value_stored"] == "inline" and orjson.loads(body["value"]) == {"after": {"id": 1}}


def test_letters_are_keyed_by_where_their_record_is_never_by_its_row_key():
    """Keyed by the row's key, two bad records of one key left one letter once compacted."""
    same_row = [dead_letters.dead_letter("d", sink="s", topic=topic, partition=0, offset=offset, reason="r",
                                         key=b'{"id": 50}', value=b"{}") for topic, offset in
                (("p.public.a", 7), ("p.public.a", 9), ("p.public.b", 7))]
    assert len({letter.key for letter in same_row}) == 3
    assert orjson.loads(same_row[1].key) == {"topic": "p.public.a", "partition": 0, "offset": 9}


def test_a_record_that_could_not_be_read_back_is_marked_missing():
    letter = dead_letters.dead_letter("d", sink="s", topic="t", partition=0, offset=7, reason="r",
                                      key=None, value=None, missing=True)
    body = orjson.loads(letter.value)
    assert body["value_stored"] == "missing" and orjson.loads(letter.key) == {"topic": "t", "partition": 0,
                                                                               "offset": 7}
