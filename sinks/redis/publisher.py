"""The thread that publishes ``<namespace>:applied:<source>`` (see applied.py for why it is sound).

About every ``interval`` seconds: ask the context's ``CheckpointFeed`` which sources' stored
checkpoints moved (as versions; it reads only what is new each round), read the end offsets of the
sink's topics after that, and hand both to the ``AppliedTracker``; then
publish, with the guarded ``APPLIED`` script, every source whose observation the sink's written
positions have reached. It runs beside ``write`` because the checkpoint that covers a change is
stored after the change reached the log, often after the sink wrote it: waiting for the next
``write`` would leave an idle sink's readers waiting forever.

Threading: ``note_written`` is called from the sink's thread after each durable write; everything
else runs in the publisher's thread. The tracker and positions are guarded by one lock.
"""

from __future__ import annotations

import logging
import threading

from cdc.api import CheckpointFeed, LogClient, SinkContext
from cdc.api.context import LogReader  # not exported by cdc.api: only its type is needed here
from sinks.redis.applied import AppliedTracker, TopicPartition
from sinks.redis.keys import applied_key
from sinks.redis.pipeline import Command, ScriptPipeline

log = logging.getLogger(__name__)


class AppliedPublisher:
    """``context``: the sink's, with its log ``log_client``; ``group``: the sink's consumer group."""

    def __init__(self, context: SinkContext, log_client: LogClient, topic_globs: list[str], group: str,
                 pipeline: ScriptPipeline, namespace: str, use_committed: bool, interval: float = 0.1) -> None:
        self.context = context
        self.log_client = log_client
        self.topic_globs = topic_globs
        self.group = group
        self.pipeline = pipeline
        self.namespace = namespace
        self.use_committed = use_committed
        self.interval = interval
        self.tracker = AppliedTracker()
        self.positions: dict[TopicPartition, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redis-applied", daemon=True)
        self._feed: CheckpointFeed | None = None  # opened in the thread that polls it
        self._group_reader: LogReader | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for reader in (self._feed, self._group_reader):
            if reader is not None:
                try:
                    reader.close()
                except Exception:  # noqa: BLE001 - closing
                    pass

    def set_namespace(self, namespace: str, use_committed: bool, *, forget_positions: bool) -> None:
        """Publish into ``namespace`` from now on; a new generation written from offset 0 starts
        with no positions (``forget_positions``), a switched-to one keeps what it wrote."""
        with self._lock:
            self.namespace = namespace
            self.use_committed = use_committed
            self.tracker = AppliedTracker()
            if forget_positions:
                self.positions = {}

    def note_written(self, ends: dict[TopicPartition, int]) -> None:
        with self._lock:
            positions = self.positions
            for tp, end in ends.items():
                if end > positions.get(tp, 0):
                    positions[tp] = end

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._round()
            except Exception as err:  # noqa: BLE001 - the next round tries again
                log.warning("applied publisher: %s: %s", type(err).__name__, err)
                self._stop.wait(1.0)

    def _read_checkpoints(self) -> dict[str, int]:
        """Sources whose stored checkpoint moved since the last round -> its version."""
        feed = self._feed
        if feed is None:
            feed = self._feed = self.context.checkpoint_feed()
            assert feed is not None, "a context with a log has a checkpoint feed (SinkContext)"
        return feed.poll()

    def _round(self) -> None:
        moved = self._read_checkpoints()
        if moved:
            ends: dict[TopicPartition, int] = {}
            for topic in self.context.topics_matching(self.topic_globs):
                ends.update(self.log_client.end_offsets(topic))
            with self._lock:
                use_committed = self.use_committed
                unknown = [tp for tp in ends if tp not in self.positions]
            committed = self._committed(unknown) if use_committed and unknown else {}
            with self._lock:
                for tp, offset in committed.items():
                    if offset and offset > self.positions.get(tp, 0):
                        self.positions[tp] = offset
                    self.positions.setdefault(tp, 0)
                for source, version in moved.items():
                    self.tracker.observe(source, version, ends)
        with self._lock:
            done = self.tracker.covered(self.positions)
            namespace = self.namespace
        if done:
            self.pipeline.run([Command("applied", (applied_key(namespace, source),), (str(version),))
                               for source, version in done.items()])

    def _committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        reader = self._group_reader
        if reader is None:
            reader = self._group_reader = self.log_client.reader(self.group)
        return reader.committed(partitions)
