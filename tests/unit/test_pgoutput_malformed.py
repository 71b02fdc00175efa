"""The pgoutput decoder on malformed input: nothing but ``DecodeError``, and it says where.

Property tests cut, flip and splice the captured payloads of ``tests/golden/pgoutput/`` (each
decoded in the stream state it was captured in) and feed random bytes; the cases after them pin the
message of each kind of damage.
"""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.errors import DecodeError
from sources.postgres.pgoutput import PgOutputDecoder
from tests.golden.capture_pgoutput import read_frames

OFFSET = re.compile(r"at byte offset (\d+)")


def _samples() -> list[tuple[int, int | None, bytes]]:
    """(protocol version, open stream xid or None, payload): a few of each message type and state."""
    seen: dict[tuple, int] = {}
    samples = []
    for name, version in (("v1", 1), ("v2", 2), ("v2-binary", 2)):
        decoder = PgOutputDecoder(version)
        for payload in read_frames(name):
            state = decoder.stream_xid
            decoder.decode(payload)
            key = (name, payload[0], state is None)
            if seen.get(key, 0) < 2 or len(payload) > 1000:  # the TOASTed row, whatever its type
                seen[key] = seen.get(key, 0) + 1
                samples.append((version, state, payload))
    gid = b"g\0"
    samples += [  # built after proto.c: two-phase and protocol 4 are not capturable from PostgreSQL 15
        (3, None, b"b" + struct.pack("!QQqI", 1, 2, 3, 4) + gid),
        (3, None, b"P" + struct.pack("!BQQqI", 0, 1, 2, 3, 4) + gid),
        (3, None, b"K" + struct.pack("!BQQqI", 0, 1, 2, 3, 4) + gid),
        (3, None, b"r" + struct.pack("!BQQqqI", 0, 1, 2, 3, 4, 5) + gid),
        (3, None, b"p" + struct.pack("!BQQqI", 0, 1, 2, 3, 4) + gid),
        (4, None, b"A" + struct.pack("!IIQq", 1, 2, 3, 4)),
    ]
    return samples


SAMPLES = _samples()


def decoder_for(version: int, stream_xid: int | None) -> PgOutputDecoder:
    decoder = PgOutputDecoder(version)
    if stream_xid is not None:
        decoder.decode(b"S" + struct.pack("!IB", stream_xid, 1))
    return decoder


def decode_or_error(decoder: PgOutputDecoder, payload: bytes):
    """The decoded message, or None after a DecodeError whose message names an offset in the payload."""
    try:
        return decoder.decode(payload)
    except DecodeError as err:
        match = OFFSET.search(str(err))
        assert match, f"no offset in: {err}"
        assert 0 <= int(match.group(1)) <= len(payload), str(err)
        return None


def test_the_samples_cover_every_message_type_and_both_stream_states():
    letters = {chr(p[0]) for _, _, p in SAMPLES}
    assert letters == set("BCORYIUDTMSEcAbPKrp")
    assert {chr(p[0]) for _, xid, p in SAMPLES if xid is not None} == set("RYIUDTME")


sample = st.sampled_from(SAMPLES)
fuzz = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fuzz
@given(sample, st.data())
def test_every_truncation_is_a_decode_error(case, data):
    version, stream_xid, payload = case
    cut = data.draw(st.integers(0, len(payload) - 1))
    result = decode_or_error(decoder_for(version, stream_xid), payload[:cut])
    # the one valid prefix: a protocol-4 Stream Abort without its abort LSN and time
    assert result is None or (payload[:1] == b"A" and cut == 9)


@fuzz
@given(sample, st.data())
def test_flipped_bytes_decode_or_raise_decode_error(case, data):
    version, stream_xid, payload = case
    damaged = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    decode_or_error(decoder_for(version, stream_xid), bytes(damaged))


@fuzz
@given(sample, st.data())
def test_spliced_payloads_decode_or_raise_decode_error(case, data):
    version, stream_xid, payload = case
    start = data.draw(st.integers(0, len(payload)))
    end = data.draw(st.integers(start, len(payload)))
    spliced = payload[:start] + data.draw(st.binary(max_size=12)) + payload[end:]
    decode_or_error(decoder_for(version, stream_xid), spliced)


@fuzz
@given(st.integers(1, 4), st.booleans(), st.sampled_from(b"BCORYIUDTMSEcAbPKrpZ\0"), st.binary(max_size=80))
def test_random_bytes_decode_or_raise_decode_error(version, in_stream, letter, tail):
    decoder = decoder_for(max(version, 2), 7) if in_stream else decoder_for(version, None)
    decode_or_error(decoder, bytes([letter]) + tail)
    decode_or_error(decoder, tail)


# --- each kind of damage, and what the error says --------------------------------------------

def text(value: bytes) -> bytes:
    return b"t" + struct.pack("!I", len(value)) + value


INSERT_HEAD = b"I" + struct.pack("!I", 16384) + b"N"


def error_of(payload: bytes, version: int = 2, stream_xid: int | None = None) -> str:
    with pytest.raises(DecodeError) as info:
        decoder_for(version, stream_xid).decode(payload)
    return str(info.value)


