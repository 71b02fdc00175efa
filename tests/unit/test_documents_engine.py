"""The documents' engine (sinks/documents/engine.py) over its state (state.py): a shop's orders
documents, each joined from five tables, kept from the log whatever order the topics arrive in,
however the batches are cut, with replays and crashes between them.

The property: after any history, every order's document at the target is the naive join of the
source's final rows (a deleted order's is deleted or was never written), one (document, version)
never came with two bodies, and the versions a document is written at only rise.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.api import CapturedShape, CapturedShapes, Op, RetriableError, SinkEvent
from cdc.events import Column
from sinks.documents.declaration import Document
from sinks.documents.engine import Engine, Written
from sinks.documents.plan import make_plan
from sinks.documents.state import State, documents_path

CUSTOMERS, ORDERS, ITEMS = "public.customers", "public.orders", "public.order_items"
PRODUCTS, CATEGORIES = "public.products", "public.categories"
TABLES = (CUSTOMERS, ORDERS, ITEMS, PRODUCTS, CATEGORIES)


def shape(table: str, *columns: tuple[str, str] | tuple[str, str, bool]) -> CapturedShape:
    return CapturedShape("shop_pg", table, tuple(Column(c[0], c[1], len(c) > 2) for c in columns), 1)


SHAPES = [
    shape(CUSTOMERS, ("id", "integer", True), ("name", "text")),
    shape(ORDERS, ("id", "integer", True), ("customer_id", "integer"), ("note", "text")),
    shape(ITEMS, ("order_id", "integer", True), ("line_no", "integer", True), ("product_id", "integer"),
          ("qty", "integer")),
    shape(PRODUCTS, ("id", "integer", True), ("name", "text"), ("category_id", "integer")),
    shape(CATEGORIES, ("id", "integer", True), ("name", "text")),
]
KEYS = {s.table: tuple(c.name for c in s.key) for s in SHAPES}
DECLARATION = {
    "name": "orders", "table": ORDERS,
    "lookups": [{"table": CUSTOMERS, "as": "customer", "foreign_key": ["customer_id"]}],
    "children": [{
        "table": ITEMS, "as": "items", "foreign_key": ["order_id"], "order_by": ["line_no"], "exclude": ["order_id"],
        "lookups": [{"table": PRODUCTS, "as": "product", "foreign_key": ["product_id"],
                     "lookups": [{"table": CATEGORIES, "as": "category", "foreign_key": ["category_id"]}]}],
    }],
}
PLAN = make_plan([Document.model_validate(DECLARATION)], ["shop.public.*"],
                 CapturedShapes("shop", {f"shop.{s.table}": s for s in SHAPES}))


def topic(table: str) -> str:
    return f"shop.{table}"


# --- the source: rows, and the events its changes make -------------------------------------------

class Source:
    """The tables' rows as the source holds them, and per topic the events its changes made (each
    with the next version: its position in the history)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[tuple, dict[str, Any]]] = {table: {} for table in TABLES}
        self.events: dict[str, list[SinkEvent]] = {topic(table): [] for table in TABLES}
        self.version = 0

    def _emit(self, table: str, key: tuple, op: Op, after: dict[str, Any] | None) -> SinkEvent:
        self.version += 1
        stream = self.events[topic(table)]
        event = SinkEvent(topic(table), 0, len(stream), dict(zip(KEYS[table], key)), op, None,
                          None if after is None else dict(after), self.version,
                          {"schema": "public", "table": table.split(".")[1]})
        stream.append(event)
        return event

    def upsert(self, table: str, row: dict[str, Any]) -> SinkEvent:
        key = tuple(row[c] for c in KEYS[table])
        op = Op.UPDATE if key in self.rows[table] else Op.CREATE
        self.rows[table][key] = dict(row)
        return self._emit(table, key, op, row)

    def delete(self, table: str, key: tuple) -> SinkEvent | None:
        if self.rows[table].pop(key, None) is None:
            return None  # the source deletes only rows it has
        return self._emit(table, key, Op.DELETE, None)

    def rekey(self, table: str, key: tuple, new_key: tuple) -> None:
        """A primary-key change: the old key's delete and the new key's create, consecutive."""
        if key == new_key or key not in self.rows[table] or new_key in self.rows[table]:
            return
        row = {**self.rows[table][key], **dict(zip(KEYS[table], new_key))}
        self.delete(table, key)
        self.upsert(table, row)

    def run(self, op: tuple) -> None:
        kind, table, *args = op
        getattr(self, kind)(table, *args)

    def all_events(self) -> list[SinkEvent]:
        return sorted((e for stream in self.events.values() for e in stream), key=lambda e: e.version)


