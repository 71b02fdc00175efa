"""The Spark sink into Iceberg (a jdbc catalog, type 1; a hadoop catalog, SCD2) and into Delta,
under live writers on PostgreSQL and MariaDB, each Iceberg sink killed with kill -9 six times
after it committed something, the Delta one twice (its kills of every kind are
``test_spark_delta_kill``'s): at the end each table, read by an engine other than Spark
(PyIceberg, delta-rs), equals its source, and the SCD2 history holds every version.

The writers insert, update, delete and change primary keys all along; midway a column is added,
later another is renamed (``schema_policy: evolve``: in place). Capture runs as two daemons
(``cdc run --only``); each sink as its own (``cdc run --only <sink>``), killed with its Spark JVM
once a new commit of one of its tables shows (its table format's commit files), then started
again from its checkpoint."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from cdc.log.kafka import KafkaLog
from tests.daemon import kill_daemon, run_daemon, stop_daemon
from tests.iceberg_tables import IcebergTables, jdbc_catalog
from tests.integration.pg_capture import topic_state, wait_until
from tests.integration.test_spark_delta_schema_live import _norm
from tests.live_ddl import MyDb, PgDb, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.spark_processes, pytest.mark.kafka, pytest.mark.postgres,
              pytest.mark.mysql, pytest.mark.iceberg, pytest.mark.timeout(2400)]

ROWS = 200
KILLS = {"ice": 6, "hist": 6, "lake": 2}   # each a Spark JVM started again
SERIES = {"postgres": "generate_series(1, {n}) g", "mysql": "(SELECT seq AS g FROM seq_1_to_{n}) s"}


class Writer:
    """Changes ``items`` until stopped: updates, inserts, deletes, key changes; ``extra`` once
    the test added it. ``versions`` counts each key's row versions (insert, update) as the
    source commits them: an SCD2 table holds that many rows of the key."""

    def __init__(self, db, seed: int) -> None:
        self.db, self.rng = db, random.Random(seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.extra = False
        self.versions: Counter = Counter({k: 1 for k in range(1, ROWS + 1)})
        self.commits = 0
        self.error: BaseException | None = None
        self.next_id = 10_000 + seed * 100_000
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = self.db.connect()
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    with self.lock:   # DDL takes it: no statement of a shape about to change is open
                        pending = Counter()
                        for _ in range(4):
                            self._change(cur, pending)
                        conn.commit()
                        self.versions.update(pending)
                        self.commits += 1
                    time.sleep(0.1)   # about 35 changes/s per source: the sinks' restarts, not a backlog, set the pace
        except BaseException as err:  # noqa: BLE001 - the test reports it
            self.error = err
        finally:
            conn.close()

    def _change(self, cur, pending: Counter) -> None:
        roll, key = self.rng.random(), self.rng.choice(list(self.versions) or [1])
        if roll < 0.55:
            sets = "qty = qty + 1" + (", extra = qty + 1" if self.extra else "")
            cur.execute(f"UPDATE items SET {sets} WHERE id = %s", (key,))
            if cur.rowcount:
                pending[key] += 1
        elif roll < 0.75:
            self.next_id += 1
            cur.execute("INSERT INTO items (id, qty) VALUES (%s, 0)", (self.next_id,))
            pending[self.next_id] += 1
        elif roll < 0.9:
            cur.execute("DELETE FROM items WHERE id = %s", (key,))
        else:   # a primary key change: the old key is deleted, the new one inserted
            self.next_id += 1
            cur.execute("UPDATE items SET id = %s, qty = qty + 1 WHERE id = %s", (self.next_id, key))
            if cur.rowcount:
                pending[self.next_id] += 1

    def ddl(self, statement: str) -> None:
        with self.lock:
            self.db.execute(statement)


def _config(tmp_path: Path, pg: PgDb, my: MyDb, kafka: str, jars: str, catalog_dsn: str) -> tuple[Path, str]:
    prefix = f"l_{uuid.uuid4().hex[:8]}"
    topics = f"['{prefix}.public.items', '{prefix}.{my.db}.items']"
    spark = (f"spark: {{master: 'local[1]', driver_memory: 1g, jars: [{jars}], "
             f"conf: {{spark.sql.shuffle.partitions: '2'}}}}")
    common = f"topics: {topics}, trigger_seconds: 0.5, schema_policy: evolve, {spark}"
    jdbc = jdbc_catalog(catalog_dsn)
    catalog = (f"{{type: jdbc, uri: '{jdbc['uri']}', properties: {{jdbc.user: '{jdbc['properties']['jdbc.user']}'"
               + (f", jdbc.password: '{jdbc['properties']['jdbc.password']}'" if "jdbc.password" in jdbc['properties']
                  else "") + "}}")
    path = tmp_path / "cdc.yaml"
    path.write_text(
        f"log:\n  kafka: {{bootstrap_servers: '{kafka}', topic_prefix: {prefix}, partitions: 2}}\n"
        f"sources:\n  - {{name: pg, type: postgres, dsn: '{pg.dsn}', tables: ['public.items'], "
        f"state_dir: '{tmp_path / 'state'}', heartbeat_interval: 1, status_interval: 1}}\n"
        f"  - {{name: my, type: mysql, url: '{my.base}', server_id: {random.randrange(10_000, 2**31)}, "
        f"tables: ['{my.db}.items'], heartbeat_interval: 1}}\n"
        f"sinks:\n"
        f"  - {{name: ice, type: delta, table_format: iceberg, iceberg: {{catalog: {catalog}}}, path: ./ice, "
        f"checkpoint: ./ice-checkpoint, {common}}}\n"
        f"  - {{name: hist, type: delta, table_format: iceberg, scd2: true, path: ./hist, "
        f"checkpoint: ./hist-checkpoint, {common}}}\n"
        f"  - {{name: lake, type: delta, path: ./lake, checkpoint: ./lake-checkpoint, {common}}}\n"
        f"http: null\n")
    return path, prefix



def _commits(root: Path) -> int:
    """Commit files of every table under ``root``: Iceberg's metadata files, Delta's log entries."""
    return sum(1 for _ in root.rglob("*.metadata.json")) + sum(1 for _ in root.rglob("_delta_log/*.json"))


def _delta_rows(path: Path, columns: list[str]) -> dict | None:
    """The Delta table at ``path`` read by delta-rs (its SQL engine reads deletion vectors and
    column mapping); None while it lacks one of ``columns``."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    try:
        table = DeltaTable(str(path))
    except Exception:  # noqa: BLE001 - TableNotFoundError: no table yet
        return None
    if not set(columns) <= {f.name for f in table.schema().fields}:
        return None
    selected = ", ".join(f'"{c}"' for c in columns)
    rows = pa.table(QueryBuilder().register("t", table).execute(f"SELECT {selected} FROM t").read_all()).to_pylist()
    return {r[columns[0]]: tuple(_norm(r[c]) for c in columns[1:]) for r in rows}


