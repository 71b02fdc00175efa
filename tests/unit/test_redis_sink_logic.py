"""The Redis sink's pure logic: key encoding, config checks, batch plans, the applied tracker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from cdc.api import ConfigError, Op, SinkEvent
from sinks.redis.applied import AppliedTracker
from sinks.redis.client import connect, redacted_url
from sinks.redis.config import RedisSinkConfig
from sinks.redis.keys import KeySpace, companion, encode_key, namespace
from sinks.redis.pipeline import row_tail
from sinks.redis.plan import plan_batch
from sinks.redis.values import column_chooser, hash_fields
from sinks.redis.wait import mysql_version, pg_version


def test_composite_keys_are_stable_and_unambiguous():
    assert encode_key({"id": 42}) == "42"
    assert encode_key({"tenant": "a:b", "id": 7}) == "a%3Ab:7"
    assert encode_key({"a": "x", "b": "y:z"}) != encode_key({"a": "x:y", "b": "z"})
    assert encode_key({"a": None, "b": True, "c": "%N"}) == "%N:true:%25N"
    assert encode_key({"j": {"b": 1, "a": 2}}) == encode_key({"j": {"a": 2, "b": 1}})
    assert "{" not in encode_key({"s": "{tag}"})


@given(st.lists(st.one_of(st.text(), st.integers(), st.none(), st.booleans()), min_size=1, max_size=4),
       st.lists(st.one_of(st.text(), st.integers(), st.none(), st.booleans()), min_size=1, max_size=4))
def test_different_keys_never_encode_alike(a, b):
    key_a = {f"c{i}": v for i, v in enumerate(a)}
    key_b = {f"c{i}": v for i, v in enumerate(b)}
    # Values that print alike (1 and "1", True and "true") are the same key by design: a primary
    # key column has one type. Compare what the encoding promises: the texts of the components.
    def texts(values):
        return [None if v is None else str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    if texts(a) != texts(b):
        assert encode_key(key_a) != encode_key(key_b)


def test_row_keys_their_companions_and_generations():
    space = KeySpace("{prefix}:{schema}.{table}:{key}", namespace("shop", 1))
    row = space.row_key("public", "orders", {"id": 5})
    assert row == "shop:public.orders:5"
    assert companion(row) == "shop:v:{shop:public.orders:5}"
    assert KeySpace("{prefix}:{table}:{key}", namespace("shop", 3)).row_key("s", "t:x", {"id": 1}) == "shop.g3:t%3Ax:1"
    assert space.table_pattern("public", "or*ders") == "shop:public.or\\*ders:*"


@pytest.mark.parametrize("template, problem", [
    ("{schema}:{key}", "must start with"),
    ("{prefix}:{table}", "must contain {key}"),
    ("{prefix}:{nope}:{key}", "unknown placeholder"),
    ("{prefix}:{{tag}}:{key}", "braces"),
])
def test_bad_key_templates_are_refused(template, problem):
    with pytest.raises(ValidationError, match=problem):
        RedisSinkConfig(name="c", url="redis://x", topics=["t.*"], key_template=template)


def test_columns_are_chosen_then_renamed():
    config = RedisSinkConfig(name="c", url="redis://x", topics=["t"], exclude=["secret"], rename={"a": "A"})
    choose = column_chooser(config)
    assert choose({"a": 1, "b": None, "secret": "x"}) == {"A": 1, "b": None}
    assert hash_fields({"a": 1, "b": None, "c": True, "d": [1, 2], "e": 1.5}) == [
        "a", "1", "c", "true", "d", b"[1,2]", "e", "1.5"]


def _event(offset, key, op, version, after=None):
    source = {} if op is None else {"schema": "public", "table": "t"}
    return SinkEvent("p.public.t", 0, offset, key, op, None, after, version, source)


def test_a_batch_keeps_the_newest_change_per_key_and_tombstones_after_it():
    space = KeySpace("{prefix}:{schema}.{table}:{key}", "n")
    events = [_event(0, {"id": 1}, Op.CREATE, 10, {"id": 1, "v": "a"}),
              _event(1, {"id": 1}, Op.UPDATE, 20, {"id": 1, "v": "b"}),
              _event(2, {"id": 2}, Op.CREATE, 11, {"id": 2}),
              _event(3, {"id": 2}, Op.DELETE, 21),
              _event(4, {"id": 2}, None, None),
              _event(5, {"id": 3}, Op.CREATE, 12, {"id": 3}),
              _event(6, {"id": 3}, None, None),
              _event(7, {"id": 4}, None, None),
              _event(8, {"id": 4}, Op.CREATE, 30, {"id": 4})]
    commands = list(plan_batch(events, space, "json", lambda row: row, {}).commands)
    by_key = {c.keys[0]: c.tail for c in commands}
    assert by_key["n:public.t:1"] == row_tail(("n:public.t:1", "n:v:{n:public.t:1}"), "s", "20",
                                              (b'{"id":1,"v":"b"}',))
    assert by_key["n:public.t:2"] == row_tail(("n:public.t:2", "n:v:{n:public.t:2}"), "d", "21")
    assert by_key["n:public.t:3"][2].startswith(b"$1\r\nt\r\n")  # the log says: deleted; whatever version
    assert by_key["n:public.t:4"][2] == b"$1\r\ns\r\n$2\r\n30\r\n"  # written again after its tombstone
    assert all(c.keys[1] == companion(c.keys[0]) for c in commands)
    assert len(commands) == 4


def test_truncates_are_returned_per_table_with_their_newest_version():
    space = KeySpace("{prefix}:{schema}.{table}:{key}", "n")
    events = [_event(0, {}, Op.TRUNCATE, 5), _event(1, {}, Op.TRUNCATE, 9), _event(2, {}, Op.TRUNCATE, 7)]
    assert plan_batch(events, space, "hash", lambda r: r, {}).truncates == {("public", "t"): 9}


def test_applied_versions_wait_for_every_partition():
    tracker = AppliedTracker()
    tracker.observe("src", 100, {("a", 0): 10, ("a", 1): 5, ("a", 2): 0})
    assert tracker.covered({("a", 0): 10}) == {}            # partition 1 not reached yet
    assert tracker.covered({("a", 0): 10, ("a", 1): 5}) == {"src": 100}
    tracker.observe("src", 90, {("a", 0): 1})               # older than published: ignored
    tracker.observe("src", 200, {("a", 0): 20, ("a", 1): 5})
    assert tracker.covered({("a", 0): 19, ("a", 1): 5}) == {}
    assert tracker.covered({("a", 0): 20, ("a", 1): 9}) == {"src": 200}


def test_checkpoints_become_versions_as_the_sources_build_them():
    from cdc.offsets import checkpoint_version
    from cdc.positions import Counter, MySqlPosition, PgLsn
    from sources.mysql.changes import version_of

    assert checkpoint_version(PgLsn.parse("1/A0")) == (1 << 32) | 0xA0 == pg_version("1/A0")
    assert checkpoint_version(MySqlPosition("binlog.000003", 1234)) == version_of(3, 1234) == \
        mysql_version("binlog.000003", 1234)
    assert checkpoint_version(Counter(5)) is None and checkpoint_version(None) is None


def test_status_shows_a_sinks_own_counters():
    from cdc.runtime.status_lines import status_line as _status_line

    line = _status_line({"kind": "sink", "name": "cache", "phase": "streaming", "consumer_lag": 3,
                         "details": {"keys_written": 120, "tombstones": 4, "stale_skipped": 9}})
    assert line.endswith("consumer_lag=3 keys_written=120 tombstones=4 stale_skipped=9")


def _shape(version, *columns, key=("id",)):
    return {"db": "shop", "schema": "public", "table": "t", "version": version,
            "columns": [{"name": n, "type": t, "key": n in key} for n, t in columns]}


def _follower(policy, shapes):
    from sinks.redis.shapes import ShapeFollower

    store: dict = {}
    return ShapeFollower("cache", policy, lambda event: shapes[event.source["schema_version"]],
                         lambda topic: None, store.get, store.__setitem__), store


def _named(version):
    return SinkEvent("p.public.t", 0, 0, {"id": 1}, Op.UPDATE, None, {"id": 1}, version,
                     {"schema": "public", "table": "t", "schema_version": version})


def test_a_cache_shape_change_matters_only_when_values_change_kind():
    from sinks.redis.shapes import value_kind

    assert value_kind("int4") == value_kind("bigint") == value_kind("int(11) unsigned") == "integer"
    assert value_kind("varchar(10)") == value_kind("text") == value_kind("timestamptz") == "text"
    assert value_kind("numeric(12,2)") == "decimal" != value_kind("double precision")
    assert value_kind("_int4") == value_kind("text[]") == "array"
    shapes = {1: _shape(1, ("id", "int4"), ("v", "varchar(10)")), 2: _shape(2, ("id", "int8"), ("v", "text"))}
    follower, store = _follower("fail", shapes)
    assert follower.follow("ns", _named(1)) is None
    assert follower.follow("ns", _named(2)) is None  # widened, same kinds: no stop under fail
    assert b'"version":2' in store["ns:shape:p.public.t"]


def test_a_new_primary_key_stops_evolve_and_rebuilds_rebuild():
    from cdc.api import RebuildRequired, SchemaChangeError

    shapes = {1: _shape(1, ("id", "int4"), ("k", "int4")), 2: _shape(2, ("id", "int4"), ("k", "int4"), key=("id", "k"))}
    for policy, error in (("evolve", SchemaChangeError), ("fail", SchemaChangeError), ("rebuild", RebuildRequired)):
        follower, _ = _follower(policy, shapes)
        follower.follow("ns", _named(1))
        with pytest.raises(error, match=r"primary key \(id\) -> \(id, k\)"):
            follower.follow("ns", _named(2))
    # Rows of an older shape than the one followed keep only the followed shape's columns.
    follower, _ = _follower("evolve", {1: _shape(1, ("id", "int4"), ("gone", "text")), 2: _shape(2, ("id", "int4"))})
    follower.follow("ns", _named(2))
    assert follower.follow("ns", _named(1)) == frozenset({"id"})


@pytest.mark.parametrize("settings, problem", [
    ({"url": "redis://cache:6379/0", "tls_ca_file": "ca.pem"}, "tls_ca_file set but url is not rediss://"),
    ({"url": "redis://cache:6379/0", "tls_cert_file": "c.pem", "tls_key_file": "k.pem"},
     "tls_cert_file, tls_key_file set but url is not rediss://"),
    ({"url": "rediss://cache:6380/0", "tls_key_file": "k.pem"}, "tls_key_file needs tls_cert_file"),
])
def test_tls_settings_without_tls_are_refused_not_ignored(settings, problem):
    with pytest.raises(ValidationError, match=problem):
        RedisSinkConfig(name="c", topics=["t.*"], **settings)


def test_urls_in_messages_hide_the_password():
    assert redacted_url("rediss://:s3cret@cache:6380/0") == "rediss://:***@cache:6380/0"
    assert redacted_url("redis://app:s3cret@cache:6379/2") == "redis://app:***@cache:6379/2"
    assert redacted_url("redis://app@cache:6379") == "redis://app@cache:6379"
    assert redacted_url("redis://cache:6379/0?password=s3cret&db=1") == "redis://cache:6379/0?password=%2A%2A%2A&db=1"


def test_an_unreadable_tls_file_is_a_config_error_naming_the_setting(tmp_path):
    config = RedisSinkConfig(name="c", url="rediss://:pw@127.0.0.1:1/0", topics=["t.*"],
                             tls_ca_file=str(tmp_path / "missing-ca.pem"))
    with pytest.raises(ConfigError, match=r"redis sink c: tls_ca_file .*missing-ca.pem cannot be read"):
        connect(config)
