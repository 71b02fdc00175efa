"""The ``documents:`` section of an OpenSearch or Redis sink: its models, and the checks that need
no captured shape.

A document is a tree of nodes. Each node is a table (``schema.table``, MySQL ``db.table``) with the
table sinks' column options, applied in this order: ``include`` (only these), ``exclude``,
``rename``. The root's key is the document's id. Below any node:

* ``children``: the rows of another table whose ``foreign_key`` columns reference this node's key,
  as an array of objects under ``as``, sorted by ``order_by`` (default: the child's key; ``-col``
  descending; nulls last; text by code point), ties by key;
* ``lookups``: the row of another table that this node's ``foreign_key`` columns reference, as an
  object under ``as`` (null when there is none).

A ``foreign_key`` is matched in order to the referenced table's key columns, in the order the
captured shape lists them (the table's column order). Nesting goes to any depth, and a table may
appear in several nodes. Join and order-by columns are kept in the sink's state even when the
document leaves them out.

``declaration_problems`` finds what is wrong without looking at the tables, as (path, message)
pairs whose paths are relative to the sink's config, and ``refuse`` raises them as one pydantic
error so that the config loader reports each at its file:line. What needs the tables' columns is
checked by ``shapes_check``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from cdc.api import ConfigError, ConfigPath, FieldPath

# One dot: the topic is <prefix>.<schema>.<table>. No globs: a node is exactly one table.
_TABLE = re.compile(r"[^.\s*?\[\]]+\.[^.\s*?\[\]]+")
# A document's name is part of an OpenSearch alias (lowercase, no ':') and of Redis keys.
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
# The sinks' own fields (__cdc_version, tombstone markers) share the document's namespace.
RESERVED_PREFIX = "__cdc_"
DEFAULT_MAX_DOCUMENT_BYTES = 10 * 1024 * 1024

Target = Literal["opensearch", "redis"]


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    table: str = Field(description="the table, as schema.table (MySQL: db.table)")
    include: list[str] | None = Field(default=None, description="only these columns (default: all)")
    exclude: list[str] = Field(default_factory=list, description="columns left out")
    rename: dict[str, str] = Field(default_factory=dict, description="column -> field name")
    lookups: list[Lookup] = Field(default_factory=list,
                                  description="rows this node's foreign_key columns reference: one object each")
    children: list[Child] = Field(default_factory=list,
                                  description="rows whose foreign_key columns reference this node: an array each")
    # On every node so that a misplaced one is refused with the reason, not as an unknown key.
    order_by: list[str] | None = Field(default=None, description="children only: the array's order, by these "
                                       "columns (-col: descending); default the child's key")
    nested: bool | None = Field(default=None, description="children only, OpenSearch only: map the array as "
                                                          "`nested` (default `object`)")

    @field_validator("table")
    @classmethod
    def _one_table(cls, table: str) -> str:
        if not _TABLE.fullmatch(table):
            raise ValueError(f"{table!r}: name one table as schema.table (MySQL: db.table), without globs")
        return table

    def fields(self) -> set[str]:
        """The field names this node is known to have without its table's shape: what ``include``
        keeps and what ``rename`` makes, after the rename."""
        shown = {name for name in self.include or () if name not in self.exclude}
        renamed = {field for name, field in self.rename.items()
                   if name not in self.exclude and (self.include is None or name in self.include)}
        return {self.rename.get(name, name) for name in shown} | renamed


class Lookup(_Node):
    """A many-to-one edge: the row of ``table`` whose key the enclosing node's ``foreign_key``
    columns hold, as an object (null when none)."""

    as_: str = Field(alias="as", min_length=1, description="the field that holds the object")
    foreign_key: list[str] = Field(description="columns of the enclosing node's table, matched in order to "
                                               "this table's key columns")


class Child(_Node):
    """A one-to-many edge: the rows of ``table`` whose ``foreign_key`` columns hold the enclosing
    node's key, as an array of objects."""

    as_: str = Field(alias="as", min_length=1, description="the field that holds the array")
    foreign_key: list[str] = Field(description="columns of this table, matched in order to the enclosing "
                                               "node's key columns")


