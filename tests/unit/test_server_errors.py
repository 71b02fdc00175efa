"""The code tables of cdc/servers: what each server code means (pure logic; the real-server
cases are in tests/integration/test_*_server_errors.py)."""

from __future__ import annotations

import pymysql
import pytest

from cdc.errors import ConfigError, PermanentError, PrerequisiteError, RetriableError
from cdc.servers import Kind, as_error, mysql, postgres


@pytest.mark.parametrize("code, kind", [
    ("57P01", Kind.RETRIABLE),  # admin shutdown
    ("57P02", Kind.RETRIABLE),  # crash shutdown
    ("57P03", Kind.RETRIABLE),  # cannot connect now
    ("08006", Kind.RETRIABLE), ("08001", Kind.RETRIABLE), ("53300", Kind.RETRIABLE),
    ("40001", Kind.RETRIABLE), ("40P01", Kind.RETRIABLE), ("55P03", Kind.RETRIABLE),
    ("28P01", Kind.LOGIN), ("28000", Kind.LOGIN), ("3D000", Kind.NO_DATABASE),
    ("42501", Kind.PRIVILEGE), ("23505", Kind.DATA), ("22003", Kind.DATA), ("42P01", Kind.PERMANENT),
])
def test_postgres_codes(code, kind):
    assert postgres.classify_code(code) is kind


@pytest.mark.parametrize("errno, kind", [
    (2002, Kind.RETRIABLE), (2003, Kind.RETRIABLE), (2006, Kind.RETRIABLE), (2013, Kind.RETRIABLE),
    (1040, Kind.RETRIABLE), (1053, Kind.RETRIABLE), (1213, Kind.RETRIABLE), (1927, Kind.RETRIABLE),
    (1045, Kind.LOGIN), (1698, Kind.LOGIN), (1049, Kind.NO_DATABASE), (2059, Kind.SETTING),
    (1044, Kind.PRIVILEGE), (1227, Kind.PRIVILEGE), (1062, Kind.DATA), (1146, Kind.PERMANENT),
])
def test_mysql_errnos(errno, kind):
    assert mysql.classify(pymysql.err.OperationalError(errno, "x")) is kind


def test_kinds_map_onto_the_one_error_tree():
    made = {kind: as_error(kind, "m", setting="the dsn (or dsn_file) of source s", role="r") for kind in Kind}
    assert isinstance(made[Kind.RETRIABLE], RetriableError)
    for kind in (Kind.LOGIN, Kind.NO_DATABASE, Kind.SETTING, Kind.REFUSED):
        assert isinstance(made[kind], ConfigError) and "of source s" in str(made[kind])
    assert isinstance(made[Kind.PRIVILEGE], PrerequisiteError) and "the role r" in str(made[Kind.PRIVILEGE])
    assert all(not made[k].retriable and isinstance(made[k], PermanentError) for k in Kind if k is not Kind.RETRIABLE)


@pytest.mark.parametrize("dsn, problem", [
    ("host=h sslmode=sometimes", "sslmode='sometimes' is not one of"),
    ("host=h colour=blue", '"colour"'),
    ("postgresql://u@h/d?colour=blue", '"colour"'),
    ("host=h target_session_attrs=any sslmode=verify-full", None),
])
def test_the_dsn_is_checked_before_connecting(dsn, problem):
    found = postgres.dsn_problem(dsn)
    assert found is None if problem is None else problem in found


def test_libpq_ping_is_found():
    # The connect classification relies on it; without it every refused connect would be retriable.
    assert postgres.ping("host=127.0.0.1 port=9 connect_timeout=5") is postgres.Ping.NO_RESPONSE
