"""The pieces of the fault suite: the daemon as a subprocess, live writers, evidence, faults.

Every fault waits for evidence that the pipeline is moving (the source's stored position moved
AND every sink's target received newer rows) before it strikes, then waits for the daemon to show
in its log that it noticed (where the fault is one a client can notice), then heals. Nothing
sleeps blindly: a loaded machine only makes the waits longer, never makes a strike land during
start-up.

The daemon runs as ``cdc run CONFIG`` in a session of its own, so ``kill -9`` of its process group
takes the supervisor and every worker at once (a machine crash, as far as the daemon knows).
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.proxy import FaultProxy

BIG = 9000  # random bytes per big value: ~12 kB of base64 text, incompressible, stored out of line


def big_text(rng: random.Random) -> str:
    """~12 kB of base64 over random bytes: no compressor shrinks it below the TOAST threshold."""
    return base64.b64encode(rng.randbytes(BIG)).decode()


def wait_for(predicate: Callable[[], object], *, timeout: float, what: str, every: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as err:  # noqa: BLE001 - a server down mid-fault: keep polling
            last_error = err
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f" (last error: {last_error!r})" if last_error else ""))
        time.sleep(every)


# --- the daemon -------------------------------------------------------------------------------

class Daemon:
    """``cdc run CONFIG`` in its own session; its stdout+stderr appended to one log file."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.log_path = config.with_suffix(".log")
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(self.config)],
                                            cwd=self.config.parent, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL the whole process group: the supervisor and every worker die at once."""
        assert self.process is not None and self.process.poll() is None, "the daemon is not running"
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        wait_for(lambda: not _group_alive(self.process.pid), timeout=30, what="the daemon's group to die")

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def mark(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, mark: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(mark)
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # Zombies count as gone: only live processes can still write anything.
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


# --- the local stack's servers, one at a time -------------------------------------------------

def dev(action: str, service: str) -> None:
    """``cdc dev ACTION SERVICE`` as the CLI runs it (its own process, like a person would)."""
    done = subprocess.run([sys.executable, "-m", "cdc.cli", "dev", action, service],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"cdc dev {action} {service} failed:\n{done.stdout}{done.stderr}"


# --- a live writer ----------------------------------------------------------------------------

class Writer:
    """Inserts, updates, deletes and primary-key updates of rows with big incompressible values,
    on its own connection straight to the server (never through a proxy), until stopped.

    ``seq`` rises with every change, so ``max(seq)`` in a target is evidence that changes made after
    a moment have reached it. A server restart breaks the writer's connection: it reconnects and
    goes on (a transaction whose commit was lost in the break is simply not known; the final
    comparison reads what the source really holds).
    """

    def __init__(self, db, seed: int) -> None:
        self.db = db  # a SourceDb: connect(), and the dialect's statements
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self.seq = 0
        self.counts = {"insert": 0, "update": 0, "update_big": 0, "key_update": 0, "delete": 0}
        self.reconnects = 0
        self.error: BaseException | None = None

    def _run(self) -> None:
        conn = None
        ids: list[int] = []
        next_id = 0
        while not self.stop_event.is_set():
            try:
                if conn is None:
                    conn = self.db.connect()
                    ids = self.db.ids(conn)
                    next_id = max(ids, default=0) + 1
                for _ in range(3):
                    self.seq += 1
                    roll = self.rng.random()
                    if roll < 0.3 or len(ids) < 50:
                        self.db.insert(conn, next_id, self.seq, f"new {next_id}", big_text(self.rng))
                        ids.append(next_id)
                        next_id += 1
                        kind = "insert"
                    elif roll < 0.55:  # the big value unchanged: the log omits it (TOAST)
                        self.db.update_small(conn, self.rng.choice(ids), self.seq)
                        kind = "update"
                    elif roll < 0.65:
                        self.db.update_big(conn, self.rng.choice(ids), self.seq, big_text(self.rng))
                        kind = "update_big"
                    elif roll < 0.85:  # a new primary key, the big value unchanged (#12 item 1)
                        old = ids.pop(self.rng.randrange(len(ids)))
                        self.db.update_key(conn, old, next_id, self.seq)
                        ids.append(next_id)
                        next_id += 1
                        kind = "key_update"
                    else:
                        self.db.delete(conn, ids.pop(self.rng.randrange(len(ids))))
                        kind = "delete"
                    self.counts[kind] += 1
                conn.commit()
                self.stop_event.wait(0.03)
            except Exception as err:  # noqa: BLE001 - the server went away under a fault
                if not self.db.is_disconnect(err):
                    self.error = err
                    raise
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
                self.reconnects += 1
                self.stop_event.wait(0.2)
        if conn is not None:
            conn.close()

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(60)


# --- evidence and faults ----------------------------------------------------------------------

@dataclass
class Fault:
    """One strike: ``inject`` it, wait until the daemon's log (since the strike) matches
    ``detected``, then ``heal``. A fault with ``hold`` (a stall) stays in place at most that many
    seconds: whether the daemon noticed it within them is recorded, not required (see the suite's
    docstring for what a stall shows today)."""

    name: str
    inject: Callable[[], None]
    heal: Callable[[], None] = lambda: None
    detected: str | None = None
    recovered: str | None = None
    hold: float | None = None
    # A client that reconnects without an error (SQLAlchemy's pool_pre_ping replaces a dead pooled
    # connection silently) shows it only here: new connections through this proxy after the strike.
    proxy: FaultProxy | None = None


@dataclass
class Record:
    fault: str
    detected_line: str | None
    recovered_line: str | None
    seconds: float
    log: str = ""  # the daemon's log from the strike to the recovery


@dataclass
class Campaign:
    """Runs faults against a daemon, each after evidence of progress."""

    daemon: Daemon
    source_progress: Callable[[], object]            # e.g. the stored position
    sink_progress: dict[str, Callable[[], int]]      # per sink: max(seq) in its target
    rng: random.Random
    timeout: float = 150.0
    records: list[Record] = field(default_factory=list)

    def wait_for_progress(self, what: str) -> None:
        """Both ends move: the source's stored position changes and every target gets newer rows."""
        source_before = _quiet(self.source_progress)
        sinks_before = {name: _quiet(f) or 0 for name, f in self.sink_progress.items()}
        wait_for(lambda: (_quiet(self.source_progress) not in (None, source_before)
                          and all((_quiet(f) or 0) > sinks_before[name] for name, f in self.sink_progress.items())),
                 timeout=self.timeout, what=f"progress at both ends before {what}", every=0.3)

    def strike(self, fault: Fault) -> Record:
        self.wait_for_progress(fault.name)
        time.sleep(self.rng.uniform(0.0, 0.5))  # a random moment *after* the evidence
        began = time.monotonic()
        mark = self.daemon.mark()
        accepted = fault.proxy.accepted if fault.proxy is not None else 0

        def noticed() -> str | None:
            line = _search(fault.detected, self.daemon.log_since(mark))
            if line is None and fault.proxy is not None and fault.proxy.accepted > accepted:
                line = (f"(no log line) reconnected: {fault.proxy.accepted - accepted} new connection(s) "
                        f"through {fault.proxy.name}")
            return line

        fault.inject()
        detected = None
        try:
            if fault.detected and fault.hold is None and not os.environ.get("FAULTS_EXPLORE"):
                detected = wait_for(noticed, timeout=self.timeout, what=f"the daemon to notice {fault.name}")
            elif fault.detected:
                with contextlib.suppress(AssertionError):
                    detected = wait_for(noticed, timeout=fault.hold or 15, what=f"the daemon to notice {fault.name}")
        finally:
            fault.heal()
        self.wait_for_progress(f"the recovery from {fault.name}")
        recovered = None
        if fault.recovered:
            recovered = wait_for(lambda: _search(fault.recovered, self.daemon.log_since(mark)),
                                 timeout=self.timeout, what=f"the daemon's recovery from {fault.name}")
        record = Record(fault.name, detected, recovered, time.monotonic() - began, self.daemon.log_since(mark))
        self.records.append(record)
        return record