class Document(_Node):
    """A root table: one document per row, its key the document's id."""

    name: str = Field(description="the document's name: the OpenSearch alias, the Redis keys' "
                                  "<prefix>:doc:<name>:<id>")
    mappings: dict[str, Any] = Field(default_factory=dict, description="OpenSearch only: field mappings by "
                                                                       "dotted path, over the generated ones")
    settings: dict[str, Any] = Field(default_factory=dict, description="OpenSearch only: index settings")

    @field_validator("name")
    @classmethod
    def _alias_and_key(cls, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r}: lowercase letters, digits, _ and - (it names an OpenSearch alias "
                             "and Redis keys)")
        return name


class DocumentFields(BaseModel):
    """The settings a sink gains for documents (a base of its config model). With ``documents``
    set, the sink keeps only these documents."""

    documents: list[Document] | None = Field(
        default=None, min_length=1, description="joined documents built from several tables of one source "
                                                "(see the sink's README); the sink then keeps only these")
    state_dir: ConfigPath = Field(default=Path("./cdc-state"), validate_default=True,
                                  description="directory of the documents' state (the joined rows), "
                                              "relative to the config file's directory")
    max_document_bytes: int = Field(default=DEFAULT_MAX_DOCUMENT_BYTES, ge=1024,
                                    description="a larger document is set aside to the dead letters, "
                                                "never truncated")
    member: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$",
                               description="with scale_out: group, this process's name among the sink's "
                                           "members (default: the host's name); each member keeps a state of "
                                           "its own under it and reads every record")
    shares: int = Field(default=16, ge=1, le=1024,
                        description="with scale_out: group, how many shares the documents are divided into "
                                    "among the members (at most this many members write at once)")


@dataclass(frozen=True)
class Place:
    """A node in its document: ``path`` in the sink's config, ``kind`` (root, child or lookup),
    and the node it hangs from (None for the root)."""

    path: FieldPath
    node: Document | Child | Lookup
    kind: Literal["root", "child", "lookup"]
    parent: Place | None


def walk(documents: list[Document]) -> Iterator[Place]:
    """Every node of every document, each after the node it hangs from."""
    def below(place: Place) -> Iterator[Place]:
        yield place
        for key, kind in (("lookups", "lookup"), ("children", "child")):
            for index, node in enumerate(getattr(place.node, key)):
                yield from below(Place(place.path + (key, index), node, kind, place))  # type: ignore[arg-type]

    for index, document in enumerate(documents):
        yield from below(Place(("documents", index), document, "root", None))


def declaration_problems(documents: list[Document], target: Target) -> list[tuple[FieldPath, str]]:
    """What is wrong with ``documents`` for a sink of ``target``, found without the tables' shapes."""
    problems: list[tuple[FieldPath, str]] = []
    first_name: dict[str, int] = {}
    for index, document in enumerate(documents):
        if document.name in first_name:
            problems.append((("documents", index, "name"), f"document name {document.name!r} is used twice "
                             f"(documents[{first_name[document.name]}] has it too)"))
        first_name.setdefault(document.name, index)
    for place in walk(documents):
        problems += _node_problems(place, target)
    return problems


