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
