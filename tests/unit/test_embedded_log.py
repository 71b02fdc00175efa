"""What only the embedded log promises: crash atomicity, several processes at once, compaction timing."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter as Tally

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.errors import DeliveryError, PermanentError
from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.log.partitioner import partition_for
from cdc.positions import Counter
from cdc.serde import Record

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Publishes batches of known, varying size forever; each value says its batch and the batch's size.
CRASHING_WRITER = """
import sys
from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.serde import Record

log = EmbeddedLog(sys.argv[1], fsync=sys.argv[2] == "1", compact_interval=0.05)
log.ensure_topic("t", TopicSettings(partitions=3))
writer = log.writer()
batch = first = int(sys.argv[3])
while True:
    size = 50 + batch * 37 % 400
    records = [Record("t", f"{batch}:{i}".encode(), f"{batch}:{size}".encode()) for i in range(size)]
    records.append(Record("t", f"all:{batch}".encode(), f"{batch}:{size}".encode(), to_all_partitions=True))
    writer.publish(records)
    if batch == first:
        print("ready", flush=True)
    batch += 1
"""

# Writes n records (keys repeat, values are 0..n-1) in small batches, slowly enough to be read meanwhile.
STEADY_WRITER = """
import sys, time
from cdc.log.embedded import EmbeddedLog
from cdc.serde import Record

log = EmbeddedLog(sys.argv[1], fsync=False, compact_interval=1e9)
writer = log.writer()
n, i, batch = int(sys.argv[2]), 0, 0
while i < n:
    size = min(1 + batch * 53 % 300, n - i)
    writer.publish([Record("t", f'{{"id": {j % 97}}}'.encode(), str(j).encode()) for j in range(i, i + size)])
    i += size
    batch += 1
    time.sleep(0.005)
