"""From a parsed config file to a typed ``AppConfig``, collecting every problem on the way.

The top-level sections are validated against ``AppConfig``; each source and sink item against
the ``config_model`` of the plugin its ``type`` names, one item at a time, so one bad item never
hides the problems of the next. Every pydantic error is mapped back to the file's line through the
paths the loader recorded. Only when nothing at all is wrong is an ``AppConfig`` built.

Secrets from files: in a source or sink, ``X_file: /path`` sets the field ``X`` to the contents of
that file (trailing newlines stripped), when the plugin's model has a field ``X`` and no field
``X_file`` of its own. A relative path is taken from the config file's directory.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Collection, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from cdc import plugins
from cdc.config.loader import Document, read_yaml
from cdc.config.loader import Path as DataPath
from cdc.config.model import AppConfig
from cdc.errors import ConfigError, ConfigProblem, PluginNotFoundError

_MISSING = object()
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
                only: Collection[str] | None = None) -> AppConfig:
    """Read, interpolate and validate the config file at ``path``.

    Raises ``ConfigError`` listing every problem in the file (each with file, line and path).
    ``env`` replaces ``os.environ`` for ``${VAR}`` references. ``only``: keep just the sources and
    sinks of these names; the others are neither validated nor interpolated (a variable only
    another connector uses may be unset), and are left out of the result.
    """
    return load_config_with_lines(path, env=env, only=only)[0]


def load_config_with_lines(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
                           only: Collection[str] | None = None) -> tuple[AppConfig, Document]:
    """``load_config``, with the parsed file: where each path of the config was written, for
    problems found later (cdc/config/shapes.py)."""
    file = os.fspath(path)
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError([ConfigProblem(file, None, "", f"cannot read the file: {reason}")]) from None
    return _parse(text, file=file, base_dir=Path(file).parent, env=env, only=only)


def parse_config(text: str, *, file: str = "<config>", base_dir: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None, only: Collection[str] | None = None) -> AppConfig:
    """Like ``load_config`` for text already read; relative paths are taken from ``base_dir``
    (default: the current directory)."""
    return _parse(text, file=file, base_dir=base_dir, env=env, only=only)[0]


def _parse(text: str, *, file: str, base_dir: str | os.PathLike[str] | None, env: Mapping[str, str] | None,
           only: Collection[str] | None) -> tuple[AppConfig, Document]:
    doc = read_yaml(text, file, os.environ if env is None else env)
    skipped = _others(doc, only)
    doc.problems = [p for p in doc.problems if p[0][:2] not in skipped]
    config = _Builder(doc, Path(base_dir if base_dir is not None else ".").absolute(), skipped).build()
    if doc.problems or config is None:
        problems = [ConfigProblem(file, line, format_path(path), message)
                    for path, line, message in doc.problems]
        problems.sort(key=lambda p: (p.line is not None, p.line or 0))
        raise ConfigError(problems or [ConfigProblem(file, None, "", "invalid config")])
    return config, doc


def _others(doc: Document, only: Collection[str] | None) -> set[tuple]:
    """Paths (``("sinks", 2)``) of the connectors ``only`` leaves out."""
    if only is None or not isinstance(doc.data, dict):
        return set()
    out = set()
    for key in ("sources", "sinks"):
        items = doc.data.get(key)
        if isinstance(items, list):
            out |= {(key, i) for i, item in enumerate(items) if isinstance(item, dict) and item.get("name") not in only}
    return out


def format_path(path: DataPath) -> str:
    """``("sources", 0, "slot")`` -> ``sources[0].slot``; odd keys are quoted: ``producer['linger.ms']``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]"
    return out


