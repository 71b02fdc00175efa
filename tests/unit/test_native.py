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

