"""The pieces of the signal storms (test_stop_storms.py, test_spark_stop_storm.py): a burst of stop
signals, worker processes to aim it at, and what a stop must leave behind.

A burst is what a stop from a service manager or a terminal looks like to one process, and more:
SIGTERM to the process group (systemd's default, Ctrl-C's SIGINT likewise), then SIGTERM and
SIGINT to the process itself, back to back or a millisecond apart (the supervisor's own SIGTERM to
its worker follows the group's). Every signal must come to the one stop request: the process
drains and exits within its grace, its position stored.

What "stored" means, checked after every stop:

* a source (``SourceLedger``): its stored offset is the seq of the last record in the topic, and
  the topic's end offset is that seq too: everything published was acknowledged and stored (a
  drain), and nothing was published twice (the next start resumes right after it). The
  generator's transactions are one event long, so each batch ends on a checkpoint;
* a sink (``SinkLedger``): its store holds, per key, exactly the newest row among the records
  below its committed offset: it committed what it wrote and wrote nothing past the commit.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import orjson

from cdc.log.base import Log, TopicSettings
from cdc.offsets import offsets_topic
from cdc.runtime.worker import worker_main
from tests.faults.harness import wait_for

TOPIC = "public.items"  # the generator's table
EVIDENCE_S = 120  # a bound on a broken test, not a timing assertion
STORM_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# Imported once by the forkserver, not by each worker: a spawned worker spends a second or two
# importing the framework, which 50 stops would pay 50 times.
PRELOAD = ["cdc.runtime.worker", "cdc.runtime.runner", "cdc.runtime.sink_runner", "cdc.config", "cdc.log.open",
           "cdc.log.embedded", "cdc.log.kafka", "cdc.offsets", "sources.generator", "sinks.sql.sink"]


def burst(pid: int, rng: random.Random) -> list[str]:
    """SIGTERM to ``pid``'s process group, then two to four SIGTERM/SIGINT to ``pid``; what was sent."""
    os.killpg(pid, signal.SIGTERM)
    sent = ["SIGTERM to the group"]
    for _ in range(rng.randint(2, 4)):
        pause = rng.choice((0.0, 0.0, 0.0005, 0.002))
        if pause:
            time.sleep(pause)
        signum = rng.choice(STORM_SIGNALS)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:  # it finished its drain already
            break
        sent.append(f"{signal.Signals(signum).name}" + (f" after {pause * 1000:g} ms" if pause else ""))
    return sent


