"""docker/grafana-dashboard.json and docker/prometheus-alerts.yaml use only metric names the
daemon's /metrics serves (a renamed metric would leave a silent panel and an alert that never fires)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from cdc.runtime.http import render_metrics

DOCKER = Path(__file__).resolve().parents[2] / "docker"
NAME = re.compile(r"\bcdc_[a-z_]+\b")


def _served() -> set[str]:
    row = {"name": "src", "kind": "source", "phase": "streaming", "events": 1, "bytes": 1, "errors": 0,
           "restarts": 0, "lag_seconds": 0.0, "retained_wal_bytes": 0, "healthy": True, "attempts": 0,
           "seconds_since_progress": 0.0, "last_error_at": None}
    return {line.split()[2] for line in render_metrics([row]).splitlines() if line.startswith("# TYPE ")}


def _exprs(node) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k in ("expr", "query", "definition") and isinstance(v, str)] + \
            [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_every_metric_the_dashboard_and_the_alerts_use_is_served():
    served = _served()
    dashboard = json.loads((DOCKER / "grafana-dashboard.json").read_text())
    rules = yaml.safe_load((DOCKER / "prometheus-alerts.yaml").read_text())
    for what, exprs in (("dashboard", _exprs(dashboard["panels"]) + _exprs(dashboard["templating"])),
                        ("alerts", [r["expr"] for g in rules["groups"] for r in g["rules"]])):
        used = {name for expr in exprs for name in NAME.findall(expr)}
        assert used, what
        assert used <= served, f"{what} uses metrics /metrics does not serve: {sorted(used - served)}"


def test_every_alert_is_complete():
    rules = yaml.safe_load((DOCKER / "prometheus-alerts.yaml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    assert len({r["alert"] for r in alerts}) == len(alerts)
    for rule in alerts:
        assert rule["expr"].strip() and rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]


def test_a_connectors_own_figures_are_served_by_name():
    """A plugin's details (a document sink's documents_written, state_rows...) are gauges of
    cdc_connector_detail; text and unset ones are left out."""
    row = {"name": "docs", "kind": "sink", "phase": "streaming", "events": 1, "bytes": 1, "errors": 0,
           "restarts": 0, "healthy": True, "attempts": 0,
           "details": {"documents_written": 7, "state_rows": 42, "state_bytes": None, "mode": "json"}}
    lines = [line for line in render_metrics([row]).splitlines() if line.startswith("cdc_connector_detail{")]
    assert lines == ['cdc_connector_detail{connector="docs",name="documents_written"} 7',
                     'cdc_connector_detail{connector="docs",name="state_rows"} 42']
