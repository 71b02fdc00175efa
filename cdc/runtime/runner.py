"""Drive one source end to end: poll batches, publish them, store what the log acknowledged.

The order of effects is the whole correctness argument:

1. ``writer.publish_events(encoder, batch.events, batch.checkpoint)``: records go to the log,
   nothing is stored yet.
2. ``writer.poll()`` returns checkpoint C only once the log acknowledged every record published
   before C's batch ended (``cdc.log.delivery``).
3. ``offsets.save(C)`` returns once the offset record itself is acknowledged.
4. ``source.commit(C)``: only now may the source advance the server (slot flush LSN, ...).

A crash between any two steps leaves the stored offset at or behind what the log holds, so a
restart resends (at least once; sinks are idempotent by version) and never skips. Offsets are
saved at most every ``offset_interval`` seconds while the source has batches, as soon as they
become safe while it has none (it caught up), and always when draining.

Latency: the log's writer may hold records back to batch them with later ones (Kafka's
``linger.ms``), which pays off only while more follow at once. A batch made when the source had
read everything its server had sent (``Batch.caught_up``: the end of a transaction in a trickle)
is sent at once instead (``LogWriter.send_now``), and so is anything still held when the source
has nothing. A source working through a backlog or a bulk load hands over batches that are not
caught up, and they are batched as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from cdc.api import ConnectorStats, Source
from cdc.events import SnapshotMarker
from cdc.formats import make_encoder
from cdc.formats.shapes import known_shapes
from cdc.log.base import Log, TopicSettings
from cdc.offsets import OffsetStore
from cdc.positions import Position
from cdc.runtime.contexts import OffsetTableBook, RuntimeSourceContext
from cdc.runtime.gc_tuning import tune_gc
from cdc.runtime.snapshot_progress import SnapshotProgressMeter
from cdc.runtime.stale_rows import StaleRows
from cdc.schema_order import segments
from cdc.serde import encode_schema_change, schema_changes_topic

log = logging.getLogger(__name__)


ANNOUNCED = frozenset({"snapshot", "streaming"})  # phases sources log themselves
IDLE_STORE_INTERVAL = 0.05  # seconds between stores while the source has nothing new
# How long the thread waits in ``send_now``: long enough for librdkafka's broker threads to wake
# and send (they skip the linger while a flush runs), short because it also waits for
# acknowledgements meanwhile, and on a busy machine (acks in tens of ms) the next transaction
# must not wait for them. If it returns before a broker thread woke, that batch lingers as it
# would have (and the next idle poll sends it).
SEND_NOW_TIMEOUT = 0.002
# How long a store of the stream's position waits for the log's acknowledgement before the stream
# goes on without it (a replicated log short of in-sync replicas): see ``_store``.
STORE_WAIT_S = 1.0


class SourceRunner:
    """Runs on one thread; ``stop_event`` may be set from any thread (or a signal handler)."""

    def __init__(self, source: Source, log_: Log, offsets: OffsetStore, topic_prefix: str,
                 topic_settings: TopicSettings, *, stats: ConnectorStats | None = None,
                 report: Callable[[ConnectorStats], None] | None = None,
                 offset_interval: float = 1.0, poll_timeout: float = 0.2, log_format: str = "json",
                 format_options=None, registry_url: str | None = None) -> None:
        self.source = source
        self.log = log_
        self.offsets = offsets
        self.topic_settings = topic_settings
        self.name = source.config.name
        self.encoder = make_encoder(log_format, source.connector, self.name, topic_prefix,
                                    lambda topic: log_.ensure_topic(topic, topic_settings), format_options,
                                    registry_url)
        self._learn = getattr(self.encoder, "learn", None)  # formats whose schemas come from the shapes
        self.stats = stats or ConnectorStats(self.name, "source")
        self.report = report or (lambda stats: None)
        self.offset_interval = offset_interval
        self.poll_timeout = poll_timeout
        self.stored: Position | None = source.start_position
        if self.stored is not None:  # shown from the start, not only after the first store
            self.stats.position = str(self.stored)
        self._schema_topic: set[str] = set()
        self.stale = StaleRows(log_, self.encoder.topic, self.encoder.record_key)
        self.progress = SnapshotProgressMeter()
        # Before start: a snapshot coordinator records with the offsets which tables its topics are complete for.
        source.attach(RuntimeSourceContext(self.name, self.stats, OffsetTableBook(offsets, self.name)))

    def _extra(self) -> dict:
        return {"connector": self.name, "phase": self.stats.phase}

    def _store(self, safe: Position | None, wait: float | None = None) -> None:
        """Store ``safe`` and let the source free what is before it. With ``wait``: wait at most
        that long for the log (too few replicas in sync, no leader) and go on; what the log
        acknowledged meanwhile is stored (``OffsetStore.offer``; the stream must not restart over
        a slow acknowledgement and resend what is already in the log)."""
        if safe is None or safe == self.stored:
            return
        if wait is None:
            self.offsets.save(self.name, safe)
        else:
            acknowledged = self.offsets.offer(self.name, safe, wait)
            if acknowledged is None:
                return
            safe = acknowledged
        self.stored = safe
        self.source.commit(safe)
        self.stats.position = str(safe)

    def _set_phase(self, phase: str) -> None:
        if phase != self.stats.phase:
            self.stats.phase = phase
            # Sources announce their snapshot and their streaming themselves, with the position:
            # a second line saying only "phase streaming" is noise there.
            log.log(logging.DEBUG if phase in ANNOUNCED else logging.INFO, "phase %s", phase, extra=self._extra())
            self.report(self.stats)

    def _publish_schema_changes(self, writer, changes) -> None:
        topic = schema_changes_topic(self.encoder.prefix)
        if topic not in self._schema_topic:
            self.log.ensure_topic(topic, replace(self.topic_settings, partitions=1))
            self._schema_topic.add(topic)
        if self._learn is not None:
            self._learn(changes)
        for change in changes:
            log.info("schema of %s: %s", change.table, ", ".join(f"{c.name} {c.type}" for c in change.columns),
                     extra=self._extra())
        writer.publish([encode_schema_change(c, self.name, self.encoder.prefix) for c in changes])

    def _publish_in_shape(self, writer, batch) -> None:
        """The batch's rows, each naming the shape it was written under (cdc/schema_order.py);
        the checkpoint goes with the last part."""
        parts = list(segments(batch.events, batch.schema_changes))
        for index, (shapes, events) in enumerate(parts):
            self.encoder.schema_versions.update(shapes)
            last = index == len(parts) - 1
            if events or last:
                writer.publish_events(self.encoder, events, batch.checkpoint if last else None)

    def run(self, stop_event: threading.Event) -> None:
        source, stats = self.source, self.stats
        writer = self.log.writer()
        if self._learn is not None:  # the shapes published before this run (cdc/formats/shapes.py)
            self._learn(known_shapes(self.log, self.encoder.prefix, self.name))
        log.info("starting from %s", self.stored or "the beginning", extra=self._extra())
        source.start()
        tune_gc()
        last_store = last_report = time.monotonic()
        last_safe = None
        try:
            while not stop_event.is_set() and not source.finished:
                self._set_phase(source.phase)
                # While the writer holds for a drain point, the source is not read (as a blocking
                # flush would not read it): the checkpoint gets its drain point however fast it runs.
                batch = None if writer.holding else source.poll(self.poll_timeout)
                if batch is not None:
                    if batch.schema_changes:
                        self._publish_schema_changes(writer, batch.schema_changes)
                    if batch.events and batch.events[0].snapshot in (SnapshotMarker.TRUE, SnapshotMarker.LAST):
                        self.progress.rows += len(batch.events)
                    stale = self.stale.before_publish(batch)  # a repeated snapshot's deletes: stale_rows.py
                    if stale:
                        writer.publish_events(self.encoder, stale)
                    # Encoded while produced: see EnvelopeEncoder.emit.
                    if batch.schema_changes:
                        self._publish_in_shape(writer, batch)
                    else:
                        writer.publish_events(self.encoder, batch.events, batch.checkpoint)
                    stats.events += len(batch.events)
                    stats.bytes = self.encoder.value_bytes
                if batch is None or batch.caught_up:  # nothing follows at once: holding records back gains nothing
                    writer.send_now(SEND_NOW_TIMEOUT)
                safe = writer.poll()
                if safe != last_safe or not writer.outstanding:  # the log keeps up (health)
                    stats.progressed()
                    last_safe = safe
                now = time.monotonic()
                # Busy: store at most every offset_interval (each store waits for an ack). Idle
                # (the source had nothing): store what became safe now, the wait costs nothing,
                # and the server may free its log (slot, binlog) sooner.
                if now - last_store >= (self.offset_interval if batch is not None else IDLE_STORE_INTERVAL):
                    self._store(safe, wait=STORE_WAIT_S)
                    last_store = now
                if now - last_report >= 1.0:
                    stats.lag_seconds = source.lag()
                    stats.retained_wal_bytes = source.retained_log_bytes()
                    stats.snapshot_progress = self.progress.figures(source.snapshot_chunks())
                    stats.incremental_snapshot = source.incremental_snapshot()
                    self.report(stats)
                    last_report = now
            # Drain: everything published is acknowledged, and its position stored, before we go.
            self._store(writer.flush())
            self._set_phase("finished" if source.finished else "stopped")
        except BaseException:
            # The source (or the process) failed; what the log already acknowledged is still
            # worth keeping, so a restart resends less. A failing log raises again here: fine.
            try:
                self._store(writer.flush(10))
            except Exception as err:  # noqa: BLE001 - the original error is the one to report
                log.warning("could not store the last position while failing: %s", err, extra=self._extra())
            raise
        finally:
            source.stop()
            writer.close()
            self.report(stats)
