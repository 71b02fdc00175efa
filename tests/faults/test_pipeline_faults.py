"""Faults against the real daemon: PostgreSQL or MariaDB -> Kafka -> SQL sinks, under a live writer.

    writer ──> source DB ──[proxy src]──> cdc run ──[proxy kafka]──> Kafka
                                            │  └──[proxy kafka]──> sinks ──[proxy tgt]──> PostgreSQL target
                                            └────────────────────> sinks ──> SQLite target (a file)

Each test strikes a shuffled list of faults, each at a random moment after evidence of progress
at both ends (``harness.Campaign``): cuts, RSTs and stalls of every connection through the
proxies, clean restarts and kill -9 of the servers (``cdc dev restart|kill|start``, data kept),
and kill -9 of the daemon's process group. At the end the topic, both targets and the source hold
the same rows, big values included, and the daemon's log shows each fault noticed and recovered
from, with no restart by hand (the daemon is only started again after it was killed).

What "noticed" means per fault, from what the daemon really prints:

* source connection cut/reset, source server restart or kill -9: the worker's
  ``RetriableError: ... (retriable)`` and the supervisor's ``exited with 75; restarting``;
* Kafka cut/reset/restart: librdkafka's ``Disconnected`` lines (``cdc.log.kafka.librdkafka``);
  the client reconnects by itself, nothing restarts. Repeats of a line within 30 s are held back
  (``cdc.log.kafka_logs``), so the evidence may instead be the new connections through the proxy;
* target connection cut/reset: the sink runner's ``write failed (...); retrying`` when a write
  was in flight; when the connection was idle in the pool, SQLAlchemy's pre-ping replaces it
  without a word, and the evidence is the new connection through the proxy;
* kill -9 of the daemon: on restart, the source's ``starting from <stored position>``.

A stall of the PostgreSQL source's connection must be noticed (``server_timeout: 5``: the
worker's ``RetriableError: ... nothing from the server for ...`` or the heartbeat's ``no answer
from the server within ...``). The other stalls last ``STALL_HOLD`` seconds and must be
recovered from, not necessarily noticed: nothing notices a stalled SQL target connection however
long it lasts (test_stalls.py, xfail), the MariaDB binlog connection only after its 60 s read
timeout, Kafka only after librdkafka's request timeouts.
"""

from __future__ import annotations

import os
import random
import re
import uuid
from pathlib import Path

import pytest

from tests.faults import databases
from tests.faults.harness import (
    Campaign,
    Daemon,
    Fault,
    Writer,
    big_text,
    delete_topics,
    dev,
    differences,
    proxy_for,
    topic_rows,
    wait_for,
)

# serial: the faults restart and kill the stack's PostgreSQL, MariaDB and Kafka.
pytestmark = [pytest.mark.faults, pytest.mark.kafka, pytest.mark.postgres, pytest.mark.serial]

# What the daemon prints (cdc/runtime/supervisor.py, worker.py, runner.py, sink_runner.py):
SOURCE_RETRIES = r"\[src/.*(retriable\)|exited with 75( \(the same error again\))?; restarting)"
SINK_RETRIES = r"\[(wh|lite)/.*(write failed .*retrying|retriable\)|exited with 75( \(the same error again\))?; restarting)"
RESUMED = r"\[src/.*starting from (?!the beginning)"
KAFKA_TROUBLE = r"librdkafka: .*(Disconnected|reset by peer|refused|timed out|Timed out)"


@pytest.fixture
def kafka_proxy(dev_env_for):
    env = dev_env_for("kafka")
    if "KAFKA_FAULT_PROXY" not in env:
        pytest.fail("the stack's Kafka has no FAULTS listener (made before it existed): "
                    "`cdc dev down` and `cdc dev up` again")
    proxy = proxy_for(env["KAFKA_FAULT_LISTENER"], "kafka", int(env["KAFKA_FAULT_PROXY"].rsplit(":", 1)[1]))
    yield proxy
    proxy.close()


def _config(tmp_path: Path, source: str, target_url: str, kafka: str, prefix: str, topics: str) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {source}\n"
        f"sinks:\n"
        f"  - {{name: wh, type: sql, url: '{target_url}', topics: ['{topics}'], batch_wait_ms: 50}}\n"
        f"  - {{name: lite, type: sql, url: 'sqlite:///{tmp_path / 'lite.db'}', topics: ['{topics}'], "
        f"batch_wait_ms: 50}}\n"
        f"http: null\n")
    return path


