"""The SQL sink classifies its target's errors as the sources do (cdc/servers): a refused login or a
missing database is a ConfigError naming the sink's url, not a retriable error."""

from __future__ import annotations

import pytest

from cdc.errors import ConfigError, RetriableError
from sinks.sql.config import SqlSinkConfig
from sinks.sql.sink import SqlSink
from tests.integration.test_mysql_server_errors import user  # noqa: F401 - a fixture
from tests.integration.test_pg_server_errors import _with, password_role, role  # noqa: F401 - fixtures


def _start(url: str) -> None:
    sink = SqlSink(SqlSinkConfig(name="wh", type="sql", topics=["*"], url=url))
    try:
        sink.start()
    finally:
        sink.stop()


@pytest.mark.postgres
def test_a_wrong_password_on_a_postgres_target_is_a_config_error(pg_dsn, password_role):
    with pytest.raises(ConfigError, match=r"the url \(or url_file\) of sink wh"):
        _start(_with(pg_dsn, user=password_role, password="wrong-password"))


@pytest.mark.postgres
def test_a_missing_postgres_database_is_a_config_error(pg_dsn):
    with pytest.raises(ConfigError, match=r"the url \(or url_file\) of sink wh"):
        _start(_with(pg_dsn, database="no_such_database"))


@pytest.mark.postgres
def test_a_postgres_target_that_does_not_answer_is_retriable():
    with pytest.raises(RetriableError, match="does not answer"):
        _start("postgresql://postgres@127.0.0.1:9/none")


@pytest.mark.mysql
def test_a_wrong_password_on_a_mysql_target_is_a_config_error(mysql_url, mysql_db, user):
    with pytest.raises(ConfigError, match=r"\[1045\].*the url \(or url_file\) of sink wh"):
        _start(mysql_url.replace("root@", f"{user}:wrong-password@") + f"/{mysql_db}")


@pytest.mark.mysql
def test_a_missing_mysql_database_is_a_config_error(mysql_url):
    with pytest.raises(ConfigError,
                       match=r"\[1049\].*the database named in the url \(or url_file\) of sink wh does not exist"):
        _start(mysql_url + "/no_such_database")
