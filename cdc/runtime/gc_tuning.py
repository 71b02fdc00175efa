"""The garbage collector's settings of a process that streams: capture or sink.

Both make and drop batches of small objects by the thousand (records, events, rows, bulk
items), none of them in a reference cycle: reference counting frees them. With the default
thresholds (700, 10, 10) the collector walks the objects of the batches in flight again and
again, and a full collection walks the whole heap.
"""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """The collector settings of a capture process once its source has started, and of a sink
    process once its sink has (``SinkRunner.run`` and ``rebuild``).

    Everything made so far lives as long as the process: keep the collector off it, and collect
    young objects less often (batches are made and dropped by the thousand, and the full
    collections that frequent gen-0 runs trigger find nothing to free). Measured on the MySQL
    stream (bench/mysql_stream.py, decoding only): 76k-84k rows/s with the default settings,
    100k-103k with these; a full collection walked the whole heap in ~40 ms each time.
    """
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
