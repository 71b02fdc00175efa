"""The shapes of a sink's topics, from ``<prefix>.schema-changes``, as the rows name them.

Every envelope names the shape it was written under (``source.schema_version``; see
cdc/schema_order.py). ``SchemaBook.schema_for(topic, version)`` returns that shape's record, and
re-reads the schema topic when it does not know the version yet: the capture side publishes a
shape before the first row that names it, so it is there (on Kafka, possibly a moment later: then
``ShapeNotYetPublished``, a ``RetriableError``, and the runner retries the same batch). A shape
that never comes (its record lost, the rows copied from another deployment's topics) must not be
retried forever: the error carries how long this book has been missing it, and
``cdc.api.Sink.shape_of`` stops the sink with ``ShapeMissingError`` once that exceeds the sink's
``schema_wait``, naming the row. With no version (a row of a source
that publishes no shapes, or written before shapes had versions) it returns the newest shape
of the topic, read again at most every ``REFRESH_S`` seconds, never "the first one seen".

Cost on the hot path: a shape already read costs a dict lookup; a read asks the log for the
schema topic's end offsets (one request) and reads only past what it read before.
"""

from __future__ import annotations

import logging
import time

import orjson

from cdc.errors import LogUnavailableError, ShapeNotYetPublished, TopicConfigError
from cdc.log.base import Log
from cdc.topics import schema_changes_topic

log = logging.getLogger(__name__)

REFRESH_S = 1.0


class SchemaBook:
    """Used from one thread only: the sink's (the sink calls it in ``write``; cdc/runtime/sink_thread.py)."""

    def __init__(self, log_: Log, prefix: str) -> None:
        self.log = log_
        self.prefix = prefix
        self.topic = schema_changes_topic(prefix)
        self._shapes: dict[str, dict[int, dict]] = {}   # topic -> version -> record
        self._newest: dict[str, dict] = {}
        self._read_at = float("-inf")
        self._missing_since: dict[tuple[str, int], float] = {}  # (topic, version) -> first miss
        self._read_to: dict = {}  # TopicPartition -> the offset read up to
        self._unreadable = False  # the last refresh could not reach the schema topic (warned once)

    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        """The schema record of ``topic`` at ``version`` (None: the newest one known, or None)."""
        if version is None:
            if time.monotonic() - self._read_at > REFRESH_S:
                self.refresh()
            return self._newest.get(topic)
        shape = self._shapes.get(topic, {}).get(version)
        if shape is None:
            self.refresh()
            shape = self._shapes.get(topic, {}).get(version)
            if shape is None:
                since = self._missing_since.setdefault((topic, version), time.monotonic())
                waited = time.monotonic() - since
                raise ShapeNotYetPublished(
                    f"{topic}: its rows name shape {version}, which {self.topic} does not hold yet "
                    f"(missing for {waited:.0f}s)", topic=topic, version=version, waited=waited)
            self._missing_since.pop((topic, version), None)
        return shape

    def shapes_between(self, topic: str, after: int, before: int) -> list[dict]:
        """The shapes of ``topic`` with ``after < version < before``, oldest first: those a sink
        jumps over when its table follows shape ``after`` and the rows it gets next name ``before``
        (rows of one partition need not name every shape: the rows of the shape between may all
        be in another partition). Called once ``before`` was found, so every earlier shape was read
        (the capture side publishes shapes in order)."""
        shapes = self._shapes.get(topic, {})
        return [shapes[v] for v in sorted(shapes) if after < v < before]

    def newest_shapes(self) -> dict[str, dict]:
        """Every topic's shape record with the highest version read so far (the last one read
        for a topic whose shapes have none), after reading what the schema topic gained."""
        self.refresh()
        out = dict(self._newest)
        for topic, shapes in self._shapes.items():
            out[topic] = shapes[max(shapes)]
        return out

    def _unavailable(self, err: LogUnavailableError) -> None:
        """A refresh that cannot reach the schema topic: a broker restarting or a leader moving
        (a cluster's normal day). The shapes read so far serve, as if the topic had gained
        nothing yet: a row naming a shape not read waits for it (``schema_for``), and that wait
        ends in ShapeNotYetPublished as it would. Raised again if nothing was read yet."""
        if not self._read_to:
            raise err
        if not self._unreadable:
            log.warning("schema topic %s unreadable for now, going on with the shapes read so far: %s",
                        self.topic, err)
        self._unreadable = True

    def refresh(self) -> None:
        """Read what the schema topic gained since the last read. Only the new records: the sink
        asks on every write, and reading the whole topic again each time cost a live sink most of
        its time at a few thousand changes/s (a new reader per second, every shape decoded again)."""
        self._read_at = time.monotonic()
        try:
            # The end offsets alone (one request for a known topic), not a listing of the topics:
            # that is a cluster metadata request, about 25 ms on a busy machine, and this runs on
            # the sink's thread, between its writes.
            ends = self.log.end_offsets(self.topic)
        except TopicConfigError:  # no shape published yet
            return
        except LogUnavailableError as err:
            self._unavailable(err)
            return
        if self._unreadable:
            log.info("schema topic %s readable again", self.topic)
            self._unreadable = False
        if any(end < self._read_to.get(tp, 0) for tp, end in ends.items()):
            # the topic was deleted and made again: what this book knew may be gone
            self._shapes.clear()
            self._newest.clear()
            self._read_to = {}
        if all(end <= self._read_to.get(tp, 0) for tp, end in ends.items()):
            return
        try:
            records = self.log.read_all(self.topic, start=self._read_to, ends=ends)
        except LogUnavailableError as err:
            self._unavailable(err)
            return
        self._read_to = dict(ends)
        for record in records:
            if record.value is None:
                continue
            value = orjson.loads(record.value)
            topic = f"{self.prefix}.{value['schema'] or value['db']}.{value['table']}"
            version = value.get("version")
            if isinstance(version, int):
                self._shapes.setdefault(topic, {})[version] = value
            self._newest[topic] = value  # the latest published (shapes before versions were keyed by table)
