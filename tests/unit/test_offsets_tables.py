"""The tables record beside a source's position in the offsets topic (cdc/offsets.py)."""

from __future__ import annotations

from cdc.log.embedded import EmbeddedLog
from cdc.offsets import OffsetStore
from cdc.positions import PgLsn


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
