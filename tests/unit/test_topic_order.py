"""tests/topic_order.py's counting, on records made by hand (it is the cluster test's judge)."""

from __future__ import annotations

from types import SimpleNamespace

import orjson

from tests.topic_order import topic_order


def _record(offset: int, key: int, version: int, op: str = "u") -> SimpleNamespace:
    value = orjson.dumps({"op": op, "source": {"version": version}})
    return SimpleNamespace(partition=0, offset=offset, key=orjson.dumps({"id": key}), value=value)


def _order(*records):
    return topic_order(SimpleNamespace(read_all=lambda topic: list(records)), "t")


def test_a_change_below_a_newer_change_is_out_of_order():
    found = _order(_record(0, 1, 10), _record(1, 1, 20), _record(2, 1, 15))
    assert [(k, v, n) for k, _, _, v, n in found.out_of_order] == [('{"id":1}', 15, 20)]
    assert found.replayed == 0


def test_changes_below_a_snapshot_row_after_it_are_the_handovers_replay():
    found = _order(_record(0, 1, 50, op="r"), _record(1, 1, 15), _record(2, 1, 30), _record(3, 1, 60))
    assert found.out_of_order == [] and found.replayed == 2


def test_a_snapshot_row_below_a_change_is_out_of_order():
    found = _order(_record(0, 1, 50), _record(1, 1, 40, op="r"))
    assert len(found.out_of_order) == 1 and found.replayed == 0


def test_equal_versions_are_duplicates():
    found = _order(_record(0, 1, 10), _record(1, 1, 10))
    assert found.duplicates == 1 and found.out_of_order == []