def joined(rows: dict[str, dict[tuple, dict[str, Any]]], order_id: int) -> dict[str, Any] | None:
    """The naive join: the orders document of ``order_id`` from the source's rows."""
    order = rows[ORDERS].get((order_id,))
    if order is None:
        return None

    def one(table: str, key: Any) -> dict[str, Any] | None:
        return None if key is None else rows[table].get((key,))

    def product(product_id: Any) -> dict[str, Any] | None:
        found = one(PRODUCTS, product_id)
        return None if found is None else {**found, "category": one(CATEGORIES, found["category_id"])}

    items = sorted((row for (o, _), row in rows[ITEMS].items() if o == order_id), key=lambda r: r["line_no"])
    return {**order, "customer": one(CUSTOMERS, order["customer_id"]),
            "items": [{**{c: v for c, v in item.items() if c != "order_id"}, "product": product(item["product_id"])}
                      for item in items]}


# --- the target and the sink around the engine ---------------------------------------------------

class Crash(Exception):
    """A kill -9, simulated: whatever was not committed is lost."""


class Target:
    """A store with external versioning: per document id the highest version (a write at a
    version <= the stored one is refused and ignored). Every write that reached it is recorded."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, bytes], tuple[int, dict[str, Any] | None]] = {}
        self.bodies: dict[tuple[str, bytes, int], dict[str, Any] | None] = {}   # every (doc, id, version) seen
        self.accepted: dict[tuple[str, bytes], list[int]] = {}
        self.refused: list[tuple[Written, int]] = []                           # with the stored version

    def write(self, written: list[Written]) -> list[tuple[Written, str]]:
        for w in written:
            doc_id = (w.document, orjson.dumps(w.key, option=orjson.OPT_SORT_KEYS))
            seen = (*doc_id, w.version)
            # one version, one content
            body = w.parsed()
            assert self.bodies.setdefault(seen, body) == body, f"{seen}: two bodies at one version"
            stored = self.docs.get(doc_id)
            if stored is not None and w.version <= stored[0]:
                self.refused.append((w, stored[0]))
                continue
            self.docs[doc_id] = (w.version, body)
            self.accepted.setdefault(doc_id, []).append(w.version)
        return []

    def body(self, order_id: int) -> tuple[bool, dict[str, Any] | None]:
        """(written at all, the body stored) of an order's document."""
        found = self.docs.get(("orders", orjson.dumps({"id": order_id})))
        return (False, None) if found is None else (True, found[1])


class Sink:
    """The engine as a sink runs it: ``apply`` then ``flush`` per batch, a new engine over the
    same state file after a crash."""

    def __init__(self, path) -> None:
        self.path = path
        self.target = Target()
        self.state = State(path, PLAN)
        self.engine = Engine(PLAN, self.state, max_bytes=1 << 20)

    def restart(self) -> None:
        self.state.close()
        self.state = State(self.path, PLAN)
        self.engine = Engine(PLAN, self.state, max_bytes=1 << 20)

    def batch(self, events: list[SinkEvent]) -> int:
        reached = self.engine.apply(events)
        self.engine.flush(self.target.write)
        return reached

    def crash_in_write(self) -> None:
        """The target takes the documents, then the process dies before the outbox is told."""
        def write(written: list[Written]) -> list[tuple[Written, str]]:
            self.target.write(written)
            raise Crash
        try:
            self.engine.flush(write)
        except Crash:
            pass
        self.restart()


def assert_sql_is_python(state: State) -> None:
    """The SQL assembly (state.assembled) makes exactly the bytes of the Python one (assemble)."""
    docs = [("orders", orjson.dumps([order_id])) for order_id in range(1, 5)]
    assert state.sql_of("orders") is not None
    with state.reading():
        built = state.assembled(docs)
        assert built.keys() == set(docs)
        for doc in docs:
            assert built[doc] == state.assemble(*doc), f"{doc}: SQL and Python assemble it differently"


def make_sink(directory) -> Sink:
    return Sink(documents_path(directory, "search", 1))


# --- the property ----------------------------------------------------------------------------------

IDS = st.integers(1, 4)
FKS = st.one_of(IDS, IDS, IDS, st.none())
NAMES = st.sampled_from(["a", "b", "c", None])
ROWS = {
    CUSTOMERS: st.fixed_dictionaries({"id": IDS, "name": NAMES}),
    ORDERS: st.fixed_dictionaries({"id": IDS, "customer_id": FKS, "note": NAMES}),
    ITEMS: st.fixed_dictionaries({"order_id": IDS, "line_no": st.integers(1, 3), "product_id": FKS,
                                  "qty": st.integers(1, 3)}),
    PRODUCTS: st.fixed_dictionaries({"id": IDS, "name": NAMES, "category_id": FKS}),
    CATEGORIES: st.fixed_dictionaries({"id": IDS, "name": NAMES}),
}


