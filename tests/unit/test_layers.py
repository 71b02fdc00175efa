"""The layers (docs/architecture.md, "Layers"), checked on the source text with ``ast``:

* the leaf modules (events, positions, errors, the sink event type, record headers, the topics'
  names, servers, units, the compiled-code switch) import no other module of the framework;
* ``cdc.api`` imports only itself and the leaves: a change inside the runtime cannot break a
  plugin through it;
* the framework (``cdc``) imports no plugin (``sources``, ``sinks``, ``spark_sinks``,
  ``snapshot``): it finds them through the entry points in pyproject.toml;
* no import circle anywhere.

Every import counts, at module level, inside a function, or under ``TYPE_CHECKING``. An import
depends on what it names: ``from pkg import name`` on ``pkg`` (its ``__init__`` runs) and on
``pkg.name`` where that is a module; ``import pkg.mod`` on ``pkg.mod``. So a package whose
``__init__`` imports a submodule that imports the package back is a circle, and a submodule that
imports a sibling by its own name is not. Compiled extensions (``cdc/_encode.c``, ...) are
modules of their package, and ``native.load("pkg._ext")`` (cdc/native.py) imports the one it names. Modules are read, never imported: a missing optional dependency
(pyspark) cannot hide anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORK = "cdc"
PLUGINS = ("sources", "sinks", "spark_sinks", "snapshot")
API = "cdc.api"
# The bottom of the framework: plain types and classifications that both the API and the
# runtime use, importing nothing of the framework but each other. ``cdc`` itself holds only
# the version.
LEAVES = frozenset({"cdc", "cdc.events", "cdc.positions", "cdc.errors", "cdc.sink_event", "cdc.headers",
                    "cdc.topics", "cdc.units", "cdc.servers", "cdc.servers.postgres", "cdc.servers.mysql",
                    "cdc.native"})


def modules(root: Path = ROOT, packages=(FRAMEWORK, *PLUGINS)) -> dict[str, Path | None]:
    """Module name -> its file (None for a compiled extension, known by its C source)."""
    found: dict[str, Path | None] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
        for path in (root / package).rglob("_*.c"):
            found.setdefault(".".join(path.relative_to(root).with_suffix("").parts), None)
    return found


def imports_of(name: str, source: str, known) -> set[str]:
    """The known modules that module ``name`` (its ``source``) depends on (see the docstring)."""
    is_package = source is not None and name in known and known[name] is not None \
        and known[name].name == "__init__.py"

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(filter(None, (resolve(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if (module := resolve(target)) is not None:
                found.add(module)
            found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known)
        elif isinstance(node, ast.Call) and _loads_native(node) and (module := resolve(node.args[0].value)):
            found.add(module)
    found.discard(name)
    return found


def _loads_native(call: ast.Call) -> bool:
    """``native.load("pkg._ext")``: the compiled module it names is imported."""
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == "load" and isinstance(func.value, ast.Name) \
        and func.value.id == "native" and len(call.args) == 1 and isinstance(call.args[0], ast.Constant) \
        and isinstance(call.args[0].value, str)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports_of(name, path.read_text(), known) if path is not None else set()
            for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


GRAPH = import_graph()


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _plugin(module: str) -> bool:
    return any(_in(module, p) for p in PLUGINS)


def test_the_scanner_follows_the_rule_of_what_an_import_names(tmp_path):
    for path, text in {"pkg/__init__.py": "from pkg.sub import x\n",
                       "pkg/sub.py": "import pkg.other as o\nfrom pkg import other\n",
                       "pkg/other.py": "def f():\n    from . import sub\n",
                       "pkg/lone.py": "from .other import f\nimport pkg._native\n",
                       "pkg/loads.py": "from pkg import native\nnative.load('pkg._ext')\n",
                       "pkg/native.py": "", "pkg/_ext.c": "",
                       "pkg/_native.c": ""}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    known = modules(tmp_path, ("pkg",))
    graph = {name: imports_of(name, path.read_text(), known) if path else set() for name, path in known.items()}
    assert graph == {"pkg": {"pkg.sub"}, "pkg.sub": {"pkg", "pkg.other"}, "pkg.other": {"pkg", "pkg.sub"},
                     "pkg.lone": {"pkg.other", "pkg._native"}, "pkg._native": set(),
                     "pkg.loads": {"pkg", "pkg.native", "pkg._ext"}, "pkg.native": set(), "pkg._ext": set()}
    assert circles(graph) == [frozenset({"pkg", "pkg.sub", "pkg.other"})]


def test_the_graph_covers_every_package():
    assert {"cdc.api", "cdc.runtime.runner", "sources.postgres.source", "sinks.sql.sink", "spark_sinks.delta",
            "snapshot.coordinator", "cdc._encode"} <= set(GRAPH)
    assert "snapshot.coordinator" in GRAPH["sources.postgres.source"]


def test_the_leaves_import_only_leaves():
    outside = {m: sorted(d for d in deps if d not in LEAVES) for m, deps in GRAPH.items() if m in LEAVES}
    assert not {m: d for m, d in outside.items() if d}


def test_the_api_imports_only_itself_and_the_leaves():
    outside = {m: sorted(d for d in deps if not _in(d, API) and d not in LEAVES)
               for m, deps in GRAPH.items() if _in(m, API)}
    assert not {m: d for m, d in outside.items() if d}, "cdc.api may import only cdc.api and the leaf modules"


@pytest.mark.parametrize("package", PLUGINS)
def test_a_plugin_imports_only_the_api_and_the_leaves_of_the_framework(package):
    outside = {m: sorted(d for d in deps if _in(d, FRAMEWORK) and not _in(d, API) and d not in LEAVES)
               for m, deps in GRAPH.items() if _in(m, package)}
    assert not {m: d for m, d in outside.items() if d}, \
        "a plugin imports cdc.api (and cdc.events, positions, errors, sink_event, servers, units) only"


def test_the_framework_imports_no_plugin():
    reaching = {m: sorted(d for d in deps if _plugin(d)) for m, deps in GRAPH.items() if _in(m, FRAMEWORK)}
    assert not {m: d for m, d in reaching.items() if d}, \
        "the framework finds plugins through entry points (pyproject.toml), never by importing them"


def test_no_import_circles():
    found = [sorted(c) for c in circles(GRAPH)]
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)
