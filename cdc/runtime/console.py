"""The console: a small web page the daemon serves at its HTTP address, and the JSON it reads.

Routes (GET; all read-only):

* ``/`` and ``/console``: the page (``console_static/``, shipped as package data: no CDN, no build).
* ``/api/connectors``: every connector's current stats (as ``/status``) with its last hour of
  samples (``cdc.runtime.history``) for the phase, lag and throughput charts.
* ``/api/dead-letters``: per dead-letter topic (``<prefix>.dead-letter.<sink>``), how many letters
  it holds and the latest ones with their reasons.
* ``/api/schemas``: per table, every shape in ``<prefix>.schema-changes`` (the versioned schema
  records), oldest first.

The last two read the log the daemon's config names. Reading a topic whole is cheap for these
small topics, but on Kafka it costs a consumer's round trips, so answers are cached for
``CACHE_S`` seconds. A log that cannot be read answers 503 with the reason, which the page shows.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from importlib import resources
from typing import TYPE_CHECKING

import orjson

from cdc.runtime.history import History
from cdc.topics import dead_letter_sink, schema_changes_topic

if TYPE_CHECKING:
    from cdc.log.base import Log

log = logging.getLogger(__name__)

CACHE_S = 3.0
LATEST_LETTERS = 20
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/console": ("index.html", "text/html; charset=utf-8"),
          "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
          "/console/console.css": ("console.css", "text/css; charset=utf-8")}


def _static(name: str) -> bytes:
    return resources.files("cdc.runtime").joinpath("console_static", name).read_bytes()


class LogView:
    """The dead-letter and schema topics of the daemon's log, read on demand and cached."""

    def __init__(self, config_path: str) -> None:
        self.config_path = config_path
        self._log: Log | None = None
        self._prefix = ""
        self._cache: dict[str, tuple[float, object]] = {}
        self._lock = threading.Lock()  # one reader at a time: a Kafka consumer is not shared

    def _open(self):
        if self._log is None:
            from cdc.config import load_config
            from cdc.log.open import open_log

            config = load_config(self.config_path)
            self._prefix = config.log.topic_prefix
            self._log = open_log(config.log)
        return self._log

    def _cached(self, what: str, compute):
        with self._lock:
            hit = self._cache.get(what)
            if hit is not None and time.monotonic() - hit[0] < CACHE_S:
                return hit[1]
            value = compute(self._open())
            self._cache[what] = (time.monotonic(), value)
            return value

    def dead_letters(self) -> list[dict]:
        def compute(log_) -> list[dict]:
            out = []
            for topic in sorted(t for t in log_.topics() if dead_letter_sink(self._prefix, t) is not None):
                letters = []
                for record in log_.read_all(topic):
                    if record.value is not None:
                        letter = orjson.loads(record.value)
                        letter.pop("value", None)  # the page shows where and why, not the payload
                        letter["letter_offset"] = record.offset
                        letters.append(letter)
                letters.sort(key=lambda letter: letter["letter_offset"])
                out.append({"topic": topic, "sink": dead_letter_sink(self._prefix, topic), "count": len(letters),
                            "latest": letters[-LATEST_LETTERS:][::-1]})
            return out
        return self._cached("dead-letters", compute)

    def schemas(self) -> list[dict]:
        def compute(log_) -> list[dict]:
            topic = schema_changes_topic(self._prefix)
            if topic not in log_.topics():
                return []
            tables: dict[tuple, dict] = {}
            for record in log_.read_all(topic):
                if record.value is None:
                    continue
                shape = orjson.loads(record.value)
                name = f"{shape.get('schema') or shape.get('db')}.{shape['table']}"
                entry = tables.setdefault((shape.get("source"), name), {
                    "source": shape.get("source"), "table": name,
                    "topic": f"{self._prefix}.{name}", "versions": {}})
                entry["versions"][shape.get("version")] = {
                    "version": shape.get("version"), "ts_ms": shape.get("ts_ms"), "ddl": shape.get("ddl"),
                    "columns": shape.get("columns", [])}
            out = []
            for key in sorted(tables, key=lambda k: (str(k[0]), k[1])):
                entry = tables[key]
                versions = sorted(entry["versions"].values(), key=lambda v: (v["version"] is None, v["version"] or 0))
                out.append({**entry, "versions": versions})
            return out
        return self._cached("schemas", compute)

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None


class Console:
    """Answers the console's routes; ``route`` returns None for a path that is not one of them."""

    def __init__(self, supervisor, history: History | None = None) -> None:
        self.supervisor = supervisor
        self.history = history or History(supervisor.snapshot)
        self.logs = LogView(supervisor.config_path)

    def start(self) -> None:
        self.history.start()

    def stop(self) -> None:
        self.history.stop()
        self.logs.close()

    def route(self, path: str) -> tuple[int, bytes, str] | None:
        if path in STATIC:
            name, content_type = STATIC[path]
            return 200, _static(name), content_type
        if path == "/api/connectors":
            rows = self.supervisor.snapshot()
            body = {"now": time.time(), "sample_interval_s": self.history.interval,
                    "connectors": [{**row, "history": self.history.series(row["name"])} for row in rows]}
            return 200, json.dumps(body).encode(), "application/json"
        if path in ("/api/dead-letters", "/api/schemas"):
            try:
                listed = self.logs.dead_letters() if path == "/api/dead-letters" else self.logs.schemas()
            except Exception as err:  # noqa: BLE001 - the page says why, the daemon goes on
                log.warning("console: cannot read the log for %s: %s", path, err)
                return 503, json.dumps({"error": f"{type(err).__name__}: {err}"}).encode(), "application/json"
            return 200, json.dumps(listed).encode(), "application/json"
        return None