def table_ops(table: str) -> st.SearchStrategy[tuple]:
    """Upserts (a new customer, a fk set to null...), deletes and key changes of ``table``. An item's
    order is part of its key: moving it to another order is a key change."""
    key = ROWS[table].map(lambda row: tuple(row[c] for c in KEYS[table]))
    upsert = ROWS[table].map(lambda row: ("upsert", table, row))
    return st.one_of(upsert, upsert, upsert,
                     key.map(lambda k: ("delete", table, k)),
                     st.tuples(key, key).map(lambda pair: ("rekey", table, *pair)))


OPS = st.lists(st.one_of(*(table_ops(table) for table in TABLES)), min_size=1, max_size=45)
ITEM_KEYS = [(order_id, line_no) for order_id in range(1, 5) for line_no in range(1, 4)]


@st.composite
def populated(draw) -> list[tuple]:
    """Inserts that fill the key space (every customer, order, product and category, some items),
    in any order: documents with something in every node for the random changes to work on."""
    inserts = [("upsert", table, draw(ROWS[table].map(lambda row, i=i: {**row, "id": i})))
               for table in (CUSTOMERS, ORDERS, PRODUCTS, CATEGORIES) for i in range(1, 5)]
    for order_id, line_no in draw(st.sets(st.sampled_from(ITEM_KEYS), max_size=8)):
        row = draw(ROWS[ITEMS])
        inserts.append(("upsert", ITEMS, {**row, "order_id": order_id, "line_no": line_no}))
    return draw(st.permutations(inserts))


# A history: from nothing, or from a filled key space, then the random changes.
HISTORIES = st.tuples(st.one_of(st.just([]), populated()), OPS).map(lambda pair: pair[0] + pair[1])
# After a batch: flushed; a crash before the flush (the runtime then delivers the batch again); a
# crash after the target took the documents, before the outbox knew; a restart after the flush.
FATES = st.sampled_from(["flush"] * 5 + ["crash before flush", "crash in write", "restart"])


def deliver(data: st.DataObject, source: Source) -> list[list[SinkEvent]]:
    """The topics' events interleaved in any order that keeps each topic's own, cut into batches."""
    events = source.all_events()
    queues = {name: deque(stream) for name, stream in source.events.items()}
    order = data.draw(st.permutations([e.topic for e in events]), label="interleaving")
    cuts = data.draw(st.lists(st.booleans(), min_size=len(events), max_size=len(events)), label="cuts")
    batches: list[list[SinkEvent]] = [[]]
    for name, cut in zip(order, cuts):
        batches[-1].append(queues[name].popleft())
        if cut:
            batches.append([])
    return [batch for batch in batches if batch]


@settings(max_examples=60, deadline=None)
@given(ops=HISTORIES, data=st.data())
def test_documents_are_the_join_of_the_final_rows(tmp_path_factory, ops, data):
    source = Source()
    for op in ops:
        source.run(op)
    batches = deliver(data, source)
    sink = make_sink(tmp_path_factory.mktemp("documents"))
    try:
        for index, batch in enumerate(batches):
            fate = data.draw(FATES, label=f"fate of batch {index}")
            if fate == "crash before flush":
                sink.engine.apply(batch)
                sink.restart()
                pending = sink.state.outbox()
                assert sink.engine.apply(batch) == 0, "the batch delivered again reached documents"
                assert sink.state.outbox() == pending
                continue  # the outbox waits for the next flush
            if fate == "crash in write":
                sink.engine.apply(batch)
                sink.crash_in_write()
                sink.engine.flush(sink.target.write)  # at the start: the outbox left behind
            else:
                sink.batch(batch)
                if fate == "restart":
                    sink.restart()
            assert sink.state.outbox() == []
            replay = data.draw(st.none() | st.integers(0, index), label="replay")
            if replay is not None:
                documents = dict(sink.target.docs)
                assert sink.batch(batches[replay]) == 0, f"replaying batch {replay} reached documents"
                assert sink.target.docs == documents and sink.state.outbox() == []
        sink.engine.flush(sink.target.write)
        assert sink.state.outbox() == []

        for order_id in range(1, 5):
            want = joined(source.rows, order_id)
            written, body = sink.target.body(order_id)
            if want is None:
                assert body is None, f"order {order_id} is deleted in the source, its document is not"
            else:
                assert written, f"order {order_id}: its document was never written"
                assert body == want, f"order {order_id}"
        for doc_id, versions in sink.target.accepted.items():
            assert versions == sorted(set(versions)), f"{doc_id}: versions went back: {versions}"
        assert_sql_is_python(sink.state)
        for w, stored in sink.target.refused:  # only re-sends after a crash in write, never a stale document
            assert w.version == stored, f"{w}: older than the stored version {stored}"
    finally:
        sink.state.close()


