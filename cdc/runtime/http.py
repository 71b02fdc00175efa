"""The daemon's HTTP face: ``/healthz``, Prometheus ``/metrics``, ``/status`` (JSON), and
``/status/report`` (what ``cdc status`` prints, see ``cdc.runtime.status_report``).

``/healthz`` answers 200 while every connector is healthy, 503 (naming the unhealthy ones) once
one has failed permanently or made no progress for its ``unhealthy_after`` seconds (blocked, or
retrying: see ``cdc.runtime.supervisor``), so an orchestrator restarts or alerts. Metric names follow Prometheus conventions; every series is
labelled with the connector's name (and kind). ``POST /connectors/<name>/<action>`` (restart,
pause, resume, rebuild) commands the supervisor, guarded as ``cdc.runtime.control`` says.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cdc.api.stats import PHASES
from cdc.config.address import parse_http_address
from cdc.errors import ConfigError
from cdc.runtime.console import Console


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _why_unhealthy(row: dict) -> str:
    """One line of /healthz for an unhealthy connector."""
    if row.get("stalled_seconds") is not None and row["stalled_seconds"] > row["unhealthy_after"]:
        why = (f"{row['consumer_lag']} records behind the log and no commit for "
               f"{row['stalled_seconds']:.0f}s")
    else:
        why = f"no progress for {row['seconds_since_progress']:.0f}s"
    return f"{row['name']}: {row['phase']}, {why}{'; ' + row['last_error'] if row.get('last_error') else ''}"


def render_metrics(rows: list[dict]) -> str:
    out = []

    def family(name: str, kind: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
            out.append(f"{name}{{{text}}} {value}")

    def field(name: str, kind: str, help_: str, key: str, of: list[tuple[dict, dict]],
              optional: bool = False) -> None:
        """One family of ``key`` in each of ``of``'s (labels, dict) pairs; ``optional``: where it is set."""
        family(name, kind, help_, [(l, d[key]) for l, d in of if not optional or d.get(key) is not None])

    ids = [({"connector": r["name"], "kind": r["kind"]}, r) for r in rows]
    field("cdc_events_total", "counter", "Change events published (sources) or written (sinks).", "events", ids)
    field("cdc_bytes_total", "counter", "Bytes of record values published or written.", "bytes", ids)
    field("cdc_errors_total", "counter", "Errors, each ending a worker process.", "errors", ids)
    field("cdc_restarts_total", "counter", "Worker restarts after retriable errors.", "restarts", ids)
    field("cdc_lag_seconds", "gauge", "Sources: 0 when caught up with the server, else now minus the commit "
                                      "time of the newest change handled; sinks: the largest topic lag.",
          "lag_seconds", ids, optional=True)
    topics = [({"connector": r["name"], "topic": t}, f) for r in rows for t, f in (r.get("topics") or {}).items()]
    field("cdc_sink_lag_records", "gauge", "Records of the topic the sink has not written yet.", "records", topics)
    field("cdc_sink_lag_seconds", "gauge", "Age of the oldest record of the topic the sink has not written "
                                           "yet (0: caught up).", "seconds", topics)
    field("cdc_retained_wal_bytes", "gauge", "WAL the source's replication slot keeps on the server.",
          "retained_wal_bytes", [({"connector": r["name"]}, r) for r in rows], optional=True)
    snapshots = [(l, r["snapshot_progress"]) for l, r in ids if r.get("snapshot_progress")]
    field("cdc_snapshot_rows", "gauge", "Rows the snapshot under way has published.", "rows", snapshots)
    field("cdc_snapshot_chunks_done", "gauge", "Chunks of the snapshot under way that are read.", "chunks_done",
          snapshots)
    field("cdc_snapshot_chunks_total", "gauge", "Chunks of the snapshot under way in all.", "chunks_total", snapshots)
    field("cdc_snapshot_eta_seconds", "gauge", "Estimated seconds until the snapshot under way is read.",
          "eta_seconds", snapshots, optional=True)
    family("cdc_phase", "gauge", "1 for the phase the connector is in, 0 for the others.",
           [({**l, "phase": p}, int(r["phase"] == p)) for l, r in ids for p in PHASES])
    family("cdc_healthy", "gauge", "1 while the connector is healthy (what /healthz checks), else 0.",
           [(l, int(r.get("healthy", True))) for l, r in ids])
    family("cdc_retry_attempts", "gauge", "Consecutive failed attempts since the last progress.",
           [(l, r.get("attempts", 0)) for l, r in ids])
    field("cdc_seconds_since_progress", "gauge", "Seconds since the connector last got work done.",
          "seconds_since_progress", ids, optional=True)
    field("cdc_sink_stalled_seconds", "gauge", "Seconds a streaming sink has been behind the log without its "
                                               "committed offsets moving (unhealthy past unhealthy_after).",
          "stalled_seconds", ids, optional=True)
    field("cdc_last_error_timestamp_seconds", "gauge", "Unix time of the last error not yet cleared by progress.",
          "last_error_at", ids, optional=True)
    family("cdc_connector_detail", "gauge", "A connector's own figures, by name (cdc status shows them too): "
                                           "e.g. a document sink's documents_written and state_rows.",
           [({"connector": r["name"], "name": k}, v) for r in rows for k, v in sorted((r.get("details") or {}).items())
            if isinstance(v, (int, float)) and not isinstance(v, bool)])
    verified = [(r["name"], r["verify"]) for r in rows if r.get("verify")]
    family("cdc_verify_mismatched_rows", "gauge", "Keys the sink's last background verify found missing, extra "
                                                  "or different in its store (cdc verify names them).",
           [({"sink": sink, "table": t}, n) for sink, v in verified for t, n in v["tables"].items()])
    family("cdc_verify_last_pass_timestamp_seconds", "gauge", "Unix time the sink's last background verify "
                                                              "ended (with an answer or not).",
           [({"sink": sink}, round(v["at"], 3)) for sink, v in verified])
    family("cdc_verify_failed", "gauge", "1 when the sink's last background verify gave no answer (see the log).",
           [({"sink": sink}, int(v["error"] is not None)) for sink, v in verified])
    return "\n".join(out) + "\n"


