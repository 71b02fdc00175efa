"""Damaged copies of captured bytes, for the property tests of decoders' fast paths."""

from __future__ import annotations

from hypothesis import strategies as st


def damage(data: st.DataObject, payload: bytes, keep: int = 0) -> bytes:
    """``payload`` cut short, with a byte flipped, or with bytes spliced in; its first ``keep``
    bytes (a header that picks the decoder) are left alone."""
    kind = data.draw(st.sampled_from(["cut", "flip", "splice"]))
    if kind == "cut":
        return payload[:data.draw(st.integers(keep, len(payload) - 1))]
    if kind == "flip":
        at = data.draw(st.integers(min(keep, len(payload) - 1), len(payload) - 1))
        return payload[:at] + bytes([payload[at] ^ data.draw(st.integers(1, 255))]) + payload[at + 1:]
    at = data.draw(st.integers(keep, len(payload)))
    return payload[:at] + data.draw(st.binary(min_size=1, max_size=8)) + payload[at:]
