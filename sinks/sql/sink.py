"""``type: sql``: keep SQL tables (PostgreSQL, MySQL/MariaDB, SQLite, DuckDB) in sync with topics.

Threading: one thread calls ``start``, ``write``, the generation methods and ``stop``; the
methods block on the database. Several sink processes may write the same target (a live sink and
a rebuild); the database's locks and the version guard keep them correct.

A write (see cdc/sink_event.py for the semantics it implements):

1. ``reduce_events``: the newest action per (topic, key).
2. ``TableCatalog.prepare`` per topic: create the table, add columns, check the source schema
   (DDL, each in its own small transaction; idempotent).
3. One transaction: read the generation to write (locked, see generations.py) and the truncate
   watermarks, then per table: raise the watermark and clear older rows; remember deletes and
   remove older rows; apply tombstones; upsert what no newer row, remembered delete or watermark
   overrides. Committed before ``write`` returns, so it is durable.

   On PostgreSQL a large write is split by key into ``write_connections`` parts (``_parts``), each
   step 3 in a transaction of its own on its own connection, all at once: the server's side of a
   write, most of its time (bench/sql_upsert.py), then runs on several cores, and one part's
   staging text is made while another's statements run. Every key is in one part, and whatever
   the version guard, remembered deletes and watermarks decide for a key is decided inside its
   part's transaction, so the parts need no order among them. ``write`` returns only when every
   part has committed; if one fails, the others may have committed, and the retried batch applies
   their keys again as no-ops (the guard), as a replay after a crash would. A batch with a
   truncate (table-wide) stays one transaction, as does a table whose key is not its events' key
   (two event keys may be one row).

Errors: connection trouble, deadlocks, serialization failures and lock timeouts are
``RetriableError``; a value that does not fit is a ``PermanentError`` naming the table, the key
and (for a batch of one, which the runtime's split reaches) the column; an incompatible schema
change is ``SchemaChangeError`` or ``RebuildRequired`` by ``schema_policy``, for every batch until
the table is rebuilt or the policy changed: they are not poison events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from cdc.api import (
    BulkLoadableSink,
    CdcError,
    PermanentError,
    ReadableSink,
    RebuildableSink,
    RetriableError,
    SchemaChangeError,
    Sink,
    SinkEvent,
    StoredRow,
    WindowPart,
    page,
    servers,
)
from cdc.api.digest import Digest, DigestingSink, DigestPlan
from sinks.sql.apply_generic import GenericApplier
from sinks.sql.apply_staged import StagedApplier
from sinks.sql.bookkeeping import Bookkeeping
from sinks.sql.bulk_load import BulkLoader
from sinks.sql.config import SqlSinkConfig
from sinks.sql.deadline import WriteDeadline
from sinks.sql.errors import DRIVER_ERRORS, describe, is_data_error, translate
from sinks.sql.generations import Generations
from sinks.sql.plan import DELETED, PlanFailed, TablePlan
from sinks.sql.reading import digest_plan as _digest_plan
from sinks.sql.reading import digest_range as _digest_range
from sinks.sql.reading import read_keys as _read_keys
from sinks.sql.reading import read_range as _read_range
from sinks.sql.reading import stored_forms as _stored_forms
from sinks.sql.reduce import TopicChanges, reduce_events
from sinks.sql.tables import TableCatalog
from sinks.sql.target import Target

log = logging.getLogger(__name__)

# The fewest keys worth a part of their own (see ``SqlSink._parts``): a part pays a transaction's
# fixed statements (connection check, generation lock, watermarks, staging, commit), about half a
# millisecond of the server's, against some 5 us a key; 500 lets the runtime's default batch of
# 2,000 events go over two connections.
MIN_PART_KEYS = 500


class SqlSink(Sink, RebuildableSink, BulkLoadableSink, ReadableSink, DigestingSink):
    """See the module docstring; generations: ``current_generation``, ``open_generation``,
    ``switch_generation``, ``drop_generation`` (generations.py); a rebuild's windows in bulk:
    ``bulk_load`` (bulk_load.py); the rows back: ``read_rows``."""

    config_model = SqlSinkConfig

    def __init__(self, config: SqlSinkConfig, generation: int | None = None) -> None:
        super().__init__(config, generation)
        self.config: SqlSinkConfig = config
        self.target: Target | None = None
        self._current = 1
        self._next_prune = 0.0
        self._seen_tables: set[str] = set()
        self.bulk: BulkLoader | None = None  # made by start()
        self._pool: ThreadPoolExecutor | None = None  # applies the other parts of a split write

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        config = self.config
        native = self.context.native  # the compiled helpers of the runtime, where it has them
        with self._errors("start"):
            target = Target(config.url.get_secret_value(), config.target_schema, f"cdc-sink-{config.name}",
                            config.connect_timeout)
            deadline = WriteDeadline(target.engine, target.kind, config.write_timeout)  # before any connection
            try:
                books = Bookkeeping(target, config.name)
                target.run_ddl(books.create)
                catalog = TableCatalog(target, books, config,
                                       lambda topic, version=None: self.context.schema_for(topic, version),
                                       lambda: self._current, self.shape_of,
                                       lambda topic, after, before: self.context.shapes_between(topic, after, before),
                                       native.unknown_names)
                generations = Generations(target, books, catalog, config.name)
                self._current = generations.ensure(self.generation)
            except BaseException:
                target.engine.dispose()
                raise
        self.target, self.books, self.catalog, self.generations = target, books, catalog, generations
        self.deadline = deadline
        self.applier = StagedApplier(target, books, config.soft_delete, native) \
            if target.kind in ("postgresql", "duckdb") else GenericApplier(target, books, config.soft_delete)
        self.bulk = BulkLoader(target, books, catalog, config.soft_delete, native)
        if target.kind == "postgresql" and config.write_connections > 1:
            self._pool = ThreadPoolExecutor(config.write_connections - 1,
                                            thread_name_prefix=f"sql-sink-{config.name}")
        log.info("sql sink %s: started on %s (%s), writing generation %s", config.name, target.kind,
                 target.engine.url.render_as_string(hide_password=True),
                 self.generation if self.generation is not None else f"{self._current} (current)")

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.target is not None:
            self.target.engine.dispose()

    @property
    def raw_rows(self) -> bool:
        """Rows may come as JSON bytes (cdc.api.Sink.raw_rows) where they go into PostgreSQL's typed
        COPY, whose C loop writes them without decoding (copy_rows.py); elsewhere ``write``
        decodes them first."""
        return self.context.native.copy_rows is not None and \
            getattr(getattr(self, "applier", None), "typed_upserts", False)

    @property
    def bootstrap_by_rebuild(self) -> bool:
        """``cdc bootstrap`` into PostgreSQL fills a new generation (the history reduced per key, in
        bulk, bulk_load.py) and switches readers to it once complete; elsewhere it writes into
        the generation readers see, batch by batch."""
        url = self.config.url.get_secret_value()
        return url.startswith(("postgresql", "postgres:")) and not self.config.soft_delete

    @property
    def engine(self) -> sa.engine.Engine:
        """The target's engine (for tests and tools that read what the sink wrote)."""
        return self._started().engine

    def _started(self) -> Target:
        """The target, once ``start`` connected to it."""
        if self.target is None:
            raise PermanentError(f"sql sink {self.config.name}: call start() first")
        return self.target

    # --- writing --------------------------------------------------------------------------------

    def write(self, events: list[SinkEvent]) -> None:
        if not events:
            return
        self._started()
        changes = reduce_events(events, self.context.delete_read)
        if not self.raw_rows:  # rows the runtime left as JSON bytes, for an applier that reads values
            for topic_changes in changes.values():
                topic_changes.materialize()
        # The deadline inside: a write it cut short is retriable, with no diagnosis of the server.
        with self._errors("write"), self.deadline.watch(f"sql sink {self.config.name}: write"):
            for _ in range(5):
                generation = self.generation if self.generation is not None else self._current
                try:
                    plans = [self.catalog.prepare(c, generation) for c in changes.values()]
                except SchemaChangeError:
                    # Readers may have moved to a rebuilt generation that fits: follow it.
                    if self.generation is None and (current := self.generations.current()) != generation:
                        self._current = current
                        continue
                    raise
                self._seen_tables.update(plan.tbl for plan in plans)
                try:
                    if self._commit(plans, generation):
                        break
                except PlanFailed as failed:
                    where = failed.plan.tbl if failed.plan is not None else "staging the batch"
                    if failed.plan is not None and is_data_error(failed.error):
                        raise self._diagnose(failed.plan, failed.error) from failed.error
                    raise translate(failed.error, f"sql sink {self.config.name}: {where}",
                                    setting=servers.setting_of("sink", self.config.name, "url")) from failed.error
            else:
                raise RetriableError(f"sql sink {self.config.name}: the current generation kept changing "
                                     f"during the write")
            self._prune_deletes()

    def _commit(self, plans: list[TablePlan], generation: int) -> bool:
        """Apply ``plans``, in parts at once where ``_parts`` splits them; False if readers moved to
        another generation first (then some parts may be in the old one: the write is retried)."""
        parts, pool = self._parts(plans), self._pool
        if len(parts) == 1 or pool is None:  # no pool: one part
            return self._commit_part(plans, generation)
        futures = [pool.submit(self._commit_part, part, generation) for part in parts[1:]]
        error: Exception | None = None
        try:
            results = [self._commit_part(parts[0], generation)]
        except Exception as err:
            error, results = err, []
        for future in futures:  # every part has ended before the write returns or raises
            try:
                results.append(future.result())
            except Exception as err:
                error = error or err
        if error is not None:
            raise error
        return all(results)

    def _parts(self, plans: list[TablePlan]) -> list[list[TablePlan]]:
        """``plans`` split by key into parts to apply at once (module docstring), or ``[plans]``."""
        if self._pool is None:
            return [plans]
        parts = min(self.config.write_connections, sum(len(plan.changes) for plan in plans) // MIN_PART_KEYS)
        if parts < 2 or not all(_splittable(plan) for plan in plans):
            return [plans]
        pieces = [plan.changes.split(parts) for plan in plans]
        return [[TablePlan(changes[n], plan.tbl, plan.entry, plan.columns)
                 for plan, changes in zip(plans, pieces) if len(changes[n])] for n in range(parts)]

    def _commit_part(self, plans: list[TablePlan], generation: int) -> bool:
        """Apply ``plans`` in one transaction; False if readers moved to another generation first."""
        with self._started().engine.begin() as conn:
            if self.generation is None:
                current = self.books.current(conn, lock="share") or 1
                if current != generation:
                    self._current = current
                    return False
            self._apply(conn, plans)
        return True

    def _apply(self, conn: sa.engine.Connection, plans: list[TablePlan]) -> None:
        marks = self.books.watermarks(conn, [plan.tbl for plan in plans])
        for plan in plans:
            stored, truncate = marks.get(plan.tbl), plan.changes.truncate
            plan.watermark = stored if truncate is None else truncate if stored is None else max(stored, truncate)
        now = datetime.now(UTC).replace(tzinfo=None)
        self.applier.apply_all(conn, plans, now)

    def _diagnose(self, plan: TablePlan, error: BaseException) -> PermanentError:
        """A data error, named as closely as a batch of one allows: the key, then the column
        (probing the row column by column in transactions that are rolled back)."""
        plan.changes.materialize()
        upserts = list(plan.live_upserts())
        if len(plan.changes) != 1 or len(upserts) != 1:
            return PermanentError(f"sql sink {self.config.name}: {plan.tbl}: a value does not fit "
                                  f"(one of {len(plan.changes)} keys; a batch of one names the key and "
                                  f"column): {describe(error)}")
        key_json, event = upserts[0]
        row = event.after
        assert isinstance(row, dict), "materialized above: an upsert's row, decoded"
        key_names = {c.name for c in plan.key_columns}
        missing = sorted(name for name in key_names if row.get(name) is None and event.key.get(name) is None)
        if missing:  # every column would fail on the key's NOT NULL: name the key, not the first column
            return PermanentError(f"sql sink {self.config.name}: {plan.tbl}: key {key_json.decode()}: the row has "
                                  f"no value for the table's key column{'s' if len(missing) > 1 else ''} "
                                  f"{', '.join(missing)} (neither in the record's key nor in its after): "
                                  f"{describe(error)}")
        for column in plan.columns:
            value = row.get(column.name)
            if column.key or column.skipped or value is None:
                continue
            after = {name: v for name, v in row.items() if name in key_names}
            after[column.name] = value
            probe = event._replace(after=after)
            changes = TopicChanges(plan.changes.topic, probe, upserts={key_json: probe})
            probe_plan = TablePlan(changes, plan.tbl, plan.entry, plan.columns, plan.watermark)
            try:
                with self._started().engine.connect() as conn:
                    transaction = conn.begin()
                    try:
                        self._apply(conn, [probe_plan])
                    finally:
                        transaction.rollback()
            except PlanFailed as failed:
                if is_data_error(failed.error):
                    return PermanentError(f"sql sink {self.config.name}: {plan.tbl}: key {key_json.decode()}: "
                                          f"column {column.name} ({column.sql_type}): cannot store "
                                          f"{value!r}: {describe(failed.error)}")
                break
            except CdcError:
                break
        return PermanentError(f"sql sink {self.config.name}: {plan.tbl}: key {key_json.decode()}: "
                              f"{describe(error)}")

    def _prune_deletes(self) -> None:
        """Forget deletes older than ``delete_memory_hours`` (at most every hour, or a tenth of it)."""
        now = time.monotonic()
        if now < self._next_prune:
            return
        hours = self.config.delete_memory_hours
        self._next_prune = now + min(3600.0, hours * 360.0)
        cutoff = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=hours)
        with self._started().engine.begin() as conn:
            pruned = self.books.prune_deletes(conn, sorted(self._seen_tables), cutoff)
        if pruned > 0:  # -1: the driver (DuckDB) does not say how many; nothing worth a line then
            log.info("sql sink %s: forgot %d deletes older than %s h", self.config.name, pruned, hours)

    @property
    def bulk_loads(self) -> bool:
        """PostgreSQL without soft deletes (bulk_load.py); elsewhere rebuilds write batch by batch."""
        return self.bulk is not None and self.bulk.able

    def bulk_load(self, part: WindowPart) -> bool:
        """A part of a rebuild's window whose keys the generation being written does not hold yet
        (cdc.api.BulkLoadableSink)."""
        self._started()
        if self.generation is None:  # only into a generation opened for it, never the one readers see
            return False
        assert self.bulk is not None, "start() made it"
        with self._errors("bulk load"), self.deadline.watch(f"sql sink {self.config.name}: bulk load"):
            return self.bulk.load(part, self.generation)

    def read_rows(self, topic: str, after: tuple | None = None, limit: int | None = None) -> list[StoredRow]:
        """The live rows of ``topic``'s table in the generation readers see (cdc.api.ReadableSink),
        as the driver reads its columns (no bookkeeping columns), keyed by the table's key."""
        target = self._started()
        with self._errors("read_rows"):
            generation = self.generations.current()
            with target.engine.begin() as conn:
                entry = next((e for e in self.books.entries(conn, generation).values() if e.topic == topic), None)
                if entry is None:
                    return []
                q, columns = target.quote, list(entry.columns)
                live = f" WHERE {q(DELETED)} = FALSE" if self.config.soft_delete else ""
                rows = conn.exec_driver_sql(f"SELECT {', '.join(q(c) for c in columns)} FROM "
                                            f"{target.qualified(entry.physical)}{live}").all()
        key = [columns.index(name) for name in entry.key]
        return page([StoredRow(tuple(row[i] for i in key), dict(zip(columns, row))) for row in rows], after, limit)

    def read_range(self, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
        """One chunk of ``cdc verify`` (cdc.api.ReadableSink; reading.py says what it costs)."""
        self._started()
        with self._errors("read_range"):
            return _read_range(self, topic, after, upto)

    def read_keys(self, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
        self._started()
        with self._errors("read_keys"):
            return _read_keys(self, topic, keys)

    def stored_forms(self, topic: str, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
        self._started()
        with self._errors("stored_forms"):
            return _stored_forms(self, topic, rows)

    def digest_plan(self, topic: str) -> DigestPlan | None:
        """``cdc verify``'s chunk digests in the target (cdc.api.DigestingSink; reading.py)."""
        self._started()
        with self._errors("digest_plan"):
            return _digest_plan(self, topic)

    def digest_range(self, topic: str, plan: DigestPlan, after: int | None, upto: int | None) -> Digest:
        self._started()
        with self._errors("digest_range"):
            return _digest_range(self, topic, plan, after, upto)

    # --- generations ----------------------------------------------------------------------------

    def current_generation(self) -> int:
        self._started()
        with self._errors("current_generation"):
            self._current = self.generations.current()
        return self._current

    def open_generation(self, generation: int) -> None:
        self._started()
        with self._errors(f"open_generation({generation})"):
            self.generations.open(generation)
        self.generation = generation

    def switch_generation(self, generation: int) -> None:
        self._started()
        with self._errors(f"switch_generation({generation})"):
            self.generations.switch(generation)
        self._current = generation
        self.generation = None  # from now on: follow the current generation (this one)

    def drop_generation(self, generation: int) -> None:
        self._started()
        with self._errors(f"drop_generation({generation})"):
            self.generations.drop(generation)
        if self.generation == generation:
            self.generation = None

    # --- errors ---------------------------------------------------------------------------------

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except CdcError:
            raise
        except DRIVER_ERRORS as err:
            url = self.config.url.get_secret_value()
            raise translate(err, f"sql sink {self.config.name}: {what}", url=url, role=_user_of(url),
                            setting=servers.setting_of("sink", self.config.name, "url")) from err


def _splittable(plan: TablePlan) -> bool:
    """Whether ``plan``'s keys may go to different transactions: its table exists, the batch has
    no truncate for it, and the table's key is its events' key (else two event keys may be one row,
    which two parts would then both write)."""
    changes = plan.changes
    if plan.entry is None or changes.truncate is not None:
        return False
    firsts = [next(iter(events.values()), None) for events in (changes.upserts, changes.deletes)]
    keys = [event.key for event in firsts if event is not None] + [next(iter(changes.tombstones.values()), {})]
    table_key = {column.name for column in plan.key_columns}
    return all(set(key) == table_key for key in keys if key)


def _user_of(url: str) -> str | None:
    try:
        return sa.engine.make_url(url).username
    except sa.exc.ArgumentError:
        return None
