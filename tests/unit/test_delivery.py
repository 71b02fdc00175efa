import time

import pytest

from cdc.errors import DeliveryError
from cdc.log.delivery import DeliveryTracker


def test_a_checkpoint_becomes_safe_only_at_a_drain_point_after_its_publish():
    tracker = DeliveryTracker()
    tracker.published("A")
    assert tracker.safe() is None          # published, not yet known delivered
    tracker.drained()
    assert tracker.safe() == "A"
    tracker.published(None)                # a publish without a checkpoint moves nothing
    tracker.published("C")
    assert tracker.safe() == "A"
    tracker.drained()
    assert tracker.safe() == "C"


def test_an_empty_publish_is_a_heartbeat():
    tracker = DeliveryTracker()
    tracker.published("H")
    tracker.drained()
    assert tracker.safe() == "H"


def test_a_failure_blocks_every_later_checkpoint_for_good():
    tracker = DeliveryTracker()
    tracker.published("A")
    tracker.drained()
    tracker.published("B")
    tracker.failed(DeliveryError("too large", retriable=False))
    tracker.failed(DeliveryError("second", retriable=True))  # the first failure is the one reported
    tracker.drained()
    with pytest.raises(DeliveryError, match="too large"):
        tracker.safe()
    tracker.published("C")
    tracker.drained()
    with pytest.raises(DeliveryError, match="too large"):
        tracker.safe()


def test_a_barrier_is_due_only_when_a_checkpoint_waited_the_interval():
    tracker = DeliveryTracker(barrier_interval=0.05)
    time.sleep(0.06)
    assert not tracker.barrier_due()       # nothing published: nothing to wait for
    tracker.published("A")
    assert tracker.barrier_due()           # no drain point for longer than the interval
    tracker.drained()
    assert not tracker.barrier_due()       # "A" is safe
    tracker.published("B")
    assert not tracker.barrier_due()       # drained just now
    time.sleep(0.06)
    assert tracker.barrier_due()
