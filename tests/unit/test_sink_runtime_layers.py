"""The sink runtime's parts (cdc/runtime/sink_runner.py and the modules it coordinates) import each
other without a circle, use each other only through what is public, and stay small."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "cdc" / "runtime"
PARTS = ["sink_runner", "sink_reading", "sink_writing", "write_pipeline", "sink_thread", "sink_rebuild",
         "window_fill", "window_loads", "sink_group", "dead_letters", "read_trail"]


def _tree(name: str) -> ast.Module:
    return ast.parse((RUNTIME / f"{name}.py").read_text())


def _imports(name: str) -> set[str]:
    """The parts ``name`` imports, at module level or under TYPE_CHECKING alike."""
    out = set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("cdc.runtime."):
                out.add(node.module.rsplit(".", 1)[1])
            elif node.module == "cdc.runtime":
                out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name.rsplit(".", 1)[1] for alias in node.names if alias.name.startswith("cdc.runtime."))
    return out & set(PARTS)


def test_the_parts_import_each_other_without_a_circle():
    graph = {name: _imports(name) for name in PARTS}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        assert name not in path, f"import circle: {' -> '.join(path[path.index(name):] + [name])}"
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, path + [name])
        done.add(name)
    for name in PARTS:
        visit(name, [])


def test_no_part_touches_a_private_member_of_another_object():
    found = []
    for name in PARTS:
        for node in ast.walk(_tree(name)):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append(f"{name}.py:{node.lineno}: .{node.attr}")
    assert not found, found


def test_the_parts_are_small():
    sizes = {name: len((RUNTIME / f"{name}.py").read_text().splitlines()) for name in PARTS}
    assert max(sizes.values()) < 400, sizes
