"""Record headers (cdc/headers.py): the version header's reading rule, and the packed form the
embedded log stores and the bulk reader hands out (cdc/log/packed_headers.py), in C
(cdc/_records.c) and in Python alike."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc import headers, native
from cdc.log import packed_headers

needs_c = pytest.mark.skipif(packed_headers._records is None, reason="cdc._records not built (test_encode.py)")

pairs = st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=6))), min_size=1, max_size=4)


def both(function, *args):
    """``function(*args)`` with the C functions and with the Python ones: (outcome, outcome), an
    outcome being the result or the type of the error raised."""
    out = []
    for use_c in (True, False):
        with native.choose(use_c):
            try:
                out.append(function(*args))
            except ValueError:  # UnicodeDecodeError included
                out.append(ValueError)
            except TypeError:
                out.append(TypeError)
    return tuple(out)


@needs_c
@settings(max_examples=300, deadline=None)
@given(pairs)
def test_packed_headers_round_trip_in_both(made):
    c_packed, py_packed = both(packed_headers.pack, made)
    assert c_packed == py_packed
    assert both(packed_headers.unpack, c_packed) == (made, made)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=24))
def test_bytes_that_are_not_packed_headers_are_refused_by_both(data):
    c_read, py_read = both(packed_headers.unpack, data)
    assert c_read == py_read
    if c_read is not ValueError:
        assert packed_headers.pack(c_read) == (data or None)


def test_a_name_that_is_not_utf8_is_refused_by_both():
    data = b"\x02\x00\x00\x00\xff\xfe\x00\x00\x00\x00"
    assert both(packed_headers.unpack, data) == (ValueError, ValueError)


def test_no_headers_is_none():
    assert both(packed_headers.pack, None) == both(packed_headers.pack, []) == (None, None)
    assert both(packed_headers.unpack, None) == (None, None)


@pytest.mark.parametrize("value, version", [
    (b"0", 0), (b"-0", 0), (b"007", 7), (b"23456789", 23456789), (b"9223372036854775807", 2 ** 63 - 1),
    (b"-9223372036854775808", -2 ** 63)])
def test_the_version_header_is_a_decimal_int64(value, version):
    assert headers.version_of([(headers.SOURCE, b"pg"), (headers.VERSION, value)]) == version


@pytest.mark.parametrize("value", [b"", b"-", b"+1", b" 1", b"1 ", b"1.0", b"1e3", b"0x1", b"9223372036854775808",
                                   b"-9223372036854775809", b"99999999999999999999", "12", None])
def test_a_version_header_that_is_not_one_is_an_error(value):
    with pytest.raises(ValueError, match="cdc.version"):
        headers.version_of([(headers.VERSION, value)])


def test_the_last_version_header_counts_and_none_is_none():
    assert headers.version_of([(headers.VERSION, b"1"), (headers.VERSION, b"2")]) == 2
    assert headers.version_of([(headers.SOURCE, b"pg")]) is None
    assert headers.version_of(None) is None and headers.version_of([]) is None
    assert headers.record_headers(-5, headers.source_header("pg")) == [(headers.VERSION, b"-5"), (headers.SOURCE, b"pg")]
