"""Sizes for people to read (shared by ``cdc status`` and the sources' log messages)."""

from __future__ import annotations


def human_bytes(count: int | None) -> str:
    if count is None:
        return "-"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
