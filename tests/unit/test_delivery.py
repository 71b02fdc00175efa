import pytest

from cdc.errors import DeliveryError
from cdc.log.delivery import DeliveryTracker


def test_checkpoint_is_safe_only_when_it_and_all_before_are_acked():
    tracker = DeliveryTracker()
    a = tracker.begin(2, "A")
    b = tracker.begin(1, None)
    c = tracker.begin(1, "C")
    tracker.ack(c)             # later batch first: nothing safe yet
    assert tracker.safe() is None
    tracker.ack(a)
    assert tracker.safe() is None
    tracker.ack(a)
    assert tracker.safe() == "A"
    tracker.ack(b)
    assert tracker.safe() == "C"
    assert tracker.idle and tracker.delivered == 4


def test_empty_publish_is_a_heartbeat():
    tracker = DeliveryTracker()
    tracker.begin(0, "H")
    assert tracker.safe() == "H"


def test_a_failure_blocks_every_later_checkpoint():
    tracker = DeliveryTracker()
    a = tracker.begin(1, "A")
    b = tracker.begin(1, "B")
    tracker.ack(a)
    assert tracker.safe() == "A"
    tracker.ack(b, DeliveryError("too large", retriable=False))
    with pytest.raises(DeliveryError, match="too large"):
        tracker.safe()
