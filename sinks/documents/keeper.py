"""What every document sink does around the engine: the plan from the captured shapes, one state
file per generation of the target, and the checks that keep state and target in step.

* The plan is made at the first write, from the newest shape of each joined table
  (``SinkContext.schema_for``), and checked as ``cdc validate`` checks it.
* The state of generation N is ``<state_dir>/<sink>.g<N>.db``. A rebuild's generation (not the one
  readers see) starts empty: its registers are copied from the current generation's state where
  there is one, and each document's register is raised above the version the current
  generation holds of it before its first write (``held_versions``), so no document's version
  goes back across the switch.
* A rebuild's state is *building* until the switch (State.set_building): the fill only stores
  rows; at the switch every document is assembled once and written into the new generation,
  then readers move to it. A new sink over topics that already hold records asks for a rebuild
  at its first write, so its first build takes that path too (bench/documents.py measures both).
* The state of the generation readers see must exist wherever the sink's group committed
  offsets: a state that holds nothing while the group committed offsets (its directory lost)
  cannot tell which documents the records before them changed, so the sink asks for a rebuild
  (``RebuildRequired``): the runtime fills a new generation from the compacted topics. A state
  that holds offsets is not compared offset by offset: the runtime commits past records it
  never hands the sink (set aside as poison, compacted away at a partition's end), so a
  committed offset ahead of the state's is normal. A state replaced by an older copy of itself
  is therefore not noticed; do not restore one (delete it, and the sink rebuilds).
* A member of a group (``scale_out: group``, shared.py) keeps a state of its own,
  ``<state_dir>/<sink>.<member>.g<N>.db``, and reads from the offsets it holds: a lost one is
  filled again from offset 0 by streaming, not by a rebuild (which would need every member
  stopped). Its engine writes only the documents of the shares it owns (``own``).
"""

from __future__ import annotations

import glob
import logging
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cdc.api import (
    CapturedShape,
    CapturedShapes,
    RebuildRequired,
    RetriableError,
    SchemaChangeError,
    SinkContext,
    SinkEvent,
    earlier_names,
)
from sinks.documents.declaration import Document
from sinks.documents.engine import Engine
from sinks.documents.plan import Plan, make_plan
from sinks.documents.state import State, documents_path, state_figures, state_offsets

log = logging.getLogger(__name__)
FIGURES_EVERY_S = 30.0  # how often report() counts the state's rows
HeldVersions = Callable[[int, list[tuple[str, dict[str, Any]]]], list[int | None]]