def _quiet(f: Callable[[], object]) -> object:
    try:
        return f()
    except Exception:  # noqa: BLE001 - the server is away: no evidence now
        return None


def _search(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text, re.MULTILINE)
    if match is None:
        return None
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else len(text)]


def proxy_for(target: str, name: str, listen_port: int = 0) -> FaultProxy:
    return FaultProxy(target, listen_port=listen_port, name=name).start()


# --- the end state ----------------------------------------------------------------------------

def topic_rows(bootstrap: str, topic: str, key: str = "id") -> dict[int, dict]:
    """The topic as compaction leaves it: per key the newest record's ``after`` (deletes and
    tombstones remove the key)."""
    import orjson
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"faults-check-{os.getpid()}",
                         "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        ends = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        rows: dict[int, dict] = {}
        read = {p: 0 for p in ends}
        deadline = time.monotonic() + 120
        while any(read[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"reading {topic} took over 120 s"
            for message in consumer.consume(1000, 1.0):
                if message.error():
                    continue
                read[message.partition()] = message.offset() + 1
                record_key = orjson.loads(message.key())[key]
                value = orjson.loads(message.value()) if message.value() is not None else None
                if value is None or value["after"] is None:
                    rows.pop(record_key, None)
                else:
                    rows[record_key] = value["after"]
        return rows
    finally:
        consumer.close()


def differences(expected: dict[int, dict], actual: dict[int, dict], limit: int = 5) -> str:
    """A short, readable account of how two row sets differ (big values shown by length)."""
    def brief(row):
        return None if row is None else {k: (f"<{len(v)} chars>" if isinstance(v, (str, bytes)) and len(v) > 40 else v)
                                         for k, v in row.items()}

    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    changed = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])
    lines = [f"{len(expected)} expected rows, {len(actual)} actual: {len(missing)} missing, "
             f"{len(extra)} extra, {len(changed)} different"]
    for k in missing[:limit]:
        lines.append(f"  missing {k}: {brief(expected[k])}")
    for k in extra[:limit]:
        lines.append(f"  extra {k}: {brief(actual[k])}")
    for k in changed[:limit]:
        cols = [c for c in expected[k] if expected[k].get(c) != actual[k].get(c)]
        lines.append(f"  different {k} in {cols}: expected {brief(expected[k])}, got {brief(actual[k])}")
    return "\n".join(lines)


def delete_topics(bootstrap: str, prefix: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    doomed = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix + ".")]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            future.result()
