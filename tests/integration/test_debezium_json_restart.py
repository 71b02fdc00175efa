"""debezium-json after a restart: the first rows of a resumed stream carry the table's real
Connect schema (Decimal, Date ...), not one guessed from values (a guard: the MySQL source
publishes its shapes again at start, and the runner also reads back those it published before)."""

from __future__ import annotations

import orjson
import pytest

from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.offsets import OffsetStore
from cdc.plugins import source_plugin
from cdc.runtime.runner import SourceRunner
from tests.integration.pg_capture import Capture, pg_config, wait_until
from tests.integration.test_mysql_source import execute, mysql_config

pytestmark = pytest.mark.mysql


class DebeziumCapture(Capture):
    def __init__(self, config, log, prefix):
        super().__init__(config, log, prefix)
        self.runner = SourceRunner(self.source, log, self.offsets, prefix, TopicSettings(), offset_interval=0.2,
                                   log_format="debezium-json")


def _after_schema(record) -> dict:
    value = orjson.loads(record.value)
    after = next(f for f in value["schema"]["fields"] if f["field"] == "after")
    return {f["field"]: f for f in after["fields"]}


def test_rows_after_a_restart_have_the_published_schema(mysql_url, mysql_db, tmp_path):
    execute(mysql_url, mysql_db, "CREATE TABLE t (id INT PRIMARY KEY, price DECIMAL(10,2), d DATE)",
            "INSERT INTO t VALUES (1, 1.50, '2024-01-02')")
    log = EmbeddedLog(tmp_path / "log", TopicSettings())
    topic = f"p.{mysql_db}.t"
    config = mysql_config(mysql_url, mysql_db)
    capture = DebeziumCapture(config, log, "p").start()
    try:
        wait_until(lambda: topic in log.topics() and log.read_all(topic), what="the snapshot row", capture=capture)
    finally:
        capture.stop()
    shapes_before = len(log.read_all("p.schema-changes"))
    execute(mysql_url, mysql_db, "INSERT INTO t VALUES (2, 2.25, '2024-03-04')")
    capture = DebeziumCapture(config, log, "p").start()
    try:
        wait_until(lambda: len(log.read_all(topic)) >= 2, what="the streamed row", capture=capture)
    finally:
        capture.stop()
    records = [r for r in log.read_all(topic) if r.value is not None]
    fields = _after_schema(records[-1])
    assert fields["price"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert fields["d"]["name"] == "io.debezium.time.Date"
    assert orjson.loads(records[-1].value)["payload"]["after"]["d"] == 19786
    # whether or not the source published the shape again, the row names a shape the topic holds
    assert len(log.read_all("p.schema-changes")) >= shapes_before