STALL_HOLD = 6.0  # seconds a stall lasts where nothing notices it sooner (test_stalls.py)


def _proxy_faults(name: str, proxy, detected: str, *, stall_noticed: bool = False) -> list[Fault]:
    """Cut, reset and stall of one proxy's connections. ``stall_noticed``: the client has a deadline
    that must notice the stall (else the stall just lasts ``STALL_HOLD`` seconds)."""
    return [Fault(f"cut {name}", proxy.cut, detected=detected, proxy=proxy),
            Fault(f"reset {name}", proxy.reset, detected=detected, proxy=proxy),
            Fault(f"stall {name}", proxy.stall, proxy.heal, detected=detected,
                  hold=None if stall_noticed else STALL_HOLD)]


def _daemon_kill(daemon: Daemon) -> Fault:
    def inject() -> None:
        daemon.kill()
        daemon.start()

    return Fault("kill -9 the daemon", inject, recovered=RESUMED)


def _faults(daemon: Daemon, source, kafka, target, servers: list[Fault], *,
            source_stall_noticed: bool = False) -> list[Fault]:
    """Every fault of a campaign: cut, reset and stall of the three proxied connections, the
    ``servers``' restarts and kills, three kills of the daemon."""
    return [*_proxy_faults("the source connection", source, SOURCE_RETRIES, stall_noticed=source_stall_noticed),
            *_proxy_faults("Kafka", kafka, KAFKA_TROUBLE),
            *_proxy_faults("the target connection", target, SINK_RETRIES),
            *servers,
            *[_daemon_kill(daemon) for _ in range(3)]]


def _run_campaign(daemon: Daemon, faults: list[Fault], source_progress, sink_progress, seed: int) -> Campaign:
    rng = random.Random(seed)
    rng.shuffle(faults)
    campaign = Campaign(daemon, source_progress, sink_progress, rng)
    for fault in faults:
        campaign.strike(fault)
        if os.environ.get("FAULTS_EXPLORE"):
            r = campaign.records[-1]
            print(f"\n=== {r.fault} ({r.seconds:.1f}s) noticed: {r.detected_line}\n{_interesting(r.log)}", flush=True)
        assert daemon.alive(), f"the daemon exited after {fault.name}:\n{daemon.log_since()[-3000:]}"
    return campaign


def _strike_then_compare(daemon: Daemon, db, faults: list[Fault], source_progress, target_dsn: str, lite: str,
                         bootstrap: str, topic: str, *, writer_seed: int, seed: int, rows=lambda rows: rows) -> None:
    """Strikes ``faults`` (shuffled by ``seed``) at the started daemon under a live writer, then
    asserts the topic and both targets (their rows through ``rows``) equal the source and each
    fault was noticed and recovered from."""
    with Writer(db, seed=writer_seed) as writer:
        campaign = _run_campaign(daemon, faults, source_progress,
                                 {"wh": lambda: databases.max_seq_pg(target_dsn),
                                  "lite": lambda: databases.max_seq_sqlite(lite)}, seed=seed)
    _assert_equal_everywhere(db, writer, bootstrap, topic,
                             {"wh": lambda: rows(databases.pg_rows(target_dsn, db.columns)),
                              "lite": lambda: rows(databases.sqlite_rows(lite, db.columns))}, daemon)
    _assert_each_fault_noticed_and_recovered(campaign)
    print_campaign(campaign, writer)


def _assert_equal_everywhere(db, writer: Writer, bootstrap: str, topic: str, targets: dict, daemon: Daemon) -> None:
    assert writer.error is None, f"the writer failed: {writer.error!r}"
    expected = db.rows()
    assert writer.counts["key_update"] > 20 and writer.counts["update"] > 20 and writer.counts["delete"] > 20

    def topic_matches():
        actual = {k: db.from_topic(v) for k, v in topic_rows(bootstrap, topic).items()}
        return actual == expected or differences(expected, actual)

    def check(read):
        def matches():
            actual = read()
            return actual == expected
        return matches

    try:
        wait_for(lambda: topic_matches() is True, timeout=120, what="the topic to equal the source")
        for name, read in targets.items():
            wait_for(check(read), timeout=120, what=f"target {name} to equal the source")
    except AssertionError as err:
        report = [str(err), "topic: " + str(topic_matches())]
        for name, read in targets.items():
            report.append(f"{name}: " + differences(expected, read()))
        report.append("daemon log (tail):\n" + daemon.log_since()[-4000:])
        raise AssertionError("\n".join(report)) from None