def _node_problems(place: Place, target: Target) -> list[tuple[FieldPath, str]]:
    node, path = place.node, place.path
    out: list[tuple[FieldPath, str]] = []
    for key in ("include", "exclude", "order_by", "foreign_key"):
        names = [name.removeprefix("-") if key == "order_by" else name for name in getattr(node, key, None) or ()]
        for position, name in enumerate(names):
            if not name:
                out.append((path + (key, position), "an empty column name"))
            elif name in names[:position]:
                out.append((path + (key, position), f"column {name!r} is named twice"))
    both = sorted(set(node.include or ()) & set(node.exclude))
    if both:
        out.append((path + ("exclude",), f"columns both included and excluded: {both}"))
    targets: dict[str, str] = {}
    for column, field in node.rename.items():
        if not field:
            out.append((path + ("rename", column), "an empty field name"))
        elif field in targets:
            out.append((path + ("rename", column), f"{targets[field]!r} and {column!r} are both renamed to {field!r}"))
        elif field.startswith(RESERVED_PREFIX):
            out.append((path + ("rename", column), f"{field!r}: fields starting {RESERVED_PREFIX} are the sink's own"))
        targets.setdefault(field, column)
    if isinstance(node, (Child, Lookup)) and not node.foreign_key:
        holder = "this table" if isinstance(node, Child) else "the enclosing node's table"
        out.append((path + ("foreign_key",), f"empty: name the columns of {holder} that reference the key "
                                             f"of {'the enclosing node' if isinstance(node, Child) else node.table}"))
    if not isinstance(node, Child):
        what = "the root (one document)" if isinstance(node, Document) else "a lookup (one object)"
        if node.order_by is not None:
            out.append((path + ("order_by",), f"only a child (an array) has an order; {node.table} here is {what}"))
        if node.nested is not None:
            out.append((path + ("nested",), f"nested maps a child's array; {node.table} here is {what}"))
    if target != "opensearch":
        if node.nested is not None and isinstance(node, Child):
            out.append((path + ("nested",), f"nested is an OpenSearch mapping; a {target} sink has none"))
        if isinstance(node, Document):
            for key in ("mappings", "settings"):
                if getattr(node, key):
                    out.append((path + (key,), f"{key} are OpenSearch's; a {target} sink has none"))
    out += _as_problems(place)
    return out


def _as_problems(place: Place) -> list[tuple[FieldPath, str]]:
    """``as`` names unique among a node's children and lookups, and apart from its own fields."""
    out: list[tuple[FieldPath, str]] = []
    node, fields = place.node, place.node.fields()
    seen: dict[str, str] = {}
    for key in ("lookups", "children"):
        for index, edge in enumerate(getattr(node, key)):
            where = place.path + (key, index, "as")
            if edge.as_ in seen:
                out.append((where, f"{edge.as_!r} names two nodes under {node.table} ({seen[edge.as_]} too)"))
            elif edge.as_ in fields:
                out.append((where, f"{edge.as_!r} is also a field of {node.table} (after rename)"))
            elif edge.as_.startswith(RESERVED_PREFIX):
                out.append((where, f"{edge.as_!r}: fields starting {RESERVED_PREFIX} are the sink's own"))
            seen.setdefault(edge.as_, f"{key}[{index}]")
    return out


def not_kept_yet(sink_name: str, documents: list[Document] | None) -> None:
    """Raise ``ConfigError`` for a table sink built from a config that declares documents: the
    runtime builds the plugin's document sink for it (``Sink.class_for``), and a table sink
    keeping the tables one index or key space each instead would be a silent surprise."""
    if documents is not None:
        raise ConfigError(f"sink {sink_name}: documents are declared, so the sink's document class keeps them "
                          "(cdc.plugins.sink_class); this class keeps tables")


def refuse(problems: list[tuple[FieldPath, str]], title: str) -> None:
    """Raise ``problems`` as one ``ValidationError`` (each at its path), if there are any.

    Raised inside a model validator, pydantic keeps each location below the model's own, which
    the config loader maps to the file's lines."""
    if problems:
        raise ValidationError.from_exception_data(title, [
            InitErrorDetails(type=PydanticCustomError("documents", "{message}", {"message": message}),
                             loc=path, input=None)
            for path, message in problems])


Document.model_rebuild()
Child.model_rebuild()
Lookup.model_rebuild()
