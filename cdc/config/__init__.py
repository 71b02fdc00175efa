"""Config files: YAML with ``${VAR}`` interpolation and ``X_file`` secrets, validated by pydantic.

    config = load_config("cdc.yaml")     # raises ConfigError listing every problem, with lines
    config.log.topic_settings()          # TopicSettings for the topics the pipeline creates
    config.sources[0]                    # the plugin's own config model (GeneratorConfig ...)

``loader`` turns YAML into data with a line per path, ``validate`` checks it against the models
(``model``) and the installed plugins' models, ``schema`` writes the JSON Schema, ``cli`` adds
``cdc validate`` and ``cdc schema``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdc.config.model import AppConfig, EmbeddedLogConfig, KafkaLogConfig, LogConfig
    from cdc.config.validate import load_config, parse_config

__all__ = ["AppConfig", "EmbeddedLogConfig", "KafkaLogConfig", "LogConfig", "load_config", "parse_config"]

_HOMES = {"AppConfig": "model", "EmbeddedLogConfig": "model", "KafkaLogConfig": "model",
          "LogConfig": "model", "load_config": "validate", "parse_config": "validate"}


def __getattr__(name: str) -> Any:
    # Imported on first use: the models pull in pydantic and every plugin's config, which the
    # light parts of this package (``loader``, ``interpolate``, ``address``) and ``cdc status``'s
    # fast path must not pay for.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"cdc.config.{home}"), name)
    globals()[name] = value
    return value
