"""``type: redis``: keep Redis keys (hashes, JSON strings, RedisJSON documents) in sync with topics,
or invalidate them on every change.

Threading: one thread calls ``start``, ``write``, the generation methods and ``stop`` (the
runtime's rule). Two threads of the sink's own run beside it: the applied publisher
(publisher.py) and, after a rebuild, the deletion of the old generation (generations.py).

A write (see cdc.api.SinkEvent for the semantics it implements):

1. ``plan_batch``: the newest change per key -> one guarded change per key (plan.py).
2. ``ScriptPipeline.run``: pipelines of ``pipeline_size`` changes, on a single server grouped into
   script calls of many rows, in a cluster one call per row, retried as a whole (pipeline.py);
   every change applies only if its version is newer than the key's (guard.py).
3. Truncates: the table's keys are found with SCAN and deleted with the truncate's version (so
   keys written after it stay).
4. Counters (``<namespace>:stats``: written, deleted, skipped) and the written positions handed to
   the applied publisher. Durable when ``write`` returns as far as Redis is: with ``appendfsync
   always`` (or a replica and ``WAIT``) nothing acknowledged is lost; with less, a server crash
   may lose the last second, which the consumer offsets already passed (see README.md).

Errors: connection trouble, OOM, BUSY, LOADING, TRYAGAIN, CLUSTERDOWN and failovers are
``RetriableError`` (after the pipeline's own retries); a wrong type under a key or a missing
module is ``PermanentError`` naming the key's table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from cdc.api import PermanentError, ReadableSink, RebuildableSink, RetriableError, Sink, SinkEvent, StoredRow, page
from sinks.documents.declaration import not_kept_yet
from sinks.redis.client import redacted_url, translate
from sinks.redis.config import RedisSinkConfig
from sinks.redis.keys import KeySpace, companion, decode_key, namespace, stats_key
from sinks.redis.pipeline import Command, ScriptPipeline
from sinks.redis.pipeline import row as row_change
from sinks.redis.plan import plan_batch
from sinks.redis.publisher import AppliedPublisher
from sinks.redis.reading import read_keys as _read_keys
from sinks.redis.reading import read_range as _read_range
from sinks.redis.reading import stored_forms as _stored_forms
from sinks.redis.server import open_server
from sinks.redis.shapes import ShapeFollower
from sinks.redis.values import column_chooser, stored_row
from sinks.redis.wait import current_namespace

log = logging.getLogger(__name__)

DEFAULT_TOMBSTONE_MS = 24 * 3600 * 1000
POINTER_CHECK_S = 1.0
TRUNCATE_SCAN_COUNT = 1000


class RedisSink(Sink, RebuildableSink, ReadableSink):
    """See the module docstring."""

    config_model = RedisSinkConfig

    @classmethod
    def class_for(cls, config: Any) -> type[Sink]:
        if getattr(config, "documents", None) is not None:
            from sinks.redis.doc_sink import RedisDocumentSink

            return RedisDocumentSink
        return cls

    def __init__(self, config: RedisSinkConfig, generation: int | None = None) -> None:
        super().__init__(config, generation)
        not_kept_yet(config.name, config.documents)
        self.config: RedisSinkConfig = config
        self.client: redis.Redis | RedisCluster | None = None  # connected by start()
        self._choose = column_chooser(config)
        self._known_tables: dict[str, tuple[str, str]] = {}
        self._current = 1
        self._publisher: AppliedPublisher | None = None
        self._pointer_checked = time.monotonic()
        self.counts = {"written": 0, "deleted": 0, "skipped": 0}
        self._shapes = ShapeFollower(config.name, config.schema_policy, self.shape_of,
                                     lambda topic: self.context.schema_for(topic, None),
                                     self._get, self._set)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        config = self.config
        client, pipeline, generations, self._current = open_server(config)
        self.client, self.pipeline, self.generations = client, pipeline, generations
        self._keyspace = KeySpace(config.key_template, namespace(config.prefix, self._writing()))
        self._live_ms = int(config.ttl_seconds * 1000) if config.ttl_seconds else 0
        self._tombstone_ms = config.tombstone_retention_ms or DEFAULT_TOMBSTONE_MS
        self._tombstone_from_topics = config.tombstone_retention_ms is None
        context = self.context
        if (log_client := context.log) is not None:
            # A pipeline of its own: the publisher runs in its own thread (ScriptPipeline is not shared).
            own = ScriptPipeline(client, config.name, config.pipeline_size, config.max_retries)
            self._publisher = AppliedPublisher(context, log_client, list(config.topics), config.name, own, self._keyspace.ns,
                                               use_committed=self.generation is None)
            self._publisher.start()
        log.info("redis sink %s: started (%s, format %s), writing generation %d under %s:", config.name,
                 "cluster" if config.cluster else "single server", config.format, self._writing(),
                 self._keyspace.ns)

    def _where(self) -> str:
        return redacted_url(self.config.url.get_secret_value())

    def stop(self) -> None:
        """Stop the publisher, finish background drops, close the connections. The client stays:
        a later call (``current_generation``, as ``cdc rebuild`` reports) connects again."""
        if self._publisher is not None:
            self._publisher.stop()
            self._publisher = None
        if self.client is not None:
            self.generations.wait()
            self.client.close()

    def _started(self) -> redis.Redis | RedisCluster:
        """The client, once ``start`` connected it."""
        if self.client is None:
            raise PermanentError(f"redis sink {self.config.name}: call start() first")
        return self.client

    def _writing(self) -> int:
        return self.generation if self.generation is not None else self._current

    # --- writing --------------------------------------------------------------------------------

    def write(self, events: list[SinkEvent]) -> None:
        if not events:
            return
        self._started()
        self._follow_generation()
        if self._tombstone_from_topics:
            self._tombstone_ms = self._retention(events[0].topic)
        keep = self._follow_shapes(events)
        plan = plan_batch(events, self._keyspace, self.config.format, self._choose, self._known_tables, keep)
        replies = self.pipeline.run(plan.commands, (self._live_ms, self._tombstone_ms))
        for (schema, table), version in plan.truncates.items():
            replies.extend(self._truncate(schema, table, version))
        self._count(replies)
        if self._publisher is not None:
            ends: dict = {}
            for event in events:
                tp = (event.topic, event.partition)
                if event.offset + 1 > ends.get(tp, 0):
                    ends[tp] = event.offset + 1
            self._publisher.note_written(ends)

    def _follow_shapes(self, events: list[SinkEvent]) -> dict[str, frozenset[str]]:
        """Each topic's shape in this write, per ``schema_policy`` (shapes.py); the columns to keep
        of rows of an older shape, per topic."""
        firsts: dict[str, SinkEvent] = {}
        for event in events:
            if event.source and event.topic not in firsts:
                firsts[event.topic] = event
        keep: dict[str, frozenset[str]] = {}
        ns = self._keyspace.ns
        for topic, first in firsts.items():
            columns = self._shapes.follow(ns, first)
            if columns is not None:
                keep[topic] = columns
        return keep

    def _get(self, key: str) -> bytes | None:
        try:
            return self._started().get(key)  # type: ignore[return-value]  # redis-py: sync client, bytes or None
        except Exception as err:  # noqa: BLE001 - classified
            raise translate(err, f"redis sink {self.config.name}: reading {key}") from err

    def _set(self, key: str, value: bytes) -> None:
        try:
            self._started().set(key, value)
        except Exception as err:  # noqa: BLE001 - classified
            raise translate(err, f"redis sink {self.config.name}: writing {key}") from err

    def _follow_generation(self) -> None:
        """A sink writing the current generation moves with readers after a rebuild switched them
        (read at most once a second)."""
        now = time.monotonic()
        if self.generation is not None or now < self._pointer_checked + POINTER_CHECK_S:
            return
        self._pointer_checked = now
        try:
            current = self.generations.current()
        except Exception as err:  # noqa: BLE001 - classified
            raise translate(err, f"redis sink {self.config.name}: reading the generation pointer") from err
        if current != self._current:
            log.info("redis sink %s: readers moved to generation %d; writing there", self.config.name, current)
            self._current = current
            self._retarget(use_committed=True, forget_positions=False)

    def _retention(self, topic: str) -> int:
        try:
            found = self.context.delete_retention_ms(topic)
        except Exception:  # noqa: BLE001 - the log may not say; keep the default
            found = None
        self._tombstone_from_topics = False
        return found or DEFAULT_TOMBSTONE_MS

    def _truncate(self, schema: str, table: str, version: int) -> list:
        """Delete the table's keys older than ``version`` (SCAN; the version guard keeps newer ones)."""
        pattern = self._keyspace.table_pattern(schema, table)
        commands: list[Command] = []
        replies: list = []
        ttls = (self._live_ms, self._tombstone_ms)
        client = self._started()
        try:
            for key in client.scan_iter(match=pattern, count=TRUNCATE_SCAN_COUNT):
                row = key.decode() if isinstance(key, bytes) else key
                if "{" in row:
                    continue  # a version companion, not a row (row keys never hold a brace)
                commands.append(row_change((row, companion(row)), "d", str(version)))
                if len(commands) >= TRUNCATE_SCAN_COUNT:
                    replies.extend(self.pipeline.run(commands, ttls))
                    commands = []
        except (RetriableError, PermanentError):
            raise
        except Exception as err:  # noqa: BLE001
            raise translate(err, f"redis sink {self.config.name}: truncating {schema}.{table}") from err
        replies.extend(self.pipeline.run(commands, ttls))
        log.info("redis sink %s: truncate of %s.%s at version %d", self.config.name, schema, table, version)
        return replies

    def read_rows(self, topic: str, after: tuple | None = None, limit: int | None = None) -> list[StoredRow]:
        """The rows of ``topic``'s table in the namespace readers use (cdc.api.ReadableSink), as a
        reader gets them back (``values.stored_row``: a hash's fields as text), each keyed by the
        components of its encoded key (keys.py), as text. SCANs the table's keys."""
        client = self._started()
        if self.config.format == "invalidate":
            raise PermanentError(f"redis sink {self.config.name}: format invalidate stores no rows to read back")
        parts = topic.split(".")
        schema, table = parts[-2] if len(parts) > 2 else "", parts[-1]  # <prefix>.<schema or db>.<table>
        keyspace = KeySpace(self.config.key_template, current_namespace(client, self.config.prefix))
        head, tail = keyspace.parts(schema, table)
        rows: list[StoredRow] = []
        try:
            for key in client.scan_iter(match=keyspace.table_pattern(schema, table), count=TRUNCATE_SCAN_COUNT):
                name = key.decode() if isinstance(key, bytes) else key
                if "{" in name:
                    continue  # a version companion, not a row (row keys never hold a brace)
                if self.config.format == "hash":
                    stored = client.hgetall(name)
                elif self.config.format == "redisjson":
                    stored = client.execute_command("JSON.GET", name)
                else:
                    stored = client.get(name)
                row = stored_row(self.config.format, stored or None)
                if row is not None:  # gone between the SCAN and the read
                    rows.append(StoredRow(decode_key(name[len(head):len(name) - len(tail)]), row))
        except (RetriableError, PermanentError):
            raise
        except Exception as err:  # noqa: BLE001
            raise translate(err, f"redis sink {self.config.name}: reading the rows of {topic}") from err
        return page(rows, after, limit)

    def read_range(self, topic: str, after: tuple | None, upto: tuple | None) -> list[StoredRow]:
        """One chunk of ``cdc verify`` (cdc.api.ReadableSink; reading.py says what it costs)."""
        self._started()
        return _read_range(self, topic, after, upto)

    def read_keys(self, topic: str, keys: Sequence[tuple]) -> list[StoredRow]:
        self._started()
        return _read_keys(self, topic, keys)

    def stored_forms(self, topic: str, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[StoredRow]:
        return _stored_forms(self, rows)

    def _count(self, replies: list) -> None:
        written = sum(1 for r in replies if r == 1)
        deleted = sum(1 for r in replies if r == 2)
        skipped = len(replies) - written - deleted
        self.counts["written"] += written
        self.counts["deleted"] += deleted
        self.counts["skipped"] += skipped
        # For `cdc status`: keys written, deletes that left a tombstone, changes the guard refused.
        self.context.stats.details.update(keys_written=self.counts["written"], tombstones=self.counts["deleted"],
                                          stale_skipped=self.counts["skipped"])
        try:
            pipe = self._started().pipeline(transaction=False)
            key = stats_key(self._keyspace.ns)
            pipe.hincrby(key, "written", written)
            pipe.hincrby(key, "deleted", deleted)
            pipe.hincrby(key, "skipped", skipped)
            pipe.execute()
        except Exception as err:  # noqa: BLE001 - counters only; the data is written
            log.warning("redis sink %s: counters not updated: %s", self.config.name, err)

    # --- generations ----------------------------------------------------------------------------

    def current_generation(self) -> int:
        self._started()
        self._current = self.generations.current()
        return self._current

    def open_generation(self, generation: int) -> None:
        self._started()
        self.generations.open(generation)
        self._shapes.forget()  # an opened generation starts empty, its followed shapes too
        self.generation = generation
        self._retarget(use_committed=False, forget_positions=True)

    def switch_generation(self, generation: int) -> None:
        self._started()
        self.generations.switch(generation)
        self._current = generation
        self.generation = None
        self._retarget(use_committed=True, forget_positions=False)

    def drop_generation(self, generation: int) -> None:
        self._started()
        if generation == self._writing():
            raise PermanentError(f"redis sink {self.config.name}: generation {generation} is the one being "
                                 f"written; it cannot be dropped")
        self.generations.drop(generation)

    def _retarget(self, use_committed: bool, forget_positions: bool) -> None:
        self._keyspace = KeySpace(self.config.key_template, namespace(self.config.prefix, self._writing()))
        if self._publisher is not None:
            self._publisher.set_namespace(self._keyspace.ns, use_committed, forget_positions=forget_positions)