@settings(max_examples=60, deadline=None)
@given(ops=HISTORIES, data=st.data())
def test_a_generation_loaded_then_assembled_once_is_the_join_too(tmp_path_factory, ops, data):
    """A rebuild's state (``set_building``): the batches up to the topics' ends as the rebuild
    began are stored without reaching anything, with restarts and replays between them; at the
    switch every document is assembled once; the changes after it go the usual way."""
    source = Source()
    for op in ops:
        source.run(op)
    batches = deliver(data, source)
    cut = data.draw(st.integers(0, len(batches)), label="batches loaded before the switch")
    sink = make_sink(tmp_path_factory.mktemp("documents"))
    try:
        sink.state.set_building()
        sink.restart()  # an engine over a building state: it knows
        for index, batch in enumerate(batches[:cut]):
            assert sink.batch(batch) == 0, "a building state reached documents"
            fate = data.draw(st.sampled_from(["go on", "restart", "replay"]), label=f"after load {index}")
            if fate == "restart":
                sink.restart()
            elif fate == "replay":
                assert sink.batch(batches[data.draw(st.integers(0, index), label="replayed")]) == 0
        assert sink.target.docs == {} and sink.state.outbox() == []
        written = sink.engine.finish_building()
        assert written == sum(1 for pk in range(1, 5) if rows_after(source, batches[:cut], pk))
        sink.engine.flush(sink.target.write, chunk=2)  # pages of two: every page written
        for batch in batches[cut:]:
            sink.batch(batch)
        for order_id in range(1, 5):
            want = joined(source.rows, order_id)
            body = sink.target.body(order_id)[1]
            assert body == want, f"order {order_id}"
        for doc_id, versions in sink.target.accepted.items():
            assert versions == sorted(set(versions)), f"{doc_id}: versions went back: {versions}"
        assert sink.state.outbox() == [] and not sink.state.building()
        assert_sql_is_python(sink.state)
    finally:
        sink.state.close()


def rows_after(source: Source, batches: list[list[SinkEvent]], order_id: int) -> bool:
    """Whether order ``order_id`` lives after the orders events in ``batches``."""
    last = None
    for event in sorted((e for batch in batches for e in batch if e.topic == topic(ORDERS)), key=lambda e: e.version):
        if event.key == {"id": order_id}:
            last = event
    return last is not None and last.op is not Op.DELETE


def test_a_load_replayed_after_a_delete_keeps_the_delete(tmp_path):
    """The statement's own guard: a replayed older create never brings a deleted row back."""
    source = Source()
    shop(source)
    created = source.all_events()
    source.delete(ORDERS, (1,))
    source.upsert(ITEMS, {"order_id": 1, "line_no": 1, "product_id": None, "qty": 5})
    later = source.all_events()[len(created):]
    sink = make_sink(tmp_path)
    sink.state.set_building()
    sink.restart()
    for batch in (created, later, created):
        sink.batch(batch)
    assert sink.engine.counters["rows_stored"] == len(created) + len(later)  # the replay stored nothing
    assert sink.engine.finish_building() == 0
    sink.engine.flush(sink.target.write)
    assert sink.target.docs == {}
    sink.state.close()


def test_a_building_state_walks_to_no_document(tmp_path, monkeypatch):
    """Truncates, tombstones without a version and unchanged large values take the one-at-a-time
    path while building too, but reach nothing: no walk (its indexes are made at the end)."""
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    sink.state.set_building()
    sink.restart()
    walks: list[str] = []
    documents_of = State.documents_of
    monkeypatch.setattr(State, "documents_of", lambda self, table, row: walks.append(table) or
                        documents_of(self, table, row))
    sink.batch(source.all_events())
    sink.batch([SinkEvent(topic(ORDERS), 0, 5, {"id": 1}, Op.UPDATE, None, {"id": 1, "customer_id": 1}, 90,
                          {"unchanged_toast": ["note"]}),
                SinkEvent(topic(CUSTOMERS), 0, 5, {"id": 1}, Op.DELETE, None, None, None, {}),
                SinkEvent(topic(ITEMS), 0, 9, {}, Op.TRUNCATE, None, None, 95, {})])
    assert walks == []
    assert sink.engine.finish_building() == 1
    sink.engine.flush(sink.target.write)
    want = {**joined(source.rows, 1), "customer": None, "items": []}
    assert sink.target.body(1) == (True, want)
    sink.state.close()


