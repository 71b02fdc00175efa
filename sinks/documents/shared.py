"""Joined documents past one process: the ``SharedSink`` side of both document sinks.

A document changes with a row of any of its tables, in whatever partition that row lives, so the
members of a document sink's group cannot divide the topics' partitions. With ``scale_out:
group`` each member instead reads every record into a state of its own (keeper.py), and the
documents are divided into ``shares`` (``state.share_of``: a hash of the document's name and root
key, the same in every member); the group coordinator gives each running member some shares
(cdc/runtime/sink_shares.py), and a member writes only the documents of its shares. What a
member reaches in shares it does not own stays in its outbox, so a share it gains later is
written from there, once the runtime saw it read the topics up to their ends as of the gain.

Versions: a member's registers count the changes it applied, not another's, so the first write
of each document after a member gained its share is seeded above the version the target holds
(the previous owner's); the content it writes is at least as new, since the member read
everything the previous owner had when it let the share go.

Engine of choice: Kafka's consumer groups only say which member owns which share, and every
member holds every joined row. That spreads the assembly and the writes, which is where the time
goes (bench/results/documents.md); it does not spread the state, which each member keeps whole
(its size per million rows is in the same results).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from cdc.api import SharedSink
from sinks.documents.engine import Engine
from sinks.documents.keeper import Keeper, member_name


class SharedDocuments(SharedSink):
    """Mixed into a document sink that has ``keeper``, ``config``, ``_writing()`` (the generation
    it writes), ``_readers()`` (the one readers see) and ``_flush(engine, generation)``."""

    keeper: Keeper
    config: Any

    def share_count(self) -> int:
        return int(self.config.shares)

    @classmethod
    def reading_group(cls, config: Any) -> str:
        return f"{config.name}.member.{member_name(config)}"

    def read_from(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return self.keeper.read_from(self._writing(), partitions)

    def own(self, shares: frozenset[int]) -> bool:
        """Shares gained: a slice of their documents waiting in the outbox is written (True
        while some wait: the runtime calls again). Shares only lost: nothing is written (a
        revocation does no I/O)."""
        generation = self._writing()
        before = self.keeper.held()
        engine = self.keeper.own(shares, generation, self._readers())
        if shares < before or not engine.draining:
            return bool(engine.draining)
        more = self._flush(engine, generation, drain=True)
        self.keeper.noted(engine)
        self.keeper.report(generation)
        return more

    @abstractmethod
    def _writing(self) -> int: ...

    @abstractmethod
    def _readers(self) -> int: ...

    @abstractmethod
    def _flush(self, engine: Engine, generation: int, drain: bool = False) -> bool:
        """The engine's outbox written into ``generation`` (``drain``: a slice of the shares
        gained, ``Engine.drain``, returning whether some wait)."""
