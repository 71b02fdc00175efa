from cdc.runtime import snapshot_progress
from cdc.runtime.snapshot_progress import SnapshotProgressMeter


def test_the_eta_counts_only_chunks_done_while_watched(monkeypatch):
    clock = iter([100.0, 110.0, 120.0])
    monkeypatch.setattr(snapshot_progress.time, "monotonic", lambda: next(clock))
    meter = SnapshotProgressMeter()
    meter.rows = 500
    first = meter.figures((20, 100))  # 20 chunks were done before the first look: no rate yet
    assert first == {"rows": 500, "chunks_done": 20, "chunks_total": 100, "eta_seconds": None}
    assert meter.figures((30, 100))["eta_seconds"] == 70.0  # 10 chunks in 10 s, 70 left
    assert meter.figures(None) is None  # no snapshot: no figures, and the next one starts afresh
    assert meter._began is None
