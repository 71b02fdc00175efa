"""Small things a user trips over (issue: running it for months, the papercuts): each with the
behaviour that was wrong."""

from __future__ import annotations

import logging
import uuid

import pytest

from cdc.log.embedded import EmbeddedLog
from tests.conftest import mysql_connect
from tests.integration.pg_capture import topic_state, wait_until


@pytest.mark.mysql
def test_the_mysql_source_logs_ddl_of_captured_databases_only(tmp_path, mysql_url, mysql_db, caplog):
    from tests.integration.test_mysql_source import capturing, execute, mysql_config

    other = f"t_other_{uuid.uuid4().hex[:8]}"
    execute(mysql_url, mysql_db, "CREATE TABLE a (id INT PRIMARY KEY, v TEXT)", "INSERT INTO a VALUES (0, 'y')")
    execute(mysql_url, None, f"CREATE DATABASE `{other}`")
    log = EmbeddedLog(tmp_path / "log", fsync=False)
    try:
        caplog.set_level(logging.INFO, logger="sources.mysql.stream")
        with capturing(mysql_config(mysql_url, mysql_db), log, "d") as capture:
            wait_until(lambda: topic_state(log, f"d.{mysql_db}.a"), capture=capture)  # streaming now
            execute(mysql_url, other, "CREATE TABLE noise (id INT PRIMARY KEY)", "ALTER TABLE noise ADD COLUMN x INT")
            execute(mysql_url, mysql_db, "ALTER TABLE a ADD COLUMN extra INT", "INSERT INTO a VALUES (1, 'x', 2)")
            wait_until(lambda: len(topic_state(log, f"d.{mysql_db}.a")) == 2, capture=capture)
    finally:
        log.close()
        execute(mysql_url, None, f"DROP DATABASE IF EXISTS `{other}`")
    ddl = [r.getMessage() for r in caplog.records if r.getMessage().startswith("DDL at")]
    assert any("ADD COLUMN extra" in m for m in ddl), ddl
    assert not any("noise" in m for m in ddl), ddl