class Keeper:
    """One document sink's plan and states (used by the sink's thread)."""

    def __init__(self, sink: str, config: Any, context: Callable[[], SinkContext],
                 held_versions: HeldVersions) -> None:
        self.sink, self.config, self.context, self.held_versions = sink, config, context, held_versions
        self.documents: list[Document] = list(config.documents or [])
        self.plan: Plan | None = None
        self.shapes: CapturedShapes | None = None
        self.engine: Engine | None = None
        self.generation: int | None = None  # of the open state
        self._figured: tuple[float, int, dict[str, Any]] | None = None  # (when, generation, state figures)
        self._answered: dict[str, int] = {}  # topic -> the newest shape version ignored
        self._filled: dict[str, int] = {}    # topic -> the newest shape version a rebuild's fill loaded
        # A member of a group: its name in the state's file, and the shares it writes (None: all).
        self.member: str | None = member_name(config) if getattr(config, "scale_out", "single") == "group" else None
        self.owned: frozenset[int] | None = None if self.member is None else frozenset()
        self.draining: frozenset[int] = frozenset()  # gained, their waiting documents being written

    def path(self, generation: int) -> Path:
        name = self.sink if self.member is None else f"{self.sink}.{self.member}"
        return documents_path(self.config.state_dir, name, generation)

    def read_from(self, generation: int, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """A member's start on ``partitions``: the offsets its state of ``generation`` holds (0
        where it holds none)."""
        held = state_offsets(self.path(generation))
        return {tp: held.get(tp, 0) for tp in partitions}

    def own(self, shares: frozenset[int], generation: int, current: int) -> Engine:
        """A member writes ``shares`` from now on; returns the engine, whose ``drain`` writes the
        documents waiting in shares it gained (each seeded first above the version the target
        holds: the previous owner wrote it at its own registers)."""
        engine = self.engine_for(generation, current)
        engine.own(shares, generation)
        self.noted(engine)
        return engine

    def noted(self, engine: Engine) -> None:
        """The engine's shares, kept for the next engine of this process."""
        self.owned, self.draining = engine.owned, engine.draining

    def held(self) -> frozenset[int]:
        return (self.owned or frozenset()) | self.draining

    def make_plan(self) -> Plan:
        """The plan, made at the first call from the newest shape of each joined table (with the
        earlier names of its renamed columns), and again after ``forget_plan``."""
        if self.plan is None:
            context = self.context()
            by_topic: dict[str, CapturedShape] = {}
            earlier: dict[str, dict[str, tuple[str, ...]]] = {}
            for table in sorted({node.table for document in self.documents for node in _nodes(document)}):
                topic = f"{context.topic_prefix}.{table}"
                record = context.schema_for(topic)
                if record is None:
                    raise RetriableError(f"sink {self.sink}: no shape of {topic} is published yet; its documents "
                                         f"wait for the source to capture the table")
                by_topic[topic] = CapturedShape.of_record(record)
                version = record.get("version")
                before = context.shapes_between(topic, 0, version) if isinstance(version, int) else []
                earlier[table] = earlier_names([*before, record])
            self.shapes = CapturedShapes(context.topic_prefix, by_topic)
            self.plan = make_plan(self.documents, list(self.config.topics), self.shapes, earlier)
        return self.plan

    def forget_plan(self) -> None:
        """The next plan is made from the shapes as they are then (a rebuild's new generation)."""
        self.close()
        self.plan, self.shapes, self._answered = None, None, {}

    def follow_shapes(self, events: list[SinkEvent], shape_of: Callable[[SinkEvent], dict | None],
                      policy: str) -> None:
        """Before a write of the generation readers see: a joined table's rows in a newer shape
        than the plan's, whose change shows in the documents (a column a node shows added,
        dropped, renamed or retyped), answered by ``policy``: ``rebuild`` (``RebuildRequired``:
        a new generation planned from the newest shapes, every document assembled in them),
        ``fail`` (``SchemaChangeError``), ``evolve`` (the plan made again now: each document
        takes the new shape at its next change) or ``ignore`` (the documents keep the plan's
        shape until a rebuild). A rebuild's generation is planned from the newest shapes
        already: its rows of older shapes need nothing."""
        plan, shapes = self.make_plan(), self.shapes
        assert shapes is not None
        for topic, (version, event) in _newest_shapes(events).items():
            held = shapes.by_topic.get(topic)
            if held is None or not isinstance(version, int) or held.version is None or \
                    version <= max(held.version, self._answered.get(topic, 0)):
                continue
            record = shape_of(event)
            if record is None:
                continue
            changed = _shown_changes(plan, held, CapturedShape.of_record(record))
            if not changed:
                self._answered[topic] = version  # nothing documents show: not asked again per batch
                continue
            what = (f"sink {self.sink}: {held.table} changed in schema version {version} ({'; '.join(changed)}), "
                    f"which its documents show")
            if policy == "rebuild":
                raise RebuildRequired(f"{what}: the documents are rebuilt in the new shape")
            if policy == "fail":
                raise SchemaChangeError(f"{what}; run `cdc rebuild`, or set schema_policy: rebuild")
            if policy == "evolve":
                log.warning("%s; schema_policy evolve: each document takes it at its next change", what)
                engine = self.engine
                self.plan, self.shapes = None, None
                new = self.make_plan()
                if engine is not None:
                    if new.digest != engine.plan.digest:  # keys or join types changed: the state cannot follow
                        raise RebuildRequired(f"{what}, and the keys the documents join on: rebuilding")
                    engine.plan = engine.state.plan = new
                    engine.state.shown_again()
                    engine.state.set_planned(self._versions())
                return
            log.warning("%s; schema_policy %s: the documents keep the shape they had until a rebuild", what, policy)
            self._answered[topic] = version  # said once

    def apply(self, events: list[SinkEvent], generation: int, current: int, rebuilding: bool,
              shape_of: Callable[[SinkEvent], dict | None], policy: str) -> Engine:
        """A write's ``events`` into ``generation``'s state (``current``: the one readers see);
        returns the engine that flushes them. Into the generation readers see, a newer shape is
        followed first (``follow_shapes``); into a rebuild's, the shapes its rows carry are
        noted for the switch (``filled``)."""
        engine = self.engine_for(generation, current)
        if events:
            if rebuilding:
                self.filled(events)
            else:
                self.follow_shapes(events, shape_of, policy)
                engine = self.engine_for(generation, current)  # ``evolve`` made the plan again
            engine.apply(events)
        return engine

    def filled(self, events: list[SinkEvent]) -> None:
        """A rebuild's fill loaded ``events``: the newest shape of each topic among them is
        checked at the switch (``_check_fill``)."""
        for topic, (version, _) in _newest_shapes(events).items():
            if version > self._filled.get(topic, 0):
                self._filled[topic] = version

    def engine_for(self, generation: int, current: int) -> Engine:
        """The engine over generation ``generation``'s state (``current``: the one readers see)."""
        if self.engine is not None and self.generation == generation:
            return self.engine
        self.close()
        plan = self.make_plan()
        path = self.path(generation)
        fresh = not path.exists()
        state = State(path, plan, self.config.shares if self.member is not None else 1)
        try:
            if fresh and generation != current:
                if self.path(current).exists():
                    state.copy_registers(self.path(current))
                # And above what readers see: the current state may be behind it (lost, restored).
                state.set_seed_from(current)
                state.set_building()  # nobody reads it before the switch: load first, assemble once
            if generation == current:
                if self.member is None:  # a member reads from its state's offsets
                    self._check_single(generation)
                    self._check_behind(state, generation, fresh)
                if state.seed_from() is not None:  # readers see it (a kill came before switched())
                    state.set_seed_from(None)
                if not fresh:
                    self._check_planned(state)
            state.set_planned(self._versions())
        except BaseException:
            state.close()
            if fresh:  # made by this call: no trace of a state that never held anything
                _remove(path)
            raise
        context = self.context()
        self.engine = Engine(plan, state, self.config.max_document_bytes, context.delete_read, context.dead_letter,
                             self.held_versions)
        if self.member is not None and generation == current:  # a rebuild runs alone: it writes everything
            self.engine.owned, self.engine.draining, self.engine.seed_shared = self.owned, self.draining, generation
        self.generation = generation
        return self.engine

    def _versions(self) -> dict[str, int]:
        """The shape version of each joined table the plan was made from."""
        assert self.shapes is not None
        return {topic: shape.version for topic, shape in self.shapes.by_topic.items() if shape.version is not None}

    def _check_planned(self, state: State) -> None:
        """The shapes the state's documents were written in (``State.planned``) against the plan's
        (the newest as this process started): a change of a column the documents show while the
        sink was stopped is answered by ``schema_policy`` as a live one (``follow_shapes``);
        ``evolve`` and ``ignore`` take the new shapes from here on."""
        planned = state.planned()
        plan, shapes = self.make_plan(), self.shapes
        assert shapes is not None
        changes = []
        for topic, newest in shapes.by_topic.items():
            before = planned.get(topic)
            if before is None or newest.version is None or before >= newest.version:
                continue
            record = self.context().schema_for(topic, before)
            if record is not None and (changed := _shown_changes(plan, CapturedShape.of_record(record), newest)):
                changes.append(f"{newest.table} ({'; '.join(changed)})")
        if not changes:
            return
        what = f"sink {self.sink}: while it was stopped, {', '.join(changes)} changed in columns its documents show"
        policy = self.config.schema_policy
        if policy == "rebuild":
            raise RebuildRequired(f"{what}: the documents are rebuilt in the new shapes")
        if policy == "fail":
            raise SchemaChangeError(f"{what}; run `cdc rebuild`, or set schema_policy: rebuild")
        log.warning("%s; schema_policy %s: each document takes them at its next change", what, policy)

    def _check_single(self, generation: int) -> None:
        """One process after members of a group kept ``generation``: its state (if any) is of an
        earlier time and its registers below the versions members wrote, so the documents are
        rebuilt (a rebuild's versions start above those readers see)."""
        members = self._member_states(generation)
        if members:
            raise RebuildRequired(f"sink {self.sink}: members of a group kept generation {generation} "
                                  f"({members[0].name}...); one process keeps it now: the documents are "
                                  f"rebuilt from the topics")

    def _check_behind(self, state: State, generation: int, fresh: bool) -> None:
        """A state holding nothing where the group committed offsets is behind: a rebuild. So
        is a new one (``fresh``) over topics that hold records: the first build loads them into
        a new generation and assembles each document once, rather than change by change."""
        log_ = self.context().log
        if log_ is None:
            return
        held = state.offsets()
        if held:
            return  # see the module docstring
        # A joined table whose topic is not made yet (its source has not published a row of it) holds
        # nothing: asking for its ends would fail this write, and so every event of the batch.
        existing = set(log_.topics())
        ends = {tp: end for topic in self.make_plan().topics() if topic in existing
                for tp, end in log_.end_offsets(topic).items()}
        reader = log_.reader(self.sink)
        try:
            committed = reader.committed(list(ends))
        finally:
            reader.close()
        behind = [(tp, at) for tp, at in committed.items() if at]
        if behind:
            (topic, partition), at = behind[0]
            raise RebuildRequired(f"sink {self.sink}: its documents state ({self.path(generation).name}) holds "
                                  f"nothing, and the offsets its group committed are past it ({topic}[{partition}] "
                                  f"at {at}): the documents are rebuilt from the topics")
        if fresh and any(ends.values()):
            raise RebuildRequired(f"sink {self.sink}: a first build of its documents ({sum(ends.values()):,} "
                                  f"records in its topics): loaded into a new generation, each document "
                                  f"assembled once")

    def opened(self, generation: int) -> None:
        """A rebuild opened ``generation``: an earlier attempt's state goes, and the plan is made
        again from the shapes as they are now."""
        self.forget_plan()
        self._filled = {}
        _remove(self.path(generation))

    def finish(self, generation: int, current: int) -> Engine:
        """Before readers switch to ``generation``: its load ends, every document goes to the
        outbox (the caller flushes it into the generation)."""
        engine = self.engine_for(generation, current)
        if engine.building:
            self._check_fill(engine)
        engine.finish_building()
        return engine

    def _check_fill(self, engine: Engine) -> None:
        """Shapes published during the fill that change columns the documents show (DDL run
        while the generation was filled): its rows were loaded under the plan of the rebuild's
        start, so the rebuild begins again in the newest shapes (nobody reads it yet)."""
        assert self.shapes is not None
        context, changes = self.context(), []
        for topic, held in self.shapes.by_topic.items():
            # The newest shape published, or one its rows were loaded in (the schema topic may
            # not have been read again since the DDL).
            record = context.schema_for(topic)
            loaded = self._filled.get(topic)
            if loaded is not None and (record is None or loaded > (record.get("version") or 0)):
                record = context.schema_for(topic, loaded) or record
            newest = None if record is None else CapturedShape.of_record(record)
            if newest is not None and held.version is not None and newest.version is not None \
                    and newest.version > held.version and (changed := _shown_changes(engine.plan, held, newest)):
                changes.append(f"{held.table} ({'; '.join(changed)})")
        if changes:
            raise RebuildRequired(f"sink {self.sink}: during the rebuild, {', '.join(changes)} changed in columns "
                                  f"its documents show: it begins again in the new shapes")

    def switched(self, generation: int) -> None:
        """Readers see ``generation`` now: its versions need no seeding any more."""
        if self.engine is not None and self.generation == generation:
            self.engine.state.set_seed_from(None)

    def dropped(self, generation: int) -> None:
        if self.generation == generation:
            self.close()
        _remove(self.path(generation))
        for path in self._member_states(generation):  # members' states of it, in this directory
            _remove(path)

    def _member_states(self, generation: int) -> list[Path]:
        """The state files members of a group kept of ``generation`` here."""
        return sorted(Path(self.config.state_dir).glob(f"{glob.escape(self.sink)}.*.g{generation}.db"))

    def figures(self, generation: int) -> dict[str, Any]:
        rows, size = state_figures(self.path(generation))
        return {"state_rows": rows, "state_bytes": size, **(self.engine.counters if self.engine is not None else {})}

    def report(self, generation: int) -> None:
        """The sink's figures into its stats' details (`cdc status`, the console, /metrics): the
        engine's counters after every write, the state's rows and bytes (a count of every table)
        at most every ``FIGURES_EVERY_S``."""
        now = time.monotonic()
        building = self.engine is not None and self.engine.building  # no index to count by: later
        if not building and (self._figured is None or now - self._figured[0] > FIGURES_EVERY_S
                             or self._figured[1] != generation):
            try:
                rows, size = state_figures(self.path(generation))
            except (sqlite3.Error, OSError) as err:  # figures only: the write is done
                log.warning("sink %s: could not count its documents state (%s); its figures wait", self.sink, err)
                rows, size = None, None
            self._figured = (now, generation, {"state_rows": rows, "state_bytes": size})
        details = self.context().stats.details
        if self._figured is not None:
            details.update(self._figured[2])
        if self.engine is not None:
            details.update(self.engine.counters)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.state.close()
            self.engine, self.generation = None, None


def member_name(config: Any) -> str:
    """This process's name among a group's members: ``member``, else the host's name."""
    return config.member or socket.gethostname()


def _newest_shapes(events: list[SinkEvent]) -> dict[str, tuple[int, SinkEvent]]:
    """Per topic, the newest shape version among ``events`` and an event of it (a batch may hold
    rows of an older shape before those of a newer one)."""
    out: dict[str, tuple[int, SinkEvent]] = {}
    for event in events:
        version = (event.source or {}).get("schema_version")
        if isinstance(version, int) and (event.topic not in out or version > out[event.topic][0]):
            out[event.topic] = (version, event)
    return out


def _shown_changes(plan: Plan, held: CapturedShape, new: CapturedShape) -> list[str]:
    """What changed between two shapes of a table in the columns a node of ``plan`` shows."""
    tplan = next(t for t in plan.tables.values() if t.table == held.table)
    shown = {c for number in tplan.nodes
             for c in (*tplan.columns, *(c.name for c in held.columns), *(c.name for c in new.columns))
             if plan.nodes[number].shows(c)}
    before = {c.name: c for c in held.columns if c.name in shown}
    after = {c.name: c for c in new.columns if c.name in shown}
    out = [f"{name} added" + (f" (renamed from {after[name].renamed_from})" if after[name].renamed_from else "")
           for name in after if name not in before]
    out += [f"{name} dropped" for name in before if name not in after
            and not any(c.renamed_from == name for c in after.values())]
    out += [f"{name} {before[name].type} -> {after[name].type}" for name in after
            if name in before and before[name].type != after[name].type]
    return out


def _nodes(node: Any) -> Iterator[Any]:
    yield node
    for below in (*node.lookups, *node.children):
        yield from _nodes(below)


def _remove(path: Path) -> None:
    for part in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        part.unlink(missing_ok=True)
