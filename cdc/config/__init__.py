"""Config files: YAML with ``${VAR}`` interpolation and ``X_file`` secrets, validated by pydantic.

    config = load_config("cdc.yaml")     # raises ConfigError listing every problem, with lines
    config.log.topic_settings()          # TopicSettings for the topics the pipeline creates
    config.sources[0]                    # the plugin's own config model (GeneratorConfig ...)

``loader`` turns YAML into data with a line per path, ``validate`` checks it against the models
(``model``) and the installed plugins' models, ``schema`` writes the JSON Schema, ``cli`` adds
``cdc validate`` and ``cdc schema``.
"""

from cdc.config.model import AppConfig, EmbeddedLogConfig, KafkaLogConfig, LogConfig
from cdc.config.validate import load_config, parse_config

__all__ = ["AppConfig", "EmbeddedLogConfig", "KafkaLogConfig", "LogConfig", "load_config", "parse_config"]