def serve(supervisor, address: str, token: str | None = None, report=None) -> ThreadingHTTPServer:
    """Start the server on ``host:port`` in a daemon thread; the caller shuts it down.

    An address that cannot be served (the port is taken, the host is not this machine's) is a
    ``ConfigError`` naming the ``http:`` setting: it is permanent until the config or the other
    process changes. ``report`` (a ``cdc.runtime.status_report.StatusReport``) serves
    ``/status/report``, what ``cdc status`` prints."""
    host, port = parse_http_address(address)
    console = Console(supervisor)  # the web page and its JSON: cdc/runtime/console.py

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: str | bytes, content_type: str) -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                sick = [r for r in supervisor.snapshot() if not r["healthy"]]
                body = "ok\n" if not sick else "".join(f"{_why_unhealthy(r)}\n" for r in sick)
                self._send(503 if sick else 200, body, "text/plain")
            elif path == "/metrics":
                self._send(200, render_metrics(supervisor.snapshot()),
                           "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/status":
                self._send(200, json.dumps(supervisor.snapshot(), indent=2) + "\n", "application/json")
            elif path == "/status/report" and report is not None:
                from urllib.parse import parse_qs, urlsplit

                code, answer = report.answer(parse_qs(urlsplit(self.path).query).get("name", []))
                self._send(code, json.dumps(answer) + "\n", "application/json")
            elif (answer := console.route(path)) is not None:
                code, data, content_type = answer
                self._send(code, data, content_type)
            else:
                self._send(404, "not found: try /, /healthz, /metrics or /status\n", "text/plain")

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            from cdc.runtime import control

            command = control.parse_command_path(self.path.split("?", 1)[0])
            if command is None:
                self._send(404, "not found: POST /connectors/<name>/<action>\n", "text/plain")
                return
            refused = control.authorize(host, token, self.headers.get("Authorization"))
            if refused is not None:
                self._send(*refused, "text/plain")
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length)) if length else {}
            except ValueError:
                self._send(400, "the request body is not JSON\n", "text/plain")
                return
            code, message = supervisor.control(command[1], command[0], body=body if isinstance(body, dict) else {})
            self._send(code, json.dumps({"message": message}) + "\n", "application/json")

        def log_message(self, *args: object) -> None:  # quiet: scrapes every few seconds
            pass

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as err:
        reason = err.strerror or str(err)
        raise ConfigError(f"http: {address}: cannot serve the status server there: {reason}; set `http:` in "
                          "the config file to a free host:port, or to null for no server") from None
    server.daemon_threads = True
    console.start()
    threading.Thread(target=server.serve_forever, name="cdc-http", daemon=True).start()
    return server