def test_a_loaded_document_too_large_names_its_root_rows_record(tmp_path):
    source = Source()
    shop(source)
    source.upsert(ORDERS, {"id": 2, "customer_id": 1, "note": "x" * 400})
    letters: list[tuple] = []
    state = State(documents_path(tmp_path, "search", 1), PLAN)
    state.set_building()
    engine = Engine(PLAN, state, 350, dead_letter=lambda topic, part, off, reason, key=None:
                    letters.append((topic, part, off, reason)))
    events = source.all_events()
    engine.apply(events)
    assert engine.finish_building() == 2
    target = Target()
    engine.flush(target.write)
    record = [e for e in events if e.topic == topic(ORDERS) and e.key == {"id": 2}][-1]
    assert [letter[:3] for letter in letters] == [(topic(ORDERS), 0, record.offset)]
    assert "more than max_document_bytes 350" in letters[0][3]
    assert target.body(2) == (True, None) and target.body(1) == (True, joined(source.rows, 1))
    state.close()


# --- examples ----------------------------------------------------------------------------------------

def shop(source: Source) -> None:
    source.upsert(CATEGORIES, {"id": 1, "name": "tools"})
    source.upsert(PRODUCTS, {"id": 1, "name": "hammer", "category_id": 1})
    source.upsert(PRODUCTS, {"id": 2, "name": "nails", "category_id": None})
    source.upsert(CUSTOMERS, {"id": 1, "name": "ann"})
    source.upsert(ORDERS, {"id": 1, "customer_id": 1, "note": "asap"})
    source.upsert(ITEMS, {"order_id": 1, "line_no": 2, "product_id": 2, "qty": 100})
    source.upsert(ITEMS, {"order_id": 1, "line_no": 1, "product_id": 1, "qty": 1})


def test_a_document_joins_its_rows(tmp_path):
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    assert sink.batch(source.all_events()) == 1
    assert sink.target.docs == {("orders", b'{"id":1}'): (7, {
        "id": 1, "customer_id": 1, "note": "asap",
        "customer": {"id": 1, "name": "ann"},
        "items": [
            {"line_no": 1, "product_id": 1, "qty": 1,
             "product": {"id": 1, "name": "hammer", "category_id": 1, "category": {"id": 1, "name": "tools"}}},
            {"line_no": 2, "product_id": 2, "qty": 100,
             "product": {"id": 2, "name": "nails", "category_id": None, "category": None}},
        ]})}
    assert sink.target.body(1)[1] == joined(source.rows, 1)


def test_rows_arriving_before_what_they_hang_from(tmp_path):
    source = Source()
    shop(source)
    source.upsert(PRODUCTS, {"id": 2, "name": "nails", "category_id": 2})
    source.upsert(CATEGORIES, {"id": 2, "name": "small parts"})
    sink = make_sink(tmp_path)
    by_topic = source.events
    # the lookups' changes come first, then the items (nothing to reach yet), the order last
    for name in (CATEGORIES, PRODUCTS, CUSTOMERS, ITEMS):
        sink.batch(by_topic[topic(name)])
    assert sink.target.docs == {}
    sink.batch(by_topic[topic(ORDERS)])
    assert sink.target.body(1) == (True, joined(source.rows, 1))
    assert sink.target.body(1)[1]["items"][1]["product"]["category"] == {"id": 2, "name": "small parts"}


def test_a_change_reaches_the_document_through_every_edge(tmp_path):
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    sink.batch(source.all_events())
    for table, change in ((CATEGORIES, {"id": 1, "name": "hand tools"}),
                          (PRODUCTS, {"id": 1, "name": "claw hammer", "category_id": None}),
                          (CUSTOMERS, {"id": 1, "name": "bob"}),
                          (ORDERS, {"id": 1, "customer_id": None, "note": "asap"}),
                          (ITEMS, {"order_id": 1, "line_no": 3, "product_id": 1, "qty": 5})):
        event = source.upsert(table, change)
        assert sink.batch([event]) == 1
        assert sink.target.docs[("orders", b'{"id":1}')] == (event.version, joined(source.rows, 1))
    event = source.delete(ITEMS, (1, 2))
    assert sink.batch([event]) == 1
    assert [item["line_no"] for item in sink.target.body(1)[1]["items"]] == [1, 3]


def test_a_moved_item_leaves_one_document_for_another(tmp_path):
    source = Source()
    shop(source)
    source.upsert(ORDERS, {"id": 2, "customer_id": None, "note": None})
    sink = make_sink(tmp_path)
    sink.batch(source.all_events())
    source.rekey(ITEMS, (1, 1), (2, 1))
    assert sink.batch(source.all_events()[-2:]) == 2
    for order_id in (1, 2):
        assert sink.target.body(order_id) == (True, joined(source.rows, order_id))
    assert sink.target.body(2)[1]["customer"] is None and len(sink.target.body(2)[1]["items"]) == 1


