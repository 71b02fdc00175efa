"""Verify an incremental snapshot end to end under a live writer: the topic equals the table, and
the sink never showed a row going back while it ran.

    .venv/bin/cdc dev up --only postgres,kafka     (add mysql for --source mariadb, spark for --sink delta)
    .venv/bin/python -m bench.incremental_verify --source postgres|mariadb [--rows 1000000]
                                                 [--sink sql|delta] [--log kafka|embedded]
                                                 [--chunk-rows 1024] [--rate 200] [--seed 16]

One run, on this machine, with the real daemon:

1. a fresh source database with ``t (id bigint PRIMARY KEY, v bigint, note text)`` of ``--rows``
   rows, and a fresh PostgreSQL database as the SQL sink's target (``--sink delta``: a Delta
   table in a temporary folder, read by a Spark session of this process);
2. ``cdc run`` of a config file holding the source (``snapshot: never``, a signal table), the log
   (Kafka by default) and the sink of the table's topic;
3. one update, alone, until the sink shows it (a sink's first batch is its slowest: Spark's took
   minutes on the shared machine, and a writer running meanwhile left the sink that many minutes
   of changes to catch up with before the snapshot began); then a writer on ``t`` at ``--rate``
   changes a second: updates, deletes, primary-key changes to new keys, inserts of new keys and
   inserts again of keys it deleted. Every write sets ``v`` from one counter that only goes up,
   so a row's ``v`` only grows (bench/sink_regressions.py);
4. a sampler that reads a sample of keys from the sink's target again and again (keys of the
   table at random, and every key the writer touches) and counts every regression: a row's
   version or value going back, or a deleted row coming back that the source did not insert again.
   The SQL sink's table is read as it is every 50 ms; the Delta table changes only by commits, so
   the sampler reads each committed version once, in order (time travel), none skipped, and reads
   the ones left once the writer stopped: a regression one commit showed and the next one mended
   is still seen (``DeltaTarget``). Reading the newest version every 50 ms instead cost its JVM
   60% of the sink JVM's CPU (41 s to 70 s in a 20k-row run) and could still miss a version;
5. ``cdc snapshot FILE src TABLE``, as a user asks for one; timed until the daemon logs that it
   ended; the writer and sampler run all along, and a while after;
6. the writer stops; once the sink shows its last change, the compacted topic (the last record
   per key) and the sink's table are compared with the table.

Prints rows/s of the snapshot, the rows it read (and read again: a row read twice, which happens
only after a crash), the sampler's readings and regressions (must be 0), both equalities and the
machine's load. Exits 1 when a regression or a difference was found.
tests/integration/test_incremental_verify.py runs the same code at a CI size,
tests/integration/test_incremental_verify_delta.py with the Delta sink.

Delta sink, 1,000,000 rows, Kafka (3 partitions), chunks of 1,024, writer at 200 changes/s, on
the shared 2 cores at load 25-45 (issue #16's check; the SQL sink's runs are in bench/README.md):

    .venv/bin/python -m bench.incremental_verify --source postgres --rows 1000000 --sink delta
      12,482 rows/s (80.1 s), 1,004,450 rows read, 0 again; 52,581 writer changes; all 6 versions
      of the Delta table read, 84,000 readings of 20,000 keys, 18,023 seen in the sink (73
      deleted since); 0 regressions; topic == table, sink == table (1,002,677 rows); 27 min
    .venv/bin/python -m bench.incremental_verify --source mariadb --rows 1000000 --sink delta
      4,542 rows/s (220.2 s), 1,007,986 rows read, 0 again; 79,385 writer changes; all 6
      versions read, 84,000 readings of 20,000 keys, 18,383 seen (136 deleted since); 0
      regressions; topic == table, sink == table (1,004,136 rows); 28 min

Most of the 27-28 minutes were Spark's (the daemon's and the sampler's JVMs starting, the sink's
first batch), and the sink MERGEd the whole snapshot in one batch of ~1M records. With a
temporary fault in the sink (each key's earliest record of a batch merged again, unguarded,
after the batch's MERGE) the same run at 20,000 rows exited 1: one regression, a row the fault
deleted and the next batch restored; both equalities still held at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.sink_regressions import RegressionCheck, Shown
from tests.daemon import cdc_process, stop_daemon

NEW_KEYS_FROM = 1_000_000_000  # keys the writer inserts or moves rows to: above any of the table's


# -- the source side ---------------------------------------------------------------------------

class SourceSide:
    """A database holding ``t``: how to fill it, connect to it, and name it in a config."""

    kind: str
    table: str  # as the source names it: namespace.t

    def connect(self):
        raise NotImplementedError

    def fill(self, rows: int) -> None:
        raise NotImplementedError

    def source_yaml(self) -> str:
        raise NotImplementedError

    def rows(self) -> dict[int, tuple[int, str]]:
        """The table now: id -> (v, note)."""
        return table_rows(self.connect())


def table_rows(conn) -> dict[int, tuple[int, str]]:
    """Table ``t`` on ``conn`` (closed after): id -> (v, note)."""
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, v, note FROM t")
            return {id_: (v, note) for id_, v, note in cur.fetchall()}
    finally:
        conn.close()


class PostgresSide(SourceSide):
    kind = "postgres"
    table = "public.t"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def connect(self):
        import psycopg2

        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        return conn

    def fill(self, rows: int) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint NOT NULL, note text)")
                cur.execute("INSERT INTO t SELECT g, 0, 'row ' || g FROM generate_series(1, %s) g", (rows,))
                cur.execute("VACUUM ANALYZE t")
        finally:
            conn.close()

    def source_yaml(self) -> str:
        return (f"type: postgres, dsn: '{self.dsn}', tables: [public.t], signal_table: public.cdc_signal, "
                "state_dir: ./state, heartbeat_interval: 1")


class MariaDbSide(SourceSide):
    kind = "mariadb"

    def __init__(self, url: str, database: str) -> None:
        self.url, self.database = url, database
        self.table = f"{database}.t"

    def connect(self):
        from urllib.parse import urlparse

        import pymysql

        parsed = urlparse(self.url)
        return pymysql.connect(host=parsed.hostname, port=parsed.port or 3306, user=parsed.username or "root",
                               password=parsed.password or "", database=self.database, autocommit=True)

    def fill(self, rows: int) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT NOT NULL, note TEXT)")
                for first in range(1, rows + 1, 100_000):  # one statement of 1M rows is slow to replicate
                    last = min(rows, first + 99_999)
                    cur.execute(f"INSERT INTO t SELECT seq, 0, CONCAT('row ', seq) FROM seq_{first}_to_{last}")
        finally:
            conn.close()

    def source_yaml(self) -> str:
        return (f"type: mysql, url: '{self.url}', tables: ['{self.table}'], signal_table: {self.database}.cdc_signal, "
                f"server_id: {random.randrange(10_000, 2**31)}, heartbeat_interval: 0.5")


# -- the writer --------------------------------------------------------------------------------

class Writer(threading.Thread):
    """Updates, deletes, primary-key changes, new keys and keys inserted again on ``t``, at
    ``rate`` changes a second, one autocommitted statement each; ``v`` from one rising counter."""

    def __init__(self, side: SourceSide, rows: int, rate: float, seed: int) -> None:
        super().__init__(daemon=True, name="writer")
        self.side, self.rows, self.rate = side, rows, rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.counter = 0
        self.changes = 0
        self.touched: list[int] = []                  # every key written, in order (the sampler watches them)
        self.reinserts: dict[int, list[int]] = {}     # key -> values it was inserted again with
        self.error: BaseException | None = None
        self._deleted: list[int] = []                 # keys deleted or moved away, not inserted again
        self._next_key = NEW_KEYS_FROM
        # Keys the sampler watches from its first reading, and a view of those it has seen in the
        # sink: half of the deletes and moves take one it has seen there (else one it watches), so
        # that deletes the sink applies are seen (a key deleted before the sink ever held it shows
        # nothing; on a loaded machine the sink commits a few large versions).
        self.hot: list[int] = []
        self.present: Mapping[Any, Any] = {}

    def _value(self) -> int:
        self.counter += 1
        return self.counter

    def _key(self) -> int:
        return self.rng.randint(1, self.rows)

    def step(self, cur) -> None:
        action = self.rng.random()
        key = self._key()
        if 0.5 <= action < 0.8 and self.rng.random() < 0.5:
            try:
                seen = list(self.present)  # the sampler's thread adds to it
            except RuntimeError:  # changed size while copied: the watched keys this time
                seen = []
            if seen or self.hot:
                key = self.rng.choice(seen or self.hot)
        if action < 0.5:
            cur.execute("UPDATE t SET v = %s WHERE id = %s", (self._value(), key))
        elif action < 0.65:
            cur.execute("DELETE FROM t WHERE id = %s", (key,))
            if cur.rowcount:
                self._deleted.append(key)
        elif action < 0.8:
            self._next_key += 1
            new = self._next_key
            self.touched.append(new)
            cur.execute("UPDATE t SET id = %s, v = %s WHERE id = %s", (new, self._value(), key))
            if cur.rowcount:
                self._deleted.append(key)
        elif action < 0.9 or not self._deleted:
            self._next_key += 1
            key = self._next_key
            cur.execute("INSERT INTO t (id, v, note) VALUES (%s, %s, %s)", (key, self._value(), f"new {key}"))
        else:
            key = self._deleted.pop(self.rng.randrange(len(self._deleted)))
            value = self._value()
            self.reinserts.setdefault(key, []).append(value)  # before the commit: the sampler may see it at once
            cur.execute("INSERT INTO t (id, v, note) VALUES (%s, %s, %s)", (key, value, f"again {key}"))
        self.touched.append(key)
        self.changes += 1

    def last_change(self) -> tuple[int, int]:
        """Before the writer starts or after it stopped: one update, of a key the table holds;
        (key, value)."""
        conn = self.side.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT max(id) FROM t WHERE id < %s", (NEW_KEYS_FROM,))
                key = cur.fetchone()[0]
                value = self._value()
                cur.execute("UPDATE t SET v = %s WHERE id = %s", (value, key))
                return key, value
        finally:
            conn.close()

    def run(self) -> None:
        conn = self.side.connect()
        began = time.monotonic()
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    self.step(cur)
                    delay = began + self.changes / self.rate - time.monotonic()
                    if delay > 0:
                        self.stop.wait(delay)
        except BaseException as err:  # noqa: BLE001 - reported by finish()
            self.error = err
        finally:
            conn.close()

    def finish(self) -> None:
        self.stop.set()
        self.join()
        if self.error is not None:
            raise RuntimeError(f"the writer failed: {self.error!r}") from self.error


# -- the sampler -------------------------------------------------------------------------------

class SqlTarget:
    """The SQL sink's table ``t`` in a PostgreSQL database."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn = None

    def sink_yaml(self, topic: str) -> str:
        url = self.dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
        return f"{{name: wh, type: sql, url: '{url}', topics: ['{topic}']}}"

    def sample(self, keys: list[int]) -> dict[int, Shown]:
        import psycopg2

        if self.conn is None:
            self.conn = psycopg2.connect(self.dsn)
            self.conn.autocommit = True
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT id, __cdc_version, v FROM t WHERE id = ANY(%s)", (keys,))
                return {id_: Shown(version, v) for id_, version, v in cur.fetchall()}
        except psycopg2.errors.UndefinedTable:
            return {}  # the sink has not made its table yet

    def rows(self) -> dict[int, tuple[int, str]]:
        import psycopg2

        return table_rows(psycopg2.connect(self.dsn))

    def readings(self, keys: list[int]) -> list[dict[int, Shown]]:
        """What the sampler reads in one round: the table as it is now."""
        return [self.sample(keys)]

    def coverage(self) -> str:
        return ""

    def twin(self) -> SqlTarget:
        """Another reader of the same table, for another thread (a connection is for one)."""
        return SqlTarget(self.dsn)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class DeltaTarget:
    """The Delta sink's table of ``t`` under ``lake``, read through a Spark session of this
    process.

    The table changes only by commits, each a version readers can still read later (time
    travel; nothing is vacuumed here). So the sampler reads every committed version, in order,
    once each (``readings``), instead of the newest one at random moments: no state the sink
    ever committed escapes it, and it costs one Spark read per commit rather than one per round
    (re-reading an unchanged table took 60% of the sink JVM's CPU on 2 cores)."""

    def __init__(self, lake: Path, namespace: str, spark=None) -> None:
        self.lake = lake
        self.path = lake / namespace / "t"
        self.spark = spark     # None: a local[1] session of its own, made at the first read
        self.read_up_to = -1   # the last version the sampler read
        self.versions = 0      # versions it read

    def sink_yaml(self, topic: str) -> str:
        return (f"{{name: wh, type: delta, topics: ['{topic}'], path: '{self.lake}', "
                f"checkpoint: '{self.lake}-checkpoint', trigger_seconds: 2}}")

    def _session(self):
        if self.spark is None:
            from cdc.dev.jars import spark_jars
            from spark_sinks.session import local_session

            self.spark = local_session("incremental-verify-sampler", jars=spark_jars(), master="local[1]",
                                       driver_memory="1g")
        return self.spark

    def _table(self, version: int | None = None):
        reader = self._session().read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(str(self.path))

    def committed(self) -> list[int]:
        """The table's committed versions (its log's commit files), oldest first."""
        log_dir = self.path / "_delta_log"
        if not log_dir.exists():
            return []  # the sink has not made its table yet
        return sorted(int(f.stem) for f in log_dir.glob("*.json") if f.stem.isdigit())

    def _read(self, keys: list[int], version: int | None) -> dict[int, Shown]:
        from pyspark.sql import functions as F

        # One SQL expression, one Py4J call: Column.isin makes a JVM literal per key, a call each,
        # and with 20,000 the sampler's first read took ~13 minutes at load 50 (its JVM's start to
        # its first plan).
        table = self._table(version)  # first: it makes the session F.expr needs
        wanted = F.expr(f"id IN ({','.join(str(int(k)) for k in keys)})") if keys else F.lit(False)
        rows = table.where(wanted).select("id", "__cdc_version", "v").collect()
        return {r["id"]: Shown(r["__cdc_version"], r["v"]) for r in rows}

    def sample(self, keys: list[int]) -> dict[int, Shown]:
        """The newest version's rows of ``keys``."""
        if not self.committed():
            return {}
        return self._read(keys, None)

    def readings(self, keys: list[int]) -> list[dict[int, Shown]]:
        """Every version committed since the last call, oldest first: the rows of ``keys`` in each."""
        out = []
        for version in self.committed():
            if version > self.read_up_to:
                out.append(self._read(keys, version))
                self.read_up_to = version
                self.versions += 1
        return out

    def coverage(self) -> str:
        return f"; read every committed version of the Delta table, {self.versions} (0..{self.read_up_to})"

    def rows(self) -> dict[int, tuple[int, str]]:
        return {r["id"]: (r["v"], r["note"]) for r in self._table().select("id", "v", "note").toLocalIterator()}

    def twin(self) -> DeltaTarget:
        return self  # Spark's session takes queries from any thread

    def close(self) -> None:
        pass  # the session is the process's: stopped at its end


