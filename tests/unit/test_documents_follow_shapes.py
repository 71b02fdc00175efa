"""A document sink meeting a newer shape of a joined table (sinks/documents/keeper.py,
``Keeper.follow_shapes``), per ``schema_policy``: a change of what a node shows rebuilds, fails,
evolves the plan in place, or is ignored; a change no node shows is nothing. The schema records
come from a stand-in for the runtime's schema topic (pure logic: no server)."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
import pytest

from cdc.api import Op, RebuildRequired, SchemaChangeError, SinkEvent
from cdc.api.context import StandaloneSinkContext
from sinks.documents.keeper import Keeper
from sinks.opensearch.config import OpenSearchSinkConfig

ORDERS = {"id": ("integer", True), "note": ("text", False)}


def record(version: int, columns: dict[str, tuple[str, bool]], renamed: dict[str, str] | None = None) -> dict:
    return {"source": "shop", "db": "shop", "schema": "public", "table": "orders", "version": version,
            "columns": [{"name": n, "type": t, "key": k, **({"renamed_from": (renamed or {})[n]}
                                                             if n in (renamed or {}) else {})}
                        for n, (t, k) in columns.items()]}


@dataclass(frozen=True)
class Shapes(StandaloneSinkContext):
    records: list[dict] = field(default_factory=list)

    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        return self.records[-1] if version is None else next(r for r in self.records if r["version"] == version)

    def shapes_between(self, topic: str, after: int, before: int) -> list[dict]:
        return [r for r in self.records if after < r["version"] < before]


def keeper(tmp_path, records: list[dict], exclude: list[str] | None = None, policy: str = "rebuild") -> Keeper:
    config = OpenSearchSinkConfig.model_validate(
        {"name": "docs", "type": "opensearch", "hosts": ["http://127.0.0.1:1"], "topics": ["shop.public.*"],
         "schema_policy": policy,
         "state_dir": str(tmp_path), "documents": [{"name": "orders", "table": "public.orders",
                                                     "exclude": exclude or []}]})
    context = Shapes(name="docs", topic_prefix="shop", records=records)
    return Keeper("docs", config, lambda: context, lambda generation, docs: [None] * len(docs))


def event(version: int, row: dict) -> SinkEvent:
    return SinkEvent("shop.public.orders", 0, 0, {"id": row["id"]}, Op.UPDATE, None, row, 10,
                     {"schema_version": version, "table": "orders"})


def shape_of(k: Keeper):
    return lambda e: k.context().schema_for(e.topic, e.source["schema_version"])


def test_a_renamed_column_rebuilds_fails_or_evolves_as_the_policy_says(tmp_path):
    later = record(2, {"id": ("integer", True), "remark": ("text", False)}, {"remark": "note"})
    for policy, raised in (("rebuild", RebuildRequired), ("fail", SchemaChangeError)):
        records = [record(1, ORDERS)]
        k = keeper(tmp_path / policy, records)
        k.make_plan()
        records.append(later)  # published after the plan was made
        with pytest.raises(raised, match=r"orders changed in schema version 2 \(remark added \(renamed from note\)\)"):
            k.follow_shapes([event(2, {"id": 1, "remark": "x"})], shape_of(k), policy)
    records = [record(1, ORDERS)]
    k = keeper(tmp_path / "evolve", records)
    engine = k.engine_for(1, 1)
    # Stored in the old shape, whose columns its body has: plain until the plan's columns change.
    engine.apply([SinkEvent("shop.public.orders", 0, 2, {"id": 3}, Op.CREATE, None, {"id": 3, "note": "before"}, 9, {})])
    records.append(later)
    k.follow_shapes([event(2, {"id": 1, "remark": "x"})], shape_of(k), "evolve")
    assert engine.plan.tables["public.orders"].columns == ("id", "remark")
    assert engine.plan.tables["public.orders"].earlier == {"remark": ("note",)}
    assert orjson.loads(engine.state._build(engine.plan.nodes[0], {"id": 1, "note": "old row"}, b"[1]")) == \
        {"id": 1, "remark": "old row"}  # a row of the old shape shows its value under the new name
    engine.apply([event(1, {"id": 1, "note": "old row"}),  # stored: the SQL assembly says the same
                  SinkEvent("shop.public.orders", 0, 1, {"id": 2}, Op.CREATE, None, {"id": 2, "remark": "new"}, 11, {})])
    with engine.state.reading():
        built = engine.state.assembled([("orders", b"[1]"), ("orders", b"[2]"), ("orders", b"[3]")])
        assert built == {doc: engine.state.assemble(*doc) for doc in built}
    assert [orjson.loads(body or b"") for body in built.values()] == [{"id": 1, "remark": "old row"},
                                                                     {"id": 2, "remark": "new"},
                                                                     {"id": 3, "remark": "before"}]
    k.close()


def test_an_ignored_change_keeps_the_shape_and_is_said_once(tmp_path, caplog):
    records = [record(1, ORDERS)]
    k = keeper(tmp_path, records)
    engine = k.engine_for(1, 1)
    records.append(record(2, {"id": ("integer", True), "note": ("text", False), "tier": ("text", False)}))
    for _ in range(2):
        k.follow_shapes([event(2, {"id": 1, "note": "n", "tier": "gold"})], shape_of(k), "ignore")
    assert [r.getMessage().count("tier added") for r in caplog.records] == [1]
    assert orjson.loads(engine.state._build(engine.plan.nodes[0], {"id": 1, "note": "n", "tier": "gold"}, b"[1]")) == \
        {"id": 1, "note": "n"}
    k.close()


def test_a_change_no_document_shows_is_nothing(tmp_path):
    records = [record(1, {**ORDERS, "secret": ("text", False)})]
    k = keeper(tmp_path, records, exclude=["secret"])
    k.make_plan()
    records.append(record(2, {**ORDERS, "secret": ("bytea", False)}))
    asked = []
    for _ in range(3):  # nothing raised, and the shape is read once, not per batch
        k.follow_shapes([event(2, {"id": 1, "note": "n", "secret": "AA=="})],
                        lambda e: asked.append(e) or shape_of(k)(e), "fail")
    assert len(asked) == 1


def test_a_joined_table_whose_topic_is_not_made_yet_counts_as_empty(tmp_path):
    """The first write of a new sink whose lookup's topic does not exist yet (its source has not
    published a row of it): the first build is asked for, from the topics that exist, instead of
    the write failing (which would set every event of the batch aside)."""
    from cdc.log.base import TopicSettings
    from cdc.log.embedded import EmbeddedLog
    from cdc.serde import Record

    log = EmbeddedLog(tmp_path / "log", fsync=False)
    log.ensure_topic("shop.public.orders", TopicSettings(partitions=1))
    writer = log.writer()
    writer.publish([Record("shop.public.orders", b'{"id":1}', b'{}')])
    writer.flush(10)
    writer.close()
    config = OpenSearchSinkConfig.model_validate(
        {"name": "docs", "type": "opensearch", "hosts": ["http://127.0.0.1:1"], "topics": ["shop.public.*"],
         "state_dir": str(tmp_path / "state"), "documents": [{
             "name": "orders", "table": "public.orders",
             "lookups": [{"table": "public.customers", "as": "customer", "foreign_key": ["customer_id"]}]}]})
    customers = {**record(1, {"id": ("integer", True), "name": ("text", False)}), "table": "customers"}
    orders = record(1, {**ORDERS, "customer_id": ("integer", False)})

    @dataclass(frozen=True)
    class Both(StandaloneSinkContext):
        def schema_for(self, topic: str, version: int | None = None) -> dict | None:
            return customers if topic.endswith("customers") else orders

    k = Keeper("docs", config, lambda: Both(name="docs", topic_prefix="shop", log=log),
               lambda generation, docs: [None] * len(docs))
    assert "shop.public.customers" not in log.topics()
    with pytest.raises(RebuildRequired, match="a first build of its documents"):
        k.engine_for(1, 1)
    log.close()


def test_figures_that_cannot_be_counted_never_fail_a_write(tmp_path, monkeypatch):
    import sqlite3

    import sinks.documents.keeper as keeper_module

    k = keeper(tmp_path, [record(1, ORDERS)])
    k.engine_for(1, 1)

    def locked(path):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(keeper_module, "state_figures", locked)
    k.report(1)  # nothing raised
    details = k.context().stats.details
    assert details["state_rows"] is None and details["rows_stored"] == 0
    k.close()


def test_a_change_made_while_the_sink_was_stopped_is_answered_at_its_start(tmp_path, caplog):
    """The state keeps the shape versions its documents were written in: a process started
    after a DDL (its plan made from the newest shapes) answers the change as a live one."""
    dropped = record(2, {"id": ("integer", True)})
    for policy, raised in (("rebuild", RebuildRequired), ("fail", SchemaChangeError), ("ignore", None)):
        records = [record(1, ORDERS)]
        before = keeper(tmp_path / policy, records, policy=policy)
        before.engine_for(1, 1)
        before.close()
        records.append(dropped)
        after = keeper(tmp_path / policy, records, policy=policy)
        if raised is not None:
            with pytest.raises(raised, match=r"while it was stopped, public.orders \(note dropped\)"):
                after.engine_for(1, 1)
        else:
            after.engine_for(1, 1)
            assert "each document takes them at its next change" in caplog.text
            after.close()
            again = keeper(tmp_path / policy, records, policy=policy)
            again.engine_for(1, 1)  # said once: the state now says version 2
            assert caplog.text.count("while it was stopped") == 1
            again.close()


def test_a_shape_published_during_the_fill_begins_the_rebuild_again(tmp_path):
    """Rows loaded while a DDL ran were stored under the plan of the rebuild's start: at the
    switch, a newer shape changing a shown column begins the rebuild again (nobody reads it yet)."""
    records = [record(1, ORDERS)]
    k = keeper(tmp_path, records)
    assert k.engine_for(2, 1).building  # a rebuild's generation
    records.append(record(2, {"id": ("integer", True)}))
    with pytest.raises(RebuildRequired, match=r"during the rebuild, public.orders \(note dropped\)"):
        k.finish(2, 1)
    k.opened(2)  # the rebuild begins again: planned from the newest shapes
    k.engine_for(2, 1)
    assert k.finish(2, 1).building is False
    k.close()


@dataclass(frozen=True)
class Unread(Shapes):
    """A schema topic read up to ``known`` records: the newest shape it names is older than
    shapes that rows carry (found by their version)."""

    known: int = 1

    def schema_for(self, topic: str, version: int | None = None) -> dict | None:
        return self.records[self.known - 1] if version is None else super().schema_for(topic, version)


def test_rows_of_a_newer_shape_loaded_by_the_fill_begin_the_rebuild_again(tmp_path):
    """The newest shape the context names may predate the rows the fill loaded (its schema topic
    not read since): the shapes of those rows count too."""
    records = [record(1, ORDERS)]
    config = keeper(tmp_path, records).config
    context = Unread(name="docs", topic_prefix="shop", records=records)
    k = Keeper("docs", config, lambda: context, lambda generation, docs: [None] * len(docs))
    k.opened(2)
    assert k.engine_for(2, 1).building
    records.append(record(2, {"id": ("integer", True)}))
    k.filled([event(1, {"id": 1, "note": "a"}), event(2, {"id": 2})])
    with pytest.raises(RebuildRequired, match=r"during the rebuild, public.orders \(note dropped\)"):
        k.finish(2, 1)
    k.close()


def test_a_batch_whose_newer_shape_is_not_its_first_row_is_followed(tmp_path):
    records = [record(1, ORDERS)]
    k = keeper(tmp_path, records)
    k.make_plan()
    records.append(record(2, {"id": ("integer", True)}))
    with pytest.raises(RebuildRequired, match=r"orders changed in schema version 2 \(note dropped\)"):
        k.follow_shapes([event(1, {"id": 1, "note": "a"}), event(2, {"id": 2})], shape_of(k), "rebuild")
    k.close()
