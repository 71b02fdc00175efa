"""The plugin boundary: a plugin spells none of the framework's own topics.

What a plugin imports of the framework (``cdc.api`` and the leaf modules) is checked with the
other layers in tests/unit/test_layers.py. This test reads every module of the bundled plugin
packages with ``ast`` (no import, so a missing optional dependency such as pyspark does not hide
a violation).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_PACKAGES = ("sources", "sinks", "spark_sinks", "snapshot")


def _modules() -> list[Path]:
    return sorted(p for package in PLUGIN_PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_there_are_plugin_modules_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert {"sinks/sql/sink.py", "spark_sinks/delta.py", "sources/postgres/source.py",
            "snapshot/coordinator.py"} <= names


INTERNAL_TOPIC_NAMES = (".offsets", "schema-changes", ".dead-letter.", ".member-shares.")


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