class Sampler(threading.Thread):
    """Reads the watched keys from the sink's target again and again into a RegressionCheck:
    ``sample_keys`` of the table at random, and the keys the writer touches (up to ``watch_cap``)."""

    def __init__(self, target: SqlTarget, writer: Writer, sample_keys: int, watch_cap: int, seed: int) -> None:
        super().__init__(daemon=True, name="sampler")
        self.target, self.writer, self.watch_cap = target, writer, watch_cap
        rng = random.Random(seed + 1)
        self.keys = sorted(rng.sample(range(1, writer.rows + 1), min(sample_keys, writer.rows)))
        self._watched = set(self.keys)
        self._taken = 0  # how many of writer.touched were taken
        self.check = RegressionCheck()
        self.rounds = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _watch_new_keys(self) -> None:
        touched = self.writer.touched
        end = len(touched)
        for key in touched[self._taken:end]:
            if len(self._watched) >= self.watch_cap:
                break
            if key not in self._watched:
                self._watched.add(key)
                self.keys.append(key)
        self._taken = end

    def _round(self) -> None:
        self._watch_new_keys()
        keys = list(self.keys)
        for shown in self.target.readings(keys):
            self.check.observe_all(keys, shown, self.writer.reinserts)
            self.rounds += 1

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._round()
                self.stop.wait(0.05)
            self._round()  # after the stop: what the target holds by now (a Delta table: each version not read yet)
        except BaseException as err:  # noqa: BLE001 - reported by finish()
            self.error = err
        finally:
            self.target.close()

    def finish(self) -> None:
        self.stop.set()
        self.join()
        if self.error is not None:
            raise RuntimeError(f"the sampler failed: {self.error!r}") from self.error