class _Builder:
    def __init__(self, doc: Document, base_dir: Path, skipped: AbstractSet[tuple] = frozenset()) -> None:
        self.doc = doc
        self.skipped = skipped
        self.base_dir = base_dir
        self.context = {"base_dir": base_dir}

    def build(self) -> AppConfig | None:
        data = self.doc.data
        if data is None and self.doc.problems:
            return None  # the YAML itself is broken: nothing to validate
        if not isinstance(data, dict):
            self.doc.problem((), "the file must be a mapping of sections: log, sources, sinks, http")
            return None
        top = {key: value for key, value in data.items() if key not in ("sources", "sinks")}
        self.validate(AppConfig, top, ())
        sources = self.items("sources", "source", plugins.source_plugin)
        sinks = self.items("sinks", "sink", plugins.sink_plugin)
        self.check_unique_names()
        if self.doc.problems:
            return None
        return self.validate(AppConfig, {**top, "sources": sources, "sinks": sinks}, ())

    def items(self, key: str, kind: str, lookup: Callable[[str], Any]) -> list[BaseModel]:
        raw = self.doc.data.get(key)
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.doc.problem((key,), f"must be a list of {kind}s")
            return []
        validated: list[BaseModel] = []
        for index, item in enumerate(raw):
            path: DataPath = (key, index)
            if path in self.skipped:
                continue
            if not isinstance(item, dict):
                self.doc.problem(path, f"each {kind} must be a mapping with at least name and type")
                continue
            type_name = item.get("type", _MISSING)
            if type_name is _MISSING or not isinstance(type_name, str):
                what = "missing" if type_name is _MISSING else "must be a string"
                self.doc.problem(path + ("type",), f"{what}: the {kind} plugin to use ({_installed(kind)})")
                continue
            try:
                plugin = lookup(type_name)
            except PluginNotFoundError as err:
                self.doc.problem(path + ("type",), err.problems[0].message)
                continue
            model = plugin.config_model
            config = self.validate(model, self.read_secret_files(model, item, path), path)
            if config is not None:
                validated.append(config)
                self.check_format(plugin, path)
        return validated

    def check_format(self, plugin: Any, path: DataPath) -> None:
        """A sink that reads the topics itself (past the runtime's decoding) must read the log's
        format; the runtime would refuse to start it (``cdc.runtime.worker``), so say it now."""
        from cdc.api import SelfDrivenSink

        if not (isinstance(plugin, type) and issubclass(plugin, SelfDrivenSink)):
            return
        log = self.doc.data.get("log")
        fmt = log.get("format", "json") if isinstance(log, dict) else "json"
        if isinstance(fmt, str) and fmt not in plugin.formats:
            self.doc.problem(path + ("type",), f"this sink reads the topics itself and cannot read log.format "
                                               f"{fmt}: it reads {', '.join(plugin.formats)}")

    def read_secret_files(self, model: type[BaseModel], item: dict[str, Any], path: DataPath) -> dict[str, Any]:
        """``item`` with every ``X_file: path`` replaced by ``X: <the file's contents>``."""
        fields = _input_keys(model)
        out = dict(item)
        for key, file_value in item.items():
            if not (isinstance(key, str) and key.endswith("_file")) or key in fields:
                continue
            target = key.removesuffix("_file")
            if target not in fields:
                continue  # not a secret file: validation reports the unknown key
            del out[key]
            key_path, target_path = path + (key,), path + (target,)
            line = self.doc.line_of(key_path)  # the key's own line, else its mapping's
            if line is not None:
                self.doc.lines[target_path] = line
            if target in item:
                self.doc.problem(key_path, f"give {target} or {key}, not both")
            elif self.doc.is_tainted(key_path):
                pass  # its ${VAR} already failed
            elif not isinstance(file_value, str) or not file_value:
                self.doc.problem(key_path, "must be the path of a file")
            else:
                secret_path = Path(file_value).expanduser()
                if not secret_path.is_absolute():
                    secret_path = self.base_dir / secret_path
                try:
                    out[target] = secret_path.read_text(encoding="utf-8").rstrip("\r\n")
                    continue
                except (OSError, UnicodeDecodeError) as err:
                    reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
                    self.doc.problem(key_path, f"cannot read secret file {secret_path}: {reason}")
            self.doc.tainted.add(target_path)  # "field required" for it would only repeat this
        return out

    def validate(self, model: type[BaseModel], data: Any, path: DataPath) -> Any:
        try:
            return model.model_validate(data, context=self.context)
        except ValidationError as err:
            by_path: dict[DataPath, list[str]] = {}
            for error in err.errors(include_url=False, include_input=False):
                where = self.trim(path + tuple(error["loc"]))
                if not self.doc.is_tainted(where):
                    message = _message(error, model, error["loc"])
                    if message not in by_path.setdefault(where, []):
                        by_path[where].append(message)
            for where, messages in by_path.items():
                self.doc.problem(where, "; ".join(messages))
            return None

    def trim(self, loc: tuple[Any, ...]) -> DataPath:
        """The part of a pydantic error location that names places in the file's data.

        Pydantic appends union member names (``int``, ``str``) and validator tags to locations;
        they stop where the data is a plain value. A missing key is kept: it is what is missing.
        """
        node: Any = self.doc.data
        out: list[str | int] = []
        for segment in loc:
            if isinstance(node, dict):
                out.append(segment)
                node = node.get(segment, _MISSING)
            elif isinstance(node, list) and isinstance(segment, int):
                out.append(segment)
                node = node[segment] if 0 <= segment < len(node) else _MISSING
            else:
                break
        return tuple(out)

    def check_unique_names(self) -> None:
        first: dict[str, DataPath] = {}
        for key in ("sources", "sinks"):
            items = self.doc.data.get(key)
            for index, item in enumerate(items if isinstance(items, list) else []):
                name = item.get("name") if isinstance(item, dict) else None
                if not isinstance(name, str):
                    continue
                if name in first:
                    self.doc.problem((key, index, "name"), f"duplicate name {name!r}: "
                                     f"{format_path(first[name][:2])} has it too; names must be unique "
                                     "across sources and sinks")
                else:
                    first[name] = (key, index, "name")


def _installed(kind: str) -> str:
    found = plugins.source_plugins() if kind == "source" else plugins.sink_plugins()
    return f"installed: {', '.join(sorted(found)) or 'none'}"


def _input_keys(model: type[BaseModel]) -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        keys.add(name)
        if isinstance(field.alias, str):
            keys.add(field.alias)
        if isinstance(field.validation_alias, str):
            keys.add(field.validation_alias)
    return keys


def _message(error: Mapping[str, Any], model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    if error["type"] == "extra_forbidden":
        key = loc[-1] if loc else "?"
        message = f"unknown key {key!r}"
        known = _keys_of_section(model, loc[:-1])
        close = difflib.get_close_matches(str(key), known, n=1) if known else []
        return f"{message}; did you mean {close[0]!r}?" if close else message
    if error["type"] == "missing":
        return "required field is missing"
    return str(error["msg"]).removeprefix("Value error, ")


def _keys_of_section(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the mapping at ``loc`` inside ``model``, for "did you mean"."""
    current: Any = model
    for segment in loc:
        if isinstance(segment, int):
            continue
        field = current.model_fields.get(segment) or next(
            (f for f in current.model_fields.values() if f.alias == segment), None)
        current = _model_in(field.annotation) if field is not None else None
        if current is None:
            return []
    return sorted(_input_keys(current))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
