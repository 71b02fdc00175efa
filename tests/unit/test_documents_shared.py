"""Members of a document sink's group (sinks/documents/shared.py): each reads every record into a
state of its own and writes the documents of the shares it owns; shares move between members as
the runtime hands them over (cdc/runtime/sink_shares.py): a share lost stops being written at
once, a share gained is handed to its new owner only once that member has read up to the log's
end as of the gain.

The property: whatever the history, the members' paces, the moves and the crashes, the target
ends equal to the join, no version carries two contents (the target checks it at every write),
and a reader never sees a document's version go back or a content older than it saw before.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.api import RebuildRequired
from sinks.documents.engine import Engine, Written
from sinks.documents.keeper import Keeper
from sinks.documents.state import State, documents_path, share_of
from tests.unit.test_documents_engine import HISTORIES, KEYS, PLAN, TABLES, Source, Target, deliver, joined
from tests.unit.test_documents_follow_shapes import ORDERS, Shapes, event, keeper, record

SHARES = 3


class Member:
    """One process of the group: a state, an engine, how many batches it applied (``at``), and
    the shares whose hand-over waits for it to reach a batch count."""

    def __init__(self, path, target: Target, watcher: Watcher | None = None) -> None:
        self.path, self.target, self.watcher = path, target, watcher
        self.at, self.waiting = 0, {}
        self._open()

    def _open(self) -> None:
        self.state = State(self.path, PLAN, SHARES)
        self.engine = Engine(PLAN, self.state, max_bytes=1 << 20, seed=self._held)
        self.engine.own(frozenset(), 1)
        self.at = self._applied()

    def _applied(self) -> int:
        """Batches are numbered by the offset past them on topic "log" (the state's offsets)."""
        return self.state.offsets().get(("log", 0), 0)

    def _held(self, generation: int, docs: list[tuple[str, dict[str, Any]]]) -> list[int | None]:
        found = [self.target.docs.get((doc, orjson.dumps(key, option=orjson.OPT_SORT_KEYS))) for doc, key in docs]
        return [None if f is None else f[0] for f in found]

    def apply(self, batch: list) -> None:
        self.engine.apply(batch)
        self.engine.state.advance({("log", 0): self.at + 1})  # committed with nothing else: a next batch
        self.at += 1
        self.flush()

    def flush(self) -> None:
        if self.watcher is not None:
            self.watcher.writer_at = self.at
        self.engine.flush(self.target.write)

    def owned(self) -> frozenset[int]:
        """The shares the runtime gave it: written, or being drained first."""
        assert self.engine.owned is not None
        return self.engine.owned | self.engine.draining

    def give(self, shares: frozenset[int]) -> None:
        self.engine.own(shares, 1)
        self.drain()

    def drain(self, most: int = 1) -> bool:
        """A slice of what waits in the shares gained (the runtime calls again while True)."""
        if self.watcher is not None:
            self.watcher.writer_at = self.at
        return self.engine.drain(self.target.write, most)

    def crash(self) -> None:
        self.state.close()
        self.waiting = {}
        self._open()


class Watcher:
    """A reader of the target: a document's content never goes back in the history. A member
    writes a document as the join after the first ``at`` batches (``join(at, order)``); a write
    the target takes must show a content the history reaches at or after the one seen before."""

    def __init__(self, target: Target, join) -> None:
        self.target, self.join = target, join
        self.writer_at = 0  # the batches applied by the member writing now
        self.low: dict[int, int] = {}  # order id -> the earliest batch count its visible content fits
        self.problems: list[str] = []
        self.taken = 0
        write = target.write

        def watched(written: list[Written]) -> list[tuple[Written, str]]:
            before = {doc_id: len(v) for doc_id, v in target.accepted.items()}
            out = write(written)
            for doc_id, versions in target.accepted.items():
                if len(versions) > before.get(doc_id, 0):
                    self._taken(orjson.loads(doc_id[1])["id"], target.docs[doc_id][1])
            return out
        target.write = watched  # type: ignore[method-assign]

    def _taken(self, order: int, body: Any) -> None:
        self.taken += 1
        low = self.low.get(order, 0)
        at = self.writer_at
        assert self.join(at, order) == body, f"order {order}: not the join after {at} batches"
        if at < low:  # as old as something seen before: only if the history still shows it then
            at = next((k for k in range(low, len(self.join.cache)) if self.join(k, order) == body), -1)
            if at < 0:
                self.problems.append(f"order {order}: content of batch {self.writer_at} after batch {low}")
                return
        self.low[order] = at


class Join:
    """``join(k, order)``: the document of ``order`` after the first ``k`` batches (each key's
    newest version among them, as the state keeps it)."""

    def __init__(self, batches: list[list]) -> None:
        rows: dict[str, dict[tuple, tuple[int, dict | None]]] = {}
        self.cache: list[dict[str, dict[tuple, dict[str, Any]]]] = [{table: {} for table in TABLES}]
        for batch in batches:
            for change in batch:
                table = change.topic.split(".", 1)[1]
                key = tuple(change.key[c] for c in KEYS[table])
                was = rows.setdefault(table, {}).get(key)
                if was is None or change.version > was[0]:
                    rows[table][key] = (change.version, None if change.after is None else dict(change.after))
            self.cache.append({table: {k: r for k, (_, r) in rows.get(table, {}).items() if r is not None}
                               for table in TABLES})

    def __call__(self, k: int, order: int) -> Any:
        return joined(self.cache[k], order)


# Member 0 is picked more often than member 1, so one runs ahead of the other when shares move.
STEPS = st.lists(st.tuples(st.sampled_from(["publish"] * 3 + ["advance"] * 4 + ["move"] * 3 + ["crash"]),
                           st.sampled_from([0, 0, 1]), st.integers(0, SHARES - 1)), min_size=10, max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=HISTORIES, data=st.data(), steps=STEPS)
def test_two_members_moving_shares_and_crashing_end_equal_to_the_join(tmp_path_factory, ops, data, steps):
    source = Source()
    for op in ops:
        source.run(op)
    batches = deliver(data, source)
    directory = tmp_path_factory.mktemp("shared")
    target = Target()
    watcher = Watcher(target, Join(batches))
    members = [Member(documents_path(directory, f"search.m{i}", 1), target, watcher) for i in range(2)]
    published = 0

    def settle() -> None:
        """The runtime's side: a share gained goes to its member once it applied up to the ends
        noted at the gain; what waits in it is written a slice per turn."""
        for member in members:
            member.drain()
            ready = {share for share, ends in member.waiting.items() if member.at >= ends}
            if ready:
                for share in ready:
                    del member.waiting[share]
                member.give(member.owned() | ready)

    def gain(member: Member, shares: set[int]) -> None:
        for share in shares:
            member.waiting[share] = published

    def owner(share: int) -> Member | None:
        return next((m for m in members if share in m.owned() or share in m.waiting), None)

    gain(members[0], set(range(SHARES)))
    try:
        for kind, who, share in steps:
            member, other = members[who], members[1 - who]
            if kind == "publish":
                published = min(published + 1, len(batches))
            elif kind == "advance" and member.at < published:
                member.apply(batches[member.at])
            elif kind == "move" and owner(share) is other:
                other.waiting.pop(share, None)
                if share in other.owned():
                    other.give(other.owned() - {share})  # revoked: nothing of it written from here
                gain(member, {share})
            elif kind == "crash":
                lost = set(member.owned()) | set(member.waiting)
                member.crash()
                gain(other, lost)  # the coordinator gives them away after the session timeout
            settle()
        # The end: everything published, every member catches up, every share owned.
        published = len(batches)
        for share in range(SHARES):
            if owner(share) is None:
                gain(members[0], {share})
        for member in members:
            while member.at < published:
                member.apply(batches[member.at])
        settle()
        for member in members:
            while member.drain():
                pass
            member.flush()
        assert sorted(s for m in members for s in m.owned()) == list(range(SHARES))
        for order_id in range(1, 5):
            want = joined(source.rows, order_id)
            written, body = target.body(order_id)
            if want is None:
                assert body is None, f"order {order_id} is deleted in the source, its document is not"
            else:
                assert written and body == want, f"order {order_id}: {body} != {want}"
        assert not watcher.problems, watcher.problems[:3]
        # Each member's outbox keeps only documents of shares it does not own.
        for member in members:
            assert all(share_of(doc, doc_id, SHARES) not in member.owned()
                       for doc, doc_id, _, _ in member.state.outbox())
    finally:
        for member in members:
            member.state.close()


def test_a_share_is_the_same_in_every_member_and_spreads_the_documents():
    ids = [orjson.dumps([n]) for n in range(3000)]
    counts = [0] * 8
    for doc_id in ids:
        counts[share_of("orders", doc_id, 8)] += 1
    assert min(counts) > 3000 / 8 * 0.8, counts
    assert share_of("orders", ids[7], 8) == share_of("orders", bytes(ids[7]), 8)
    assert share_of("orders", ids[7], 1) == 0


def test_the_outbox_of_a_member_holds_what_it_does_not_own_until_it_does(tmp_path):
    source = Source()
    for order_id in range(1, 9):
        source.upsert("public.orders", {"id": order_id, "customer_id": None, "note": "n"})
    target = Target()
    member = Member(documents_path(tmp_path, "search.m0", 1), target)
    mine = share_of("orders", orjson.dumps([1]), SHARES)
    member.give(frozenset({mine}))
    member.apply(source.all_events())
    written = {orjson.loads(doc_id)["id"] for _, doc_id in target.docs}
    assert written and all(share_of("orders", orjson.dumps([n]), SHARES) == mine for n in written)
    kept = {orjson.loads(doc_id)[0] for _, doc_id, _, _ in member.state.outbox()}
    assert kept == set(range(1, 9)) - written
    member.give(frozenset(range(SHARES)))
    while member.drain():
        pass
    assert {orjson.loads(doc_id)["id"] for _, doc_id in target.docs} == set(range(1, 9))
    assert member.state.outbox() == []
    member.state.close()


def test_a_member_keeps_a_state_of_its_own_and_reads_from_its_offsets(tmp_path):
    records = [record(1, ORDERS)]
    config = keeper(tmp_path, records).config.model_copy(update={"scale_out": "group", "member": "host-1"})
    context = Shapes(name="docs", topic_prefix="shop", records=records)
    k = Keeper("docs", config, lambda: context, lambda generation, docs: [None] * len(docs))
    assert k.path(1).name == "docs.host-1.g1.db"
    assert k.read_from(1, [("shop.public.orders", 0)]) == {("shop.public.orders", 0): 0}
    engine = k.engine_for(1, 1)
    engine.apply([event(1, {"id": 1, "note": "a"})._replace(offset=41)])
    assert k.read_from(1, [("shop.public.orders", 0), ("shop.public.orders", 1)]) == \
        {("shop.public.orders", 0): 42, ("shop.public.orders", 1): 0}
    assert engine.owned == frozenset()  # nothing written until the runtime hands it shares
    k.close()


def test_one_process_after_members_of_a_group_rebuilds_and_a_dropped_generation_takes_their_states(tmp_path):
    records = [record(1, ORDERS)]
    single = keeper(tmp_path, records)
    member = Keeper("docs", single.config.model_copy(update={"scale_out": "group", "member": "host-1"}),
                    single.context, lambda generation, docs: [None] * len(docs))
    member.engine_for(1, 1)
    member.close()
    with pytest.raises(RebuildRequired, match="members of a group kept generation 1"):
        single.engine_for(1, 1)
    single.opened(2)
    single.engine_for(2, 1)  # the rebuild's generation: no member kept it
    single.dropped(1)
    assert not (tmp_path / "docs.host-1.g1.db").exists()
    single.close()