# -- the topic ---------------------------------------------------------------------------------

@dataclass
class TopicView:
    """A topic read from its start: what compaction keeps (the last record per key), and its
    snapshot reads."""

    rows: dict[int, tuple[int, str]] = field(default_factory=dict)
    reads: int = 0           # op r records
    read_keys: set = field(default_factory=set)

    @property
    def reread(self) -> int:
        return self.reads - len(self.read_keys)


def fold_topic(log, topic: str, timeout: float = 600) -> TopicView:
    """Read as it comes: a reader returns each partition in offset order, and a key lives in one
    partition, so its records fold in their order (nothing of the topic is held in memory)."""
    view = TopicView()
    ends = log.end_offsets(topic)
    reader = log.reader()
    deadline = time.monotonic() + timeout
    try:
        reader.assign({tp: 0 for tp in ends})
        while any(reader.position(tp) < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} to its end took over {timeout:.0f}s")
            for record in reader.poll(10_000, 0.2):
                if record.offset >= ends[(record.topic, record.partition)]:
                    continue
                id_ = orjson.loads(record.key)["id"]
                event = orjson.loads(record.value) if record.value is not None else None
                if event is None or event["op"] == "d":
                    view.rows.pop(id_, None)
                    continue
                if event["op"] == "r":
                    view.reads += 1
                    view.read_keys.add(id_)
                view.rows[id_] = (event["after"]["v"], event["after"]["note"])
    finally:
        reader.close()
    return view


