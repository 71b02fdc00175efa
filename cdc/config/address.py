"""The daemon's HTTP address as the config file writes it: its default and how it is read.

Kept apart from the pydantic model so that ``cdc status``'s fast path (``cdc.runtime.quick_status``)
can find the daemon without importing pydantic.
"""

from __future__ import annotations

DEFAULT_HTTP = "127.0.0.1:8083"


def parse_http_address(value: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:8083"`` for IPv6) -> (host, port); port 0 means any free port."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected host:port, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be a number from 0 to 65535, got {port!r}")
    return host, int(port)
