"""Three processes of one SQL sink sharing its topics as one Kafka consumer group
(``scale_out: group``), PostgreSQL -> Kafka -> PostgreSQL, under a live writer (updates, deletes,
key changes), one member killed outright again and again: the target ends equal to the source.

Each kill comes only after evidence that the member to kill is in the thick of it: the group's
coordinator lists it as owning partitions, and the group's committed offset of one of those
partitions moved while it owned it (so it read, wrote and committed). Each member has its own
``client.id`` (a config file of its own), which is how the coordinator's view names it.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import threading
import time
import uuid
from pathlib import Path

import orjson
import psycopg2
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka.admin import AdminClient

from tests.daemon import kill_daemon, run_daemon, stop_daemon
from tests.integration.pg_capture import wait_until
from tests.integration.test_sql_pipeline import Writer, _rows, _seed

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

PARTITIONS = 6
KILLS = 5


class Group:
    """The consumer group as its coordinator sees it."""

    def __init__(self, kafka: str, group: str) -> None:
        self.admin = AdminClient({"bootstrap.servers": kafka})
        self.group = group

    def _ask(self, request):
        """The coordinator's answer; asked again while it has none (a group it is still loading,
        a busy machine), for at most two minutes."""
        deadline = time.monotonic() + 120
        while True:
            try:
                return request()[self.group].result(20)
            except (concurrent.futures.TimeoutError, KafkaException):
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def owned_by(self) -> dict[str, set[tuple[str, int]]]:
        """client.id -> the partitions the coordinator assigned to that member."""
        description = self._ask(lambda: self.admin.describe_consumer_groups([self.group], request_timeout=20))
        out: dict[str, set[tuple[str, int]]] = {}
        for member in description.members or ():
            parts = member.assignment.topic_partitions if member.assignment else []
            out.setdefault(member.client_id, set()).update((tp.topic, tp.partition) for tp in parts)
        return out

    def hosts(self) -> dict[str, str]:
        """client.id -> the host the coordinator saw the member connect from ("/127.0.0.2")."""
        description = self._ask(lambda: self.admin.describe_consumer_groups([self.group], request_timeout=20))
        return {member.client_id: member.host for member in description.members or ()}

    def committed(self) -> dict[tuple[str, int], int]:
        request = ConsumerGroupTopicPartitions(self.group)
        result = self._ask(lambda: self.admin.list_consumer_group_offsets([request], request_timeout=20))
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0}


def _config(tmp_path: Path, name: str, prefix: str, sink: str, source_dsn: str, target_dsn: str, kafka: str,
            client_id: str) -> Path:
    url = target_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
    # A member killed outright is noticed after session.timeout.ms: the broker's least, so that the
    # test's rebalances come within seconds.
    consumer = f"{{client.id: {client_id}, session.timeout.ms: 6000, heartbeat.interval.ms: 1000}}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: {PARTITIONS}, "
        f"consumer: {consumer}}}\n"
        f"sources:\n  - {{name: src, type: postgres, dsn: '{source_dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"sinks:\n  - {{name: {sink}, type: sql, url: '{url}', topics: ['{prefix}.public.*'], batch_wait_ms: 50, "
        f"batch_size: 500, scale_out: group}}\n"
        f"http: null\n")
    return path


def _wait_for_evidence(group: Group, client_id: str, member: subprocess.Popen) -> set[tuple[str, int]]:
    """Wait until ``client_id`` owns partitions and the group's commit of one of them moved while it
    owned them; returns what it owns."""
    def owns() -> set[tuple[str, int]]:
        assert member.poll() is None, f"member {client_id} exited with {member.returncode}"
        return group.owned_by().get(client_id, set())

    mine = wait_until(owns, timeout=120, what=f"{client_id} to own partitions")
    before = group.committed()

    def committed_while_owning() -> bool:
        now, still = group.committed(), owns()
        return any(now.get(tp, -1) > before.get(tp, -1) for tp in mine & still)

    wait_until(committed_while_owning, timeout=120, what=f"{client_id} to commit an offset")
    return mine


def test_three_members_one_killed_again_and_again_end_equal_to_the_source(pg_dsn, target_dsn, kafka_bootstrap,
                                                                          tmp_path):
    _seed(pg_dsn)
    prefix, sink = f"t_{uuid.uuid4().hex[:8]}", f"wh_{uuid.uuid4().hex[:6]}"

    def config(name: str, client_id: str) -> Path:
        return _config(tmp_path, name, prefix, sink, pg_dsn, target_dsn, kafka_bootstrap, client_id)

    source = run_daemon(config("source", "source"), "src", log="source.log")
    members: dict[str, subprocess.Popen] = {}
    group = Group(kafka_bootstrap, sink)
    try:
        for name in ("steady-1", "steady-2", "victim-0"):
            members[name] = run_daemon(config(name, name), sink, log=f"{name}.log")
        with Writer(pg_dsn, seed=18) as writer:
            for kill in range(KILLS):
                victim = f"victim-{kill}"
                owned = _wait_for_evidence(group, victim, members[victim])
                kill_daemon(members.pop(victim))
                # The killed member's partitions move (a rebalance) once the coordinator notices it;
                # its successor joins meanwhile (another rebalance).
                successor = f"victim-{kill + 1}"
                members[successor] = run_daemon(config(successor, successor), sink, log=f"{successor}.log")
                wait_until(lambda: victim not in group.owned_by(), timeout=60, what=f"{victim} to leave the group")
                assert owned  # it owned these when it died; the others own them now
            _wait_for_evidence(group, f"victim-{KILLS}", members[f"victim-{KILLS}"])
        assert writer.changes > 500
        # Every member is alive and in the group at the end, and the partitions are shared out.
        owners = wait_until(lambda: (lambda o: o if len(o) == 3 and all(o.values()) else None)(group.owned_by()),
                            timeout=60, what="three members owning partitions")
        assert sum(len(parts) for parts in owners.values()) == PARTITIONS
        wait_until(lambda: _rows(target_dsn) == _rows(pg_dsn), timeout=180, what="target == source")
    finally:
        for member in members.values():
            stop_daemon(member)
        stop_daemon(source)


class StallingSqlSink:
    """Builds an SqlSink whose first write waits for ``release`` before it goes to the database:
    the write in flight of a member that loses its partition meanwhile."""

    @staticmethod
    def make(config, stalled: threading.Event, release: threading.Event, landed: threading.Event):
        from sinks.sql.sink import SqlSink

        class Stalling(SqlSink):
            first = True

            def write(self, events):
                if Stalling.first:
                    Stalling.first = False
                    stalled.set()
                    release.wait(120)
                    super().write(events)
                    landed.set()
                    return
                super().write(events)
        return Stalling(config)


def _envelope(version: int, qty: int) -> bytes:
    return orjson.dumps({"before": None, "after": {"id": 1, "qty": qty}, "op": "u", "ts_ms": 0,
                         "source": {"connector": "postgresql", "name": "src", "db": "db", "schema": "public",
                                    "table": "items", "snapshot": "false", "version": version}})


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_a_late_write_of_a_member_that_lost_its_partition_does_not_regress_the_row(pg_dsn, kafka_bootstrap,
                                                                                    strategy):
    """Member A's write stalls past ``max.poll.interval.ms``: the group takes its partition away and
    gives it to member B, which writes the key's older and then its newer version and commits. Then
    A's stalled write (the older version) lands: the version guard keeps the newer row, and the
    group's committed offset is not moved back by A. With the default (cooperative) assignment and
    with the eager ``range`` one, which revokes every partition at each rebalance."""
    from cdc.log.base import TopicSettings
    from cdc.log.kafka import KafkaLog
    from cdc.runtime.sink_runner import SinkRunner
    from cdc.serde import Record
    from sinks.sql.config import SqlSinkConfig
    from sinks.sql.sink import SqlSink

    prefix, name = f"r_{uuid.uuid4().hex[:8]}", f"race_{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.public.items"
    # A member that does not poll for 6 s is out of the group (the broker's least session timeout).
    fast = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000, "heartbeat.interval.ms": 1000,
            "partition.assignment.strategy": strategy}
    logs = [KafkaLog(kafka_bootstrap, consumer_config=fast) for _ in range(3)]
    admin, log_a, log_b = logs
    admin.ensure_topic(topic, TopicSettings(partitions=1))
    producer = admin.writer()

    def publish(version: int, qty: int) -> None:
        producer.publish([Record(topic, b'{"id":1}', _envelope(version, qty))])
        producer.flush(30)

    url = pg_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
    config = SqlSinkConfig(name=name, type="sql", url=url, topics=[f"{prefix}.*"], batch_wait_ms=50,
                           scale_out="group")
    stalled, release, landed = threading.Event(), threading.Event(), threading.Event()
    runner_a = SinkRunner(StallingSqlSink.make(config, stalled, release, landed), log_a, prefix)
    runner_b = SinkRunner(SqlSink(config), log_b, prefix)
    stops = {runner_a: threading.Event(), runner_b: threading.Event()}
    errors: dict[SinkRunner, BaseException] = {}

    def run(runner: SinkRunner) -> None:
        try:
            runner.run(stops[runner])
        except BaseException as err:  # noqa: BLE001 - the test reports it
            errors[runner] = err

    def row() -> int | None:
        conn = psycopg2.connect(pg_dsn)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT qty FROM items WHERE id = 1")
                found = cur.fetchone()
                return found[0] if found else None
        except psycopg2.errors.UndefinedTable:
            return None
        finally:
            conn.close()

    reader = admin.reader(name)  # reads the group's commits; does not join
    threads = [threading.Thread(target=run, args=(r,)) for r in (runner_a, runner_b)]
    try:
        publish(10, 1)
        threads[0].start()
        assert stalled.wait(120), "member A never began its write"
        threads[1].start()  # joins while A owns the only partition; gets it once A is out
        wait_until(lambda: row() == 1, timeout=120, what="B to write the older version after taking the partition")
        publish(20, 2)
        wait_until(lambda: row() == 2 and reader.committed([(topic, 0)])[(topic, 0)] == 2, timeout=60,
                   what="B to write and commit the newer version")
        release.set()
        assert landed.wait(60), "A's late write did not return"
        assert row() == 2  # A's older version landed after B's newer one and changed nothing
        # A learns it lost the partition (its commit is refused, or dropped); B's commit stands.
        wait_until(lambda: not runner_a.reading.membership or not runner_a.reading.membership.owned, timeout=60,
                   what="A to learn that its partition is gone")
        assert reader.committed([(topic, 0)])[(topic, 0)] == 2
        assert runner_a not in errors and runner_b not in errors, errors
    finally:
        release.set()
        for stop in stops.values():
            stop.set()
        for thread in threads:
            thread.join(60)
        reader.close()
        producer.close()
        for log in logs:
            log.close()


def test_a_rebuild_or_bootstrap_of_a_grouped_sink_waits_for_an_empty_group(kafka_bootstrap):
    """Reading every partition from offset 0 cannot be split among members: while one runs, a
    rebuild and a bootstrap are refused with a ConfigError that says so; once the group is empty,
    a bootstrap runs as one process and reads everything."""
    from cdc.api import SinkConfig
    from cdc.errors import ConfigError
    from cdc.log.kafka import KafkaLog
    from cdc.runtime.sink_runner import SinkRunner
    from tests.integration.test_sink_runner import RecordingSink, _publish

    prefix, name = f"b_{uuid.uuid4().hex[:8]}", f"boot_{uuid.uuid4().hex[:6]}"
    log = KafkaLog(kafka_bootstrap)
    _publish(log, 200, keys=20, prefix=prefix)
    config = SinkConfig(name=name, type="recording", topics=[f"{prefix}.*"], batch_wait_ms=50, scale_out="group")
    member = SinkRunner(RecordingSink(config), log, prefix)
    stop = threading.Event()
    thread = threading.Thread(target=member.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: member.reading.membership is not None and member.reading.membership.owned, timeout=60,
                   what="the member to own partitions")
        for attempt in (lambda r: r.rebuild(threading.Event()),
                        lambda r: r.run(threading.Event(), from_start=True, until_caught_up=True)):
            with pytest.raises(ConfigError, match="cannot be split among members"):
                attempt(SinkRunner(RecordingSink(config), log, prefix))
    finally:
        stop.set()
        thread.join(60)
    wait_until(lambda: log.group_members(name) == 0, timeout=60, what="the group to be empty")
    alone = RecordingSink(config)
    SinkRunner(alone, log, prefix).run(threading.Event(), from_start=True, until_caught_up=True)
    assert len(alone.generations[1]) == 20
    log.close()
