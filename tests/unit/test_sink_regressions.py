"""The regression check of the incremental-snapshot verification (bench/sink_regressions.py) sees
a row going back, and only then: sequences of readings built by hand."""

from __future__ import annotations

from bench.sink_regressions import RegressionCheck, Shown


def check(*readings, reinserts=None) -> list[str]:
    state = RegressionCheck()
    for row in readings:
        state.observe(7, row, reinserts or {})
    return state.regressions


def test_rows_moving_forward_and_absent_before_they_arrive_are_no_regression():
    assert check(None, None, Shown(10, 0), Shown(10, 0), Shown(20, 3), Shown(35, 9)) == []


def test_a_lower_version_is_a_regression():
    assert len(check(Shown(20, 3), Shown(10, 3))) == 1


def test_a_lower_value_under_the_same_or_a_higher_version_is_a_regression():
    """A chunk row (an older value) written over a streamed change with a version that is not lower."""
    assert len(check(Shown(20, 3), Shown(20, 0))) == 1
    assert len(check(Shown(20, 3), Shown(25, 0))) == 1


def test_a_deleted_row_coming_back_with_nothing_inserting_it_again_is_a_regression():
    assert len(check(Shown(20, 3), None, Shown(10, 0))) == 1
    assert len(check(Shown(20, 3), None, Shown(30, 5))) == 1  # even with newer-looking numbers


def test_a_row_inserted_again_after_its_delete_may_come_back():
    assert check(Shown(20, 3), None, Shown(40, 8), reinserts={7: [8]}) == []
    assert check(Shown(20, 3), None, Shown(50, 9), reinserts={7: [8]}) == []  # updated since


def test_a_row_coming_back_older_than_the_insert_after_its_delete_is_a_regression():
    """Re-inserted with 8, but the row shown is one from before the delete (value 5)."""
    assert len(check(Shown(20, 3), None, Shown(30, 5), reinserts={7: [8]})) == 1
    # an insert from before the delete the sink showed does not excuse it either
    assert len(check(Shown(20, 3), None, Shown(30, 5), reinserts={7: [2]})) == 1


def test_a_row_inserted_again_but_shown_under_an_older_version_is_a_regression():
    assert len(check(Shown(20, 3), None, Shown(15, 8), reinserts={7: [8]})) == 1


def test_observe_all_takes_missing_keys_as_absent():
    state = RegressionCheck()
    state.observe_all([1, 2], {1: Shown(5, 1), 2: Shown(5, 1)}, {})
    state.observe_all([1, 2], {1: Shown(6, 2)}, {})
    state.observe_all([1, 2], {1: Shown(6, 2), 2: Shown(5, 1)}, {})
    assert state.readings == 6
    assert len(state.regressions) == 1 and "key 2 came back" in state.regressions[0]
