"""The plugin boundary: a sink plugin imports ``cdc.api`` and nothing else of the framework.

Everything a sink needs (event types, errors, the context with stats, the log, schemas, the
dead-letter writer) comes through ``cdc.api``; the framework's internals can then change without
touching a plugin. This test reads every module of the bundled sink packages with ``ast`` (no
import, so a missing optional dependency such as pyspark does not hide a violation).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_PACKAGES = ("sinks", "spark_sinks")
ALLOWED = {"cdc.api"}  # and what cdc.api re-exports; see its module docstring


def _modules() -> list[Path]:
    return sorted(p for package in PLUGIN_PACKAGES for p in (ROOT / package).rglob("*.py"))


def framework_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every ``cdc`` module that ``source`` imports, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name == "cdc" or a.name.startswith("cdc.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "cdc":  # from cdc import api, errors
                found += [(node.lineno, f"cdc.{a.name}") for a in node.names]
            elif node.module.startswith("cdc."):
                found.append((node.lineno, node.module))
    return found


def test_the_scanner_sees_every_form_of_import():
    source = ("import cdc.errors\nfrom cdc.log.base import Log\nfrom cdc import api, serde\n"
              "def f():\n    from cdc.dev.jars import spark_jars\nfrom cdc.api import Sink\nimport cdcx\n")
    assert sorted(framework_imports(source)) == [(1, "cdc.errors"), (2, "cdc.log.base"), (3, "cdc.api"),
                                                 (3, "cdc.serde"), (5, "cdc.dev.jars"), (6, "cdc.api")]


def test_there_are_plugin_modules_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert "sinks/sql/sink.py" in names and "spark_sinks/delta.py" in names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_plugin_imports_only_the_plugin_api(path: Path):
    outside = [f"{path.relative_to(ROOT).as_posix()}:{line}: {module}"
               for line, module in framework_imports(path.read_text()) if module not in ALLOWED]
    assert not outside, "plugins may import only cdc.api of the framework:\n" + "\n".join(outside)


INTERNAL_TOPIC_NAMES = (".offsets", "schema-changes", ".dead-letter.")


def internal_topic_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string in ``source`` (docstrings aside) that spells one of the
    framework's own topics: a plugin that builds such a name reads the framework's storage
    directly instead of asking the context (or cdc.api's helpers) for what it needs."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and any(name in node.value for name in INTERNAL_TOPIC_NAMES)]


def test_the_scanner_sees_internal_topic_names_outside_docstrings():
    source = ('"""Reads <prefix>.offsets."""\nx = f"{p}.offsets"\ny = t.endswith(".schema-changes")\n'
              'z = "ok"\n')
    assert [line for line, _ in internal_topic_literals(source)] == [2, 3]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_plugin_names_none_of_the_frameworks_own_topics(path: Path):
    found = [f"{path.relative_to(ROOT).as_posix()}:{line}: {text!r}"
             for line, text in internal_topic_literals(path.read_text())]
    assert not found, ("the framework's own topics reach a plugin through cdc.api (SinkContext."
                       "checkpoint_feed, topics_matching, dead_letter_topic, ...):\n" + "\n".join(found))
