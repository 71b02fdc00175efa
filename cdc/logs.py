"""Logging set-up: every record carries the connector and its phase.

Modules log through ``logging.getLogger(__name__)`` and pass ``extra={"connector": ..., "phase":
...}`` (the runner does); in a worker process, records without them get the worker's connector and
its current phase (a plugin's own records too); elsewhere they show ``-``, so third-party records
format too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

FORMAT = "%(asctime)s %(levelname)s [%(connector)s/%(phase)s] %(name)s: %(message)s"


class _Defaults(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for attr in ("connector", "phase"):
            if not hasattr(record, attr):
                setattr(record, attr, "-")
        return True


def setup(level: int = logging.INFO, connector: str | None = None,
          phase: Callable[[], str] | None = None) -> None:
    """Configure the root logger once per process (a worker passes its connector name, and how
    to read its current phase)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(_Defaults())
    if connector:
        class _Connector(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                if not hasattr(record, "connector"):
                    record.connector = connector
                if not hasattr(record, "phase") and phase is not None:
                    record.phase = phase()
                return True
        handler.addFilter(_Connector())
        handler.filters.reverse()  # the connector default first, then the generic one
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("py4j", "kafka", "urllib3", "opensearch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