def test_a_deleted_order_is_written_deleted_at_a_higher_version(tmp_path):
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    sink.batch(source.all_events())
    event = source.delete(ORDERS, (1,))
    assert sink.batch([event]) == 1
    assert sink.target.docs[("orders", b'{"id":1}')] == (event.version, None)
    # its items stay in the state and reach no document until the order is back
    item = source.upsert(ITEMS, {"order_id": 1, "line_no": 1, "product_id": 2, "qty": 2})
    assert sink.batch([item]) == 0
    back = source.upsert(ORDERS, {"id": 1, "customer_id": None, "note": "again"})
    assert sink.batch([back]) == 1
    assert sink.target.docs[("orders", b'{"id":1}')] == (back.version, joined(source.rows, 1))


def test_a_version_rises_above_the_documents_own_when_an_older_row_arrives_later(tmp_path):
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    sink.batch(source.all_events())
    customer = source.upsert(CUSTOMERS, {"id": 1, "name": "anne"})      # version 8, delivered late
    item = source.upsert(ITEMS, {"order_id": 1, "line_no": 1, "product_id": 1, "qty": 9})  # version 9
    sink.batch([item])
    sink.batch([customer])
    assert sink.target.accepted[("orders", b'{"id":1}')] == [7, 9, 10]
    assert sink.target.docs[("orders", b'{"id":1}')] == (10, joined(source.rows, 1))


def test_a_replay_or_an_older_record_changes_nothing(tmp_path):
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    events = source.all_events()
    sink.batch(events)
    before = dict(sink.target.docs)
    assert sink.batch(events) == 0 and sink.batch(events[3:5]) == 0
    older = events[4]._replace(version=1, after={"id": 1, "customer_id": None, "note": "stale"})
    assert sink.batch([older]) == 0
    assert sink.target.docs == before and sink.state.outbox() == []


def test_the_outbox_survives_a_crash_between_apply_and_flush(tmp_path):
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    sink.engine.apply(source.all_events())
    sink.restart()
    assert [(doc, ver) for doc, _, ver, _ in sink.state.outbox()] == [("orders", 7)]
    sink.engine.flush(sink.target.write)
    assert sink.target.docs == {("orders", b'{"id":1}'): (7, joined(source.rows, 1))}
    assert sink.state.outbox() == []


def test_a_crash_after_the_target_took_a_document_rewrites_it_alike(tmp_path):
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    sink.engine.apply(source.all_events())
    sink.crash_in_write()
    assert len(sink.state.outbox()) == 1
    sink.engine.flush(sink.target.write)
    assert [(w.version, w.parsed(), stored) for w, stored in sink.target.refused] == [(7, joined(source.rows, 1), 7)]
    assert sink.state.outbox() == [] and sink.target.accepted == {("orders", b'{"id":1}'): [7]}


# --- what a review found -------------------------------------------------------------------------

def _plan_ordered_by(column: str, column_type: str, descending: bool = False):
    shapes = [*SHAPES[:2], shape(ITEMS, ("order_id", "integer", True), ("line_no", "numeric", True),
                                 ("product_id", "integer"), ("qty", "integer"), (column, column_type)), *SHAPES[3:]]
    declaration = {**DECLARATION, "children": [{**DECLARATION["children"][0],
                                                "order_by": [("-" if descending else "") + column]}]}
    return make_plan([Document.model_validate(declaration)], ["shop.public.*"],
                     CapturedShapes("shop", {f"shop.{s.table}": s for s in shapes}))


def _items(plan, tmp_path, values: list) -> list:
    engine = Engine(plan, State(documents_path(tmp_path, "search", 1), plan), max_bytes=1 << 20)
    events = [SinkEvent(topic(ORDERS), 0, 0, {"id": 1}, Op.CREATE, None, {"id": 1, "customer_id": None,
                                                                          "note": None}, 1, {})]
    for n, (line, value) in enumerate(values):
        events.append(SinkEvent(topic(ITEMS), 0, n, {"order_id": 1, "line_no": line}, Op.CREATE, None,
                                {"order_id": 1, "line_no": line, "product_id": None, "qty": 1, "at": value},
                                2 + n, {}))
    target = Target()
    engine.apply(events)
    engine.flush(target.write)
    return [(item["line_no"], item["at"]) for item in target.body(1)[1]["items"]]


