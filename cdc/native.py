"""The one switch between the compiled parts (C extensions that setup.py builds where it finds a
compiler) and the Python reference code they mirror, for the whole process.

A module that has a compiled twin loads it with ``load(name)``, which returns None where it was
not built, and asks ``enabled()`` each time its hot path runs (per batch, or per record where the
path is per record: ``enabled`` is a function returning a global), so a change takes effect at once:

* ``CDC_NATIVE=0`` in the environment, read once when this module is first imported: nothing
  compiled is loaded, exactly as in an installation built without a compiler (for users who want
  the reference code, and to test that installation);
* ``with reference(): ...``: the reference code in this process until the block ends (tests
  compare the two implementations with it). It flips a process-wide flag, so it is meant for
  code that the caller runs itself, not for threads that run meanwhile.

A part with no reference code (the bulk window, the bulk Kafka reader, the block producer) counts
as not built while the switch is off, and its callers take the path they take without a compiler.

A leaf module: it imports nothing of the framework, so the plugin API and plugins may use it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

_OFF = {"0", "off", "false", "no"}
# Whether this process may load compiled parts at all (the environment, read once).
ALLOWED = os.environ.get("CDC_NATIVE", "1").strip().lower() not in _OFF
_enabled = ALLOWED


def load(name: str) -> Any:
    """The compiled module ``name`` (``"cdc._encode"``), or None where it was not built, where
    its shared libraries are missing (librdkafka), or with ``CDC_NATIVE=0``. Typed ``Any``: the
    extensions have no stubs (a caller checks for None)."""
    if not ALLOWED:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def enabled() -> bool:
    """Whether the compiled parts run now (False under ``reference()`` and with ``CDC_NATIVE=0``)."""
    return _enabled


@contextmanager
def reference() -> Iterator[None]:
    """The reference code for the duration of the block, in this whole process (see the module
    docstring); blocks nest."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def choose(compiled: bool) -> AbstractContextManager[None]:
    """``reference()`` unless ``compiled`` (then the switch as it is): for a test or benchmark that
    runs a path both ways."""
    return nullcontext() if compiled else reference()
