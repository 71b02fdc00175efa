"""A sink's ``documents:`` compiled against the captured shapes: what the engine keeps and walks.

The plan numbers every node of every document (depth first, a node before what hangs from it)
and says, per node: its table, its edge to the node it hangs from, how it shows its row
(``include``, ``exclude``, ``rename``, applied to whatever shape a row has, so a column added
later shows up without a new plan) and, for a child, its order. Per table: its key, the
columns the state keeps of its rows (``None``: all, when a node shows every column), and the
foreign-key indexes its edges navigate.

An edge is stored on the side that holds the foreign key (``fk_table``): a child's own table,
or the table of the node a lookup hangs from. One index per (table, foreign-key columns) serves
both directions: assembling (a parent's children; the rows referencing a lookup row) and
reaching (which documents a changed row belongs to; section 2 of the design).

``digest`` identifies what the state depends on: the declaration, and per table its key
columns and the families of the columns edges compare. A stored state made under another
digest must be rebuilt; a column added to or dropped from a table without a role in a join
does not change it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

import orjson

from cdc.api import CapturedShapes, ConfigError
from sinks.documents.declaration import Child, Document, Place, walk
from sinks.documents.keys import key_encoder, key_family
from sinks.documents.shapes_check import check


@dataclass(frozen=True)
class Edge:
    """How a node hangs from its parent: ``fk_columns`` of ``fk_table`` hold the key of the
    referenced table (the parent for a child, the node itself for a lookup), whose key
    ``families`` encode them (keys.py)."""

    kind: Literal["child", "lookup"]
    fk_table: str
    fk_columns: tuple[str, ...]
    families: tuple[str, ...]

    def reference(self, row: Mapping[str, Any]) -> bytes | None:
        """The key bytes ``row`` (of ``fk_table``) references, None for a null reference."""
        return self._encode(row)

    @cached_property
    def _encode(self) -> Callable[[Mapping[str, Any]], bytes | None]:
        return key_encoder(self.fk_columns, self.families)


@dataclass(frozen=True)
class NodePlan:
    number: int                       # position in ``Plan.nodes``
    document: str
    path: tuple[str | int, ...]       # in the sink's config
    table: str
    kind: Literal["root", "child", "lookup"]
    parent: int | None
    field: str | None                 # ``as``: where the parent shows this node
    edge: Edge | None
    include: frozenset[str] | None
    exclude: frozenset[str]
    rename: Mapping[str, str]
    order_by: tuple[tuple[str, bool], ...]   # (column, descending) of a child's array
    nested: bool
    below: tuple[int, ...] = ()       # the nodes hanging from this one, lookups first
    order_families: tuple[str, ...] = ()     # keys.key_family of each order_by column: how it compares

    def shows(self, column: str) -> bool:
        return (self.include is None or column in self.include) and column not in self.exclude

    def project(self, row: Mapping[str, Any], columns: Sequence[str]) -> dict[str, Any]:
        """The fields this node shows of ``row``, whose shape has ``columns`` (in table order)."""
        return {self.rename.get(c, c): row.get(c) for c in columns if self.shows(c)}


@dataclass(frozen=True)
class TablePlan:
    table: str
    topic: str
    key: tuple[str, ...]
    families: tuple[str, ...]                 # of the key columns
    kept: frozenset[str] | None               # the columns the state keeps; None: every column
    indexes: tuple[tuple[str, ...], ...]      # foreign-key column lists edges navigate
    nodes: tuple[int, ...]                    # the nodes over this table
    columns: tuple[str, ...] = ()             # of the shape the plan was made from: what documents show
    earlier: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # column -> its earlier names

    def key_of(self, row: Mapping[str, Any]) -> bytes | None:
        return self._encode(row)

    @cached_property
    def _encode(self) -> Callable[[Mapping[str, Any]], bytes | None]:
        return key_encoder(self.key, self.families)


@dataclass(frozen=True)
class Plan:
    source: str
    roots: Mapping[str, int]                  # document name -> its root node
    nodes: tuple[NodePlan, ...]
    tables: Mapping[str, TablePlan]
    digest: str

    def topics(self) -> dict[str, str]:
        """Topic -> table, for routing a sink event to its table."""
        return {plan.topic: table for table, plan in self.tables.items()}


def make_plan(documents: list[Document], topics: list[str], shapes: CapturedShapes,
              earlier: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None) -> Plan:
    """The plan of ``documents``; ``ConfigError`` with every problem ``cdc validate`` would report
    (a shape changed since, or the file was never validated against the shapes). ``earlier``:
    per table, its columns' earlier names (``cdc.api.earlier_names``), under which rows of older
    shapes carry their values."""
    problems = check(documents, topics, shapes)
    if problems:
        raise ConfigError("documents do not fit the captured shapes: " + "; ".join(
            f"{'.'.join(map(str, path))}: {message}" for path, message in problems))
    places = list(walk(documents))
    number = {place.path: index for index, place in enumerate(places)}
    nodes = [_node(index, place, number, shapes) for index, place in enumerate(places)]
    below: dict[int, list[int]] = {}
    for node in nodes:
        if node.parent is not None:
            below.setdefault(node.parent, []).append(node.number)
    nodes = [replace(node, below=tuple(below.get(node.number, ()))) for node in nodes]
    tables = {table: _table(table, [n for n in nodes if n.table == table], nodes, shapes, (earlier or {}).get(table, {}))
              for table in dict.fromkeys(n.table for n in nodes)}
    first = shapes.of(nodes[0].table)
    source = (first.source if first is not None else None) or ""
    roots = {node.document: node.number for node in nodes if node.kind == "root"}
    return Plan(source, roots, tuple(nodes), tables, _digest(documents, tables, nodes))


def _node(index: int, place: Place, number: Mapping[tuple, int], shapes: CapturedShapes) -> NodePlan:
    node = place.node
    parent = place.parent
    edge = None
    if parent is not None:
        assert not isinstance(node, Document)
        child = isinstance(node, Child)
        referenced = shapes.of(parent.node.table if child else node.table)
        assert referenced is not None  # check() found every shape
        edge = Edge("child" if child else "lookup", node.table if child else parent.node.table,
                    tuple(node.foreign_key), tuple(key_family(c.type) for c in referenced.key))
    order_by: tuple[tuple[str, bool], ...] = ()
    order_families: tuple[str, ...] = ()
    if isinstance(node, Child):
        shape = shapes.of(node.table)
        assert shape is not None
        names = node.order_by if node.order_by is not None else [c.name for c in shape.key]
        order_by = tuple((name.removeprefix("-"), name.startswith("-")) for name in names)
        order_families = tuple(key_family(column.type) if (column := shape.column(name)) is not None else ""
                               for name, _ in order_by)
    root = place
    while root.parent is not None:
        root = root.parent
    assert isinstance(root.node, Document)
    return NodePlan(
        number=index, document=root.node.name, path=place.path, table=node.table, kind=place.kind,
        parent=None if parent is None else number[parent.path],
        field=None if isinstance(node, Document) else node.as_, edge=edge,
        include=None if node.include is None else frozenset(node.include), exclude=frozenset(node.exclude),
        rename=dict(node.rename), order_by=order_by, nested=bool(node.nested), order_families=order_families)


def _table(table: str, over: list[NodePlan], nodes: list[NodePlan], shapes: CapturedShapes,
           earlier: Mapping[str, tuple[str, ...]]) -> TablePlan:
    shape = shapes.of(table)
    assert shape is not None
    edges = [n.edge for n in nodes if n.edge is not None and n.edge.fk_table == table]
    indexes = tuple(dict.fromkeys(edge.fk_columns for edge in edges))
    kept: frozenset[str] | None = None
    if all(n.include is not None for n in over):
        # Join and order-by columns stay in the state even where no document shows them.
        wanted = {c for n in over for c in n.include or ()} | {c.name for c in shape.key}
        wanted |= {c for edge in edges for c in edge.fk_columns}
        wanted |= {c for n in over for c, _ in n.order_by}
        wanted |= {old for c in list(wanted) for old in earlier.get(c, ())}  # older rows name them so
        kept = frozenset(wanted)
    key = tuple(c.name for c in shape.key)
    columns = tuple(c.name for c in shape.columns)
    return TablePlan(table, shapes.topic_of(table), key, tuple(key_family(c.type) for c in shape.key), kept,
                     indexes, tuple(n.number for n in over), columns,
                     {c: tuple(names) for c, names in earlier.items() if names and c in columns})


def _digest(documents: list[Document], tables: Mapping[str, TablePlan], nodes: list[NodePlan]) -> str:
    joined = {table: {"key": list(plan.key), "families": list(plan.families)} for table, plan in tables.items()}
    edges = [[n.number, n.edge.fk_table, list(n.edge.fk_columns), list(n.edge.families)]
             for n in nodes if n.edge is not None]
    text = orjson.dumps({"documents": [d.model_dump(mode="json", by_alias=True) for d in documents],
                         "tables": joined, "edges": edges}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()[:32]
