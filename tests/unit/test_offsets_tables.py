"""The tables record beside a source's position in the offsets topic (cdc/offsets.py)."""

from __future__ import annotations

import pytest

from cdc.errors import DecodeError
from cdc.log.embedded import EmbeddedLog
from cdc.offsets import OffsetStore
from cdc.positions import PgLsn
from cdc.serde import Record


def test_the_tables_record_is_kept_apart_from_the_positions(tmp_path):
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    offsets = OffsetStore(log, "p")
    try:
        assert offsets.load_tables("pg") is None
        offsets.save("pg", PgLsn(5))
        offsets.save_tables("pg", frozenset({"public.a"}))
        offsets.save_tables("pg", frozenset({"public.a", "public.b"}))
        assert offsets.load_tables("pg") == {"public.a", "public.b"}
        assert offsets.load_tables("other") is None
        assert offsets.load_all() == {"pg": PgLsn(5)}  # not taken for a position
        offsets.reset("pg")
        assert offsets.load_all() == {"pg": None}
    finally:
        offsets.close()
        log.close()


def test_a_record_without_a_key_is_named_not_taken_for_a_position(tmp_path):
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    offsets = OffsetStore(log, "p")
    writer = log.writer()
    try:
        writer.publish([Record(offsets.topic, None, b'"1/0"')])
        writer.flush(10)
        with pytest.raises(DecodeError, match=rf"{offsets.topic} partition 0 offset 0: not an offset record \(no key\)"):
            offsets.load_all()
    finally:
        writer.close()
        offsets.close()
        log.close()


class _SlowWriter:
    """A log writer whose records stay unacknowledged until ``ack()`` (a cluster short of in-sync
    replicas, say)."""

    def __init__(self) -> None:
        self.published: list = []
        self.acked = 0

    def publish(self, records, checkpoint=None) -> None:
        self.published.extend(records)

    def send_now(self, timeout: float) -> None:
        pass

    @property
    def outstanding(self) -> int:
        return len(self.published) - self.acked

    def flush(self, timeout: float = 30.0):
        if self.outstanding:
            from cdc.errors import DeliveryError

            raise DeliveryError("not acknowledged", retriable=True)

    def ack(self) -> None:
        self.acked = len(self.published)

    def close(self) -> None:
        pass


def test_an_offer_sends_one_position_at_a_time_and_says_which_the_log_stored(tmp_path):
    from cdc.errors import DeliveryError

    log = EmbeddedLog(tmp_path / "log", fsync=False)
    offsets = OffsetStore(log, "p")
    offsets._writer.close()
    offsets._writer = slow = _SlowWriter()
    try:
        assert offsets.offer("pg", PgLsn(5), 0.01) is None
        assert offsets.offer("pg", PgLsn(5), 0.01) is None   # waits for the same record
        assert offsets.offer("pg", PgLsn(6), 0.01) is None   # nothing newer while it is on its way
        assert len(slow.published) == 1
        slow.ack()
        # The one on its way is stored; the newer one goes now.
        assert offsets.offer("pg", PgLsn(6), 0.01) == PgLsn(5)
        assert len(slow.published) == 2
        slow.ack()
        assert offsets.offer("pg", PgLsn(6), 0.01) == PgLsn(6)
        assert len(slow.published) == 2
        # Another source's record on its way is waited for, never returned as this one's.
        assert offsets.offer("pg", PgLsn(8), 0.01) is None
        slow.ack()
        assert offsets.offer("my", PgLsn(9), 0.01) is None and len(slow.published) == 4
        slow.ack()
        assert offsets.offer("my", PgLsn(9), 0.01) == PgLsn(9)
        with pytest.raises(DeliveryError):   # the plain store still gives up after its timeout
            offsets.save("pg", PgLsn(7), 0.01)
    finally:
        log.close()
