"""``scale_out: group`` (a sink's processes share its topics as one Kafka consumer group) needs a log
with consumer groups: with the embedded log it is refused with a typed error naming the sink, and
single-process running stays the default."""

from __future__ import annotations

import pytest

from cdc.api import SinkConfig
from cdc.config import parse_config
from cdc.errors import ConfigError
from cdc.log.embedded import EmbeddedLog
from cdc.runtime.sink_runner import SinkRunner
from tests.integration.test_sink_runner import RecordingSink


def _text(log: str, scale_out: str | None) -> str:
    extra = f", scale_out: {scale_out}" if scale_out else ""
    return (f"{log}sinks:\n  - {{name: wh, type: sql, url: 'sqlite:///x.db', topics: ['cdc.*']{extra}}}\n"
            "http: null\n")


def test_the_default_is_one_process():
    config = parse_config(_text("", None))
    assert config.sinks[0].scale_out == "single"


def test_group_with_the_embedded_log_is_a_config_error_naming_the_sink():
    with pytest.raises(ConfigError) as caught:
        parse_config(_text("", "group"))
    assert "wh" in str(caught.value) and "scale_out: group" in str(caught.value)
    assert "embedded" in str(caught.value)


def test_group_with_kafka_is_accepted():
    config = parse_config(_text("log:\n  kafka: {bootstrap_servers: 'localhost:9092'}\n", "group"))
    assert config.sinks[0].scale_out == "group"


def test_an_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="scale_out"):
        parse_config(_text("log:\n  kafka: {bootstrap_servers: 'localhost:9092'}\n", "members"))


def test_a_runner_refuses_group_on_a_log_without_groups(tmp_path):
    log = EmbeddedLog(tmp_path / "log")
    try:
        config = SinkConfig(name="rec", type="recording", topics=["p.*"], scale_out="group")
        with pytest.raises(ConfigError, match="consumer groups"):
            SinkRunner(RecordingSink(config), log, "p")
    finally:
        log.close()


def test_a_self_driven_sink_refuses_group(tmp_path):
    """A Spark sink consumes the topics with its own machinery and scales with its executors."""
    from cdc.config import load_config
    from cdc.runtime.worker import build_runner

    path = tmp_path / "cdc.yaml"
    path.write_text("log:\n  kafka: {bootstrap_servers: 'localhost:9092'}\n"
                    f"sinks:\n  - {{name: lake, type: delta, topics: ['cdc.*'], path: '{tmp_path / 'delta'}', "
                    f"checkpoint: '{tmp_path / 'ck'}', scale_out: group}}\nhttp: null\n")
    with pytest.raises(ConfigError, match="scales out its own way"):
        build_runner(load_config(path), "lake")