def test_iceberg_and_delta_sinks_killed_again_and_again_end_equal_to_their_sources(
        pg_dsn, target_dsn, mysql_url, mysql_db, kafka_bootstrap, dev_env_for, tmp_path):
    pg, my = PgDb(pg_dsn), MyDb(mysql_url, mysql_db)
    dbs = {"public": pg, mysql_db: my}
    for db in dbs.values():
        db.execute("CREATE TABLE items (id integer PRIMARY KEY, qty integer NOT NULL, note text)")
        db.execute(f"INSERT INTO items SELECT g, 0, 'seed' FROM {SERIES[db.kind].format(n=ROWS)}")
    config, prefix = _config(tmp_path, pg, my, kafka_bootstrap, dev_env_for("spark")["SPARK_JARS"], target_dsn)
    ice = IcebergTables(jdbc_catalog(target_dsn), str(tmp_path / "ice"), dsn=target_dsn)
    hist = IcebergTables({"type": "hadoop"}, str(tmp_path / "hist"))
    writers = {ns: Writer(db, seed) for seed, (ns, db) in enumerate(dbs.items(), 1)}
    capture = {name: run_daemon(config, name, log=f"{name}.log") for name in ("pg", "my")}
    sinks: dict[str, object] = {}
    kills = Counter()
    ddl_done: list[str] = []
    log = KafkaLog(kafka_bootstrap)
    try:
        # Writers start once both snapshots are in the topics: a change before a snapshot's
        # position is folded into its row, not a version of its own.
        for ns in dbs:
            wait_until(lambda ns=ns: len(topic_state(log, f"{prefix}.{ns}.items")) == ROWS, timeout=180,
                       what=f"the snapshot of {ns}.items in its topic")
        for writer in writers.values():
            writer.thread.start()

        def start(name: str) -> None:
            sinks[name] = (run_daemon(config, name, log=f"{name}.log"), _commits(tmp_path / name))

        for name in ("ice", "hist", "lake"):
            start(name)
        deadline = time.monotonic() + 1500
        while any(kills[n] < wanted for n, wanted in KILLS.items()):
            assert time.monotonic() < deadline, f"kills so far: {dict(kills)}"
            for writer in writers.values():
                assert writer.error is None, writer.error
            least = min(kills["ice"], kills["hist"])
            for name, (process, before) in list(sinks.items()):
                # The Delta sink's kills are spread over the Iceberg ones': one before each DDL.
                if kills[name] >= KILLS[name] or (name == "lake" and kills[name] > least // 3):
                    continue
                assert process.poll() is None, (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
                if _commits(tmp_path / name) > before:   # evidence: it committed since it started
                    kill_daemon(process)
                    kills[name] += 1
                    start(name)
            # Midway a column is added, later another renamed: each sink meets them between kills.
            if least >= 2 and "add" not in ddl_done:
                for writer in writers.values():
                    writer.ddl("ALTER TABLE items ADD COLUMN extra integer")
                    writer.extra = True
                ddl_done.append("add")
            if least >= 4 and "rename" not in ddl_done:
                for writer in writers.values():
                    writer.ddl("ALTER TABLE items RENAME COLUMN note TO remark")
                ddl_done.append("rename")
            time.sleep(0.2)
        for writer in writers.values():
            writer.stop.set()
            writer.thread.join()
            assert writer.error is None, writer.error
        columns = ["id", "qty", "remark", "extra"]
        sources = {ns: rows_of(db.url, "items", columns) for ns, db in dbs.items()}

        def ice_equal() -> bool:
            try:
                return all({r[0]: tuple(_norm(v) for v in r[1:]) for r in ice.rows(f"{ns}.items", *columns)}
                           == sources[ns] for ns in dbs)
            except Exception:  # noqa: BLE001 - a column not there yet, or no table
                return False

        def hist_equal() -> bool:
            try:
                return all({r[0]: tuple(_norm(v) for v in r[1:])
                            for r in hist.rows(f"{ns}.items", *columns, where=lambda r: r["__cdc_current"])}
                           == sources[ns] for ns in dbs)
            except Exception:  # noqa: BLE001
                return False

        def lake_equal() -> bool:
            return all(_delta_rows(tmp_path / "lake" / ns / "items", columns) == sources[ns] for ns in dbs)

        wait_until(ice_equal, timeout=600, what="the Iceberg (jdbc) tables equal to their sources")
        wait_until(hist_equal, timeout=600, what="the SCD2 Iceberg (hadoop) tables' current rows equal")
        wait_until(lake_equal, timeout=600, what="the Delta tables, read by delta-rs, equal to their sources")

        # The history is complete: every version of every key, each closed where the next begins.
        for ns, writer in writers.items():
            history: dict[int, list[tuple]] = {}
            for key, start_at, end_at in hist.rows(f"{ns}.items", "id", "__cdc_valid_from", "__cdc_valid_to"):
                history.setdefault(key, []).append((start_at, end_at))
            counts = {key: len(spans) for key, spans in history.items()}
            assert counts == dict(writer.versions), ns
            for key, spans in history.items():
                for (_, end_at), (next_start, _) in zip(spans, spans[1:]):
                    assert end_at == next_start, (ns, key, spans)
        assert ddl_done == ["add", "rename"]
    finally:
        log.close()
        for writer in writers.values():
            writer.stop.set()
        for process in [*capture.values(), *(p for p, _ in sinks.values())]:
            stop_daemon(process)
