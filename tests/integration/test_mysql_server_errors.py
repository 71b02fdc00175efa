"""MySQL/MariaDB start-up errors against the real server, classified by errno
(cdc/servers/mysql.py): a refused login names the url to correct, not a grant to make."""

from __future__ import annotations

import uuid

import pytest

from cdc.errors import ConfigError, RetriableError
from sources.mysql.source import MySqlSource
from tests.integration.test_mysql_source import execute, mysql_config

pytestmark = pytest.mark.mysql


@pytest.fixture
def user(mysql_url):
    name = f"u{uuid.uuid4().hex[:8]}"
    execute(mysql_url, None, f"CREATE USER '{name}'@'%' IDENTIFIED BY 'right-password'")
    yield name
    execute(mysql_url, None, f"DROP USER '{name}'@'%'")


def _start(url: str, db: str) -> None:
    source = MySqlSource(mysql_config(url, db), None)
    try:
        source.start()
    finally:
        source.stop()


def test_a_wrong_password_is_a_config_error_naming_the_url(mysql_url, mysql_db, user):
    with pytest.raises(ConfigError) as raised:
        _start(mysql_url.replace("root@", f"{user}:wrong-password@"), mysql_db)
    message = str(raised.value)
    assert not raised.value.retriable
    assert "(errno 1045)" in message and "the url (or url_file) of source my" in message
    assert "GRANT" not in message


def test_a_server_that_does_not_answer_is_retriable(mysql_db, mysql_url):
    with pytest.raises(RetriableError, match=r"errno 2003"):
        _start("mysql://root@127.0.0.1:9", mysql_db)
