"""Every config in examples/ is valid as it stands (``cdc validate --offline``), with the
environment its header tells the reader to load."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_an_example_config_validates(example, monkeypatch, capsys):
    for name, value in {"KAFKA_BOOTSTRAP": "127.0.0.1:9092", "PG_DSN": "postgresql://u@127.0.0.1/db",
                        "OPENSEARCH_URL": "http://127.0.0.1:9200", "REDIS_URL": "redis://127.0.0.1:6379/0",
                        "MYSQL_URL": "mysql://root@127.0.0.1:3306"}.items():
        monkeypatch.setenv(name, value)
    assert main(["validate", "--offline", str(example)]) == 0, capsys.readouterr()
    assert ": ok" in capsys.readouterr().out


def test_the_examples_are_found():
    assert {"postgres-opensearch.yaml", "postgres-opensearch-documents.yaml"} <= {p.name for p in EXAMPLES}