# -- the run -----------------------------------------------------------------------------------

@dataclass
class Verification:
    source: str
    rows: int
    seconds: float              # from `cdc snapshot` until the daemon logged that it ended
    view: TopicView
    changes: int                # the writer's
    check: RegressionCheck
    rounds: int                 # the sampler's readings of its keys (a Delta table: one per version)
    watched: int                # keys it read each round, at the end
    topic_equal: bool
    sink_equal: bool
    table_rows: int
    load: tuple[float, float, float]
    coverage: str = ""          # what of the sink the sampler read (target.coverage())

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    def lines(self) -> list[str]:
        shown = len(self.check.present) + len(self.check.deleted)
        return [
            f"{self.source}: incremental snapshot of {self.rows:,} rows under a writer "
            f"({self.changes:,} changes: updates, deletes, key changes, inserts)",
            f"  snapshot: {self.rate:,.0f} rows/s ({self.seconds:.1f} s); rows read {self.view.reads:,}, "
            f"read again {self.view.reread:,}",
            f"  sampler: {self.rounds:,} rounds over up to {self.watched:,} keys ({self.check.readings:,} readings, "
            f"{shown:,} keys seen in the sink, {len(self.check.deleted):,} of them deleted since){self.coverage}; "
            f"regressions: {len(self.check.regressions)}",
            f"  compacted topic == table: {self.topic_equal}; sink == table: {self.sink_equal} "
            f"({self.table_rows:,} rows)",
            f"  load average {self.load[0]:.1f} {self.load[1]:.1f} {self.load[2]:.1f} (at the end)",
        ] + [f"  REGRESSION {r}" for r in self.check.regressions[:20]]


