"""The console's routes: the page and its assets are shipped, the connectors' JSON carries their
history, an unknown path is left to the caller, and a log that cannot be read is a 503 with why."""

from __future__ import annotations

import json

from cdc.runtime.console import Console
from cdc.runtime.history import History


class Supervisor:  # the one method and attribute the console reads
    def __init__(self, config_path: str) -> None:
        self.config_path = config_path

    def snapshot(self) -> list[dict]:
        return [{"name": "src", "kind": "source", "phase": "streaming", "events": 7, "lag_seconds": 0.5}]


def test_the_page_and_its_assets_are_served(tmp_path):
    console = Console(Supervisor(str(tmp_path / "cdc.yaml")))
    for path, kind, marker in (("/", "text/html", b"/console/console.js"), ("/console", "text/html", b"<main>"),
                               ("/console/console.js", "text/javascript", b"/api/connectors"),
                               ("/console/console.css", "text/css", b"svg.chart")):
        code, body, content_type = console.route(path)
        assert code == 200 and content_type.startswith(kind) and marker in body, path
    assert console.route("/nothing-here") is None


def test_connectors_come_with_their_history(tmp_path):
    supervisor = Supervisor(str(tmp_path / "cdc.yaml"))
    history = History(supervisor.snapshot)
    history.sample(now=100.0)
    code, body, _ = Console(supervisor, history).route("/api/connectors")
    [row] = json.loads(body)["connectors"]
    assert code == 200 and row["name"] == "src" and row["events"] == 7
    assert row["history"] == [{"t": 100.0, "phase": "streaming", "lag_seconds": 0.5, "events": 7,
                               "events_per_s": None}]


def test_a_log_that_cannot_be_read_is_a_503_naming_the_reason(tmp_path):
    console = Console(Supervisor(str(tmp_path / "missing.yaml")))
    for path in ("/api/dead-letters", "/api/schemas"):
        code, body, _ = console.route(path)
        assert code == 503 and "missing.yaml" in json.loads(body)["error"], body
