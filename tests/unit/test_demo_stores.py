"""The demo's comparison: equal values in different stores' forms compare equal, and a missing,
extra or changed row is named."""

from __future__ import annotations

from decimal import Decimal

from cdc.demo.stores import canonical, differences


def test_one_value_in_every_store_form_is_one_canonical_text():
    assert canonical(Decimal("12.30")) == canonical("12.30") == canonical(12.3) == canonical(b"12.30") == "12.3"
    assert canonical(1) == canonical("1") == canonical(b"1") == "1"
    assert canonical(Decimal("100")) == canonical(100.0) == "100"  # no exponent form ("1E+2")
    assert canonical(None) is None and canonical("gold") == "gold" and canonical("NaN") == "NaN"
    assert canonical("1") != canonical("1.5")


def test_differences_name_what_is_missing_extra_or_changed():
    source = {"t": {"1": {"id": "1", "v": "a"}, "2": {"id": "2", "v": "b"}}, "u": {}}
    assert differences(source, {"t": {"1": {"id": "1", "v": "a"}, "2": {"id": "2", "v": "b"}}, "u": {}}) == {}
    found = differences(source, {"t": {"1": {"id": "1", "v": "x"}, "3": {"id": "3", "v": "c"}}})
    assert set(found) == {"t"}
    assert "missing 1 (e.g. 2)" in found["t"] and "extra 1 (e.g. 3)" in found["t"]
    assert "different 1 (e.g. 1)" in found["t"] and "'v': 'a'" in found["t"]
    # A NULL the store lacks (a Redis hash has no field for it) equals NULL.
    assert differences({"t": {"1": {"id": "1", "v": None}}}, {"t": {"1": {"id": "1", "v": None}}}) == {}