def tail_text(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


# --- workers ----------------------------------------------------------------------------------

def _worker_in_own_session(config: str, name: str, conn, drain_timeout: float, log_path: str) -> None:
    """``worker_main`` as the supervisor runs it, but in a session of its own, so that a signal to
    its process group reaches it and nothing else; its output appended to ``log_path``."""
    os.setsid()
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    worker_main(config, name, conn, logging.INFO, drain_timeout)


class Workers:
    """Worker processes forked from a forkserver that imported the framework once."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)

    def start(self, config: Path, name: str, log_path: Path, drain_timeout: float):
        """The worker process, and the read end of its report pipe (kept open: the worker's
        reports must not fail for want of a reader)."""
        reports, child = self.ctx.Pipe(duplex=False)
        process = self.ctx.Process(target=_worker_in_own_session, name=f"storm-{name}",
                                   args=(str(config), name, child, drain_timeout, str(log_path)))
        process.start()
        child.close()
        # Its own session once it reports: a burst before that would reach the forkserver's group.
        wait_for(lambda: reports.poll() or process.exitcode is not None, timeout=EVIDENCE_S,
                 what=f"worker {name}'s first report")
        assert process.exitcode is None, f"worker {name} exited {process.exitcode}:\n{tail_text(log_path)}"
        assert os.getpgid(process.pid) == process.pid
        return process, reports


def stop_within(process, grace: float, what: str, log_path: Path) -> int:
    """Its exit code once it exited; fails (and kills its group) if it is alive after ``grace``."""
    process.join(grace)
    if process.exitcode is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.join()
        raise AssertionError(f"{what}: still running {grace:.0f}s later: deadlocked, or not draining:\n"
                             f"{tail_text(log_path)}")
    return process.exitcode


# --- what a stop leaves -----------------------------------------------------------------------

class Tail:
    """The records of one topic partition, read on as it grows (what compaction left of them)."""

    def __init__(self, log_: Log, topic: str) -> None:
        self.log, self.tp = log_, (topic, 0)
        self.records: list = []
        self._reader = None

    def end(self) -> int:
        if self.tp[0] not in self.log.topics():
            return 0
        return self.log.end_offsets(self.tp[0])[self.tp]

    def read_to(self, end: int) -> list:
        if self._reader is None:
            self._reader = self.log.reader()
            self._reader.assign({self.tp: 0})
        deadline = time.monotonic() + EVIDENCE_S
        while (missing := end - self._reader.position(self.tp)) > 0:
            self.records += self._reader.poll(min(missing, 5000), 0.5)  # returns once it has them
            assert time.monotonic() < deadline, f"read {len(self.records)} records of {self.tp}, not to {end}"
        return self.records

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def seq_of(record) -> int:
    return orjson.loads(record.value)["source"]["seq"]


class SourceLedger:
    """The generator source ``name``: its stored offset against what the log holds."""

    def __init__(self, log_: Log, prefix: str, name: str = "gen") -> None:
        self.name = name
        self.data = Tail(log_, f"{prefix}.{TOPIC}")
        self.offsets = Tail(log_, offsets_topic(prefix))
        self.stored = 0

    def published(self) -> int:
        """Records in its topic: evidence that it is running when this grows."""
        return self.data.end()

    def _stored(self) -> int:
        key = orjson.dumps({"source": self.name})
        mine = [r for r in self.offsets.read_to(self.offsets.end()) if r.key == key]
        return orjson.loads(mine[-1].value)["seq"] if mine else 0

    def stored_moved(self) -> bool:
        return self._stored() > self.stored

    def check_stop(self, what: str) -> int:
        """After a stop: stored offset == seq of the topic's last record == records ever in the
        topic (its end offset); the stored offset, which must have moved on."""
        stored, end = self._stored(), self.data.end()
        last = seq_of(self.data.read_to(end)[-1])
        assert stored == last, f"{what}: stored offset {stored}, but the log acknowledged up to seq {last}"
        assert end == last, f"{what}: {end} records for seqs 1..{last}: a stop did not drain, so its next " \
                            f"start published again what the log had"
        assert stored > self.stored, f"{what}: the stored offset did not move ({stored})"
        self.stored = stored
        return stored

    def close(self) -> None:
        self.data.close()
        self.offsets.close()


class SinkLedger:
    """The SQL sink ``name`` (SQLite ``db``): its committed offset against its store. Its topic
    must not be compacted while the test runs (``keep_records``)."""

    def __init__(self, log_: Log, prefix: str, db: Path, name: str = "lite") -> None:
        self.log, self.db, self.name = log_, db, name
        self.data = Tail(log_, f"{prefix}.{TOPIC}")
        self.committed = 0
        self.expected: dict[int, int] = {}  # key -> seq of its newest record below the commit

    def _committed(self) -> int:
        reader = self.log.reader(self.name)
        try:
            return reader.committed([self.data.tp])[self.data.tp] or 0
        finally:
            reader.close()

    def committed_moved(self) -> bool:
        return self._committed() > self.committed

    def check_stop(self, what: str) -> int:
        committed = self._committed()
        assert committed > self.committed, f"{what}: the committed offset did not move ({committed})"
        records = self.data.read_to(committed)
        assert [r.offset for r in records[:committed]] == list(range(committed)), f"{self.data.tp} was compacted"
        for record in records[self.committed:committed]:
            self.expected[orjson.loads(record.key)["id"]] = seq_of(record)
        with sqlite3.connect(self.db) as conn:
            stored = dict(conn.execute("SELECT id, seq FROM items"))
        differ = sorted(k for k, v in self.expected.items() if stored.get(k) != v)
        extra = set(stored) - set(self.expected)
        assert not differ and not extra, (
            f"{what}: the store differs from the records below its committed offset {committed}: "
            f"{len(differ)} keys differ (e.g. {[(k, self.expected[k], stored.get(k)) for k in differ[:5]]}: key, "
            f"expected seq, stored seq), {len(extra)} keys only past the commit")
        self.committed = committed
        return committed

    def close(self) -> None:
        self.data.close()


def keep_records(log_: Log, prefix: str) -> None:
    """Create the generator's topic and the offsets topic uncompacted for a day (embedded log)."""
    for topic in (f"{prefix}.{TOPIC}", offsets_topic(prefix)):
        log_.ensure_topic(topic, TopicSettings(partitions=1, min_compaction_lag_ms=86_400_000))


def wait_while_alive(predicate, what: str, alive, log_path: Path, timeout: float = EVIDENCE_S) -> None:
    """Poll ``predicate`` until it holds; fail at once if the process exits meanwhile."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert alive(), f"the process exited while waiting for {what}:\n{tail_text(log_path)}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{tail_text(log_path)}"
        time.sleep(0.02)
