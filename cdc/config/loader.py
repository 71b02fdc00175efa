"""YAML to plain data, remembering the line of every key, with ``${VAR}`` interpolation.

PyYAML's composer gives a node tree whose nodes carry ``start_mark``; walking it ourselves
(instead of ``yaml.safe_load``) keeps, for each path in the data (``("sources", 0, "slot")``), the
line where it was written, so every later problem can point at file:line. Scalars are built with
YAML's own rules (``3`` is an int, ``true`` a bool); string scalars are then interpolated (see
``interpolate``). Problems found here (syntax, duplicate keys, unset variables) are collected, not
raised, so that validation can still report everything else in the same run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from cdc.config.interpolate import has_references, interpolate

if TYPE_CHECKING:
    from typing import Any

Path = tuple[str | int, ...]

_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"


class Document:
    """A parsed config file: its data, where each part of it was written, what went wrong.

    A plain class, not a dataclass: ``cdc status``'s fast path reads the file through here, and
    ``dataclasses`` (with ``inspect``) would be a sizeable part of its start-up."""

    __slots__ = ("file", "data", "lines", "problems", "tainted")

    def __init__(self, file: str) -> None:
        self.file = file
        self.data: Any = None
        self.lines: dict[Path, int] = {}   # path -> 1-based line
        self.problems: list[tuple[Path, int | None, str]] = []
        # Paths whose value is already known to be wrong: validation errors at or under them are noise.
        self.tainted: set[Path] = set()

    def line_of(self, path: Path) -> int | None:
        """The line of ``path``, or of its nearest enclosing part that was written in the file
        (a missing field points at the mapping that lacks it)."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return None

    def problem(self, path: Path, message: str, line: int | None = None) -> None:
        self.problems.append((path, line if line is not None else self.line_of(path), message))
        self.tainted.add(path)

    def is_tainted(self, path: Path) -> bool:
        return any(path[:len(t)] == t for t in self.tainted)


def read_yaml(text: str, file: str, env: Mapping[str, str]) -> Document:
    """Parse ``text`` (the contents of ``file``) into a ``Document``; never raises for bad input."""
    doc = Document(file)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = "; ".join(part for part in (err.context, err.problem) if part) or str(err)
        lines = text.splitlines()
        # Braces are flow indicators: `{a: ${X}}` does not parse, `{a: "${X}"}` does.
        if mark and mark.line < len(lines) and "${" in lines[mark.line]:
            what += ' (inside {...} or [...], quote values that hold ${...}: "${VAR}")'
        doc.problems.append(((), mark.line + 1 if mark else None, f"invalid YAML: {what}"))
        return doc
    except yaml.YAMLError as err:
        doc.problems.append(((), None, f"invalid YAML: {err}"))
        return doc
    if root is None:  # an empty file: every section takes its default
        doc.data = {}
        return doc
    doc.lines[()] = root.start_mark.line + 1
    doc.data = _Walker(doc, env).value(root, ())
    return doc


class _Walker:
    def __init__(self, doc: Document, env: Mapping[str, str]) -> None:
        self.doc = doc
        self.env = env
        self.constructor = SafeConstructor()

    def value(self, node: Node, path: Path) -> Any:
        if isinstance(node, MappingNode):
            return self.mapping(node, path)
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                self.doc.problem(path, f"unsupported YAML tag {node.tag}", node.start_mark.line + 1)
            items = []
            for index, item in enumerate(node.value):
                self.doc.lines[path + (index,)] = item.start_mark.line + 1
                items.append(self.value(item, path + (index,)))
            return items
        return self.scalar(node, path)

    def mapping(self, node: MappingNode, path: Path) -> dict[Any, Any]:
        if node.tag != _MAP_TAG:
            self.doc.problem(path, f"unsupported YAML tag {node.tag}", node.start_mark.line + 1)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = key_node.value
                line = key_node.start_mark.line + 1
                if key in seen:
                    self.doc.problem(path + (key,), f"duplicate key {key!r} (first on line {seen[key]})", line)
                seen.setdefault(key, line)
        try:
            self.constructor.flatten_mapping(node)  # resolves "<<" merge keys, in place
        except ConstructorError as err:
            self.doc.problem(path, str(err.problem), node.start_mark.line + 1)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.doc.problem(path, "a key must be a plain value, not a list or mapping",
                                 key_node.start_mark.line + 1)
                continue
            key = self.scalar(key_node, path, interpolated=False)
            if isinstance(key, (int, float, bool)) or key is None:
                key = key_node.value  # `1: x` or `on: x` is still the key the user wrote
            self.doc.lines[path + (key,)] = key_node.start_mark.line + 1
            result[key] = self.value(value_node, path + (key,))
        return result

    def scalar(self, node: Node, path: Path, interpolated: bool = True) -> Any:
        try:
            value = self.constructor.construct_object(node, deep=True)
        except ConstructorError as err:
            self.doc.problem(path, str(err.problem), node.start_mark.line + 1)
            return node.value
        if interpolated and node.tag == _STR_TAG and has_references(value):
            value, errors = interpolate(value, self.env)
            for message in errors:
                self.doc.problem(path, message, node.start_mark.line + 1)
        return value
