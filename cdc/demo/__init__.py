"""``cdc demo``: the whole mission on the local stack, in a few minutes.

1. Starts PostgreSQL, MariaDB, Redis and OpenSearch from the local stack (``cdc dev``) and
   recreates a shop: ``customers`` and ``orders`` in PostgreSQL, ``products`` in MariaDB.
2. Writes a config (embedded log; both sources; four sinks: a SQLite warehouse, an OpenSearch
   index per table, a Redis cache, and joined documents in OpenSearch: each order with its
   customer) and starts ``cdc run`` on it, in the background.
3. Waits until both sources finished their snapshot (phase ``streaming`` and a stored offset),
   and only then makes live changes in both databases, with a schema change in the middle
   (``customers.tier`` integer -> text) that the search index can only follow by a rebuild.
4. Counts the live (non-snapshot) events in the log, waits until every store equals its source,
   table by table, and every joined document PostgreSQL's join of the order and its customer
   (``cdc.demo.stores``), and says so; prints the console's address.

The daemon and the stack stay up for poking (``cdc demo --stop`` stops the daemon, ``cdc dev
down`` the stack); ``--then-stop`` stops the daemon at the end. Running the demo again starts
over: it stops the daemon of the previous run and recreates the databases and stores.

Whenever the demo stops its daemon (``--then-stop``, ``--stop``, a failed step) it also drops
what its PostgreSQL source made on the server, as ``cdc drop`` does: the replication slot (left
behind it would hold the server's WAL until the next run), the publication and the stored offset.
While the daemon runs the slot stays: the daemon streams from it. The databases and the stores
stay for poking until the next run recreates them.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from cdc.demo import shop, stores

PREFIX = "shop"                 # topics: shop.public.customers, shop.shop_inventory.products, ...
CACHE_PREFIX = "shopdemo"       # Redis keys
TOPICS = {"customers": "shop.public.customers", "orders": "shop.public.orders",
          "products": f"shop.{shop.MARIA_DATABASE}.products"}
ALIASES = TOPICS                # the search index's aliases are named as the topics
QUALIFIED = {"customers": "public.customers", "orders": "public.orders",
             "products": f"{shop.MARIA_DATABASE}.products"}
SOURCES = ("shop_pg", "shop_maria")
SINKS = ("warehouse", "search", "cache")
DOCUMENTS = "shop-orders"       # the joined documents' alias: an order with its customer


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo", help="capture PostgreSQL and MariaDB into a warehouse, a search index and a cache, live")
    demo.add_argument("--changes", type=int, default=300, help="live changes to make in each database")
    demo.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each step")
    demo.add_argument("--then-stop", action="store_true", help="stop the daemon at the end")
    demo.add_argument("--stop", action="store_true", help="only stop the daemon of an earlier demo")
    demo.set_defaults(handler=run)


def _home() -> Path:
    from cdc.dev.paths import dev_home

    return dev_home() / "demo"


def stop_daemon(home: Path) -> bool:
    """Stop the daemon an earlier run left (its process group, SIGTERM, then SIGKILL)."""
    pid_file = home / "daemon.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    pid_file.unlink()
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)
    return True


def release_source(home: Path) -> None:
    """After the daemon stopped: ``cdc drop`` of the PostgreSQL source of the demo's config, once
    the server has let go of the slot (a walsender ends a moment after its client)."""
    import psycopg2
    from pydantic import SecretStr

    from cdc.config import load_config
    from cdc.errors import CdcError
    from cdc.runtime.slots_cli import cmd_drop

    config = home / "cdc.yaml"
    if not config.exists():
        return
    try:
        source = next((s for s in load_config(str(config)).sources if s.name == "shop_pg"), None)
        # a field of the PostgreSQL plugin's config, a model the framework does not import
        dsn = getattr(source, "dsn", None)
        if not isinstance(dsn, SecretStr):
            print("the demo's config has no PostgreSQL source shop_pg: its replication slot is not dropped")
            return
        shop.wait_slots_released(dsn.get_secret_value(), timeout=30)
        cmd_drop(argparse.Namespace(file=str(config), source="shop_pg", yes=True))
    except (CdcError, OSError, psycopg2.Error) as err:  # the stack is down, or the config no longer the demo's
        print(f"the demo's replication slot is not dropped ({err}); `cdc drop {config} shop_pg` drops it")


def _config(dsn: str, maria_url: str, opensearch: str, redis: str, home: Path, http: str) -> str:
    topics = f'["{PREFIX}.public.*", "{PREFIX}.{shop.MARIA_DATABASE}.*"]'
    return f"""# written by `cdc demo`
log:
  embedded: {{path: ./cdc-data, topic_prefix: {PREFIX}}}
