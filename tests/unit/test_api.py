"""The plugin API on its own: what importing it loads, the standalone contexts a plugin built
alone has, capabilities asked for by type, and the key order every ReadableSink reads in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cdc.api import (
    IncrementalSnapshotSource,
    PermanentError,
    ReadableSink,
    SlotOwningSource,
    Source,
    SourceConfig,
    StoredRow,
    key_order,
    page,
    standalone_sink_context,
)


def test_importing_the_api_loads_nothing_of_the_runtime():
    code = ("import sys, cdc.api\n"
            "print(sorted(m for m in sys.modules if m.startswith(('cdc.', 'sources', 'sinks', 'spark_sinks', "
            "'snapshot')) and not m.startswith(('cdc.api', 'cdc.events', 'cdc.positions', 'cdc.errors', "
            "'cdc.sink_event', 'cdc.headers', 'cdc.topics', 'cdc.servers', 'cdc.units'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_sink_context_without_a_runtime_refuses_the_services_by_name():
    context = standalone_sink_context("lake")
    assert context.dead_letter_topic == "cdc.dead-letter.lake" and context.stats.name == "lake"
    assert context.log is None and context.native.copy_rows is None and context.topics_matching(["*"]) == []
    for call in (lambda: context.open_kafka_log("b:9092"), context.spark_jars,
                 lambda: context.avro_writer_schema("http://r", 1), lambda: context.schema_book(None, "p")):
        with pytest.raises(PermanentError, match="needs the runtime's context"):
            call()


class _Built(Source):
    config_model = SourceConfig
    connector = "test"

    def start(self): ...
    def poll(self, timeout): ...
    def commit(self, position): ...
    def stop(self): ...


def test_a_source_built_alone_has_a_context_whose_table_book_records_nothing():
    source = _Built(SourceConfig(name="s", type="test"), None)
    assert source.context.name == "s" and source.context.table_book.load() is None
    source.context.table_book.save(frozenset({"public.t"}))
    assert source.context.table_book.load() is None


def test_capabilities_are_declared_types():
    from sinks.redis.sink import RedisSink
    from sinks.sql.sink import SqlSink
    from sources.generator import GeneratorSource
    from sources.mysql.source import MySqlSource
    from sources.postgres.source import PostgresSource

    assert issubclass(PostgresSource, IncrementalSnapshotSource) and issubclass(PostgresSource, SlotOwningSource)
    assert issubclass(MySqlSource, IncrementalSnapshotSource) and not issubclass(MySqlSource, SlotOwningSource)
    assert not issubclass(GeneratorSource, IncrementalSnapshotSource)
    assert issubclass(SqlSink, ReadableSink) and issubclass(RedisSink, ReadableSink)


def test_key_order_compares_numbers_by_value_whatever_form_a_store_keeps_them_in():
    keys = [("10",), (9,), (None,), ("b",), ("a",), (1.5,), (b"2",), ("NaN",)]
    assert sorted(keys, key=key_order) == [(None,), (1.5,), (b"2",), (9,), ("10",), ("NaN",), ("a",), ("b",)]
    assert key_order((1, "x")) < key_order((1, "y")) < key_order((2, "a"))
    assert key_order(("42",)) == key_order((42,))


def test_page_sorts_then_takes_the_keys_after_a_key():
    rows = [StoredRow((k,), {"id": k}) for k in (3, 11, 2, 7)]
    assert [r.key for r in page(rows, None, None)] == [(2,), (3,), (7,), (11,)]
    assert [r.key for r in page(rows, ("3",), 2)] == [(7,), (11,)]
    assert page(rows, (11,), None) == []
