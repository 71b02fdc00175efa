"""Restart one server of the local stack with its data kept (same directory, same port).

Used by tests that need a node restart in the middle (OpenSearch forgets delete tombstones
across one). It stops the server's whole process group, starts the same command again and waits
until it answers, then records the new pid in the stack's state file.
"""

from __future__ import annotations

from cdc.dev import stack


def restart(name: str, timeout: float = 180.0) -> None:
    with stack._locked():
        state = stack._load()
        entry = state["services"][name]
        service = stack._service(state["root"], name, entry)
        stack._stop_group(entry["pid"], service.stop_signal)
        process = service.launch()
        stack._wait_ready({name: (service, process)}, timeout)
        entry["pid"] = process.pid
        stack._save(state)
