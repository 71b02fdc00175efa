"""The PostgreSQL source's deadlines for a server that stops answering (pure logic)."""

from __future__ import annotations

import psycopg2.extensions
import pytest

from cdc.errors import RetriableError
from sources.postgres.deadline import Silence, with_connect_timeout


def test_a_connect_timeout_is_added_unless_the_dsn_has_one():
    for dsn in ("postgresql://u@db:5432/shop", "host=db user=u dbname=shop"):
        assert psycopg2.extensions.parse_dsn(with_connect_timeout(dsn, 30))["connect_timeout"] == "30"
    explicit = "postgresql://u@db/shop?connect_timeout=3"
    assert with_connect_timeout(explicit, 30) == explicit
    assert with_connect_timeout("postgresql://db/x?colour=blue", 30) == "postgresql://db/x?colour=blue"


def test_silence_asks_once_per_interval_and_fails_past_the_limit(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("sources.postgres.deadline.time.monotonic", lambda: now[0])
    silence = Silence(limit=30, ask_every=10, what="reading from slot s")
    assert not silence.should_ask()
    now[0] = 110.0
    assert silence.should_ask() and not silence.should_ask()  # once per interval
    now[0] = 125.0
    silence.heard()
    now[0] = 154.0
    silence.check()  # 29 s of silence: not yet
    now[0] = 156.0
    with pytest.raises(RetriableError, match="nothing from the server for 31s"):
        silence.check()
