"""Writing to the Kafka log: ``KafkaWriter``, over one idempotent confluent-kafka producer (and the
block producer for a snapshot's RowBlocks), and its produce call with positional arguments.

The producer's settings are ``cdc.log.kafka.PRODUCER_DEFAULTS`` (explained in that module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError, Producer

from cdc import native
from cdc.errors import CdcError, DeliveryError
from cdc.events import ChangeEvent, RowBlock
from cdc.headers import Headers
from cdc.log.base import Log, LogWriter
from cdc.log.block_producer import BlockProducer, open_block_producer
from cdc.log.delivery import DeliveryTracker
from cdc.log.kafka_errors import delivery_error, kafka_error
from cdc.positions import Position
from cdc.serde import EmitError, EnvelopeEncoder, Record

BARRIER_WAIT_S = 1.0  # seconds a due drain point waits for acknowledgements before the stream goes on


class KafkaWriter(LogWriter):
    """Publishes through one idempotent producer; acknowledgements are taken in bulk at drain
    points (see ``cdc.log.delivery``), so librdkafka reports only failures back to Python.

    Snapshot rows that come as a ``RowBlock`` go through a second producer, our own binding
    (cdc/log/block_producer.py), a block per call, where it is built and the encoder writes such
    rows as lines (the json format). It is made at the first block and closed once drained. Two
    producers keep no order between them, so the writer switches between them only when the one
    it leaves holds nothing unacknowledged: before a block goes out, every record of the
    confluent-kafka producer is acknowledged (a streamed change before a new snapshot's rows), and
    before any other record goes out, every record of the blocks is (the snapshot's rows before
    the stream's changes of the same keys: otherwise compaction could keep an older snapshot row
    over a newer change). A failed block record fails the writer like any failed record.
    """

    close_timeout = 5.0  # seconds close() waits for records in flight
    drain_wait = 1.0     # seconds per wait while switching producers (until all is acknowledged or failed)

    def __init__(self, log: Log, config: dict[str, Any], barrier_interval: float = 1.0) -> None:
        self._log = log
        self._config = config
        self._tracker: DeliveryTracker[Position] = DeliveryTracker(barrier_interval)
        self._producer = Producer({**config, "on_delivery": self._on_failure, "delivery.report.only.error": True})
        self._produce = positional_produce(self._producer.produce)  # (topic, value, key, headers)
        self._closed = False
        self._blocks: BlockProducer | None = None  # while a snapshot's RowBlocks are in flight
        self._no_blocks = False                    # no block producer to be had with this config

    def _on_failure(self, err: KafkaError, msg: Any) -> None:
        self._tracker.failed(delivery_error(err, msg.topic(), msg.partition()))

    def publish(self, records: Iterable[Record], checkpoint: Position | None = None) -> None:
        """Produce ``records`` (any iterable; change events go through ``publish_events``)."""
        if self._closed:
            raise DeliveryError("publish on a closed writer", retriable=False)
        self._drain_blocks()
        produce = self._produce
        try:
            for record in records:
                topic, key, value, everywhere, headers = record
                try:
                    if everywhere:
                        self._produce_everywhere(topic, value, key, headers)
                        continue
                    try:
                        produce(topic, value, key, headers)
                    except BufferError:
                        self._produce_when_room(topic, value, key, headers)
                except DeliveryError:
                    raise
                except Exception as exc:
                    # Refused: fail it, so that nothing past it is ever safe, and say so now.
                    raise self._refuse(exc, topic) from exc
        except DeliveryError:
            raise
        except Exception as exc:
            # The iterable failed (a value that cannot be encoded): the rest of the batch never
            # comes, so its checkpoint must never become safe.
            error = DeliveryError(f"a record could not be made: {type(exc).__name__}: {exc}", retriable=False)
            self._tracker.failed(error)
            raise
        self._tracker.published(checkpoint)

    def publish_events(self, encoder: EnvelopeEncoder, events: list[ChangeEvent],
                       checkpoint: Position | None = None) -> None:
        """Encode and produce in one loop: the encoder calls ``produce`` itself for each record
        (see ``EnvelopeEncoder.emit``)."""
        if self._closed:
            raise DeliveryError("publish on a closed writer", retriable=False)
        if type(events) is RowBlock and encoder.row_blocks_as_lines:
            blocks = self._block_producer()
            if blocks is not None:
                self._publish_block(encoder, events, blocks, checkpoint)
                return
        self._drain_blocks()
        try:
            encoder.emit(events, self._produce, self._produce_when_room, self._produce_everywhere)
        except EmitError as exc:
            # Nothing past the failed record was produced, and nothing after it may become safe.
            cause = exc.cause
            if isinstance(cause, DeliveryError):  # already recorded (_produce_everywhere)
                raise cause from cause.__cause__
            raise self._refuse(cause, exc.topic or "?") from cause
        self._tracker.published(checkpoint)

    def fail(self, error: DeliveryError) -> None:
        self._tracker.failed(error)

    # --- RowBlocks through the block producer ----------------------------------------------------

    def _block_producer(self) -> BlockProducer | None:
        if self._blocks is None and not self._no_blocks:
            self._blocks = open_block_producer(self._config)
            self._no_blocks = self._blocks is None
        return self._blocks

    def _publish_block(self, encoder: EnvelopeEncoder, rows: RowBlock, blocks: BlockProducer,
                       checkpoint: Position | None) -> None:
        producer = self._producer
        while len(producer):  # the confluent-kafka producer's records first (see the class docstring)
            producer.flush(self.drain_wait)
        self._tracker.safe()  # one of them failed: raise it now, before anything past it goes out
        try:
            encoder.emit_row_block(rows, blocks.produce_rows)
        except EmitError as exc:
            cause = exc.cause
            if isinstance(cause, DeliveryError):  # refused by librdkafka
                self.fail(cause)
                raise cause from cause.__cause__
            raise self._refuse(cause, exc.topic or "?") from cause
        self._block_failures(blocks)
        self._tracker.published(checkpoint)

    def _block_failures(self, blocks: BlockProducer) -> None:
        """Record (and raise) the first block record that was not acknowledged, if one was."""
        error = blocks.error()
        if error is not None:
            self.fail(error)
            raise error

    def _drain_blocks(self) -> None:
        """Every block record acknowledged (or failed: raised) before any other record goes out;
        then the block producer is closed. librdkafka fails a record after ``message.timeout.ms``,
        so this wait ends."""
        blocks = self._blocks
        if blocks is None:
            return
        while blocks.flush(self.drain_wait):
            self._block_failures(blocks)
        self._block_failures(blocks)
        self._blocks = None
        blocks.close(0)

    def _produce_when_room(self, topic: str, value: bytes | None, key: bytes | None, headers: Headers | None = None,
                           partition: int = -1) -> None:
        """The local queue is full: serve acknowledgements until it has room (the backpressure)."""
        producer = self._producer
        while True:
            producer.poll(0.1)
            try:
                # the stub asks for a list of (str, str | bytes | None): ours only reads as one
                producer.produce(topic, value, key, partition, None, None, 0, headers)  # type: ignore[arg-type]
                return
            except BufferError:
                continue

    def _produce_everywhere(self, topic: str, value: bytes | None, key: bytes, headers: Headers | None = None) -> None:
        """One copy of a record to each partition of ``topic`` (a truncate)."""
        try:
            count = self._log.partitions(topic, fresh=True)  # a partition added by hand is truncated too
        except CdcError as exc:
            error = DeliveryError(f"delivery to {topic} failed: {exc}", retriable=exc.retriable)
            self._tracker.failed(error)
            raise error from exc
        for partition in range(count):
            try:  # produce's arguments in their places, as positional_produce gives them
                self._producer.produce(topic, value, key, partition, None, None, 0, headers)  # type: ignore[arg-type]
            except BufferError:
                self._produce_when_room(topic, value, key, headers, partition)

    def _refuse(self, exc: BaseException, topic: str) -> DeliveryError:
        """Record in the tracker that a record for ``topic`` could not be made or was refused by
        ``produce``; the error to raise."""
        err = kafka_error(exc)
        if err is not None:
            error = delivery_error(err, topic, None)
        else:
            error = DeliveryError(f"a record for {topic} failed: {type(exc).__name__}: {exc}; the batch is not "
                                  "published", retriable=False)
        self.fail(error)
        return error

    def poll(self) -> Position | None:
        """The safe checkpoint; a drain point when nothing is outstanding, and a forced one (a
        flush) when the stream has not paused for ``barrier_interval`` seconds."""
        producer, tracker, blocks = self._producer, self._tracker, self._blocks
        if blocks is not None:
            blocks.poll()
            self._block_failures(blocks)
        if not self._closed:
            producer.poll(0)
            if len(producer) == 0 and (blocks is None or blocks.outstanding == 0):
                tracker.drained()
            elif tracker.barrier_due():
                # A drain point, waited for in slices: while a broker is away, an election runs or
                # too few replicas are in sync, librdkafka keeps retrying (until message.timeout.ms,
                # then the reports fail); the stream holds (``holding``: it publishes nothing more
                # meanwhile), its checkpoint unmoved (health shows it stalled), and can stop between
                # slices; it does not restart to resend what is already on its way.
                return self.flush(BARRIER_WAIT_S, give_up=False)
        return tracker.safe()

    @property
    def holding(self) -> bool:
        return self._tracker.barrier_due() and self.outstanding > 0

    def flush(self, timeout: float = 30.0, *, give_up: bool = True) -> Position | None:
        producer, tracker, blocks = self._producer, self._tracker, self._blocks
        left = producer.flush(timeout) if not self._closed else 0
        if blocks is not None:  # at most one of the two holds records (see the class docstring)
            left += blocks.flush(timeout)
            error = blocks.error()
            if error is not None:
                tracker.failed(error)
        if not left:
            tracker.drained()
        safe = tracker.safe()  # a failed delivery outranks the timeout
        if left and give_up:
            raise DeliveryError(f"{left} records not acknowledged within {timeout:g}s "
                                f"(broker slow or unreachable?)", retriable=True)
        return safe

    def send_now(self, timeout: float) -> None:
        """librdkafka's flush sends every partition's batch regardless of ``linger.ms`` while it
        runs; it returns once all are acknowledged, or after ``timeout`` with some in flight."""
        producer, blocks = self._producer, self._blocks
        if blocks is not None and blocks.outstanding:
            if blocks.flush(timeout) == 0 and blocks.error() is None:
                self._tracker.drained()  # the other producer holds nothing while blocks are out
        elif not self._closed and len(producer) and producer.flush(timeout) == 0:
            self._tracker.drained()

    @property
    def outstanding(self) -> int:
        blocks = self._blocks.outstanding if self._blocks is not None else 0
        return (len(self._producer) if not self._closed else 0) + blocks

    def close(self) -> None:
        blocks, self._blocks = self._blocks, None
        if blocks is not None:  # whatever it drops never becomes safe
            blocks.close(self.close_timeout)
        if self._closed:
            return
        self._closed = True
        producer = self._producer
        # Give records in flight a moment; whatever is left is dropped, and so never becomes safe.
        if producer.flush(self.close_timeout):
            producer.purge()
            producer.poll(0)
        producer.close()


def positional_produce(produce: Callable[..., None]) -> Callable[..., None]:
    """``produce(topic, value, key, headers=None)`` for confluent-kafka's ``Producer.produce``,
    whose positional arguments are (topic, value, key, partition, callback, on_delivery,
    timestamp, headers): the headers in their place, the others at their defaults (any
    partition, the producer's delivery callback, now). A keyword costs about 0.45 us a record
    there (its argument parser makes a str for every keyword it looks up), a tenth of a record's
    encoding and producing. In C where ``cdc/_records.c`` is built; this is the reference."""
    if _records is not None and native.enabled():
        return _records.produce_positionally(produce)

    def positional(topic: str, value: bytes | None, key: bytes | None, headers: Headers | None = None) -> None:
        return produce(topic, value, key, -1, None, None, 0, headers)
    return positional


_records = native.load("cdc._records")  # the same call in C