def status(port: int) -> dict[str, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as answer:
            return {row["name"]: row for row in orjson.loads(answer.read())}
    except OSError:
        return {}


def wait_for(what: str, check: Callable[[], object], daemon, folder: Path, timeout: float, port: int = 0) -> object:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        failed = [name for name, row in status(port).items() if row.get("phase") == "failed"] if port else []
        if daemon.poll() is not None or failed:
            raise RuntimeError(f"cdc run exited ({daemon.returncode}) or {failed} failed before {what}: "
                               f"{(folder / 'daemon.log').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:.0f}s: {what}; daemon log: "
                               f"{(folder / 'daemon.log').read_text()[-3000:]}")
        time.sleep(0.1)
    return value


def config_file(folder: Path, side: SourceSide, target, log_yaml: str, prefix: str, chunk_rows: int,
                port: int) -> Path:
    topic = f"{prefix}.{side.table}"
    path = folder / "cdc.yaml"
    path.write_text(f"log:\n  {log_yaml}\n"
                    f"sources:\n  - {{name: src, snapshot: never, incremental_chunk_rows: {chunk_rows}, "
                    f"{side.source_yaml()}}}\n"
                    f"sinks:\n  - {target.sink_yaml(topic)}\n"
                    f"http: \"127.0.0.1:{port}\"\n")
    return path


def verify(side: SourceSide, target, folder: Path, rows: int, log_yaml: str, prefix: str,
           chunk_rows: int = 1024, rate: float = 200, seed: int = 16, sample_keys: int = 2000,
           watch_cap: int = 20_000, timeout: float = 3600, startup: float = 300) -> Verification:
    """One verification run (the module's docstring): ``side`` holds a filled ``t`` already;
    ``target`` is the sink's (SqlTarget on an empty database, DeltaTarget); ``log_yaml`` the
    config's log entry; ``startup``: how long the daemon and the sampler may take to start (Spark
    on a busy machine takes minutes), ``timeout`` the snapshot and the sink's catching up."""
    from cdc.config import load_config
    from cdc.dev.services import free_port
    from cdc.log.open import open_log
    from cdc.offsets import OffsetStore
    from cdc.positions import IncrementalProgress

    port = free_port()
    config = config_file(folder, side, target, log_yaml, prefix, chunk_rows, port)
    topic = f"{prefix}.{side.table}"
    writer = Writer(side, rows, rate, seed)
    sampler = Sampler(target, writer, sample_keys, watch_cap, seed)
    writer.hot, writer.present = list(sampler.keys), sampler.check.present
    daemon = cdc_process(config, "run", log="daemon.log")
    log = None

    def wait(what: str, check: Callable[[], object], timeout: float) -> object:
        def helpers_fine_and_check() -> object:
            for helper in (writer, sampler):
                if helper.error is not None:
                    raise RuntimeError(f"the {helper.name} failed before {what}: {helper.error!r}") from helper.error
            return check()
        return wait_for(what, helpers_fine_and_check, daemon, folder, timeout, port)

    try:
        wait("the source to stream", lambda: status(port).get("src", {}).get("phase") == "streaming",
             startup)
        wait("the sink to run", lambda: status(port).get("wh", {}).get("phase") == "streaming",
             startup)
        # One change through first, alone: a sink's first batch can take minutes (Spark's on a busy
        # machine), and a writer started meanwhile would leave it that many minutes of changes to
        # catch up with before the snapshot even begins.
        key, value = writer.last_change()
        wait("a first change in the sink", lambda: _sink_value(target.twin(), key) == value, startup)
        writer.start()
        sampler.start()
        wait("the writer's first change in the sink", lambda: sampler.check.present, startup)
        began = time.monotonic()  # before the command: a small table's snapshot can end before it returns
        asked = cdc_process(config, "snapshot", "src", side.table, log="snapshot.log")
        if asked.wait(120) != 0:
            raise RuntimeError(f"cdc snapshot failed: {(folder / 'snapshot.log').read_text()}")
        # The daemon's log line, not its status: a short snapshot can start and end between two
        # status updates, the line stays.
        done = f"incremental snapshot of {side.table} done"
        wait("the snapshot to end", lambda: done in (folder / "daemon.log").read_text(errors="replace"), timeout)
        seconds = time.monotonic() - began
        time.sleep(2)  # the writer and the sampler go on a while after the last chunk
        writer.finish()
        key, value = writer.last_change()
        wait("the writer's last change in the sink",
             lambda: _sink_value(target.twin(), key) == value,
             timeout)
        sampler.finish()
        log = open_log(load_config(str(config)).log)
        view = fold_topic(log, topic)
        table = side.rows()
        stored = OffsetStore(log, prefix).load("src")
        if isinstance(stored, IncrementalProgress):
            raise RuntimeError(f"the stored position still holds a snapshot: {stored}")
        return Verification(side.kind, rows, seconds, view, writer.changes, sampler.check, sampler.rounds,
                            len(sampler.keys), view.rows == table, target.twin().rows() == table,
                            len(table), os.getloadavg(), target.coverage())
    finally:
        writer.stop.set()
        sampler.stop.set()
        stop_daemon(daemon)
        if log is not None:
            log.close()


def _sink_value(target, key: int) -> int | None:
    try:
        row = target.sample([key]).get(key)
        return row.value if row else None
    finally:
        target.close()


# -- the command -------------------------------------------------------------------------------

@contextmanager
def postgres_databases(admin_dsn: str) -> Iterator[tuple[str, str]]:
    from bench.pg_stream import drop_slots, execute

    run = uuid.uuid4().hex[:8]
    names = (f"iv_src_{run}", f"iv_dst_{run}")
    for name in names:
        execute(admin_dsn, f'CREATE DATABASE "{name}"')
    try:
        base = admin_dsn.rsplit("/", 1)[0]  # a URL: the SQL sink's url is made from it
        yield f"{base}/{names[0]}", f"{base}/{names[1]}"
    finally:
        drop_slots(admin_dsn, names[0])
        for name in names:
            execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def mariadb_database(url: str) -> Iterator[str]:
    name = f"iv_{uuid.uuid4().hex[:8]}"
    side = MariaDbSide(url, None)
    conn = side.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
        yield name
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


def settings(needed: list[str]) -> dict[str, str]:
    from cdc.dev.stack import read_env

    env = read_env()
    out = {k: os.environ.get(k) or env.get(k, "") for k in needed}
    missing = [k for k in needed if not out[k]]
    if missing:
        raise SystemExit(f"no {', '.join(missing)}: start the servers (`.venv/bin/cdc dev up --only ...`)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=("postgres", "mariadb"), default="postgres")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--sink", choices=("sql", "delta"), default="sql")
    parser.add_argument("--log", choices=("kafka", "embedded"), default="kafka")
    parser.add_argument("--chunk-rows", type=int, default=1024)
    parser.add_argument("--rate", type=float, default=200, help="the writer's changes a second")
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()

    if args.sink == "delta" and args.log != "kafka":
        raise SystemExit("the Delta sink reads Kafka: --log kafka")
    needed = ["PG_DSN"] + (["MYSQL_URL"] if args.source == "mariadb" else []) + (
        ["KAFKA_BOOTSTRAP"] if args.log == "kafka" else [])
    env = settings(needed)
    prefix = f"iv_{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix="cdc-incremental-verify-"))
    log_yaml = (f"kafka: {{bootstrap_servers: '{env['KAFKA_BOOTSTRAP']}', topic_prefix: {prefix}, partitions: 3}}"
                if args.log == "kafka" else f"embedded: {{path: ./data, topic_prefix: {prefix}}}")
    try:
        with postgres_databases(env["PG_DSN"]) as (source_dsn, target_dsn), \
                (mariadb_database(env["MYSQL_URL"]) if args.source == "mariadb" else _nothing()) as mariadb:
            side = PostgresSide(source_dsn) if args.source == "postgres" else MariaDbSide(env["MYSQL_URL"], mariadb)
            filled = time.monotonic()
            side.fill(args.rows)
            print(f"{args.source}: {args.rows:,} rows written in {time.monotonic() - filled:.0f} s; "
                  f"{args.log} log, {'SQL sink into PostgreSQL' if args.sink == 'sql' else 'Delta sink'}, chunks of "
                  f"{args.chunk_rows:,}, writer at "
                  f"{args.rate:g} changes/s, load {os.getloadavg()[0]:.1f}", flush=True)
            target = SqlTarget(target_dsn) if args.sink == "sql" else DeltaTarget(folder / "lake", side.table.split(".")[0])
            # Spark on a busy machine takes minutes to start (the sink's and the sampler's).
            watch = {"sample_keys": 2000, "watch_cap": 20_000} | ({"startup": 1200} if args.sink == "delta" else {})
            result = verify(side, target, folder, args.rows, log_yaml, prefix, args.chunk_rows, args.rate,
                            args.seed, **watch)
        print("\n".join(result.lines()))
        if result.check.regressions or not (result.topic_equal and result.sink_equal):
            raise SystemExit(1)
    finally:
        if args.log == "kafka":
            from bench.pg_stream import delete_topics
            from cdc.log.kafka import KafkaLog

            kafka = KafkaLog(env["KAFKA_BOOTSTRAP"])
            delete_topics(kafka, prefix)
            kafka.close()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
