"""Fixtures for tests against the real servers of the local stack.

A test says what it needs with a marker (``@pytest.mark.postgres`` ...) and takes the fixture of
that service. Servers are session-scoped: the first fixture that needs one runs ``cdc dev up`` for
it (a no-op when ``scripts/test`` already started the stack). Each test gets a fresh database,
topic name, key prefix or index, so tests never see each other's data.

A service that cannot start fails the test under ``CI=true`` (and wherever
``CDC_REQUIRE_SERVICES=1``); elsewhere it is skipped with the command that starts it.
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlparse

import pytest
from hypothesis import HealthCheck, settings

from cdc.dev import stack
from cdc.errors import DevStackError

# Hypothesis times each example (200 ms by default) and its data generation: on a shared machine
# at load 10 a correct example can take longer. Tests assert results, never timings.
settings.register_profile("cdc", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cdc")

MARKER_SERVICES = {"postgres", "postgres17", "mysql", "kafka", "redis", "opensearch", "spark"}


def _services_required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("CDC_REQUIRE_SERVICES") == "1"


@pytest.fixture(scope="session")
def dev_env_for():
    """``dev_env_for("kafka")`` -> the dev.env settings, with that service running."""
    cache: dict[str, dict[str, str]] = {}

    def ensure(name: str) -> dict[str, str]:
        if name not in cache:
            try:
                cache[name] = stack.up([name])
            except DevStackError as err:
                if _services_required():
                    pytest.fail(f"service {name} could not start: {err}", pytrace=False)
                pytest.skip(f"service {name} is not available ({err}); run `cdc dev up`")
        return cache[name]

    return ensure


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def pytest_addoption(parser):
    parser.addoption(
        "--phase", choices=("all", "parallel", "spark", "serial", "cluster", "spark_processes"), default="all",
        help="which tests to run: 'serial' only the tests marked serial (they stop, freeze, restart "
             "or kill a server of the shared stack, or change its global settings), one at a time; "
             "'spark' only the other Spark tests, one at a time (one Spark session); 'parallel' the "
             "rest, which may run in pytest-xdist workers side by side; 'cluster' the tests marked "
             "cluster (failures of the replicated Kafka of `cdc dev up --profile cluster`); "
             "'spark_processes' the tests marked so (several Spark processes of their own). "
             "scripts/test runs the spark and cluster phases (one after the other) beside the "
             "parallel and spark_processes ones (likewise), then the serial phase alone.")


def pytest_configure(config):
    # Workers beside a test that restarts a shared server would see it go away under them.
    if (getattr(config.option, "numprocesses", None) or 0) and config.getoption("--phase") != "parallel":
        raise pytest.UsageError("with -n (pytest-xdist workers) pass --phase parallel: the tests marked "
                                "serial must not run beside others (run them with --phase serial)")


def _select_phase(config, items) -> None:
    phase = config.getoption("--phase")
    if phase == "all":
        return
    keep, drop = [], []
    for item in items:
        # The Spark tests have a phase of their own: each xdist worker would start a Spark JVM of
        # its own (seconds of CPU and a GB of memory each), two of them on two cores starve each
        # other's first batches, and `xdist_group` cannot keep them on one worker (pytest-xdist 3.8
        # renames item._nodeid, which pytest 9.2's Item.nodeid no longer reads). One Spark process
        # beside the parallel workers slows both, but the whole suite ends sooner than with the
        # phases one after the other (scripts/test).
        # A Spark test marked `spark_processes` runs several Spark processes of its own at once
        # (sinks killed again and again): beside the parallel and the Spark phases it overloaded
        # two cores (load 15, other tests' waits ran out), so it has a phase of its own, run
        # once the parallel one is done. So do the cluster tests, which kill and restart the
        # nodes of the replicated Kafka (no other test uses it), run once the spark one is done.
        if item.get_closest_marker("cluster") is not None:
            mine = "cluster"
        elif item.get_closest_marker("spark_processes") is not None:
            mine = "spark_processes"
        elif item.get_closest_marker("serial") is not None:
            mine = "serial"
        elif item.get_closest_marker("spark") is not None:
            mine = "spark"
        else:
            mine = "parallel"
        (keep if mine == phase else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    # A test using a service fixture must carry that service's marker, so `-m` selections and
    # the per-service suites in CI stay truthful.
    needs = {"pg_dsn": "postgres", "pg_admin_dsn": "postgres", "target_dsn": "postgres", "pg17_dsn": "postgres17",
             "pg17_admin_dsn": "postgres17", "pg17_bindir": "postgres17", "mysql_url": "mysql",
             "mysql_db": "mysql", "kafka_bootstrap": "kafka", "kafka_topic": "kafka",
             "redis_url": "redis", "redis_prefix": "redis", "redis_cluster_url": "redis", "opensearch_url": "opensearch",
             "opensearch_index": "opensearch", "spark": "spark", "registry_url": "registry"}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, marker in needs.items():
            if fixture in fixtures and item.get_closest_marker(marker) is None:
                raise pytest.UsageError(f"{item.nodeid} uses {fixture} but is not marked @pytest.mark.{marker}")
    _select_phase(config, items)


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """A test that runs the CLI or a worker in-process gets cdc.logs.setup's handler on the root
    logger, writing to the stream pytest captured for that test; left there, it fails every
    later record once that stream is closed ("--- Logging error ---"). Taken off after the test."""
    import logging

    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
        root.removeHandler(handler)
    root.setLevel(level)


# --- PostgreSQL -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def pg_admin_dsn(dev_env_for) -> str:
    return dev_env_for("postgres")["PG_DSN"]


@pytest.fixture
def pg_dsn(pg_admin_dsn):
    """A fresh database; dropped (with its replication slots) after the test."""
    yield from _fresh_database(pg_admin_dsn)


@pytest.fixture
def target_dsn(pg_admin_dsn):
    """A second fresh database on the same server, for a sink to write into; dropped after the test."""
    yield from _fresh_database(pg_admin_dsn)


@pytest.fixture(scope="session")
def pg17_admin_dsn(dev_env_for) -> str:
    return dev_env_for("postgres17")["PG17_DSN"]


@pytest.fixture(scope="session")
def pg17_bindir(dev_env_for) -> str:
    """The PostgreSQL 17 binaries (initdb, postgres) the stack runs, for tests that start servers of their own."""
    return dev_env_for("postgres17")["PG17_BINDIR"]


@pytest.fixture
def pg17_dsn(pg17_admin_dsn):
    """A fresh database on the PostgreSQL 17 server; dropped (with its slots) after the test."""
    yield from _fresh_database(pg17_admin_dsn)


def _fresh_database(pg_admin_dsn: str):
    import psycopg2

    name = _unique("t")
    admin = psycopg2.connect(pg_admin_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    yield pg_admin_dsn.rsplit("/", 1)[0] + "/" + name
    import time

    with admin.cursor() as cur:
        # Walsenders of slots in this database hold it: end them, wait for their slots to be
        # released (a terminated walsender takes a moment), drop the slots, then the database.
        deadline = time.monotonic() + 30
        while True:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                        "AND pid <> pg_backend_pid()", (name,))
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE database = %s AND NOT active", (name,))
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (name,))
            if cur.fetchone()[0] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


# --- MariaDB ----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def mysql_url(dev_env_for) -> str:
    return dev_env_for("mysql")["MYSQL_URL"]


def mysql_connect(url: str, database: str | None = None, **kwargs):
    import pymysql

    parsed = urlparse(url)
    kwargs.setdefault("autocommit", True)
    return pymysql.connect(host=parsed.hostname, port=parsed.port or 3306,
                           user=parsed.username or "root", password=parsed.password or "",
                           database=database, **kwargs)


def fresh_mysql_database(mysql_url: str):
    """A generator: a fresh schema name (created), dropped when resumed."""
    name = _unique("t")
    conn = mysql_connect(mysql_url)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")
    yield name
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    conn.close()


@pytest.fixture
def mysql_db(mysql_url):
    """A fresh schema name (created); dropped after the test."""
    yield from fresh_mysql_database(mysql_url)


# --- Kafka ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def kafka_bootstrap(dev_env_for) -> str:
    return dev_env_for("kafka")["KAFKA_BOOTSTRAP"]


@pytest.fixture
def kafka_topic(kafka_bootstrap):
    """A fresh topic name (not created: tests create it with the settings they test)."""
    from confluent_kafka.admin import AdminClient

    name = _unique("t")
    yield name
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    existing = admin.list_topics(timeout=10).topics
    doomed = [t for t in existing if t == name or t.startswith(name + ".")]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=10).values():
            future.result()


# --- Redis ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def redis_url(dev_env_for) -> str:
    return dev_env_for("redis")["REDIS_URL"]


@pytest.fixture
def redis_prefix(redis_url):
    """A fresh key prefix; its keys are deleted after the test."""
    import redis

    prefix = _unique("t") + ":"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="session")
def redis_cluster_url(dev_env_for) -> str:
    """Any node of the stack's three-master Redis Cluster (service ``redis-cluster``)."""
    return dev_env_for("redis-cluster")["REDIS_CLUSTER_URL"]


# --- OpenSearch -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def opensearch_url(dev_env_for) -> str:
    return dev_env_for("opensearch")["OPENSEARCH_URL"]


@pytest.fixture
def opensearch_index(opensearch_url):
    """A fresh index name (not created); the index and its versions are deleted after the test."""
    from opensearchpy import OpenSearch

    name = _unique("t")
    yield name
    client = OpenSearch(opensearch_url)
    client.indices.delete(index=f"{name}*", ignore_unavailable=True)
    client.close()


# --- Schema registry --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def registry_url(dev_env_for) -> str:
    """The stack's Confluent-compatible schema registry (Apicurio, service ``registry``)."""
    return dev_env_for("registry")["REGISTRY_URL"]


# --- Spark ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def spark(dev_env_for, tmp_path_factory):
    """One local[2] Spark session with the Kafka source and Delta Lake, for the whole run."""
    from spark_sinks.session import local_session

    jars = dev_env_for("spark")["SPARK_JARS"]
    session = local_session("cdc-tests", jars=jars.split(","),
                            warehouse=str(tmp_path_factory.mktemp("spark-warehouse")))
    yield session
    session.stop()
