"""A rebuild's new generation filled in bulk, for a ``BulkLoadableSink`` (see sink_rebuild.py).

The history is read into windows reduced to the newest version per key (cdc.bulk_window),
partition after partition where the reader allows it (``stages``): a partition read to its end
has its keys' newest versions, and its window is loaded on the sink's thread while the next is
read (window_loads.py). A window goes in bulk (``bulk_load``) only if the generation holds none
of its keys, else through ``write`` (version-guarded, as a batch is, with its retries and poison
isolation: sink_writing.py). The window in flight and the one being filled share the bound
(``bulk_window_mb``).

Nothing is committed here: the reading positions move once every window is loaded, and the
rebuild commits them at its switch. A failure or a kill anywhere leaves readers on the old
generation, and the next rebuild opens the new one empty again and starts over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc import bulk_window
from cdc.api import BulkLoadableSink, Sink
from cdc.api.stats import ConnectorStats
from cdc.bulk_window import NewestWindow
from cdc.errors import SchemaChangeError
from cdc.log.base import TopicPartition
from cdc.runtime.sink_reading import SinkReading
from cdc.runtime.sink_thread import SinkThread
from cdc.runtime.sink_writing import SinkWriter
from cdc.runtime.window_loads import WindowLoads

log = logging.getLogger(__name__)

BULK_POLL_RECORDS = 50_000  # records per read of a bulk rebuild (no write waits on them)
BULK_ADD_RECORDS = 5_000    # records added to a window between checks of its size
BULK_PART_KEYS = 100_000    # keys per part of a window handed to the sink (Python objects held at once)
BULK_STAGES = 8             # a bulk read in about this many stages of whole partitions at most
BULK_STAGE_RECORDS = 10_000  # records (offsets) of a stage at least: no stage switch for a few records


def stages(targets: dict[TopicPartition, int], packed: bool) -> list[list[TopicPartition]]:
    """The partitions in the order they are read, in stages: one stage after another where the
    reader can be assigned anew (the packed reader), so that once a stage is read to its ends
    its keys are final and its window loads while the next stage is read; else all at once
    (one stage). A stage is one partition, or several small ones."""
    wanted = sorted(tp for tp, end in targets.items() if end > 0)
    if not packed:
        return [wanted]
    # Small partitions share a stage: each stage costs a new assignment and the fetch's start,
    # so a sink of many small topics would otherwise pay that per partition.
    least = max(sum(targets.values()) // BULK_STAGES, BULK_STAGE_RECORDS)
    out: list[list[TopicPartition]] = [[]]
    held = 0
    for tp in wanted:
        if held >= least:
            out.append([])
            held = 0
        out[-1].append(tp)
        held += targets[tp]
    return out if wanted else []


class WindowFill:
    """Fills a generation from the reading thread; ``load_window`` runs on the sink's thread."""

    def __init__(self, sink: Sink, sink_thread: SinkThread, reading: SinkReading, writer: SinkWriter,
                 stats: ConnectorStats, report: Callable[[ConnectorStats], None],
                 progress: Callable[[int, int], None] | None) -> None:
        self.sink = sink
        self.sink_thread = sink_thread
        self.reading = reading
        self.writer = writer
        self.stats = stats
        self.report = report
        self.progress = progress

    def _extra(self) -> dict:
        return {"connector": self.stats.name, "phase": self.stats.phase}

    def fill(self, targets: dict[TopicPartition, int], generation: int, halt: Callable[[], None]) -> None:
        """``generation`` filled with everything up to ``targets``; ``halt()`` raises when the
        rebuild is to stop. The reading positions end at the targets."""
        with bulk_window.collection_paused():
            # The log's bulk reader, where it has one, hands out batches packed in one bytes object
            # (no Python object per record); it commits nothing. Else the group's reader (assigned).
            bulk = self.reading.log.bulk_reader()
            try:
                log.info("generation %d: reading the history %s", generation,
                         "packed (cdc.log.kafka_bulk)" if bulk is not None else "record by record",
                         extra=self._extra())
                self._fill_from(bulk or self.reading.reader, bulk is not None, targets, generation, halt)
            finally:
                if bulk is not None:
                    bulk.close()

    def _fill_from(self, reader, packed: bool, targets: dict[TopicPartition, int], generation: int,
                   halt: Callable[[], None]) -> None:
        config = self.sink.config
        bound = config.bulk_window_mb << 20
        window = NewestWindow(bound)
        loads = WindowLoads(self.sink_thread.submit, lambda w, bulk: self.load_window(w, bulk, generation),
                            self._extra())
        positions = self.reading.positions
        read: dict[TopicPartition, int] = {}
        wait = config.batch_wait_ms / 1000
        reported = time.monotonic()
        try:
            for stage in stages(targets, packed):
                if packed:  # only this stage's partitions: nothing of the next mixes in
                    reader.assign({tp: positions.get(tp, 0) for tp in stage})
                cut = False  # a window of this stage was loaded before the stage's ends
                while not all(read.get(tp, 0) >= targets[tp] for tp in stage):
                    halt()
                    loads.raise_failed()
                    if packed:  # a read at a time (a window overshoots its bound by one read at most)
                        batches = [reader.poll(BULK_ADD_RECORDS, wait)]
                    else:
                        records = reader.poll(BULK_POLL_RECORDS, wait)
                        batches = [records[at:at + BULK_ADD_RECORDS] for at in range(0, len(records), BULK_ADD_RECORDS)]
                    for batch in batches:  # a window overshoots its bound by one slice at most
                        for record, err in (window.add_packed(batch, read) if packed else window.add(batch, read)):
                            self.writer.poison(record.topic, record.partition, record.offset, str(err), record)
                        if window.stats()[1] + loads.held() >= bound:
                            loads.wait()  # the window in flight loaded: its memory is free
                            if window.stats()[1] + loads.held() >= bound:  # still: loaded before more is read
                                loads.submit(window, whole=False)
                                loads.wait()
                                window, cut = window.following(), True
                    if packed:  # a partition's end, seen after its last record (compaction may leave none there)
                        for tp, end in reader.ends.items():
                            read[tp] = max(read.get(tp, 0), end)
                    self.stats.progressed()
                    if time.monotonic() - reported > 1.0:  # a long rebuild is progress, not a stall
                        self.report(self.stats)
                        reported = time.monotonic()
                    if self.progress:
                        self.progress(sum(min(read.get(tp, 0), e) for tp, e in targets.items()), sum(targets.values()))
                if window.records:  # the stage read to its ends: loaded while the next stage is read
                    loads.submit(window, whole=not cut)
                    window = window.following()
            loads.wait()
        finally:
            loads.settle()
        positions.update(read)

    def load_window(self, window: NewestWindow, bulk: bool, generation: int) -> None:
        """On the sink's thread: ``window`` into ``generation``, in bulk if ``bulk`` (the
        generation holds none of its keys) and the sink takes it, else (or if that fails)
        through ``write`` with its retries and poison isolation."""
        keys, nbytes = window.stats()
        began = time.monotonic()
        self._load_parts(window, bulk)
        self.stats.bytes += window.read_bytes()
        self.stats.events += window.records  # every record of the window is in the store now
        log.info("generation %d: a window of %d records reduced to %d keys (%.0f MiB) loaded %s in %.1fs",
                 generation, window.records, keys, nbytes / (1 << 20), "in bulk" if bulk else "as guarded writes",
                 time.monotonic() - began, extra=self._extra())

    def _load_parts(self, window: NewestWindow, bulk: bool) -> None:
        sink = self.sink
        assert isinstance(sink, BulkLoadableSink)  # sink_rebuild fills in windows for no other sink
        for part in window.parts(BULK_PART_KEYS):
            if bulk:
                if part.tombstones:  # the generation never held these keys: nothing to remove
                    continue
                try:
                    if sink.bulk_load(part):
                        self.stats.progressed()
                        continue
                except SchemaChangeError:
                    raise
                except Exception as err:  # noqa: BLE001 - nothing of the part was written: write it as events
                    log.warning("bulk load of %d keys of %s failed (%s); writing them as events",
                                len(part.upserts) + len(part.deletes), part.topic, err, extra=self._extra())
            self.writer.write_in_shape(part.events())
            self.stats.progressed()
