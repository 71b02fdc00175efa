"""Plugin discovery through entry points, and what happens when one plugin cannot be imported."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pytest

from cdc import plugins
from cdc.errors import ConfigError, PluginNotFoundError
from sources.generator import GeneratorSource


@dataclass
class FakeEntryPoint:
    name: str
    value: str
    group: str
    obj: Any = None
    error: BaseException | None = None
    dist: Any = None

    def load(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.obj


class _Metadata(dict):
    def get_all(self, key):
        return ["redis", "opensearch", "test"] if key == "Provides-Extra" else None


class FakeDist:
    """Stands in for the installed distribution: its name, extras and requirements."""

    metadata = _Metadata(Name="cdc-framework")
    requires = ['redis<8,>=5; extra == "redis"', 'opensearch-py<4,>=2.6; extra == "opensearch"',
                'pytest<10; extra == "test"']


@pytest.fixture(autouse=True)
def fresh_discovery():
    plugins.clear_cache()
    yield
    plugins.clear_cache()


def install(monkeypatch, *fakes: FakeEntryPoint) -> None:
    """The real entry points of a group, plus ``fakes``."""
    def fake_entry_points(group: str):
        return [*entry_points(group=group), *(f for f in fakes if f.group == group)]

    monkeypatch.setattr(plugins, "entry_points", fake_entry_points)


def test_discovers_the_generator_source():
    found = plugins.source_plugins()
    assert found["generator"] is GeneratorSource
    assert plugins.source_plugin("generator") is GeneratorSource


def test_unknown_type_names_the_installed_ones():
    with pytest.raises(PluginNotFoundError) as caught:
        plugins.source_plugin("oracle")
    assert str(caught.value) == f"unknown source type 'oracle'; installed: {', '.join(sorted(_real()))}"
    assert isinstance(caught.value, ConfigError) and not caught.value.retriable
    with pytest.raises(PluginNotFoundError, match="unknown sink type 'nope'; installed: "):
        plugins.sink_plugin("nope")


def _real(group: str = "cdc.sources") -> set[str]:
    """The plugins this project registers (entry points of the installed distribution)."""
    from importlib.metadata import entry_points

    return {e.name for e in entry_points(group=group)}


def test_a_plugin_that_fails_to_import_does_not_hide_the_others(monkeypatch):
    missing = ModuleNotFoundError("No module named 'redis'", name="redis")
    install(monkeypatch,
            FakeEntryPoint("cache", "sinks.cache:CacheSink", "cdc.sinks", error=missing, dist=FakeDist()),
            FakeEntryPoint("broken", "sources.broken:Broken", "cdc.sources", error=SyntaxError("bad")))

    assert set(plugins.source_plugins()) == _real()
    assert set(plugins.sink_plugins()) == _real("cdc.sinks")  # the broken one is left out
    with pytest.raises(PluginNotFoundError) as caught:
        plugins.sink_plugin("cache")
    message = str(caught.value)
    assert "sink type 'cache' is installed but cannot be loaded" in message
    assert "No module named 'redis'" in message
    assert "pip install 'cdc-framework[redis]'" in message
    with pytest.raises(PluginNotFoundError, match="SyntaxError: bad"):
        plugins.source_plugin("broken")
    # Unknown types still list what works, and say what is broken.
    with pytest.raises(PluginNotFoundError, match=", ".join(sorted(_real())) + r" \(not loadable: broken\)"):
        plugins.source_plugin("oracle")


def test_install_hint_maps_module_names_to_requirement_names(monkeypatch):
    missing = ModuleNotFoundError("No module named 'opensearchpy'", name="opensearchpy")
    install(monkeypatch, FakeEntryPoint("search", "sinks.os:Sink", "cdc.sinks", error=missing, dist=FakeDist()))
    with pytest.raises(PluginNotFoundError, match=r"pip install 'cdc-framework\[opensearch\]'"):
        plugins.sink_plugin("search")


def test_an_entry_point_that_is_not_a_plugin_class_is_reported(monkeypatch):
    install(monkeypatch, FakeEntryPoint("odd", "sources.odd:thing", "cdc.sources", obj=object()))
    assert "odd" not in plugins.source_plugins()
    with pytest.raises(PluginNotFoundError, match="is not a Source subclass"):
        plugins.source_plugin("odd")
