"""Generations of a sink's tables, for rebuilds without readers ever seeing a partial table.

Readers query views (``orders``); each view selects from the physical table of the current
generation (``orders__g1``). A rebuild writes a new generation beside it and then switches every
view of the sink at once. ``cdc_sink_generations`` holds one row per (sink, generation) with state
``current`` (readers see it; exactly one), ``open`` (being written by a rebuild) or ``retired``
(switched away from, until dropped).

Writers that follow the current generation (``SqlSink.generation is None``) read it at the start
of every write transaction with a shared row lock (PostgreSQL, MySQL); the switch takes the row
for update first, so it waits for writes still going to the old generation, and every write after
it goes to the new one. On SQLite every write transaction holds the database write lock anyway.

The switch is one transaction on PostgreSQL, SQLite and DuckDB (views replaced, states updated).
MySQL cannot put DDL in a transaction: it commits the new states first (writers move on), then
swaps all views with one atomic ``RENAME TABLE``; readers may see the old generation for that
moment, never an empty or partial one.
"""

from __future__ import annotations

import logging

from cdc.api import PermanentError
from sinks.sql.bookkeeping import CURRENT, OPEN, RETIRED, Bookkeeping, TableEntry, physical_name
from sinks.sql.evolve import record_columns, with_key
from sinks.sql.tables import TableCatalog
from sinks.sql.target import Target

log = logging.getLogger(__name__)


class Generations:
    def __init__(self, target: Target, books: Bookkeeping, catalog: TableCatalog, sink_name: str) -> None:
        self.target = target
        self.books = books
        self.catalog = catalog
        self.sink_name = sink_name

    def ensure(self, pinned: int | None) -> int:
        """At start: a brand-new sink's generation 1 is current; a pinned generation that nobody
        opened is registered as open. Returns the current generation."""
        with self.target.engine.begin() as conn:
            states = self.books.states(conn)
            current = next((g for g, s in states.items() if s == CURRENT), None)
            if current is None:
                current = 1
                self.books.set_state(conn, current, CURRENT)
            if pinned is not None and pinned not in states and pinned != current:
                self.books.set_state(conn, pinned, OPEN)
        return current

    def current(self) -> int:
        with self.target.engine.connect() as conn:
            return self.books.current(conn) or 1

    def open(self, generation: int) -> None:
        """An empty ``generation`` to write into; readers keep the current one. Leftovers of an
        earlier attempt at the same generation are dropped."""
        with self.target.engine.begin() as conn:
            current = self.books.current(conn) or 1
            if generation == current:
                raise PermanentError(f"sql sink {self.sink_name}: generation {generation} is the current "
                                     f"one; open a new generation (e.g. {current + 1})")
            leftovers = self.books.entries(conn, generation)
            names = set(leftovers) | set(self.books.entries(conn, current))
            for name in names:
                self.target.drop_table(conn, physical_name(name, generation))
            self.books.forget_entries(conn, generation, [physical_name(n, generation) for n in names])
            self.books.set_state(conn, generation, OPEN)
        self.catalog.forget(generation)
        log.info("sql sink %s: generation %d opened (readers stay on %d)", self.sink_name, generation, current)

    def switch(self, generation: int) -> None:
        """Every view of the sink shows ``generation`` from now on. A table that the current
        generation has and ``generation`` lacks (its topic had no rows in the rebuild) is created
        empty in ``generation`` first, so no view is left pointing at a table about to be dropped."""
        engine = self.target.engine
        with engine.begin() as conn:
            current = self.books.current(conn, lock="update") or 1
            known = self.books.states(conn)
            old, new = self.books.entries(conn, current), self.books.entries(conn, generation)
        if generation == current:
            return
        if generation not in known:  # a typo would otherwise show readers empty tables
            raise PermanentError(f"sql sink {self.sink_name}: generation {generation} was never opened")
        for name, entry in old.items():
            if name not in new:
                record = self.catalog.schema_for(entry.topic)
                columns = (with_key(record_columns(record), entry.key) if record else list(entry.columns.values()))
                new[name] = self.catalog.sync(TableEntry(name, generation, entry.topic,
                                                         {c.name: c for c in columns},
                                                         record.get("version") if record else entry.schema_version))
        views = {name: physical_name(name, generation) for name in new}
        if self.target.kind == "mysql":
            with engine.begin() as conn:
                self._set_states(conn, current, generation)
            with engine.begin() as conn:
                self.target.switch_views(conn, views)
        else:
            with engine.begin() as conn:
                self.books.current(conn, lock="update")
                self.target.switch_views(conn, views)
                self._set_states(conn, current, generation)
        self.catalog.forget()
        log.info("sql sink %s: readers switched from generation %d to %d (%d tables)",
                 self.sink_name, current, generation, len(views))

    def _set_states(self, conn, current: int, generation: int) -> None:
        if current != generation:
            self.books.set_state(conn, current, RETIRED)
        self.books.set_state(conn, generation, CURRENT)

    def drop(self, generation: int) -> None:
        """Drop ``generation``'s tables and its bookkeeping; never the current generation."""
        with self.target.engine.begin() as conn:
            current = self.books.current(conn) or 1
            if generation == current:
                raise PermanentError(f"sql sink {self.sink_name}: generation {generation} is the one "
                                     f"readers see; switch to another before dropping it")
            names = set(self.books.entries(conn, generation)) | set(self.books.entries(conn, current))
            for name in names:
                self.target.drop_table(conn, physical_name(name, generation))
            self.books.forget_entries(conn, generation, [physical_name(n, generation) for n in names])
            self.books.forget_generation(conn, generation)
        self.catalog.forget(generation)
        log.info("sql sink %s: generation %d dropped", self.sink_name, generation)
