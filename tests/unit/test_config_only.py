"""`load_config(..., only=...)`: the settings of connectors not asked for are not read."""

from __future__ import annotations

import pytest

from cdc.config import parse_config
from cdc.errors import ConfigError

TEXT = """
sources:
  - {name: gen, type: generator}
sinks:
  - {name: wh, type: sql, url: "${NOT_SET_ANYWHERE}", topics: [x]}
  - {name: broken, type: sql, topics: [x], unknown_key: 1}
"""


def test_a_connector_left_out_is_not_validated_nor_interpolated():
    with pytest.raises(ConfigError) as everything:
        parse_config(TEXT, env={})
    assert "NOT_SET_ANYWHERE" in str(everything.value) and "unknown_key" in str(everything.value)
    config = parse_config(TEXT, env={}, only=["gen"])
    assert [s.name for s in config.sources] == ["gen"] and config.sinks == []


def test_the_connectors_asked_for_are_still_checked():
    with pytest.raises(ConfigError) as err:
        parse_config(TEXT, env={}, only=["gen", "wh"])
    text = str(err.value)
    assert "NOT_SET_ANYWHERE" in text and "unknown_key" not in text
    assert ":5: sinks[0].url" in text  # the line and path still point at the right item