def test_children_sort_as_their_types_order_not_as_the_text_events_carry(tmp_path):
    # Exact numerics arrive as text ("10.00" < "9.50" as text); instants with fewer fraction digits.
    numeric = _plan_ordered_by("at", "numeric(10,2)")
    assert [v for _, v in _items(numeric, tmp_path / "a", [("1", "10.00"), ("2", "9.50"), ("3", None),
                                                             ("4", "-1")])] == ["-1", "9.50", "10.00", None]
    instants = _plan_ordered_by("at", "timestamp with time zone", descending=True)
    assert [v for _, v in _items(instants, tmp_path / "b", [("1", "2026-01-01T00:00:05Z"),
                                                              ("2", "2026-01-01T00:00:05.5Z")])] == \
        ["2026-01-01T00:00:05.5Z", "2026-01-01T00:00:05Z"]
    # Ties, and the default order, by the key as its type orders: line 9 before line 10 (numeric key).
    assert [line for line, _ in _items(numeric, tmp_path / "c", [("10", "1"), ("9", "1")])] == ["9", "10"]
    # A tie of one number spelled two ways (1.0 = 1 in numeric) is a tie too.
    assert [line for line, _ in _items(numeric, tmp_path / "e", [("10", "1.0"), ("9", "1")])] == ["9", "10"]
    # A column whose values changed kind (an ALTER TYPE) orders by kind instead of failing.
    assert [v for _, v in _items(_plan_ordered_by("at", "text"), tmp_path / "d", [("1", "b"), ("2", 3)])] == [3, "b"]


def test_a_document_that_cannot_be_assembled_is_set_aside_alone(tmp_path, monkeypatch):
    source = Source()
    shop(source)
    source.upsert(ORDERS, {"id": 2, "customer_id": 1, "note": "two"})
    letters: list[str] = []
    state = State(documents_path(tmp_path, "search", 1), PLAN)
    engine = Engine(PLAN, state, 1 << 20, dead_letter=lambda topic, part, off, reason, key=None: letters.append(reason))
    assemble = State.assemble

    def broken(self, doc, doc_id):
        if doc_id == b"[1]":
            raise TypeError("an unorderable value")
        return assemble(self, doc, doc_id)

    monkeypatch.setattr(State, "assemble", broken)
    monkeypatch.setattr(State, "sql_of", lambda self, doc: None)  # the Python assembly: it can fail alone
    target = Target()
    engine.apply(source.all_events())
    engine.flush(target.write)
    assert target.body(2) == (True, joined(source.rows, 2)) and target.body(1) == (False, None)
    assert len(letters) == 1 and "orders/[1] could not be assembled (TypeError" in letters[0]
    assert state.outbox() == []  # not stuck: the next flush writes the others


def test_an_unchanged_large_value_keeps_the_value_the_state_has(tmp_path):
    sink = make_sink(tmp_path)
    sink.batch([SinkEvent(topic(ORDERS), 0, 0, {"id": 1}, Op.CREATE, None,
                          {"id": 1, "customer_id": None, "note": "x" * 5000}, 1, {})])
    sink.batch([SinkEvent(topic(ORDERS), 0, 1, {"id": 1}, Op.UPDATE, None, {"id": 1, "customer_id": 7}, 2,
                          {"unchanged_toast": ["note"]})])
    assert sink.target.body(1)[1]["note"] == "x" * 5000 and sink.target.body(1)[1]["customer_id"] == 7


def test_a_truncate_without_a_version_empties_the_table_in_the_documents(tmp_path):
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    sink.batch(source.all_events())
    sink.batch([SinkEvent(topic(ITEMS), 0, 9, {}, Op.TRUNCATE, None, None, None, {})])
    assert sink.target.body(1)[1]["items"] == []


def test_a_lookup_changed_many_times_in_a_batch_is_walked_once_per_state(tmp_path, monkeypatch):
    source = Source()
    shop(source)
    for order in range(2, 40):
        source.upsert(ORDERS, {"id": order, "customer_id": 1, "note": None})
    sink = make_sink(tmp_path)
    sink.batch(source.all_events())
    walks = []
    documents_of = State.documents_of
    monkeypatch.setattr(State, "documents_of", lambda self, table, row: walks.append(table) or
                        documents_of(self, table, row))
    changes = [source.upsert(CUSTOMERS, {"id": 1, "name": f"ann {n}"}) for n in range(50)]
    assert sink.batch(changes) == 39  # every order of the customer, once
    assert walks == [CUSTOMERS, CUSTOMERS]  # before the batch and after it, not per change
    assert sink.target.body(39)[1]["customer"] == {"id": 1, "name": "ann 49"}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.tuples(JSON_VALUES, JSON_VALUES), min_size=1, max_size=6), descending=st.booleans())