sources:
  - name: shop_pg
    type: postgres
    dsn: "{dsn}"
    tables: ["public.*"]
    state_dir: ./cdc-state
    heartbeat_interval: 1
  - name: shop_maria
    type: mysql
    url: "{maria_url}"
    server_id: 4711
    tables: ["{shop.MARIA_DATABASE}.*"]
sinks:
  - name: warehouse           # SQLite: sqlite3 {home / 'warehouse.db'}
    type: sql
    url: "sqlite:///{home / 'warehouse.db'}"
    topics: {topics}
    schema_policy: rebuild
    batch_wait_ms: 100
  - name: search              # an index per table, read through the alias named as the topic
    type: opensearch
    hosts: ["{opensearch}"]
    topics: {topics}
    settings: {{index: {{number_of_replicas: 0}}}}
    drop_old_generation_after_s: 60
  - name: cache               # a hash per row: {CACHE_PREFIX}:public.customers:<id>
    type: redis
    url: "{redis}"
    key_prefix: {CACHE_PREFIX}
    topics: {topics}
  - name: documents           # joined documents: each order with its customer, alias {DOCUMENTS}
    type: opensearch
    hosts: ["{opensearch}"]
    topics: ["{PREFIX}.public.*"]
    state_dir: ./cdc-state
    drop_old_generation_after_s: 60
    documents:
      - name: {DOCUMENTS}
        table: public.orders
        settings: {{index: {{number_of_replicas: 0}}}}
        lookups:
          # tier changes type in the live changes; an OpenSearch field cannot: left out
          - {{table: public.customers, as: customer, foreign_key: [customer_id], exclude: [tier, joined]}}
http: "{http}"
"""


def _reset_stores(opensearch_url: str, redis_url: str, home: Path) -> None:
    """What an earlier run left in the stores goes, so this run's stores start empty."""
    import redis as redis_client
    from opensearchpy import OpenSearch

    client = OpenSearch(hosts=[opensearch_url], timeout=60)
    for pattern in (f"{PREFIX}.*", f"{DOCUMENTS}__g*"):
        for index in client.indices.get(index=pattern, params={"ignore_unavailable": "true"}):
            client.indices.delete(index=index)
    if client.indices.exists(index="cdc-sink-state"):
        # Another OpenSearch sink (a test's, a user's) may have made the state index without ours in it.
        for sink in ("search", "documents"):
            client.delete(index="cdc-sink-state", id=sink, params={"ignore": 404, "refresh": "true"})
    client.close()
    cache = redis_client.Redis.from_url(redis_url)
    for key in cache.scan_iter(match=f"{CACHE_PREFIX}*", count=1000):
        cache.delete(key)
    cache.close()
    for stale in ("cdc-data", "cdc-state", "warehouse.db", "warehouse.db-wal", "warehouse.db-shm"):
        subprocess.run(["rm", "-rf", str(home / stale)], check=False)


def _status(http: str) -> dict[str, dict]:
    from cdc.runtime.control import daemon_status

    return {row["name"]: row for row in daemon_status(http) or []}


class Failed(Exception):
    pass


