"""A source of synthetic change events, for trying the pipeline and for testing and benchmarking it.

Its "log" is a deterministic sequence: event number ``n`` (from 1) is a function of ``n`` and the
seed alone, so a restart from a stored position continues with exactly the events after it, and
a test can compute what a topic must contain. Transactions group ``transaction_size`` events;
checkpoints fall only on transaction boundaries, as for a database.

Each event touches one of ``keys`` rows of the table ``<schema>.<table>``: the first change of a key
creates it, later ones update it, and every ``delete_every``-th event deletes it (the next change
of that key creates it again). ``version`` is the event number, so it increases per key.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Literal

from pydantic import Field

from cdc.api import Source, SourceConfig
from cdc.errors import PermanentError, RetriableError
from cdc.events import Batch, ChangeEvent, Op, TableId, TransactionInfo
from cdc.positions import Counter, Position


class GeneratorConfig(SourceConfig):
    type: Literal["generator"] = "generator"
    database: str = "demo"
    schema_name: str = Field(default="public", alias="schema")
    table: str = "items"
    keys: int = Field(default=1000, ge=1, description="distinct primary keys")
    events: int | None = Field(default=None, ge=0, description="stop after this many (None: forever)")
    rate: float | None = Field(default=None, gt=0, description="events per second (None: as fast as possible)")
    transaction_size: int = Field(default=10, ge=1)
    delete_every: int = Field(default=0, ge=0, description="every N-th event is a delete (0: never)")
    payload_bytes: int = Field(default=120, ge=0, description="size of the filler text column")
    seed: int = 1
    fail_at: int | None = Field(default=None, ge=1, description="raise an error when reaching this event "
                                "(for trying out restarts and failure handling)")
    fail_retriable: bool = True


class GeneratorSource(Source):
    """Thread rules: start/poll/commit on the runtime's thread; ``stop`` from any thread."""

    config_model = GeneratorConfig
    connector = "generator"

    def __init__(self, config: GeneratorConfig, position: Position | None) -> None:
        super().__init__(config, position)
        if position is not None and not isinstance(position, Counter):
            raise TypeError(f"generator source resumes from a Counter, not {type(position).__name__}")
        self.cfg = config
        self.next_seq = (position.seq if position else 0) + 1
        self.committed: Counter | None = position
        self.table = TableId(config.database, config.schema_name, config.table)
        self._stopping = threading.Event()
        self._started_at = 0.0
        self._emitted_at_start = self.next_seq - 1
        self._filler = "x" * config.payload_bytes

    @property
    def phase(self) -> str:
        return "finished" if self.finished else "streaming"

    @property
    def finished(self) -> bool:
        return self.cfg.events is not None and self.next_seq > self.cfg.events

    def start(self) -> None:
        self._started_at = time.monotonic()

    def event(self, seq: int) -> ChangeEvent:
        """Event number ``seq``: a pure function of (seq, config)."""
        cfg = self.cfg
        key_id = random.Random(cfg.seed * 1_000_003 + seq).randrange(cfg.keys)
        tx_id, order = divmod(seq - 1, cfg.transaction_size)
        deleting = cfg.delete_every and seq % cfg.delete_every == 0
        row = {"id": key_id, "seq": seq, "amount": f"{seq % 10_000}.{seq % 100:02d}",
               "note": self._filler}
        return ChangeEvent(
            op=Op.DELETE if deleting else Op.UPDATE if seq > cfg.keys else Op.CREATE,
            table=self.table, key={"id": key_id},
            before=None if not deleting else {"id": key_id},
            after=None if deleting else row,
            version=seq, ts_ms=1_700_000_000_000 + seq,
            source_fields={"txId": tx_id + 1, "seq": seq},
            transaction=TransactionInfo(str(tx_id + 1), order + 1, order + 1))

    def poll(self, timeout: float) -> Batch | None:
        cfg = self.cfg
        if self.finished or self._stopping.is_set():
            self._stopping.wait(timeout)
            return None
        count = cfg.max_batch_events
        if cfg.events is not None:
            count = min(count, cfg.events - self.next_seq + 1)
        if cfg.rate is not None:
            due = self._emitted_at_start + int((time.monotonic() - self._started_at) * cfg.rate)
            count = min(count, due - (self.next_seq - 1))
            if count <= 0:
                self._stopping.wait(min(timeout, 1.0 / cfg.rate))
                return None
        end = self.next_seq + count - 1
        if cfg.fail_at is not None and self.next_seq <= cfg.fail_at <= end:
            error = RetriableError if cfg.fail_retriable else PermanentError
            raise error(f"generator {cfg.name}: failing at event {cfg.fail_at} as configured (fail_at)")
        events = [self.event(seq) for seq in range(self.next_seq, end + 1)]
        self.next_seq = end + 1
        # A checkpoint only where a transaction ends.
        boundary = end - end % cfg.transaction_size
        if cfg.events is not None and end == cfg.events:
            boundary = end
        checkpoint = Counter(boundary) if boundary >= events[0].version else None
        return Batch(events, checkpoint)

    def commit(self, position: Position) -> None:
        assert isinstance(position, Counter)
        if self.committed is not None and position.seq < self.committed.seq:
            raise ValueError(f"commit went backwards: {position} after {self.committed}")
        self.committed = position

    def stop(self) -> None:
        self._stopping.set()
