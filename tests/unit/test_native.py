"""The one switch between compiled and reference code (cdc/native.py): ``reference()`` turns every
compiled path off in this process and back on after, and ``CDC_NATIVE=0`` loads none at all, so
the framework runs as an installation built without a compiler."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cdc import native

needs_c = pytest.mark.skipif(native.load("cdc._encode") is None, reason="not built, or CDC_NATIVE=0")


def test_reference_turns_the_switch_off_for_its_block_and_nests():
    was = native.enabled()
    with native.reference():
        assert not native.enabled()
        with native.reference():
            assert not native.enabled()
        assert not native.enabled()
    assert native.enabled() == was


def test_reference_restores_the_switch_when_its_block_fails():
    was = native.enabled()
    with pytest.raises(KeyError), native.reference():
        raise KeyError("x")
    assert native.enabled() == was


def test_a_module_that_was_not_built_loads_as_none():
    assert native.load("cdc._no_such_extension") is None


@needs_c
def test_choose_runs_the_compiled_or_the_reference_code():
    with native.choose(True):
        assert native.enabled()
    with native.choose(False):
        assert not native.enabled()


# The modules with a compiled twin or part, and what each holds of it: all None under CDC_NATIVE=0.
LOADED = {"cdc.serde": "_encode", "cdc.sink_events": "_decode", "cdc.schema_order": "_decode",
          "cdc.log.packed_headers": "_records", "cdc.log.kafka_reader": "_records",
          "cdc.log.kafka_writer": "_records", "cdc.runtime.contexts": "_COPYTEXT", "cdc.bulk_window": "_window", "cdc.log.kafka_bulk": "_rdconsume",
          "cdc.log.block_producer": "_rdproduce", "sinks.opensearch.lines": "_lines",
          "sinks.opensearch.documents": "_lines", "sources.mysql.c_decoder": "_rowdecode",
          "sources.postgres.copy_json": "_copyjson"}


@needs_c
@pytest.mark.parametrize("setting", ["0", "off"])
def test_cdc_native_off_loads_nothing_compiled(setting):
    script = ("import importlib, sys\n"
              f"loaded = {LOADED!r}\n"
              "held = {m: getattr(importlib.import_module(m), a) is not None for m, a in loaded.items()}\n"
              "from cdc import bulk_window, native\n"
              "from cdc.runtime.contexts import native_codecs\n"
              "print(held, native.enabled(), bulk_window.available(), native_codecs())\n"
              "assert not any(held.values()) and not native.enabled() and not bulk_window.available()\n"
              "assert native_codecs().copy_rows is None\n"
              "assert [m for m in sys.modules if m.rpartition('.')[2] in set(loaded.values())] == []\n")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "CDC_NATIVE": setting},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr



class Tripwire:
    """Stands for a compiled module: any use of it fails the test."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the compiled {name} ran under native.reference()")


def _calls():
    """(module, attribute holding its extension, a call through its hot path) for every call site."""
    from cdc import bulk_window, schema_order, serde, sink_events
    from cdc.events import ChangeEvent, Op, TableId
    from cdc.log import block_producer, kafka_bulk, kafka_reader, kafka_writer, packed_headers
    from cdc.log.base import LogRecord
    from cdc.runtime import contexts
    from sinks.opensearch import documents, lines
    from sources.mysql import c_decoder
    from sources.mysql.columns import LONG, ColumnSpec
    from sources.postgres import copy_json
    from sources.postgres.types.server_json import RAW

    table = TableId("db", "s", "t")
    event = ChangeEvent(Op.CREATE, table, {"id": 1}, None, {"id": 1}, 5, 1)
    value = serde.EnvelopeEncoder("postgresql", "src", "p").encode([event])[0]
    record = LogRecord(value.topic, 0, 0, value.key, value.value, 0, None)
    events = sink_events.decode_batch([record], {})[0]
    spec = copy_json.CopyJson.of("public.t", ["id"], [RAW], [0], [], 5)
    emit = serde.EnvelopeEncoder("postgresql", "src", "p").emit
    return [
        (serde, "_encode", lambda: emit([event], lambda *a: None, None, None, now_ms=1)),
        (sink_events, "_decode", lambda: sink_events.decode_batch([record], {}, True)),
        (sink_events, "_decode", lambda: sink_events.decode_records([record], True)),
        (sink_events, "_decode", lambda: sink_events.decode_packed(kafka_bulk.PackedBatch.of([record]), {}, True)),
        (schema_order, "_decode", lambda: schema_order.split_by_schema(events)),
        (packed_headers, "_records", lambda: packed_headers.unpack(packed_headers.pack([("a", b"1")]))),
        (kafka_reader, "_records", lambda: kafka_reader.log_records([], 0, [])),
        (kafka_writer, "_records", lambda: kafka_writer.positional_produce(print)),
        (documents, "_lines", lambda: documents.reduce(events)),
        (lines, "_lines", lambda: lines.encode([documents.Upsert("1", 5, {"id": 1}, None)], "i", None, None, [], [])),
        (c_decoder, "_rowdecode", lambda: c_decoder.c_program([ColumnSpec(LONG, False, 0)], ["id"], [0])),
        (copy_json, "_copyjson", lambda: spec(b"1\n") and copy_json.CopyJson.for_table(
            "public.t", [("id", 23)], {}, [0], [], 5)),
        (contexts, "_COPYTEXT", lambda: contexts.native_codecs()),
        (contexts, "_WINDOW", lambda: contexts.native_codecs()),
        (bulk_window, "_window", lambda: bulk_window.available() and bulk_window.NewestWindow(1)),
        (kafka_bulk, "_rdconsume", lambda: kafka_bulk.open_bulk_reader({}, "g")),
        (block_producer, "_rdproduce", lambda: block_producer.open_block_producer({})),
    ]


@pytest.mark.parametrize("at", range(len(_calls())))
def test_every_call_site_takes_the_reference_under_the_switch(at, monkeypatch):
    module, attribute, call = _calls()[at]
    monkeypatch.setattr(module, attribute, Tripwire())
    with native.reference():
        call()
