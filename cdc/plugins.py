"""Finding source and sink plugins through entry points.

A plugin is a class registered under the ``cdc.sources`` or ``cdc.sinks`` entry point group; the
entry point's name is the ``type`` a config file uses::

    [project.entry-points."cdc.sources"]
    generator = "sources.generator:GeneratorSource"

Plugins are imported once, on first use, and cached; asking for one type imports that plugin
alone (a config of a SQL sink does not pay for importing Spark). A plugin whose import fails (typically an
optional dependency that is not installed) does not hide the others: it is left out of
``source_plugins()`` / ``sink_plugins()``, and only asking for that type by name raises, with the
import error and, when the plugin's distribution says which extra provides the missing module,
the ``pip install`` command that fixes it.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from cdc.api import Sink, SinkConfig, Source, SourceConfig
from cdc.errors import ConfigProblem, PluginNotFoundError

log = logging.getLogger(__name__)

SOURCE_GROUP = "cdc.sources"
SINK_GROUP = "cdc.sinks"

_KINDS = {SOURCE_GROUP: ("source", Source, SourceConfig), SINK_GROUP: ("sink", Sink, SinkConfig)}
_NOT_AN_EXTRA = {"all", "test", "tests", "dev", "docs"}


@dataclass(frozen=True, slots=True)
class _Discovered:
    plugins: dict[str, type]
    broken: dict[str, str]  # type name -> why it cannot be used (import error and install hint)


def source_plugins() -> dict[str, type[Source]]:
    """Every source plugin that imports cleanly, by ``type`` name."""
    return dict(_discover(SOURCE_GROUP).plugins)


def sink_plugins() -> dict[str, type[Sink]]:
    """Every sink plugin that imports cleanly, by ``type`` name."""
    return dict(_discover(SINK_GROUP).plugins)


def source_plugin(type_name: str) -> type[Source]:
    """The source class for ``type_name``; ``PluginNotFoundError`` if none can be used."""
    return _lookup(SOURCE_GROUP, type_name)


def sink_plugin(type_name: str) -> type[Sink]:
    """The sink class for ``type_name``; ``PluginNotFoundError`` if none can be used."""
    return _lookup(SINK_GROUP, type_name)


def sink_class(config: Any) -> type[Sink]:
    """The class that keeps the store of ``config`` (a sink's config): its plugin's
    ``Sink.class_for``."""
    return sink_plugin(config.type).class_for(config)


def clear_cache() -> None:
    """Forget what was discovered (for tests that change the installed entry points)."""
    _discover.cache_clear()
    _loaded.clear()


def _lookup(group: str, type_name: str) -> Any:
    named = [ep for ep in entry_points(group=group) if ep.name == type_name]
    if named:
        if len(named) > 1:
            log.warning("%s type %r is registered twice; using the first (not %s)", _KINDS[group][0],
                        type_name, named[1].value)
        loaded = _load(group, named[0])
        if not isinstance(loaded, str):
            return loaded
        found = _Discovered({}, {type_name: loaded})
    else:
        found = _discover(group)
    kind = _KINDS[group][0]
    if type_name in found.broken:
        message = f"{kind} type {type_name!r} is installed but cannot be loaded: {found.broken[type_name]}"
    else:
        installed = ", ".join(sorted(found.plugins)) or "none"
        message = f"unknown {kind} type {type_name!r}; installed: {installed}"
        if found.broken:
            message += f" (not loadable: {', '.join(sorted(found.broken))})"
    raise PluginNotFoundError([ConfigProblem("<config>", None, "type", message)], message=message)


@functools.cache
def _discover(group: str) -> _Discovered:
    kind, base, config_base = _KINDS[group]
    plugins: dict[str, type] = {}
    broken: dict[str, str] = {}
    for ep in entry_points(group=group):
        if ep.name in plugins or ep.name in broken:
            log.warning("%s type %r is registered twice; using the first (not %s)", kind, ep.name, ep.value)
            continue
        loaded = _load(group, ep)
        if isinstance(loaded, str):
            broken[ep.name] = loaded
        else:
            plugins[ep.name] = loaded
    return _Discovered(plugins, broken)


_loaded: dict[tuple[str, str, str], type | str] = {}


def _load(group: str, ep: Any) -> type | str:
    """The plugin class, or why it cannot be used; once per entry point."""
    key = (group, ep.name, ep.value)
    if key not in _loaded:
        _loaded[key] = _import(group, ep)
    return _loaded[key]


def _import(group: str, ep: Any) -> type | str:
    kind, base, config_base = _KINDS[group]
    try:
        cls = ep.load()
    except Exception as err:  # noqa: BLE001 - any import failure must not hide the other plugins
        reason = f"{type(err).__name__}: {err}"
        hint = _install_hint(ep, err)
        log.debug("%s plugin %r (%s) failed to import: %s", kind, ep.name, ep.value, reason)
        return f"{reason}; install it with: {hint}" if hint else reason
    model = getattr(cls, "config_model", None)
    if not (isinstance(cls, type) and issubclass(cls, base)
            and isinstance(model, type) and issubclass(model, config_base)):
        return (f"{ep.value} is not a {base.__name__} subclass with a "
                f"config_model derived from {config_base.__name__}")
    return cls


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "", name).lower()


def _install_hint(ep: Any, err: BaseException) -> str | None:
    """``pip install 'dist[extra]'`` for the extra that provides the module that failed to import.

    The extra is the one whose requirement is named like the missing module (``redis`` ->
    ``redis``, ``opensearchpy`` -> ``opensearch-py``, ``delta`` -> ``delta-spark``); failing
    that, an extra named like the plugin type itself.
    """
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    try:
        dist_name = dist.metadata["Name"]
        requires = dist.requires or []
        extras = set(dist.metadata.get_all("Provides-Extra") or [])
    except Exception:  # noqa: BLE001 - a hint is a nicety; broken metadata must not make it worse
        return None
    missing = getattr(err, "name", None) if isinstance(err, ImportError) else None
    if missing:
        module = _normalize(missing.split(".")[0])
        for requirement in requires:
            spec, _, marker = requirement.partition(";")
            extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
            name = re.match(r"\s*([A-Za-z0-9._-]+)", spec)
            if not extra or not name or extra.group(1) in _NOT_AN_EXTRA:
                continue
            requirement_name = _normalize(name.group(1))
            if requirement_name == module or requirement_name.startswith(module):
                return f"pip install '{dist_name}[{extra.group(1)}]'"
    if ep.name in extras:
        return f"pip install '{dist_name}[{ep.name}]'"
    return None
