"""A bootstrap's or a rebuild's progress on the terminal (`cdc bootstrap`, `cdc rebuild`)."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """``[#####.....]  45%  123,456/270,000 records  34,567/s`` on a terminal; a line every 5 s elsewhere."""

    def __init__(self, label: str, stream=sys.stderr) -> None:
        self.label = label
        self.stream = stream
        self.began = time.monotonic()
        self.shown = 0.0
        self.tty = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.shown < (0.2 if self.tty else 5.0) and done < total:
            return
        self.shown = now
        fraction = done / total if total else 1.0
        rate = done / max(now - self.began, 1e-6)
        bar = "#" * int(fraction * 30)
        text = f"{self.label} [{bar:<30}] {fraction:4.0%} {done:,}/{total:,} records {rate:,.0f}/s"
        self.stream.write(("\r" + text) if self.tty else text + "\n")
        if self.tty and done >= total:
            self.stream.write("\n")
        self.stream.flush()