writer.close()
log.close()
"""


def _python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=ROOT, **kwargs)


def _rows(log: EmbeddedLog, topic: str) -> list[tuple[bytes, bytes | None]]:
    return [(r.key, r.value) for r in log.read_all(topic, timeout=10)]


@pytest.mark.parametrize("fsync", [True, False])
def test_a_killed_writer_leaves_only_whole_batches(tmp_path, fsync):
    rng = random.Random(7)
    batches: list[int] = []
    for _ in range(5):  # kill it at various points, restarting after the last whole batch each time
        proc = _python(CRASHING_WRITER, str(tmp_path), "1" if fsync else "0", str(len(batches)),
                       stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.25))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        assert proc.returncode == -signal.SIGKILL

        log = EmbeddedLog(tmp_path)
        records = log.read_all("t", timeout=10)
        per_batch = Tally(r.value for r in records)
        before, batches = len(batches), sorted(int(value.split(b":")[0]) for value in per_batch)
        assert len(batches) > before
        assert batches == list(range(len(batches)))  # batches commit in order: a prefix of them
        for value, count in per_batch.items():
            size = int(value.split(b":")[1])
            assert count == size + 3, f"batch {value!r}: {count} of {size + 3} records"
        log.close()

    log = EmbeddedLog(tmp_path)
    ends = log.end_offsets("t")
    for (_topic, partition), end in ends.items():
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == list(range(end))  # dense, no duplicates (the keys are all distinct)
    assert len({(r.partition, r.key) for r in records}) == len(records)

    writer = log.writer()  # the log is usable after the crash, and continues at the end
    writer.publish([Record("t", b"after", b"crash")])
    writer.close()
    p = partition_for(b"after", 3)
    assert log.end_offsets("t")[("t", p)] == ends[("t", p)] + 1
    log.close()


def test_a_reader_in_another_process_sees_every_record_once_in_order(tmp_path):
    n = 20_000
    log = EmbeddedLog(tmp_path)
    log.ensure_topic("t", TopicSettings(partitions=3))
    reader = log.reader("g")
    reader.assign({("t", p): 0 for p in range(3)})
    proc = _python(STEADY_WRITER, str(tmp_path), str(n))
    got = []
    read_while_writing = False
    deadline = time.monotonic() + 60
    try:
        while len(got) < n and time.monotonic() < deadline:
            batch = reader.poll(1000, 0.5)
            if batch and proc.poll() is None:
                read_while_writing = True
            got += batch
    finally:
        assert proc.wait(60) == 0
    assert read_while_writing
    got += reader.poll(1000, 0.2)  # nothing more may come
    assert sorted(int(r.value) for r in got) == list(range(n))
    for p in range(3):
        mine = [r for r in got if r.partition == p]
        assert [r.offset for r in mine] == list(range(len(mine)))
        assert all(partition_for(r.key, 3) == p for r in mine)
        assert reader.position(("t", p)) == len(mine)
    last: dict[bytes, int] = {}
    for r in got:  # per key, values arrive in the order they were written
        assert int(r.value) > last.get(r.key, -1)
        last[r.key] = int(r.value)
    reader.close()
    log.close()


def _wait_until_ms(target_ms: int) -> None:
    delay = target_ms - time.time_ns() // 1_000_000
    if delay > 0:
        time.sleep(delay / 1000)


def test_compaction_respects_min_compaction_lag_and_delete_retention(tmp_path):
    log = EmbeddedLog(tmp_path, fsync=False, compact_interval=3600)
    log.ensure_topic("t", TopicSettings(min_compaction_lag_ms=1000, delete_retention_ms=2000))
    writer = log.writer()
    writer.publish([Record("t", b"a", b"a1"), Record("t", b"b", b"b1")])
    writer.publish([Record("t", b"a", b"a2"), Record("t", b"b", None)])
    written_ms = max(r.timestamp_ms for r in log.read_all("t"))

    _wait_until_ms(written_ms + 50)
    log.compact("t")
    if time.time_ns() // 1_000_000 - written_ms >= 900:
        pytest.skip("the machine is too slow to compact within the compaction lag")
    # Superseded, but younger than the lag: nothing goes.
    assert _rows(log, "t") == [(b"a", b"a1"), (b"b", b"b1"), (b"a", b"a2"), (b"b", None)]

    _wait_until_ms(written_ms + 1300)
    log.compact("t")
    # Past the lag the superseded values go; the tombstone stays for its retention.
    assert _rows(log, "t") == [(b"a", b"a2"), (b"b", None)]

    _wait_until_ms(written_ms + 2300)
    log.compact("t")
    assert _rows(log, "t") == [(b"a", b"a2")]
    writer.close()
    log.close()


def test_end_offsets_never_shrink_when_compaction_removes_the_last_records(tmp_path):
    log = EmbeddedLog(tmp_path, compact_interval=3600)
    log.ensure_topic("t", TopicSettings(partitions=2, delete_retention_ms=0))
    writer = log.writer()
    keys = [b"k%d" % i for i in range(3)]
    writer.publish([Record("t", keys[i % 3], b"v%d" % i) for i in range(30)])
    writer.publish([Record("t", key, None) for key in keys])  # delete every key
    ends = log.end_offsets("t")
    assert sum(ends.values()) == 33
    time.sleep(0.01)
    log.compact("t")
    assert _rows(log, "t") == []  # the reader still reaches the end offsets across the gaps
    assert log.end_offsets("t") == ends
    reopened = EmbeddedLog(tmp_path)
    assert reopened.end_offsets("t") == ends
    reopened.close()

    writer.publish([Record("t", b"k0", b"again")])
    p = partition_for(b"k0", 2)
    (record,) = log.read_all("t")
    assert (record.partition, record.offset) == (p, ends[("t", p)])  # offsets are never reused
    writer.close()
    log.close()


def test_a_reader_without_a_group_cannot_commit(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.ensure_topic("t")
    reader = log.reader(None)
    with pytest.raises(PermanentError, match="group"):
        reader.commit({("t", 0): 1})
    reader.close()
    log.close()


def test_publishing_to_an_unknown_topic_fails_whole_and_poisons_the_writer(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.ensure_topic("t")
    writer = log.writer()
    writer.publish([Record("t", b"a", b"1")], Counter(1))
    with pytest.raises(DeliveryError, match="nope") as caught:
        writer.publish([Record("t", b"b", b"2"), Record("nope", b"c", b"3")], Counter(2))
    assert caught.value.retriable is False
    assert log.end_offsets("t") == {("t", 0): 1}  # nothing of the failed batch was written
    with pytest.raises(DeliveryError):
        writer.flush()  # and no checkpoint past the failure is reported
    writer.close()
    log.close()


def test_the_writer_compacts_on_its_own(tmp_path):
    log = EmbeddedLog(tmp_path, compact_interval=0)
    log.ensure_topic("t", TopicSettings(partitions=2))
    writer = log.writer()
    for round_ in range(3):
        writer.publish([Record("t", b"k%d" % i, b"%d" % round_) for i in range(50)])
    assert sorted(_rows(log, "t")) == sorted((b"k%d" % i, b"2") for i in range(50))
    assert sum(log.end_offsets("t").values()) == 150
    writer.close()
    log.close()


def test_writers_in_threads_sharing_one_log_get_dense_offsets(tmp_path):
    log = EmbeddedLog(tmp_path, fsync=False)
    log.ensure_topic("t", TopicSettings(partitions=2))

    def write(name: str) -> None:
        writer = log.writer()
        for b in range(50):
            writer.publish([Record("t", f"{name}:{b}:{i}".encode(), b"v") for i in range(20)])
        writer.close()

    threads = [threading.Thread(target=write, args=(f"w{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = log.read_all("t")
    assert len(records) == len({r.key for r in records}) == 3 * 50 * 20
    for p in range(2):
        assert [r.offset for r in records if r.partition == p] == list(range(log.end_offsets("t")[("t", p)]))
    log.close()


def test_poll_blocks_until_a_record_arrives_or_the_timeout(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.ensure_topic("t")
    reader = log.reader()
    reader.assign({("t", 0): 0})
    started, cpu = time.monotonic(), time.thread_time()
    assert reader.poll(10, 0.3) == []
    assert 0.25 <= time.monotonic() - started < 2
    assert time.thread_time() - cpu < 0.1  # it waited, it did not spin

    def publish_later() -> None:
        time.sleep(0.3)
        writer = log.writer()
        writer.publish([Record("t", b"k", b"v")])
        writer.close()

    thread = threading.Thread(target=publish_later)
    started = time.monotonic()
    thread.start()
    got = reader.poll(10, 10)
    waited = time.monotonic() - started
    thread.join()
    assert [(r.key, r.value) for r in got] == [(b"k", b"v")]
    assert 0.25 <= waited < 3
    reader.close()
    log.close()


# A publish: (key number, value or None for a tombstone) per record; then whether to compact.
_steps = st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 7), st.none() | st.binary(max_size=3)),
                                     min_size=1, max_size=12), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_steps, drop_tombstones=st.booleans())
def test_compaction_in_any_interleaving_keeps_exactly_each_keys_newest_record(tmp_path_factory, steps,
                                                                             drop_tombstones):
    # Every record is past the lag at once (lag 0), so a pass cleans everything written before it.
    # The model: in publish order, each key's newest record; a tombstone also goes once it was
    # cleaned with a retention of 0. Offsets never move; reads skip the gaps.
    path = tmp_path_factory.mktemp("log")
    log = EmbeddedLog(path, fsync=False, compact_interval=3600)
    log.ensure_topic("t", TopicSettings(partitions=2, min_compaction_lag_ms=0,
                                        delete_retention_ms=0 if drop_tombstones else 3_600_000))
    writer = log.writer()
    newest: dict[bytes, bytes | None] = {}
    cleaned_tombstones: set[bytes] = set()
    for records, compact in steps:
        batch = [Record("t", b"k%d" % k, v) for k, v in records]
        writer.publish(batch)
        for record in batch:
            newest[record.key] = record.value
            cleaned_tombstones.discard(record.key)
        if compact:
            time.sleep(0.002)  # the records' millisecond is past: within the lag of 0
            log.compact("t")
            if drop_tombstones:
                cleaned_tombstones.update(k for k, v in newest.items() if v is None)
    rows = log.read_all("t")
    expected = {k: v for k, v in newest.items() if k not in cleaned_tombstones}
    last_compacted = steps[-1][1]
    if last_compacted:  # everything was cleaned: exactly one record per key, each named by ``latest``
        assert sorted((r.key, r.value) for r in rows) == sorted(expected.items())
        import sqlite3

        check = sqlite3.connect(path / "log.db")
        assert sorted(check.execute("SELECT key, id & ? FROM latest", ((1 << 40) - 1,))) == \
            sorted((r.key, r.offset) for r in rows)
        check.close()
    # Always: each key's newest record is there, and nothing of a key comes after its newest.
    by_key: dict[bytes, list] = {}
    for r in rows:
        by_key.setdefault(r.key, []).append(r.value)
    for key, value in expected.items():
        assert by_key[key][-1] == value
    assert set(by_key) == set(expected)
    offsets = [(r.partition, r.offset) for r in rows]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    writer.close()
    log.close()


_OLD_LAYOUT = """
CREATE TABLE topics (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, cleanup_policy TEXT NOT NULL,
    min_compaction_lag_ms INTEGER NOT NULL, delete_retention_ms INTEGER NOT NULL, retention_ms INTEGER);
