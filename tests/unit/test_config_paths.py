"""Every relative path in a config file is relative to that file, wherever the daemon starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.config import load_config


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A config file in one directory, the working directory in another."""
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    cwd = tmp_path / "somewhere-else"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return config_dir


def test_postgres_state_dir_is_relative_to_the_config_file(elsewhere):
    (elsewhere / "cdc.yaml").write_text(
        "log: {embedded: {path: ./log}}\n"
        "sources:\n"
        "  - {name: pg, type: postgres, dsn: 'postgresql://u@127.0.0.1/db', state_dir: ./state}\n"
        "  - {name: pg2, type: postgres, dsn: 'postgresql://u@127.0.0.1/db'}\n"
        "http: null\n")
    config = load_config(str(elsewhere / "cdc.yaml"))
    assert config.log.embedded.path == (elsewhere / "log").resolve()
    assert config.source("pg").state_dir == (elsewhere / "state").resolve()
    assert config.source("pg2").state_dir == (elsewhere / "cdc-state").resolve()  # the default too


def test_an_absolute_or_home_path_is_kept(elsewhere):
    (elsewhere / "cdc.yaml").write_text(
        f"sources:\n  - {{name: pg, type: postgres, dsn: 'postgresql://u@h/db', state_dir: '{elsewhere}/abs'}}\n")
    assert load_config(str(elsewhere / "cdc.yaml")).source("pg").state_dir == elsewhere / "abs"


@pytest.mark.parametrize("scheme", ["sqlite", "sqlite+pysqlite", "duckdb"])
def test_a_file_database_url_is_relative_to_the_config_file(elsewhere, scheme):
    (elsewhere / "cdc.yaml").write_text(
        f"sinks:\n  - {{name: wh, type: sql, topics: ['cdc.*'], url: '{scheme}:///data/wh.db?timeout=5'}}\n"
        f"  - {{name: mem, type: sql, topics: ['cdc.*'], url: 'sqlite:///:memory:'}}\n"
        f"  - {{name: abs, type: sql, topics: ['cdc.*'], url: 'sqlite:////var/tmp/x.db'}}\n")
    config = load_config(str(elsewhere / "cdc.yaml"))
    expected = (elsewhere / "data" / "wh.db").resolve()
    assert config.sink("wh").url.get_secret_value() == f"{scheme}:///{expected}?timeout=5"
    assert config.sink("mem").url.get_secret_value() == "sqlite:///:memory:"
    assert config.sink("abs").url.get_secret_value() == "sqlite:////var/tmp/x.db"


def test_the_schema_still_describes_the_path_fields():
    from sources.postgres.config import PostgresConfig

    schema = PostgresConfig.model_json_schema()
    assert "config file" in schema["properties"]["state_dir"]["description"]
    assert Path(schema["properties"]["state_dir"]["default"]) == Path("cdc-state")
