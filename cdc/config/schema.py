"""The JSON Schema of a config file, with the models of the installed plugins, for editors.

``sources`` and ``sinks`` items are a ``oneOf`` of the plugins' config models, discriminated on
``type`` (the entry point name). Secret fields (``SecretStr``, ``format: password``) also accept
their ``X_file`` form, as the loader does. Two limits: a ``${VAR}`` in a number or boolean field
is valid for ``cdc validate`` but not for the schema, and the schema only knows the plugins
installed where it was generated.
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

from pydantic import BaseModel, create_model
from pydantic.json_schema import models_json_schema

from cdc import plugins
from cdc.config.model import AppConfig

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def config_json_schema() -> dict[str, Any]:
    sources = {name: _typed(cls.config_model, name) for name, cls in sorted(plugins.source_plugins().items())}
    sinks = {name: _typed(cls.config_model, name) for name, cls in sorted(plugins.sink_plugins().items())}
    every: list[type[BaseModel]] = [AppConfig, *sources.values(), *sinks.values()]
    entries: list[tuple[type[BaseModel], Literal["validation"]]] = [(model, "validation") for model in every]
    refs, schema = models_json_schema(entries, ref_template="#/$defs/{model}")
    defs = schema["$defs"]
    root = defs.pop(_def_name(refs[(AppConfig, "validation")]))
    for section, models in (("sources", sources), ("sinks", sinks)):
        mapping = {name: refs[(model, "validation")]["$ref"] for name, model in models.items()}
        for ref in mapping.values():
            _add_secret_files(defs[_def_name({"$ref": ref})])
        items: dict[str, Any] = {"oneOf": [{"$ref": ref} for ref in mapping.values()],
                                 "discriminator": {"propertyName": "type", "mapping": mapping}}
        if not mapping:
            items = {"not": {}, "description": f"no {section} plugins are installed"}
        root["properties"][section]["items"] = items
    return {"$schema": DIALECT, **root, "title": "cdc config file", "$defs": _reachable(root, defs)}


def _typed(model: type[BaseModel], type_name: str) -> type[BaseModel]:
    """``model`` with ``type: Literal[type_name]``, which a discriminated union needs."""
    field = model.model_fields.get("type")
    if field is not None and get_args(field.annotation) == (type_name,):
        return model
    return create_model(model.__name__, __base__=model, __doc__=model.__doc__,
                        # a Literal made at run time, which mypy cannot read as a type
                        type=(Literal[type_name], type_name))  # type: ignore[arg-type]


def _def_name(ref: dict[str, str]) -> str:
    return ref["$ref"].rsplit("/", 1)[-1]


def _is_secret(prop: dict[str, Any]) -> bool:
    return prop.get("format") == "password" or any(_is_secret(p) for p in prop.get("anyOf", []))


def _add_secret_files(model_schema: dict[str, Any]) -> None:
    properties = model_schema.get("properties", {})
    required = set(model_schema.get("required", [])) | {"type"}  # the loader picks the plugin by it
    rules: list[dict[str, Any]] = []
    for name, prop in list(properties.items()):
        file_key = f"{name}_file"
        if not _is_secret(prop) or file_key in properties:
            continue
        properties[file_key] = {"type": "string", "title": file_key,
                                "description": f"path of a file holding {name} (trailing newline dropped)"}
        rules.append({"not": {"required": [name, file_key]}})
        if name in required:
            required.discard(name)
            rules.append({"anyOf": [{"required": [name]}, {"required": [file_key]}]})
    model_schema["required"] = sorted(required)
    if rules:
        model_schema["allOf"] = model_schema.get("allOf", []) + rules


def _reachable(root: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The definitions ``root`` refers to, directly or not (the base SourceConfig/SinkConfig go)."""
    keep: set[str] = set()
    pending = [root]
    while pending:
        text = json.dumps(pending.pop())
        for name in defs:
            if name not in keep and f'"#/$defs/{name}"' in text:
                keep.add(name)
                pending.append(defs[name])
    return {name: defs[name] for name in sorted(keep)}