CREATE TABLE partitions (
    id INTEGER PRIMARY KEY, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL DEFAULT 0, clean_offset INTEGER NOT NULL DEFAULT 0,
    UNIQUE (topic, partition));
CREATE TABLE records (
    id INTEGER PRIMARY KEY, key BLOB, value BLOB, timestamp_ms INTEGER NOT NULL, headers BLOB);
CREATE INDEX records_by_key ON records (key);
CREATE INDEX tombstones ON records (timestamp_ms) WHERE value IS NULL;
CREATE TABLE group_offsets (
    grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition)) WITHOUT ROWID;
"""


def test_a_log_compacted_by_the_key_index_is_compacted_by_latest_after_reopening(tmp_path):
    # A log made before the ``latest`` table: its clean section (offsets 0-1) deduplicated by the
    # index of every key; offsets 2-3 not yet. Opened now, its clean records' keys are known to
    # the next pass, which removes them when newer records of those keys come.
    import sqlite3

    conn = sqlite3.connect(tmp_path / "log.db")
    conn.executescript(_OLD_LAYOUT)
    conn.execute("INSERT INTO topics VALUES ('t', 1, 'compact', 0, 3600000, NULL)")
    conn.execute("INSERT INTO partitions (id, topic, partition, next_offset, clean_offset) VALUES (1, 't', 0, 4, 2)")
    base = 1 << 40
    conn.executemany("INSERT INTO records (id, key, value, timestamp_ms) VALUES (?, ?, ?, 0)",
                     [(base, b"a", b"a1"), (base + 1, b"b", b"b1"), (base + 2, b"c", b"c1"), (base + 3, b"a", b"a2")])
    conn.commit()
    conn.close()

    log = EmbeddedLog(tmp_path, fsync=False, compact_interval=3600)
    writer = log.writer()
    writer.publish([Record("t", b"b", b"b2")])
    time.sleep(0.002)
    log.compact("t")
    assert _rows(log, "t") == [(b"c", b"c1"), (b"a", b"a2"), (b"b", b"b2")]
    check = sqlite3.connect(tmp_path / "log.db")
    assert check.execute("SELECT name FROM sqlite_master WHERE name = 'records_by_key'").fetchall() == []
    assert sorted(check.execute("SELECT key, id - ? FROM latest", (base,))) == [(b"a", 3), (b"b", 4), (b"c", 2)]
    check.close()
    writer.close()
    log.close()


def test_a_pass_with_a_deadline_does_one_chunk_and_starts_at_its_turn(tmp_path, monkeypatch):
    # A writer's pass is bounded (its publishes wait for it): past the deadline it stops after a
    # chunk, and the partition it starts at turns, so that a busy one cannot starve the others.
    import sqlite3

    import cdc.log.embedded_compaction as compaction

    monkeypatch.setattr(compaction, "_CHUNK", 5)
    log = EmbeddedLog(tmp_path, fsync=False, compact_interval=3600)
    log.ensure_topic("t", TopicSettings(partitions=2, min_compaction_lag_ms=0))
    writer = log.writer()
    writer.publish([Record("t", b"k%d" % (i % 4), b"%d" % i) for i in range(40)])
    time.sleep(0.002)

    def clean() -> list[int]:
        check = sqlite3.connect(tmp_path / "log.db")
        try:
            return [c for c, in check.execute("SELECT clean_offset FROM partitions ORDER BY partition")]
        finally:
            check.close()

    topic = log._require("t")
    ends = [log.end_offsets("t")[("t", p)] for p in range(2)]
    assert min(ends) > 5  # both partitions need more than one chunk
    assert compaction.compact_topic(topic, log._conn(), deadline=0, turn=1) is False
    assert clean() == [0, 5]
    assert compaction.compact_topic(topic, log._conn(), deadline=0, turn=2) is False
    assert clean() == [5, 5]
    assert compaction.compact_topic(topic, log._conn()) is True
    assert clean() == ends
    assert sorted(_rows(log, "t")) == sorted((b"k%d" % k, b"%d" % (36 + k)) for k in range(4))
    writer.close()
    log.close()


def test_an_older_version_compacting_between_openings_leaves_latest_right(tmp_path):
    # An older version (compacting by an index of every key, which it makes again) opens the log
    # between two openings by this one: its compaction is not in ``latest``. Opened again, this
    # version finds each key's clean record anew, so a delete after that removes the key whole
    # instead of bringing its older value back.
    import sqlite3

    settings = TopicSettings(partitions=1, min_compaction_lag_ms=0, delete_retention_ms=0)
    log = EmbeddedLog(tmp_path, fsync=False, compact_interval=3600)
    log.ensure_topic("t", settings)
    writer = log.writer()
    writer.publish([Record("t", b"K", b"v1")])
    time.sleep(0.002)
    log.compact("t")  # latest: K -> offset 0
    writer.close()
    log.close()

    old = sqlite3.connect(tmp_path / "log.db", isolation_level=None)  # what the older version does
    base = old.execute("SELECT id FROM partitions").fetchone()[0] << 40
    old.execute("CREATE INDEX records_by_key ON records (key)")
    old.execute("INSERT INTO records (id, key, value, timestamp_ms) VALUES (?, ?, ?, 0)", (base + 1, b"K", b"v2"))
    old.execute("DELETE FROM records WHERE id = ?", (base,))  # its compaction: v1 superseded by v2
    old.execute("UPDATE partitions SET next_offset = 2, clean_offset = 2")
    old.close()

    log = EmbeddedLog(tmp_path, fsync=False, compact_interval=3600)
    writer = log.writer()
    writer.publish([Record("t", b"K", None)])
    time.sleep(0.002)
    log.compact("t")
    assert _rows(log, "t") == []
    writer.close()
    log.close()


def test_a_topic_far_behind_does_not_keep_a_writers_other_topics_from_compaction(tmp_path, monkeypatch):
    # Every pass is cut after one chunk here; the busy topic never catches up, and the quiet one
    # still gets its turn, each pass starting at the next topic.
    import cdc.log.embedded as embedded
    import cdc.log.embedded_compaction as compaction

    monkeypatch.setattr(embedded, "_PASS_S", 0.0)
    monkeypatch.setattr(compaction, "_CHUNK", 5)
    log = EmbeddedLog(tmp_path, fsync=False, compact_interval=0)
    for topic in ("a_busy", "b_quiet"):
        log.ensure_topic(topic, TopicSettings(partitions=1, min_compaction_lag_ms=0))
    writer = log.writer()
    for i in range(100):
        writer.publish([Record("a_busy", b"k%d" % (j % 3), b"%d" % i) for j in range(10)]
                       + [Record("b_quiet", b"same", b"%d" % i)])
        time.sleep(0.002)
    assert len(_rows(log, "b_quiet")) <= 6  # one chunk of it behind at most, not a hundred records
    writer.close()
    log.close()
