"""The snapshot decision (snapshot/policy.py): the table in its docstring, row by row."""

from __future__ import annotations

import pytest

from cdc.api import SnapshotMode
from cdc.errors import PositionLostError
from cdc.positions import MySqlPosition, PgLsn, SnapshotProgress
from snapshot.policy import Step, policy_for

M = SnapshotMode
AT = PgLsn(0x1000)
UNFINISHED = SnapshotProgress(MySqlPosition("binlog.000002", 4))


@pytest.mark.parametrize("mode, stored, step, position", [
    (M.INITIAL, None, Step.SNAPSHOT, None),
    (M.INITIAL_ONLY, None, Step.SNAPSHOT, None),
    (M.WHEN_NEEDED, None, Step.SNAPSHOT, None),
    (M.ALWAYS, None, Step.SNAPSHOT, None),
    (M.NEVER, None, Step.STREAM, None),
    (M.INITIAL, AT, Step.STREAM, AT),
    (M.INITIAL_ONLY, AT, Step.FINISH, AT),
    (M.WHEN_NEEDED, AT, Step.STREAM, AT),
    (M.ALWAYS, AT, Step.SNAPSHOT, AT),        # the topics may hold rows as of AT
    (M.NEVER, AT, Step.STREAM, AT),
    (M.INITIAL, UNFINISHED, Step.SNAPSHOT, UNFINISHED.at),
    (M.INITIAL_ONLY, UNFINISHED, Step.SNAPSHOT, UNFINISHED.at),
    (M.WHEN_NEEDED, UNFINISHED, Step.SNAPSHOT, UNFINISHED.at),
    (M.ALWAYS, UNFINISHED, Step.SNAPSHOT, UNFINISHED.at),
    (M.NEVER, UNFINISHED, Step.STREAM, UNFINISHED.at),
])
def test_the_plan_at_start(mode, stored, step, position):
    plan = policy_for(mode).on_start(stored)
    assert (plan.step, plan.position) == (step, position)
    assert plan.why


@pytest.mark.parametrize("mode", [M.INITIAL, M.INITIAL_ONLY, M.NEVER, M.ALWAYS])
def test_a_lost_position_stops_the_source_unless_when_needed(mode):
    lost = PositionLostError("slot s is missing")
    with pytest.raises(PositionLostError, match="slot s is missing"):
        policy_for(mode).on_lost(lost)


def test_when_needed_heals_a_lost_position_with_a_snapshot():
    plan = policy_for(M.WHEN_NEEDED).on_lost(PositionLostError("binlog purged"))
    assert (plan.step, plan.position) == (Step.SNAPSHOT, None) and "binlog purged" in plan.why


def test_only_initial_only_stops_after_the_snapshot():
    assert [m for m in M if not policy_for(m).streams_after_snapshot] == [M.INITIAL_ONLY]


NEW = frozenset({"public.b"})


@pytest.mark.parametrize("mode, step", [(M.INITIAL, Step.BACKFILL), (M.WHEN_NEEDED, Step.BACKFILL),
                                        (M.ALWAYS, Step.SNAPSHOT), (M.NEVER, Step.STREAM),
                                        (M.INITIAL_ONLY, Step.FINISH)])
def test_tables_new_to_the_config_are_backfilled_per_the_mode(mode, step):
    plan = policy_for(mode).on_start(AT, NEW)
    assert (plan.step, plan.position) == (step, AT)
    assert plan.tables == (NEW if step is Step.BACKFILL else frozenset())


def test_an_unfinished_backfill_is_taken_again_with_what_is_new_since():
    unfinished = SnapshotProgress(AT, extra={"backfill": ["public.b"]})
    plan = policy_for(M.INITIAL).on_start(unfinished, frozenset({"public.c"}))
    assert (plan.step, plan.position, plan.tables) == (Step.BACKFILL, AT, frozenset({"public.b", "public.c"}))
    assert policy_for(M.ALWAYS).on_start(unfinished).step is Step.SNAPSHOT
    assert policy_for(M.NEVER).on_start(unfinished).step is Step.STREAM