def _wait(what: str, check, daemon: subprocess.Popen, log_file: Path, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if daemon.poll() is not None:
            raise Failed(f"the daemon exited ({daemon.returncode}) while waiting for {what}:\n"
                         f"{log_file.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {timeout:.0f}s; the daemon's log ({log_file}) ends:\n"
                         f"{log_file.read_text()[-3000:]}")
        time.sleep(0.5)


def event_counts(log_, source_names) -> dict[str, dict[str, int]]:
    """Per source, the change events in the log: snapshot rows and live changes."""
    import orjson

    from cdc.topics import internal_topic

    counts = {name: {"snapshot": 0, "live": 0} for name in source_names}
    for topic in log_.topics():
        if not topic.startswith(f"{PREFIX}.") or internal_topic(topic):
            continue
        for record in log_.read_all(topic):
            if record.value is None:
                continue
            source = orjson.loads(record.value)["source"]
            if source["name"] in counts:
                counts[source["name"]]["live" if source["snapshot"] == "false" else "snapshot"] += 1
    return counts


class Shop:
    """Where the demo's tables are, and how to read them and the stores (through the sinks of the
    demo's config file, ``config_path``)."""

    def __init__(self, pg_dsn: str, maria_url: str, config_path: Path) -> None:
        self.pg_dsn, self.maria_url, self.config_path = pg_dsn, maria_url, config_path

    def sources(self) -> stores.Rows:
        import psycopg2

        pg = psycopg2.connect(self.pg_dsn)
        try:
            with pg.cursor() as cur:
                rows = stores.sql_rows(cur, stores.PG_TABLES)
        finally:
            pg.close()
        maria = shop.maria_connect(self.maria_url, shop.MARIA_DATABASE)
        try:
            with maria.cursor() as cur:
                rows.update(stores.sql_rows(cur, stores.MARIA_TABLES))
        finally:
            maria.close()
        return rows

    def _sink(self, name: str):
        """The demo's sink ``name``, built from its config (not started)."""
        from cdc.config import load_config
        from cdc.plugins import sink_class

        config = load_config(str(self.config_path), only=[name]).sink(name)
        return sink_class(config)(config)

    def stores(self) -> dict[str, stores.Rows]:
        """Every sink's rows, each read through the sink (``ReadableSink``); a store the sink cannot
        read yet (being made) reads as empty."""
        from cdc.errors import CdcError

        out = {}
        for name in SINKS:
            sink = self._sink(name)
            try:
                sink.start()
                out[name] = stores.sink_rows(sink, TOPICS)
            except CdcError:
                out[name] = {}
            finally:
                sink.stop()
        return out

    def check(self) -> dict[str, dict[str, str]]:
        """store -> table -> what differs; empty when every store equals its source (the joined
        documents: each equal to its order joined with its customer in PostgreSQL)."""
        source = self.sources()
        out = {name: diff for name, rows in self.stores().items() if (diff := stores.differences(source, rows))}
        if diff := stores.differences(self.joined(), self.documents()):
            out["documents"] = diff
        return out

    def joined(self) -> dict[str, dict]:
        """The orders joined with their customers, as PostgreSQL has them now."""
        import psycopg2

        pg = psycopg2.connect(self.pg_dsn)
        try:
            with pg.cursor() as cur:
                return stores.joined_orders(cur)
        finally:
            pg.close()

    def documents(self) -> dict[str, dict]:
        """The joined documents readers see (none while the index is being made)."""
        from opensearchpy import OpenSearch

        from cdc.config import load_config

        config = load_config(str(self.config_path), only=["documents"]).sink("documents")
        client = OpenSearch(hosts=list(config.hosts), timeout=60)  # type: ignore[attr-defined]
        try:
            return stores.document_rows(client, DOCUMENTS)
        finally:
            client.close()

    def search_generation(self, table: str) -> int:
        """The generation the search sink's readers see for ``table`` (what it ``describe``s)."""
        sink = self._sink("search")
        try:
            sink.start()
            return next((row["generation"] for row in sink.describe() if row["topic"] == TOPICS[table]), 0)
        finally:
            sink.stop()


def run(args: argparse.Namespace) -> int:
    home = _home()
    home.mkdir(parents=True, exist_ok=True)
    if args.stop:
        print("stopped the demo's daemon" if stop_daemon(home) else "no demo daemon was running")
        release_source(home)
        return 0
    try:
        return _run(args, home)
    except Failed as err:
        print(f"\nFAILED: {err}")
        return 1


def _run(args: argparse.Namespace, home: Path) -> int:
    import psycopg2

    from cdc.config import load_config
    from cdc.dev import stack
    from cdc.dev.services import free_port
    from cdc.log.open import open_log
    from cdc.offsets import OffsetStore
    from cdc.positions import SnapshotProgress

    if stop_daemon(home):
        print("0. stopped the daemon of the previous demo run")
    env = stack.up(["postgres", "mysql", "redis", "opensearch"])
    dsn = shop.reset_postgres(env["PG_DSN"])
    shop.reset_mariadb(env["MYSQL_URL"])
    _reset_stores(env["OPENSEARCH_URL"], env["REDIS_URL"], home)
    print(f"1. PostgreSQL {shop.PG_DATABASE}: 50 customers, 200 orders; "
          f"MariaDB {shop.MARIA_DATABASE}: 40 products")

    config = home / "cdc.yaml"
    http = f"127.0.0.1:{free_port()}"
    config.write_text(_config(dsn, env["MYSQL_URL"], env["OPENSEARCH_URL"], env["REDIS_URL"], home, http))
    log_file = home / "daemon.log"
    daemon = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=home,
                              stdout=open(log_file, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    (home / "daemon.pid").write_text(str(daemon.pid))
    print(f"2. started `cdc run {config}` (pid {daemon.pid}; log {log_file}): 2 sources, 4 sinks "
          "(warehouse: SQLite, search: OpenSearch, cache: Redis, documents: orders joined with their "
          "customers in OpenSearch)")
    shop_ = Shop(dsn, env["MYSQL_URL"], config)
    loaded = load_config(str(config))
    try:
        log_ = _wait("the log", lambda: (config.parent / "cdc-data").exists() and open_log(loaded.log),
                     daemon, log_file, args.timeout)

        def snapshots_done():
            rows = _status(http)
            if not all(rows.get(name, {}).get("phase") == "streaming" for name in SOURCES):
                return None
            stored = OffsetStore(log_, PREFIX).load_all()
            # A stored SnapshotProgress means the snapshot's end is not acknowledged yet.
            return stored if all(stored.get(name) is not None and not isinstance(stored[name], SnapshotProgress)
                                 for name in SOURCES) else None
        stored = _wait("both snapshots", snapshots_done, daemon, log_file, args.timeout)
        before = event_counts(log_, SOURCES)
        print("3. both snapshots are done; the sources stream from their stored positions:")
        for name in SOURCES:
            print(f"     {name:<11} phase streaming, {before[name]['snapshot']} snapshot rows, "
                  f"{before[name]['live']} live changes, stored offset {stored[name]}")
        if any(before[name]["live"] for name in SOURCES):
            raise Failed(f"live changes before any were made: {before}")

        # The stores first hold the snapshot, so the search index is made for the first shape
        # (tier integer) and the schema change below is one it must rebuild for.
        _wait("the snapshot in every store", lambda: not shop_.check(), daemon, log_file, args.timeout)
        at_snapshot = {table: len(rows) for table, rows in shop_.sources().items()}
        print("   every store holds the snapshot; live changes start now")

        rng = random.Random()
        pg = psycopg2.connect(dsn)
        pg.autocommit = True
        maria = shop.maria_connect(env["MYSQL_URL"], shop.MARIA_DATABASE)
        with pg.cursor() as pg_cur, maria.cursor() as maria_cur:
            for i in range(args.changes):
                if i == args.changes // 2:
                    pg_cur.execute(shop.SCHEMA_CHANGE)
                    print(f"     schema change: {shop.SCHEMA_CHANGE}")
                shop.pg_change(pg_cur, rng, i, tier_is_text=i >= args.changes // 2)
                shop.maria_change(maria_cur, rng, i)
        pg.close()
        maria.close()
        print(f"   made {args.changes} live changes in each database, while capturing")

        _wait("the search index's rebuild", lambda: shop_.search_generation("customers") > 1,
              daemon, log_file, args.timeout)
        _wait("every store equal to its source", lambda: not shop_.check(), daemon, log_file, args.timeout)
        after = event_counts(log_, SOURCES)
        live = {name: after[name]["live"] for name in SOURCES}
        # Compaction keeps the latest record per key: these are the live changes still in the log.
        print("4. live changes in the log (source.snapshot = false; the latest per key), all made after "
              "the snapshots: " + ", ".join(f"{name} {count}" for name, count in live.items()))
        if not all(live.values()):
            raise Failed(f"a source published no live change: {live}")
        print(f"   the schema change rebuilt the search index: {ALIASES['customers']} now reads "
              f"generation {shop_.search_generation('customers')}")
        # The stores were equal just now; read once more to print what each holds.
        source, held = shop_.sources(), shop_.stores()
        problems = {name: stores.differences(source, rows) for name, rows in held.items()}
        joined, documents = shop_.joined(), shop_.documents()
        problems["documents"] = stores.differences(joined, documents)
        print("5. every store equals its source:")
        for table in TOPICS:
            print(f"     {table:<10} source {len(source[table]):>4} rows ({at_snapshot[table]} at the snapshot)  ==  " + "  ".join(
                f"{name} {len(held[name].get(table, {})):>4}" for name in SINKS))
        print(f"     orders joined with their customer: source {len(joined['orders']):>4}  ==  documents "
              f"{len(documents['orders']):>4} (alias {DOCUMENTS})")
        if any(problems.values()):
            raise Failed(f"a store moved away from its source: {problems}")
        log_.close()
    except Failed:
        stop_daemon(home)
        release_source(home)
        raise
    print(f"\nconsole:  http://{http}/       (also /status, /metrics, /healthz)")
    print(f"poke:     the warehouse: {home / 'warehouse.db'} (SQLite: customers, orders, products)")
    print(f"          curl '{env['OPENSEARCH_URL']}/{ALIASES['customers']}/_search?size=3&pretty'")
    print(f"          redis-cli -u {env['REDIS_URL']} HGETALL {CACHE_PREFIX}:public.customers:1")
    print(f"          curl '{env['OPENSEARCH_URL']}/{DOCUMENTS}/_search?size=1&pretty'   (an order with its customer)")
    if args.then_stop:
        stop_daemon(home)
        release_source(home)
        print("the daemon is stopped (--then-stop)")
    else:
        print("the daemon keeps running (it streams from its replication slot): `cdc demo --stop` stops it "
              "and drops the slot; `cdc dev down` the stack")
    return 0