def _assert_each_fault_noticed_and_recovered(campaign: Campaign) -> None:
    unnoticed = [r.fault for r in campaign.records
                 if r.detected_line is None and r.recovered_line is None and not r.fault.startswith("stall")]
    assert not unnoticed, f"faults the daemon's log does not show: {unnoticed}"


@pytest.fixture
def pg_admin(pg_admin_dsn):
    """An admin connection that survives server restarts; drops the databases made through it."""
    admin = psycopg2_admin(pg_admin_dsn)
    yield admin
    admin.drop_databases()


@pytest.fixture
def mysql_database(mysql_url):
    """A fresh MariaDB database (the conftest fixture's connection would not survive a restart)."""
    name = f"f_{uuid.uuid4().hex[:10]}"
    conn = databases.mysql_connect(mysql_url, None)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")
    conn.close()
    yield name
    conn = databases.mysql_connect(mysql_url, None)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    conn.close()


def test_postgres_source_through_cuts_stalls_restarts_and_kills(pg_admin, pg_admin_dsn, dev_env_for, kafka_proxy,
                                                                tmp_path):
    env = dev_env_for("kafka")
    pg_host = pg_admin_dsn.split("@", 1)[1].split("/", 1)[0]
    pg_dsn = pg_admin.create_database("source")
    db = databases.PostgresDocs(pg_dsn)
    rng = random.Random(12)
    db.create(150, lambda: big_text(rng))
    target_dsn = pg_admin.create_database("target")
    target_name = target_dsn.rsplit("/", 1)[1]
    admin = pg_admin

    src_proxy, tgt_proxy = proxy_for(pg_host, "pg-src"), proxy_for(pg_host, "pg-tgt")
    prefix, slot = f"f_{uuid.uuid4().hex[:8]}", f"f_{uuid.uuid4().hex[:8]}"
    source = (f"{{name: src, type: postgres, dsn: 'postgresql://postgres@{src_proxy.address}/{pg_dsn.rsplit('/', 1)[1]}', "
              f"slot: {slot}, tables: ['public.docs'], state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, "
              f"status_interval: 1, server_timeout: 5}}")
    config = _config(tmp_path, source, f"postgresql+psycopg2://postgres@{tgt_proxy.address}/{target_name}",
                     kafka_proxy.address, prefix, f"{prefix}.public.*")
    daemon = Daemon(config)
    lite = str(tmp_path / "lite.db")

    def stored_position():
        return admin.scalar("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))

    faults = _faults(daemon, src_proxy, kafka_proxy, tgt_proxy, [
        Fault("restart postgres", lambda: dev("restart", "postgres"), detected=SOURCE_RETRIES),
        Fault("kill -9 postgres", lambda: (dev("kill", "postgres"), dev("start", "postgres")),
              detected=SOURCE_RETRIES),
        Fault("restart kafka", lambda: dev("restart", "kafka"), detected=KAFKA_TROUBLE, proxy=kafka_proxy),
    ], source_stall_noticed=True)
    daemon.start()
    try:
        _strike_then_compare(daemon, db, faults, stored_position, target_dsn, lite, env["KAFKA_BOOTSTRAP"],
                             f"{prefix}.public.docs", writer_seed=3, seed=5)
    finally:
        daemon.stop()
        src_proxy.close()
        tgt_proxy.close()
        delete_topics(env["KAFKA_BOOTSTRAP"], prefix)


@pytest.mark.mysql
def test_mariadb_source_through_cuts_stalls_restarts_and_kills(mysql_database, mysql_url, pg_admin, pg_admin_dsn,
                                                               dev_env_for, kafka_proxy, tmp_path):
    mysql_db = mysql_database
    env = dev_env_for("kafka")
    pg_host = pg_admin_dsn.split("@", 1)[1].split("/", 1)[0]
    mysql_host = mysql_url.split("@", 1)[1]
    db = databases.MariaDbDocs(mysql_url, mysql_db)
    rng = random.Random(13)
    db.create(150, lambda: big_text(rng))

    target_dsn = pg_admin.create_database("target")
    target_name = target_dsn.rsplit("/", 1)[1]

    src_proxy, tgt_proxy = proxy_for(mysql_host, "mysql-src"), proxy_for(pg_host, "pg-tgt")
    prefix = f"f_{uuid.uuid4().hex[:8]}"
    source = (f"{{name: src, type: mysql, url: 'mysql://root@{src_proxy.address}', server_id: "
              f"{random.randrange(1000, 2**31)}, tables: ['{mysql_db}.docs']}}")
    config = _config(tmp_path, source, f"postgresql+psycopg2://postgres@{tgt_proxy.address}/{target_name}",
                     kafka_proxy.address, prefix, f"{prefix}.{mysql_db}.*")
    daemon = Daemon(config)
    lite = str(tmp_path / "lite.db")

    def stored_position():
        from cdc.log.kafka import KafkaLog
        from cdc.offsets import OffsetStore

        log = KafkaLog(env["KAFKA_BOOTSTRAP"])
        try:
            return str(OffsetStore(log, prefix).load("src"))
        finally:
            log.close()

    faults = _faults(daemon, src_proxy, kafka_proxy, tgt_proxy, [
        Fault("restart mariadb", lambda: dev("restart", "mysql"), detected=SOURCE_RETRIES),
        Fault("kill -9 mariadb", lambda: (dev("kill", "mysql"), dev("start", "mysql")), detected=SOURCE_RETRIES),
        Fault("restart postgres (the target)", lambda: dev("restart", "postgres"), detected=SINK_RETRIES),
    ])
    daemon.start()
    try:
        _strike_then_compare(daemon, db, faults, stored_position, target_dsn, lite, env["KAFKA_BOOTSTRAP"],
                             f"{prefix}.{mysql_db}.docs", writer_seed=4, seed=6, rows=_bytes_blobs)
    finally:
        daemon.stop()
        src_proxy.close()
        tgt_proxy.close()
        delete_topics(env["KAFKA_BOOTSTRAP"], prefix)


def _bytes_blobs(rows: dict[int, dict]) -> dict[int, dict]:
    return {k: {**v, "blob": bytes(v["blob"]) if v["blob"] is not None else None} for k, v in rows.items()}


class psycopg2_admin:  # noqa: N801 - a tiny helper, named for what it wraps
    """An autocommit admin connection that reconnects after a server restart."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn = None
        self.databases: list[str] = []

    def create_database(self, kind: str) -> str:
        name = f"{kind}_{uuid.uuid4().hex[:8]}"
        self.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return self.dsn.rsplit("/", 1)[0] + "/" + name

    def drop_databases(self) -> None:
        """Drop the databases made here and their replication slots (walsenders ended first)."""
        for name in self.databases:
            wait_for(lambda: self._drop(name), timeout=60, what=f"dropping database {name}")
        self.close()

    def _drop(self, name: str) -> bool:
        self.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                     "AND pid <> pg_backend_pid()", (name,))
        self.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE database = %s AND NOT active", (name,))
        if self.scalar("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (name,)):
            return False
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return True

    def _cursor(self):
        import psycopg2

        if self.conn is None or self.conn.closed:
            self.conn = psycopg2.connect(self.dsn, connect_timeout=5)
            self.conn.autocommit = True
        return self.conn.cursor()

    def execute(self, sql: str, params=None) -> None:
        try:
            with self._cursor() as cur:
                cur.execute(sql, params)
        except Exception:
            self.close()
            raise

    def scalar(self, sql: str, params=None):
        try:
            with self._cursor() as cur:
                cur.execute(sql, params)
                row = cur.fetchone()
                return row[0] if row else None
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def print_campaign(campaign: Campaign, writer: Writer) -> None:
    print(f"\nwriter: {writer.counts}, reconnects {writer.reconnects}")
    for record in campaign.records:
        print(f"{record.seconds:6.1f}s  {record.fault:<40} noticed: {record.detected_line or '-'}\n"
              f"{'':48} recovered: {record.recovered_line or '-'}")


def _interesting(log: str) -> str:
    lines = [line[:220] for line in log.splitlines()
             if line[:4].isdigit() and not re.search(r"schema of|phase |INFO .*sql sink .*started", line)]
    return "\n".join(lines[:25])