def test_the_sql_assembly_makes_the_python_bytes_whatever_the_values(tmp_path_factory, values, descending):
    """Any JSON a row carries (escapes, unicode, floats, nested values) comes out of the SQL
    assembly byte for byte as out of the Python one; children ordered by a text column (code
    points, nulls last, ties by key) in the same order; a renamed field, a lookup's include."""
    shapes = [shape(ORDERS, ("id", "integer", True), ("customer_id", "integer"), ("note", "text")),
              shape(CUSTOMERS, ("id", "integer", True), ("name", "text")),
              shape(ITEMS, ("order_id", "integer", True), ("line_no", "integer", True), ("label", "text"),
                    ("extra", "jsonb"))]
    declaration = {"name": "orders", "table": ORDERS, "rename": {"note": "it's \"noted\""},
                   "lookups": [{"table": CUSTOMERS, "as": "customer", "foreign_key": ["customer_id"],
                                "include": ["name"]}],
                   "children": [{"table": ITEMS, "as": "items", "foreign_key": ["order_id"],
                                 "order_by": [("-" if descending else "") + "label"]}]}
    plan = make_plan([Document.model_validate(declaration)], ["shop.public.*"],
                     CapturedShapes("shop", {f"shop.{s.table}": s for s in shapes}))
    state = State(documents_path(tmp_path_factory.mktemp("sql"), "search", 1), plan)
    try:
        engine = Engine(plan, state, max_bytes=1 << 30)
        labels = [v if isinstance(v, str) or v is None else None for v, _ in values]
        events = [SinkEvent(topic(CUSTOMERS), 0, 0, {"id": 1}, Op.CREATE, None, {"id": 1, "name": values[0][1]}, 1, {}),
                  SinkEvent(topic(ORDERS), 0, 0, {"id": 1}, Op.CREATE, None,
                            {"id": 1, "customer_id": 1, "note": values[0][0]}, 2, {})]
        for n, ((_, extra), label) in enumerate(zip(values, labels)):
            events.append(SinkEvent(topic(ITEMS), 0, n, {"order_id": 1, "line_no": n % 3}, Op.CREATE, None,
                                    {"order_id": 1, "line_no": n % 3, "label": label, "extra": extra}, 3 + n, {}))
        engine.apply(events)
        assert state.sql_of("orders") is not None
        with state.reading():
            built = state.assembled([("orders", b"[1]")])[("orders", b"[1]")]
            assert built is not None and built == state.assemble("orders", b"[1]")
        document = orjson.loads(built)
        assert list(document) == ["id", "customer_id", "it's \"noted\"", "customer", "items"]
        assert document["customer"] == {"name": values[0][1]}
        kept = {n % 3: label for n, label in enumerate(labels)}  # a later line of one key replaced the earlier
        present = sorted((label, line) for line, label in kept.items() if label is not None)
        want = [line for _, line in (sorted(present, key=lambda p: p[0], reverse=True) if descending else present)]
        assert [item["line_no"] for item in document["items"]] == want + sorted(k for k, v in kept.items() if v is None)
    finally:
        state.close()


def test_a_submitted_write_is_not_sent_again_while_in_flight_and_a_failed_one_stays_in_the_outbox(tmp_path):
    """Engine.submit (the OpenSearch document sink's writes in flight): the next batch's flush
    skips documents whose write is in flight; a write that fails when waited for leaves them in
    the outbox, and the next flush writes them."""
    source = Source()
    shop(source)
    sink = make_sink(tmp_path)
    held: list[list[Written]] = []

    def later(written: list[Written]):
        held.append(written)
        return lambda: sink.target.write(written)
    sink.engine.apply(source.all_events())
    first = sink.engine.submit(later)
    assert first is not None and len(held) == 1 and sink.target.docs == {}
    sink.engine.apply([source.upsert(CUSTOMERS, {"id": 2, "name": "bob"})])  # reaches no document
    assert sink.engine.submit(later) is None and len(held) == 1  # order 1 is in flight: not sent twice
    first()
    assert sink.state.outbox() == [] and sink.target.body(1)[1] == joined(source.rows, 1)

    sink.engine.apply([source.upsert(ORDERS, {"id": 1, "customer_id": 2, "note": "moved"})])

    def failing(written: list[Written]):
        def end():
            raise RetriableError("the node went away")
        return end
    broken = sink.engine.submit(failing)
    assert broken is not None
    with pytest.raises(RetriableError):
        broken()
    assert len(sink.state.outbox()) == 1
    sink.engine.flush(sink.target.write)
    assert sink.state.outbox() == [] and sink.target.body(1)[1] == joined(source.rows, 1)
    sink.state.close()
