"""Generations behind aliases, so that readers never see an empty or partial index.

Readers query the alias ``<name>``; it points at the index of the current generation,
``<name>__g<N>``, with the filter that hides tombstone documents (tombstones.py). A rebuild
writes generation N+1 into new indexes nobody reads; the switch moves every alias of the sink
from N to N+1 in one ``_aliases`` call (atomic in OpenSearch: a search sees the old index or the
new one). The old generation is dropped ``drop_old_generation_after_s`` later.

The sink's record is one document in the index ``cdc-sink-state`` (``_id``: the sink's name)::

    {"current": N, "open": N+1 | null, "aliases": {alias: topic}, "retired": {"M": drop at (epoch s)}}

The aliases themselves are the truth readers see: at start, if they all point at a generation
other than ``current`` (a crash between the ``_aliases`` call and saving the record), the record
is corrected. A crash during a rebuild leaves an opened generation nobody reads; opening it again
deletes what it has, so a rebuild either finishes or starts over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc.api import PermanentError
from sinks.opensearch.naming import generation_index, split_generation
from sinks.opensearch.tombstones import ALIAS_FILTER

log = logging.getLogger(__name__)

STATE_INDEX = "cdc-sink-state"


@dataclass(slots=True)
class State:
    current: int = 1
    open: int | None = None
    aliases: dict[str, str] = field(default_factory=dict)      # alias -> topic
    retired: dict[int, float] = field(default_factory=dict)    # generation -> drop at (epoch s)


class Generations:
    def __init__(self, client, sink_name: str) -> None:
        self.client = client
        self.sink_name = sink_name
        self.state = State()

    # -- the record ------------------------------------------------------------------------------
    def load(self) -> State:
        if not self.client.indices.exists(index=STATE_INDEX):
            self.client.indices.create(index=STATE_INDEX, body={
                "settings": {"number_of_shards": 1, "auto_expand_replicas": "0-1"},
                "mappings": {"dynamic": False}}, params={"ignore": 400})
        answer = self.client.get(index=STATE_INDEX, id=self.sink_name, params={"ignore": 404})
        doc = answer.get("_source") if answer.get("found") else None
        if doc:
            self.state = State(doc["current"], doc.get("open"), dict(doc.get("aliases", {})),
                               {int(g): t for g, t in doc.get("retired", {}).items()})
        self._reconcile()
        return self.state

    def stored_aliases(self) -> dict[str, str]:
        """alias -> topic as the record holds them now (a sink may have added some since this one
        loaded it); ``state`` is left as it is."""
        answer = self.client.get(index=STATE_INDEX, id=self.sink_name, params={"ignore": 404})
        doc = answer.get("_source") if answer.get("found") else None
        return {**dict((doc or {}).get("aliases", {})), **self.state.aliases}

    def save(self) -> None:
        s = self.state
        self.client.index(index=STATE_INDEX, id=self.sink_name, params={"refresh": "true"}, body={
            "current": s.current, "open": s.open, "aliases": s.aliases,
            "retired": {str(g): t for g, t in s.retired.items()}})

    def _reconcile(self) -> None:
        if not self.state.aliases:
            return
        pointed = self.alias_targets()
        generations = {g for g in pointed.values() if g is not None}
        if len(generations) == 1 and (g := generations.pop()) != self.state.current:
            log.warning("opensearch sink %s: the aliases show generation %d, the record %d: the last switch "
                        "was cut short; following the aliases", self.sink_name, g, self.state.current)
            self.state.current = g
            self.state.open = None
            self.save()

    def alias_targets(self) -> dict[str, int | None]:
        """alias -> the generation it points at (None: the alias does not exist)."""
        names = list(self.state.aliases)
        answer = self.client.indices.get_alias(name=",".join(names), params={"ignore_unavailable": "true",
                                                                            "ignore": 404})
        targets: dict[str, int | None] = dict.fromkeys(names)
        for index, body in answer.items():
            if not isinstance(body, dict):
                continue
            for alias in body.get("aliases", {}):
                parsed = split_generation(index)
                if alias in targets and parsed is not None:
                    targets[alias] = parsed[1]
        return targets

    # -- indexes ---------------------------------------------------------------------------------
    def ensure_index(self, alias: str, topic: str, generation: int, body: dict) -> bool:
        """Create ``<alias>__g<generation>`` (with ``body``: settings, mappings) if missing; in the
        current generation the alias is created with it, in the same call. True if created."""
        index = generation_index(alias, generation)
        if self.client.indices.exists_alias(name=alias) is False and self.client.indices.exists(index=alias):
            raise PermanentError(f"opensearch sink {self.sink_name}: {alias} is an index, not an alias: this "
                                 f"sink serves readers through an alias of that name. Reindex or delete it, "
                                 f"or choose another index_name")
        if alias not in self.state.aliases:
            self.state.aliases[alias] = topic
            self.save()
        if self.client.indices.exists(index=index):
            return False
        if generation == self.state.current:
            body = {**body, "aliases": {alias: {"filter": ALIAS_FILTER}}}
        self.client.indices.create(index=index, body=body)
        log.info("opensearch sink %s: created %s%s", self.sink_name, index,
                 f" behind alias {alias}" if generation == self.state.current else " (not yet read)")
        return True

    def open(self, generation: int) -> None:
        if generation == self.state.current:
            raise PermanentError(f"opensearch sink {self.sink_name}: generation {generation} is the current "
                                 f"one; open a new generation (e.g. {self.state.current + 1})")
        self._delete_generation(generation)  # leftovers of an earlier attempt: start over
        self.state.open = generation
        self.state.retired.pop(generation, None)
        self.save()
        log.info("opensearch sink %s: generation %d opened (readers stay on %d)", self.sink_name, generation,
                 self.state.current)

    def switch(self, generation: int, create_missing: Callable[[str, str], None],
               finish_fill: Callable[[str, str], None] = lambda alias, topic: None) -> None:
        """Every alias of the sink shows ``generation``, in one ``_aliases`` call. An alias whose
        topic had no rows in the rebuild gets an empty index first (``create_missing(alias, topic)``);
        each index gets the settings readers need back (``finish_fill(alias, topic)``: it was filled
        without periodic refreshes) and is refreshed before any alias moves."""
        old = self.state.current
        if generation == old:
            return
        if generation != self.state.open:
            raise PermanentError(f"opensearch sink {self.sink_name}: generation {generation} was never opened")
        pointed = self.alias_targets()
        actions: list[dict[str, Any]] = []
        for alias, topic in sorted(self.state.aliases.items()):
            new_index = generation_index(alias, generation)
            if not self.client.indices.exists(index=new_index):
                create_missing(alias, topic)
            finish_fill(alias, topic)
            self.client.indices.refresh(index=new_index)
            if (was := pointed.get(alias)) is not None and was != generation:
                actions.append({"remove": {"index": generation_index(alias, was), "alias": alias}})
            actions.append({"add": {"index": new_index, "alias": alias, "filter": ALIAS_FILTER}})
        self.client.indices.update_aliases(body={"actions": actions})
        self.state.current, self.state.open = generation, None
        self.save()
        log.info("opensearch sink %s: readers switched from generation %d to %d (%d aliases)", self.sink_name,
                 old, generation, len(self.state.aliases))

    def drop(self, generation: int, delay_s: float) -> None:
        if generation == self.state.current:
            raise PermanentError(f"opensearch sink {self.sink_name}: generation {generation} is the one readers "
                                 f"see; switch to another before dropping it")
        if delay_s <= 0:
            self._delete_generation(generation)
            self.state.retired.pop(generation, None)
        else:
            self.state.retired[generation] = time.time() + delay_s
            log.info("opensearch sink %s: generation %d is dropped in %.0fs", self.sink_name, generation, delay_s)
        if self.state.open == generation:
            self.state.open = None
        self.save()

    def drop_due(self) -> None:
        now = time.time()
        due = [g for g, at in self.state.retired.items() if at <= now and g != self.state.current]
        for generation in due:
            self._delete_generation(generation)
            del self.state.retired[generation]
        if due:
            self.save()

    def _delete_generation(self, generation: int) -> None:
        names = [generation_index(alias, generation) for alias in self.state.aliases]
        if names:
            self.client.indices.delete(index=",".join(names), params={"ignore_unavailable": "true"})
            log.info("opensearch sink %s: generation %d deleted (%d indexes)", self.sink_name, generation,
                     len(names))