@pytest.mark.parametrize("payload, version, stream_xid, message", [
    (b"", 2, None, r"payload is empty: expected a message type byte at byte offset 0"),
    (b"Z\x00\x01", 2, None, r"unknown type 0x5a at byte offset 0: expected a message type \(A, B, "),
    # tuples
    (INSERT_HEAD + b"\x00\x03" + text(b"1"), 2, None,
     r"Insert message \('I'\) at byte offset 14: expected the kind of column 2 of 3, but the payload ends"),
    (INSERT_HEAD + b"\x00\x02" + b"t" + struct.pack("!I", 10) + b"abc", 2, None,
     r"Insert .* offset 9: expected a length within the payload for column 1, found 10 with 3 bytes left"),
    (INSERT_HEAD + b"\x00\x01" + b"t\x00\x00", 2, None,
     r"Insert .* offset 9: expected the value length of column 1 of 1 \(4 bytes\), but only 2 remain"),
    (INSERT_HEAD + b"\x00\x02" + b"n" + b"x", 2, None,
     r"Insert .* offset 9: expected the kind of column 2 of 2 \(n, u, t or b\), found byte 0x78"),
    (INSERT_HEAD + b"\x00\x01" + text(b"ab\xffc"), 2, None,
     r"Insert .* offset 15: expected UTF-8 text in column 1 of 1, found byte 0xff"),
    (INSERT_HEAD + b"\x00", 2, None, r"Insert .* offset 6: expected the column count \(2 bytes\), but only 1 remain"),
    (INSERT_HEAD + b"\x00\x01n\x00", 2, None, r"Insert .* offset 9: expected the end of the message, but 1 more bytes"),
    (b"I" + struct.pack("!I", 16384) + b"K\x00\x00", 2, None, r"Insert .* offset 5: expected 'N' \(a new tuple\), found byte 0x4b"),
    (b"I\x00\x00", 2, None, r"Insert .* offset 1: expected the relation OID \(4 bytes\), but only 2 remain"),
    (b"U" + struct.pack("!I", 1) + b"K\x00\x01n" + b"X\x00\x01n", 2, None,
     r"Update .* offset 9: expected 'N' \(the new tuple\), found byte 0x58"),
    (b"U" + struct.pack("!I", 1) + b"K\x00\x01n", 2, None, r"Update .* offset 9: expected 'N' \(the new tuple\), but the payload ends"),
    (b"D" + struct.pack("!I", 1) + b"N\x00\x01n", 2, None, r"Delete .* offset 5: expected 'K' \(old key\) or 'O' \(old row\)"),
    # strings, counts and lengths
    (b"R" + struct.pack("!I", 1) + b"public\0users", 2, None,
     r"Relation .* offset 12: expected the relation name \(a NUL-terminated string\), but no NUL byte follows"),
    (b"R" + struct.pack("!I", 1) + b"public\0us\xe9rs\0d\x00\x00", 2, None,
     r"Relation .* offset 14: expected the relation name in UTF-8, found byte 0xe9"),
    (b"R" + struct.pack("!I", 1) + b"public\0users\0x\x00\x00", 2, None,
     r"Relation .* offset 18: expected a replica identity \(d, n, f or i\), found byte 0x78"),
    (b"R" + struct.pack("!I", 1) + b"public\0users\0d\x00\x02\x01id\0" + struct.pack("!Ii", 23, -1), 2, None,
     r"Relation .* offset 33: expected the flags of column 2 of 2, but the payload ends"),
    (b"T" + struct.pack("!IB", 3, 0) + struct.pack("!I", 1), 2, None,
     r"Truncate .* offset 6: expected 3 relation OIDs \(12 bytes\), but only 4 bytes remain"),
    (b"M\x01" + struct.pack("!Q", 1) + b"p\0" + struct.pack("!I", 9) + b"abc", 2, None,
     r"Message .* offset 12: expected a content length within the payload, found 9 with 3 bytes left"),
    (b"C" + bytes(25) + b"\x00", 2, None, r"Commit .* offset 26: expected the end of the message, but 1 more bytes"),
    (b"B" + bytes(10), 2, None, r"Begin .* offset 9: expected the commit timestamp \(8 bytes\), but only 2 remain"),
    # the stream rule
    (b"E", 2, None, r"Stream Stop .* offset 0: expected a Stream Start before a Stream Stop, but no stream block is open"),
    (b"S" + struct.pack("!IB", 8, 1), 2, 7,
     r"Stream Start .* offset 0: expected no Stream Start inside the stream block of xid 7, but no Stream Stop"),
    (b"c" + bytes(29), 2, 7, r"Stream Commit .* expected no Stream Commit inside the stream block of xid 7"),
    (b"A" + bytes(8), 2, 7, r"Stream Abort .* expected no Stream Abort inside the stream block of xid 7"),
    (b"B" + bytes(20), 2, 7, r"Begin .* expected no Begin inside the stream block of xid 7"),
    (b"I\x00\x00", 2, 7, r"Insert .* offset 1: expected the xid of a streamed change \(4 bytes\), but only 2 remain"),
    (b"S" + struct.pack("!IB", 8, 1), 1, None, r"Stream Start .* protocol version 1, but Stream Start needs version 2"),
    (b"S" + struct.pack("!IB", 8, 2), 2, None, r"Stream Start .* offset 5: expected a first-segment flag of 0 or 1"),
    (b"A" + bytes(12), 4, None, r"Stream Abort .* offset 9: expected the abort LSN \(8 bytes\), but only 4 remain"),
], ids=lambda value: None)
def test_error_messages(payload, version, stream_xid, message):
    assert re.search(message, error_of(payload, version, stream_xid))


def test_a_failed_message_leaves_the_stream_state_alone():
    decoder = decoder_for(2, 7)
    with pytest.raises(DecodeError):
        decoder.decode(b"S\x00")
    assert decoder.stream_xid == 7
    with pytest.raises(DecodeError):
        decoder.decode(b"E\x00")
    assert decoder.stream_xid == 7
