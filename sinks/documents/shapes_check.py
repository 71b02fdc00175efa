"""A ``documents:`` declaration checked against the captured tables' newest shapes.

For every node: its table's topic is among the sink's ``topics`` and has a shape; every column
it names exists (``include``, ``exclude``, ``rename``, ``order_by``, ``foreign_key``); no ``as``
equals a field of the node it hangs in; the table has a key. For every edge: the
``foreign_key`` has as many columns as that key, and each is of the key column's family
(sinks/documents/keys.py), else both columns and their types are named. And every table comes
from one source: a document's version grows from its rows' versions, which compare only within
one source.

Paths are relative to the sink's config, like ``declaration_problems``'.
"""

from __future__ import annotations

import difflib

from cdc.api import CapturedShape, CapturedShapes, FieldPath, table_topics
from sinks.documents.declaration import Child, Document, Lookup, Place, walk
from sinks.documents.keys import key_family

Problems = list[tuple[FieldPath, str]]


def check(documents: list[Document], topics: list[str], shapes: CapturedShapes) -> Problems:
    problems: Problems = []
    found: dict[FieldPath, CapturedShape] = {}   # node path -> its table's shape
    sources: dict[str, list[str]] = {}           # source -> its tables, in declaration order
    for place in walk(documents):
        node = place.node
        topic = shapes.topic_of(node.table)
        if not table_topics([topic], topics):
            problems.append((place.path + ("table",), f"{node.table}: its topic {topic} is not among the sink's "
                                                      f"topics ({', '.join(topics)})"))
        shape = shapes.of(node.table)
        if shape is None:
            problems.append((place.path + ("table",), f"{node.table}: no shape of it has been captured yet "
                                                      f"({topic} has no record in the schema topic); run its "
                                                      "source first, or validate with --offline"))
            continue
        found[place.path] = shape
        tables = sources.setdefault(shape.source or "(unnamed)", [])
        if node.table not in tables:
            tables.append(node.table)
        problems += _columns(place, shape)
        if not shape.key:
            # The root's key is the document id; a lookup and a parent are referenced by their key;
            # and the state keeps every row under its key (a row without one could never be
            # updated or deleted in a document).
            problems.append((place.path + ("table",), f"{node.table} has no key columns in its captured shape; "
                                                      "every table of a document needs one (the state keeps "
                                                      "rows by key)"))
        parent = place.parent
        if parent is not None and parent.path in found:
            problems += _edge(place, shape, found[parent.path])
        if node.children or node.lookups:
            problems += _as_apart(place, shape)
    if len(sources) > 1:
        listed = ", ".join(f"{source} ({', '.join(tables)})" for source, tables in sources.items())
        problems.append((("documents",), f"versions compare only within one source: {listed}"))
    return problems


def _unknown(shape: CapturedShape, name: str) -> str:
    names = [c.name for c in shape.columns]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (its columns: {', '.join(names)})"
    return f"{shape.table} has no column {name!r}{hint}"


def _columns(place: Place, shape: CapturedShape) -> Problems:
    node, path = place.node, place.path
    out: Problems = []
    for key in ("include", "exclude", "order_by"):
        for index, name in enumerate(getattr(node, key) or ()):
            if shape.column(name.removeprefix("-") if key == "order_by" else name) is None:
                out.append((path + (key, index), _unknown(shape, name.removeprefix("-"))))
    for column in node.rename:
        if shape.column(column) is None:
            out.append((path + ("rename", column), _unknown(shape, column)))
    fields: dict[str, str] = {}
    for column in _kept(node, shape):
        field = node.rename.get(column, column)
        if field in fields:
            out.append((path + ("rename", column if column in node.rename else fields[field]),
                        f"two columns of {shape.table} become field {field!r}: {fields[field]!r} and {column!r}"))
        fields.setdefault(field, column)
    return out


def _kept(node: Document | Child | Lookup, shape: CapturedShape) -> list[str]:
    """The columns the node's document part shows, in the table's order."""
    wanted = set(node.include) if node.include is not None else None
    return [c.name for c in shape.columns if (wanted is None or c.name in wanted) and c.name not in node.exclude]


def _edge(place: Place, shape: CapturedShape, parent_shape: CapturedShape) -> Problems:
    """The foreign key of a child (its own columns -> the parent's key) or of a lookup (the
    parent's columns -> the lookup's key)."""
    node = place.node
    assert isinstance(node, (Child, Lookup))
    many, one = (shape, parent_shape) if isinstance(node, Child) else (parent_shape, shape)
    path = place.path + ("foreign_key",)
    out: Problems = []
    columns = []
    for index, name in enumerate(node.foreign_key):
        column = many.column(name)
        if column is None:
            out.append((path + (index,), _unknown(many, name)))
        columns.append(column)
    key = one.key
    if not key or not node.foreign_key:
        return out  # reported as a missing key or an empty foreign_key
    if len(node.foreign_key) != len(key):
        names = ", ".join(c.name for c in key)
        out.append((path, f"{len(node.foreign_key)} column(s) of {many.table} cannot reference the key of "
                          f"{one.table}, which has {len(key)} ({names}), matched in order"))
        return out
    for index, (column, target) in enumerate(zip(columns, key, strict=True)):
        if column is not None and key_family(column.type) != key_family(target.type):
            out.append((path + (index,), f"{many.table}.{column.name} ({column.type}) cannot reference "
                                         f"{one.table}.{target.name} ({target.type}): their encoded keys would "
                                         f"never match (key families {key_family(column.type)} and "
                                         f"{key_family(target.type)})"))
    return out


def _as_apart(place: Place, shape: CapturedShape) -> Problems:
    """An ``as`` equal to a field the node shows would overwrite it; ``declaration_problems``
    caught those it could see without the shape."""
    node = place.node
    fields = {node.rename.get(c, c) for c in _kept(node, shape)} - node.fields()
    out: Problems = []
    for key in ("lookups", "children"):
        for index, edge in enumerate(getattr(node, key)):
            if edge.as_ in fields:
                out.append((place.path + (key, index, "as"), f"{edge.as_!r} is also a field of {node.table}; "
                                                             "rename or exclude that column, or choose another name"))
    return out


class ShapeCheckedDocuments:
    """The ``cdc.api.ShapeCheckedConfig`` answers of a sink config with ``DocumentFields``."""

    documents: list[Document] | None
    topics: list[str]

    def needs_shapes(self) -> bool:
        return self.documents is not None

    def check_shapes(self, shapes: CapturedShapes) -> list[tuple[FieldPath, str]]:
        return check(self.documents or [], list(self.topics), shapes)
