"""``DeltaSink.run`` when ``stop()`` came during the rebuild before the query (spark_sinks/delta.py).
Pure logic: ``start`` is replaced by what the real one leaves then (the job made, no query), so
no Spark session is needed; tests/integration/test_spark_delta_sink.py runs the real one."""

from __future__ import annotations

import threading

from cdc.api import standalone_sink_context
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from spark_sinks.job import DeltaJob


class _StoppedBeforeTheQuery(DeltaSink):
    def start(self, session=None, *, before_query=None) -> None:
        # The real start() returns so when stop() came while before_query (the rebuild) ran.
        self.job = DeltaJob(self.config, bootstrap_servers="127.0.0.1:9", prefix="p", context=self.context)


def test_a_stop_during_the_rebuild_ends_the_run_as_stopped(tmp_path):
    config = DeltaSinkConfig.model_validate({"name": "lake", "type": "delta", "topics": ["p.*"],
                                             "path": str(tmp_path / "d"), "checkpoint": str(tmp_path / "c")})
    sink = _StoppedBeforeTheQuery(config)
    sink.attach(standalone_sink_context("lake", "p"))
    sink.request_rebuild()
    reports: list[str] = []
    sink.run(threading.Event(), report=lambda stats: reports.append(stats.phase))
    assert reports == ["stopped"]
