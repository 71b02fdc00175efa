"""The private internals of third-party libraries the product still uses, each checked against
the installed library, so that an upgrade that moves one fails here, loudly, instead of leaving
a feature that silently does nothing. Each is used in one small function that says why:

* PyMySQL's ``Connection._sock`` (``sinks/sql/deadline.py``, ``_socket_of``): PyMySQL has no
  public ``fileno()``; the SQL sink's write deadline shuts the socket down from a timer thread.
* PySpark's ``SparkContext._gateway`` and ``_jvm`` (``spark_sinks/session.py``): no public way to
  ask whether the JVM runs, and log4j is reached through Py4J only.
"""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import pymysql
import pytest

from sinks.sql.deadline import _socket_of
from tests.conftest import mysql_connect


@pytest.mark.mysql
def test_the_write_deadline_finds_and_shuts_pymysqls_socket(mysql_url):
    conn = mysql_connect(mysql_url)
    try:
        duplicate = _socket_of(conn)
        assert duplicate is not None, "PyMySQL no longer keeps its socket in Connection._sock"
        try:
            assert duplicate.getpeername()[1] == (urlparse(mysql_url).port or 3306)
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()
        with pytest.raises(pymysql.err.OperationalError):  # what the deadline turns into a retry
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
    finally:
        conn.close()


def test_pyspark_still_has_the_class_attributes_the_session_reads():
    import pyspark  # the spark extra, which scripts/setup installs

    assert hasattr(pyspark.SparkContext, "_gateway") and hasattr(pyspark.SparkContext, "_jvm")
