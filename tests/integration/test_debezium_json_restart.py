"""debezium-json after a restart: the first rows of a resumed stream carry the table's real
Connect schema (Decimal, Date ...), not one guessed from values (a guard: the MySQL source
publishes its shapes again at start, and the runner also reads back those it published before)."""

from __future__ import annotations

import orjson
import pytest

from cdc.log.base import TopicSettings
from cdc.log.embedded import EmbeddedLog
from cdc.offsets import OffsetStore
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


def _state(log, topic: str) -> dict:
    """key -> latest row, from either format, as the sink runtime decodes records."""
    from cdc.sink_events import decode_record

    rows: dict = {}
    if topic not in log.topics():
        return rows
    for record in sorted(log.read_all(topic), key=lambda r: (r.partition, r.offset)):
        event = decode_record(record)
        key = orjson.dumps(event.key)
        if event.op is None or event.op.value == "d":
            rows.pop(key, None)
        else:
            rows[key] = event.after
    return rows


@pytest.mark.postgres
def test_a_snapshot_taken_again_deletes_rows_gone_in_between_in_debezium_json(pg_dsn, tmp_path):
    """The runner's search for rows an earlier snapshot left (cdc/runtime/stale_rows.py) reads the
    topic: it must understand the format it wrote, or it takes every row for stale (or fails)."""
    from tests.integration.pg_capture import execute as pg_execute

    pg_execute(pg_dsn, "CREATE TABLE t (id int PRIMARY KEY, d date)",
               "INSERT INTO t SELECT g, '2024-01-01'::date + g FROM generate_series(1, 5) g")
    log = EmbeddedLog(tmp_path / "log", TopicSettings())
    config = pg_config(pg_dsn, tmp_path)
    capture = DebeziumCapture(config, log, "rs").start()
    try:
        wait_until(lambda: len(_state(log, "rs.public.t")) == 5, capture=capture)
    finally:
        capture.stop()
    OffsetStore(log, "rs").reset(config.name)  # as if the first run died before its snapshot's end was stored
    pg_execute(pg_dsn, "DELETE FROM t WHERE id = 3")
    capture = DebeziumCapture(config, log, "rs").start()
    try:
        wait_until(lambda: capture.source.phase == "streaming", capture=capture)
        wait_until(lambda: {orjson.loads(k)["id"] for k in _state(log, "rs.public.t")} == {1, 2, 4, 5},
                   what="key 3 deleted, the others kept", capture=capture)
    finally:
        capture.stop()
    assert _state(log, "rs.public.t")[b'{"id":1}'] == {"id": 1, "d": "2024-01-02"}
