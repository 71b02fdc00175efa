"""Joined documents kept by two members of one sink's group (``scale_out: group`` with
``documents:``; sinks/documents/shared.py, cdc/runtime/sink_shares.py), PostgreSQL -> Kafka ->
OpenSearch, under the live writer of test_documents_pipeline (moves, key changes, deletes on every
table of the shop).

Each member is a daemon of its own with a state directory of its own (two "hosts"). Every member
reads every record; the group coordinator of the sink's name divides the documents' shares among
them. A member is killed outright (its process group) once the coordinator lists it as owning
shares and its own reading group's commits moved while it did, then started again; once its
state directory is deleted first, so it reads everything again from offset 0. Then a member is
stopped (SIGSTOP) past its session until the other owns every share and wrote, and resumed: it
must learn of the move before it writes those shares again. A reader polls the
documents throughout and fails on a version going back or a version seen with two contents. At
the end both members own shares and every document equals the SQL join.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.daemon import kill_daemon, run_daemon, stop_daemon, wait_beside
from tests.integration.test_documents_pipeline import DOCUMENTS, Reader, SearchTarget, Writer, _expected, _moved
from tests.integration.test_documents_pipeline import shop as shop  # the fixture
from tests.integration.test_sink_group import Group

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.opensearch]

KILLS = 4
SHARES = 6


def _config(tmp_path: Path, member: str, prefix: str, sink: str, dsn: str, kafka: str, opensearch: str,
            alias: str) -> Path:
    # A member killed outright is noticed after session.timeout.ms: the broker's least, so that the
    # shares move within seconds.
    consumer = f"{{client.id: {member}, session.timeout.ms: 6000, heartbeat.interval.ms: 1000}}"
    path = tmp_path / f"{member}.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 3, "
        f"consumer: {consumer}}}\n"
        f"sources:\n  - {{name: shop, type: postgres, dsn: '{dsn}', tables: ['public.*'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1}}\n"
        f"sinks:\n  - name: {sink}\n    type: opensearch\n    hosts: ['{opensearch}']\n"
        f"    topics: ['{prefix}.public.*']\n    batch_wait_ms: 50\n    scale_out: group\n"
        f"    member: {member}\n    shares: {SHARES}\n    state_dir: '{tmp_path / member}'\n"
        + DOCUMENTS.format(alias=alias, nested="\n            nested: true") + "http: null\n")
    return path


def test_two_members_of_a_document_sink_killed_in_turn_end_equal_to_the_sql_join(shop, kafka_bootstrap,
                                                                                   opensearch_url, tmp_path):
    prefix = f"g{uuid.uuid4().hex[:6]}"
    sink, alias = f"{prefix}-docs", f"{prefix}-orders"

    def config(member: str) -> Path:
        return _config(tmp_path, member, prefix, sink, shop, kafka_bootstrap, opensearch_url, alias)

    target = SearchTarget(opensearch_url, alias)
    shares = Group(kafka_bootstrap, sink)
    source = run_daemon(config("source"), "shop", log="source.log")
    members: dict[str, subprocess.Popen] = {}
    logs = {"m1": "m1.log", "m2": "m2.log"}  # each member's log of its current run
    writer, reader = Writer(shop), Reader(target)
    try:
        for name in ("m1", "m2"):
            members[name] = run_daemon(config(name), sink, log=f"{name}.log")
        wait_beside("the first documents", lambda: target.top_version() > 0, members["m1"])
        writer.start()
        reader.start()
        for kill in range(KILLS):
            victim = ("m1", "m2")[kill % 2]
            reading = Group(kafka_bootstrap, f"{sink}.member.{victim}")

            def owns(victim: str = victim) -> set:
                return shares.owned_by().get(victim, set())

            wait_beside(f"{victim} to own shares", owns, members[victim], limit=240)
            before, top = reading.committed(), target.top_version()
            wait_beside(f"{victim} to read, write and commit while owning shares",
                        lambda r=reading, b=before, t=top, v=victim: owns(v) and _moved(writer, target, t)
                        and any(at > b.get(tp, -1) for tp, at in r.committed().items()), members[victim], limit=240)
            kill_daemon(members.pop(victim))
            if kill == 1:  # its state lost: it reads every record again from offset 0
                shutil.rmtree(tmp_path / victim)
            logs[victim] = f"{victim}-{kill + 1}.log"
            members[victim] = run_daemon(config(victim), sink, log=logs[victim])
        # A stall: m1 stopped (its whole process group) past the session, so the coordinator gives
        # its shares to m2, which writes them; resumed, m1 must hear of it before it writes again.
        # Evidence that this run of m1 (not one killed before, which the coordinator may still
        # list until its session ends) writes shares: its own log says so, and the coordinator
        # agrees.
        m1_log = tmp_path / logs["m1"]
        wait_beside("m1 to write shares", lambda: "this member writes shares" in m1_log.read_text(errors="replace")
                    and shares.owned_by().get("m1"), members["m1"], limit=240)
        stopped_at = len(m1_log.read_text(errors="replace"))
        os.killpg(members["m1"].pid, signal.SIGSTOP)
        try:
            wait_beside("m2 to own every share while m1 is stopped",
                        lambda: len(shares.owned_by().get("m2", ())) == SHARES, members["m2"], limit=120)
            top = target.top_version()
            wait_beside("m2 to write while m1 is stopped", lambda: _moved(writer, target, top), members["m2"],
                        limit=120)
        finally:
            os.killpg(members["m1"].pid, signal.SIGCONT)
        wait_beside("m1 to hear that its shares went",
                    lambda: re.search(r"(lost|revoked) shares", m1_log.read_text(errors="replace")[stopped_at:]),
                    members["m1"], limit=120)
        wait_beside("writes under the last runs", lambda: writer.changes > 1500, source, limit=300)
        writer.stopping.set()
        writer.join(30)
        assert writer.error is None, writer.error
        owners = wait_beside("both members owning shares",
                             lambda: (lambda o: o if len(o) == 2 and all(o.values()) else None)(
                                 {m: s for m, s in shares.owned_by().items() if m in ("m1", "m2")}),
                             source, limit=120)
        assert sum(len(s) for s in owners.values()) == SHARES, owners
        expected = _expected(shop)
        wait_beside("every document equal to the SQL join", lambda: target.documents() == expected, source,
                    limit=300, every=1.0)
    finally:
        writer.stopping.set()
        reader.stopping.set()
        for member in members.values():
            stop_daemon(member)
        stop_daemon(source)
    reader.join(10)
    assert not reader.problems, reader.problems[:5]
    assert reader.reads > 20 and len(reader.seen) > 10
    lost = (tmp_path / "m2-2.log").read_text(errors="replace")
    assert "assigned shares" in lost and "this member writes shares" in lost, "the member with a lost state took shares"
