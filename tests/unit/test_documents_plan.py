"""The documents' plan (sinks/documents/plan.py) and key bytes (keys.py): nodes and edges, what
the state keeps and indexes, projections, the digest, and that a foreign key's bytes equal the
bytes of the key it references exactly when the values are equal in the source."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.api import CapturedShape, CapturedShapes, ConfigError
from cdc.events import Column
from sinks.documents.declaration import Document
from sinks.documents.keys import key_bytes, key_encoder
from sinks.documents.plan import make_plan


def shape(table: str, *columns: tuple[str, str] | tuple[str, str, bool]) -> CapturedShape:
    return CapturedShape("shop_pg", table, tuple(Column(c[0], c[1], len(c) > 2) for c in columns), 1)


SHAPES = [
    shape("public.orders", ("id", "integer", True), ("customer_id", "integer"), ("placed_at", "text"),
          ("internal_note", "text")),
    shape("public.customers", ("id", "bigint", True), ("name", "text"), ("password_hash", "text")),
    shape("public.order_items", ("order_id", "integer", True), ("line_no", "integer", True),
          ("product_id", "varchar(20)"), ("qty", "integer")),
    shape("public.products", ("id", "text", True), ("sku", "text"), ("name", "text"), ("category_id", "numeric"),
          ("price", "numeric(10,2)")),
    shape("public.categories", ("id", "numeric(20,0)", True), ("name", "text")),
    shape("public.item_discounts", ("id", "uuid", True), ("order_id", "integer"), ("line_no", "integer")),
]
DECLARATION = {
    "name": "orders", "table": "public.orders", "exclude": ["internal_note"], "rename": {"placed_at": "created"},
    "lookups": [{"table": "public.customers", "as": "customer", "foreign_key": ["customer_id"]}],
    "children": [{
        "table": "public.order_items", "as": "items", "foreign_key": ["order_id"],
        "children": [{"table": "public.item_discounts", "as": "discounts", "foreign_key": ["order_id", "line_no"],
                      "order_by": ["-id"]}],
        "lookups": [{"table": "public.products", "as": "product", "foreign_key": ["product_id"],
                     "include": ["id", "sku", "name"],
                     "lookups": [{"table": "public.categories", "as": "category", "foreign_key": ["category_id"]}]}],
    }],
}


def shapes_of(shapes: list[CapturedShape]) -> CapturedShapes:
    return CapturedShapes("cdc", {f"cdc.{s.table}": s for s in shapes})


def plan_of(declaration=DECLARATION, shapes=SHAPES):
    return make_plan([Document.model_validate(declaration)], ["cdc.public.*"], shapes_of(shapes))


def test_nodes_in_order_with_their_edges():
    plan = plan_of()
    assert [(n.number, n.table, n.kind, n.parent, n.field, n.below) for n in plan.nodes] == [
        (0, "public.orders", "root", None, None, (1, 2)),
        (1, "public.customers", "lookup", 0, "customer", ()),
        (2, "public.order_items", "child", 0, "items", (3, 5)),
        (3, "public.products", "lookup", 2, "product", (4,)),
        (4, "public.categories", "lookup", 3, "category", ()),
        (5, "public.item_discounts", "child", 2, "discounts", ()),
    ]
    edges = {n.field: (n.edge.kind, n.edge.fk_table, n.edge.fk_columns, n.edge.families)
             for n in plan.nodes if n.edge is not None}
    assert edges == {
        "customer": ("lookup", "public.orders", ("customer_id",), ("integer",)),
        "items": ("child", "public.order_items", ("order_id",), ("integer",)),
        "product": ("lookup", "public.order_items", ("product_id",), ("text",)),
        "category": ("lookup", "public.products", ("category_id",), ("numeric",)),
        "discounts": ("child", "public.item_discounts", ("order_id", "line_no"), ("integer", "integer")),
    }
    assert plan.roots == {"orders": 0} and plan.source == "shop_pg"
    assert plan.topics()["cdc.public.order_items"] == "public.order_items"


def test_what_the_state_keeps_and_indexes_per_table():
    tables = plan_of().tables
    assert {t: p.indexes for t, p in tables.items()} == {
        "public.orders": (("customer_id",),), "public.customers": (),
        "public.order_items": (("order_id",), ("product_id",)), "public.products": (("category_id",),),
        "public.categories": (), "public.item_discounts": (("order_id", "line_no"),)}
    # products shows three columns, but its join column stays in the state; the others keep all.
    assert tables["public.products"].kept == {"id", "sku", "name", "category_id"}
    assert all(p.kept is None for t, p in tables.items() if t != "public.products")
    assert tables["public.order_items"].key == ("order_id", "line_no")


def test_children_sort_by_their_key_unless_told():
    nodes = plan_of().nodes
    assert nodes[2].order_by == (("order_id", False), ("line_no", False))
    assert nodes[5].order_by == (("id", True),)
    assert nodes[0].order_by == () and nodes[1].order_by == ()


def test_a_node_shows_its_row_through_the_shape_the_row_has():
    root = plan_of().nodes[0]
    row = {"id": 7, "customer_id": 3, "placed_at": "2026-01-01", "internal_note": "x", "added": 1}
    assert root.project(row, ["id", "customer_id", "placed_at", "internal_note"]) == \
        {"id": 7, "customer_id": 3, "created": "2026-01-01"}
    # a column added later shows up without a new plan; one the row's shape lacks is not made up
    assert root.project(row, ["id", "customer_id", "placed_at", "internal_note", "added"])["added"] == 1
    assert "added" not in root.project(row, ["id"])


def test_a_foreign_key_finds_the_key_it_references():
    plan = plan_of()
    nodes, tables = plan.nodes, plan.tables
    item = {"order_id": 7, "line_no": 2, "product_id": "p-1", "qty": 1}
    assert nodes[2].edge.reference(item) == tables["public.orders"].key_of({"id": 7})
    assert nodes[5].edge.reference({"id": "A", "order_id": 7, "line_no": 2}) == \
        tables["public.order_items"].key_of(item)
    # numeric without a scale keeps the one it was given: 5.0 of it is still category 5 of numeric(20,0)
    assert nodes[4].edge.reference({"category_id": "5.0"}) == tables["public.categories"].key_of({"id": "5"})
    assert nodes[4].edge.reference({"category_id": "5.1"}) != tables["public.categories"].key_of({"id": "5"})
    assert nodes[1].edge.reference({"customer_id": None}) is None


def test_the_digest_follows_what_the_state_depends_on():
    digest = plan_of().digest
    assert plan_of().digest == digest
    added = [replace(s, columns=s.columns + (Column("new", "text"),)) for s in SHAPES]
    assert plan_of(shapes=added).digest == digest  # a column without a role in a join
    assert plan_of({**DECLARATION, "exclude": []}).digest != digest
    retyped = {"public.customers": (Column("id", "text", True),), "public.orders": (Column("id", "integer", True),
                                                                                    Column("customer_id", "text"))}
    both = [replace(s, columns=retyped[s.table] + s.columns[len(retyped[s.table]):]) if s.table in retyped else s
            for s in SHAPES]
    assert plan_of(shapes=both).digest != digest  # the join now compares text: stored keys mean otherwise
    one = [s for s in both if s.table != "public.orders"] + [s for s in SHAPES if s.table == "public.orders"]
    with pytest.raises(ConfigError, match="customer_id .integer. cannot reference public.customers.id .text."):
        plan_of(shapes=one)


def test_a_plan_refuses_shapes_the_declaration_does_not_fit():
    with pytest.raises(ConfigError, match="public.order_items has no column 'line'"):
        plan_of({**DECLARATION, "children": [{**DECLARATION["children"][0], "order_by": ["line"]}]})


@given(st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-10**6, max_value=10**6),
       st.integers(min_value=0, max_value=3))
def test_numerics_equal_in_the_source_encode_alike(number, extra_zeros):
    written = f"{number:f}" + ("0" * extra_zeros if "." in f"{number:f}" else "")
    assert key_bytes([written], ["numeric"]) == key_bytes([f"{number:f}"], ["numeric"])
    other = number + Decimal("0.0001")
    assert key_bytes([f"{other:f}"], ["numeric"]) != key_bytes([written], ["numeric"])


def test_key_bytes_of_composite_keys_nulls_and_uuids():
    assert key_bytes([7, 2], ["integer", "integer"]) == b"[7,2]"
    assert key_bytes([7, 2], ["integer", "integer"]) != key_bytes([2, 7], ["integer", "integer"])
    assert key_bytes([7, None], ["integer", "integer"]) is None
    assert key_bytes(["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"], ["uuid"]) == \
        key_bytes(["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"], ["uuid"])
    assert key_bytes(["-0.00"], ["numeric(2)"]) == key_bytes(["0"], ["numeric(2)"])
    assert key_bytes(["NaN"], ["numeric"]) == b'["NaN"]'


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["integer", "text", "numeric", "uuid", "timestamptz", "boolean"]), min_size=1,
                max_size=3), st.data())
def test_a_key_encoder_is_key_bytes_of_the_rows_columns(families, data):
    """The encoders made once per key (the fast paths of plain integer and text keys included)
    give exactly key_bytes of the row's values, None for a null or missing one."""
    values = st.one_of(st.none(), st.integers(-10**12, 10**12), st.text(max_size=5),
                       st.sampled_from(["1.50", "1.5", "-0.00", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"]))
    columns = [f"c{i}" for i in range(len(families))]
    row = {c: data.draw(values) for c in columns}
    if data.draw(st.booleans()):
        row.pop(columns[-1])
    assert key_encoder(columns, families)(row) == key_bytes([row.get(c) for c in columns], families)
