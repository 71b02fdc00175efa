"""`cdc run` end to end with the generator source: drain on SIGTERM, HTTP, kill -9 cycles.

The generator's events are a pure function of their sequence number, so the test knows exactly
what the topic must hold, and can check after every crash that the stored offset is never ahead
of what the log holds.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest

from cdc.dev.services import free_port
from cdc.offsets import OffsetStore
from cdc.positions import Counter
from sources.generator import GeneratorConfig, GeneratorSource
from tests.integration.pg_capture import wait_until

TOPIC_SUFFIX = "public.items"


def _write_config(tmp_path: Path, log_kind: str, bootstrap: str | None, *, events: int | None,
                  rate: float | None, http_port: int | None = None) -> tuple[Path, str]:
    prefix = f"t_{uuid.uuid4().hex[:8]}"
    if log_kind == "kafka":
        log_yaml = f"  kafka: {{bootstrap_servers: '{bootstrap}', topic_prefix: {prefix}, partitions: 3}}"
    else:
        log_yaml = f"  embedded: {{path: ./data, topic_prefix: {prefix}, partitions: 3}}"
    source = (f"  - {{name: gen, type: generator, keys: 300, transaction_size: 10, delete_every: 7, "
              f"max_batch_events: 500, events: {events if events is not None else 'null'}, "
              f"rate: {rate if rate is not None else 'null'}}}")
    http = f'"127.0.0.1:{http_port}"' if http_port else "null"
    path = tmp_path / "cdc.yaml"
    path.write_text(f"log:\n{log_yaml}\nsources:\n{source}\nhttp: {http}\n")
    return path, prefix


def _start(config: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=config.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _open_log(config: Path):
    from cdc.config import load_config
    from cdc.log.open import open_log

    loaded = load_config(str(config))
    return open_log(loaded.log), loaded.log.topic_prefix


def _stored(log_, prefix: str) -> int:
    stored = OffsetStore(log_, prefix).load("gen")
    assert stored is None or isinstance(stored, Counter)
    return stored.seq if stored else 0


def _generator() -> GeneratorSource:
    """The same generator as the config's `gen` source: its events are a function of seq."""
    return GeneratorSource(GeneratorConfig(name="gen", keys=300, transaction_size=10, delete_every=7), None)


def _expected_history(total: int) -> dict[int, list[tuple[int, bool]]]:
    """key -> [(seq, is_delete), ...] for events 1..total."""
    generator, history = _generator(), {}
    for seq in range(1, total + 1):
        event = generator.event(seq)
        history.setdefault(event.key["id"], []).append((seq, event.op == "d"))
    return history


def _log_state(log_, topic: str) -> dict[int, int | None]:
    """key -> seq of its newest record in the (compacted) topic, None for a tombstone."""
    state: dict[int, int | None] = {}
    if topic in log_.topics():
        for record in log_.read_all(topic):  # per key, all records are in one partition, in order
            key = orjson.loads(record.key)["id"]
            state[key] = None if record.value is None else orjson.loads(record.value)["source"]["seq"]
    return state


def _assert_offset_not_ahead(log_, prefix: str, total: int) -> tuple[int, dict]:
    """Every change up to the stored offset is in the log: each key's newest record is that
    change or a later one (compaction may have dropped older records, never newer ones)."""
    offset = _stored(log_, prefix)
    state = _log_state(log_, f"{prefix}.{TOPIC_SUFFIX}")
    for key, changes in _expected_history(total).items():
        upto = [(seq, deleted) for seq, deleted in changes if seq <= offset]
        if not upto:
            continue
        last_seq, last_deleted = upto[-1]
        assert key in state, f"offset {offset}: key {key} (changed at {last_seq}) is missing from the log"
        got = state[key]
        if got is None:  # a tombstone: the last change up to the offset, or a later one, is a delete
            assert last_deleted or any(d for s, d in changes if s > last_seq), \
                f"offset {offset}: key {key} is deleted in the log but its change {last_seq} is an upsert"
        else:
            assert got >= last_seq, f"offset {offset}: key {key} holds change {got}, older than {last_seq}"
    return offset, state


def _assert_log_equals_source(log_, prefix: str, total: int) -> None:
    state = _log_state(log_, f"{prefix}.{TOPIC_SUFFIX}")
    expected = {key: (None if changes[-1][1] else changes[-1][0])
                for key, changes in _expected_history(total).items()}
    assert state == expected


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def log_kind(request):
    bootstrap = request.getfixturevalue("kafka_bootstrap") if request.param == "kafka" else None
    return request.param, bootstrap


def test_run_publishes_everything_and_stores_the_last_position(tmp_path, log_kind):
    config, prefix = _write_config(tmp_path, *log_kind, events=3000, rate=None)
    process = _start(config)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output.decode()
    log_, prefix = _open_log(config)
    try:
        assert _stored(log_, prefix) == 3000
        _assert_log_equals_source(log_, prefix, 3000)
    finally:
        log_.close()


def test_sigterm_drains_and_http_answers(tmp_path):
    port = free_port()
    config, prefix = _write_config(tmp_path, "embedded", None, events=None, rate=2000, http_port=port)
    process = _start(config)
    try:
        deadline = time.monotonic() + 60
        metrics = ""
        while "cdc_events_total" not in metrics or 'phase="streaming"} 1' not in metrics:
            assert time.monotonic() < deadline, "no metrics within 60s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    metrics = response.read().decode()
            except OSError:
                time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            assert response.status == 200
        events_line = next(l for l in metrics.splitlines() if l.startswith("cdc_events_total{"))
        assert 'connector="gen"' in events_line
        time.sleep(1.5)
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
        assert process.returncode == 0, output.decode()
        assert time.monotonic() - began < 10, "SIGTERM took too long to drain"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    log_, prefix = _open_log(config)
    try:
        offset, state = _assert_offset_not_ahead(log_, prefix, _stored(log_, prefix) + 1000)
        # Drained: the stored offset covers everything published, up to the last transaction end.
        assert offset > 0 and offset % 10 == 0
        assert max(s for s in state.values() if s is not None) - offset < 10 + 500
    finally:
        log_.close()


@pytest.mark.slow
def test_kill_9_cycles_lose_nothing_and_never_store_ahead(tmp_path, log_kind):
    total = 120_000
    config, _ = _write_config(tmp_path, *log_kind, events=total, rate=3000)
    rng = random.Random(1)
    log_, prefix = _open_log(config)
    offsets_seen = []
    try:
        for _cycle in range(8):
            before = _stored(log_, prefix)
            process = _start(config)
            try:
                # Strike once this run stored an offset of its own (a blind sleep lands in start-up
                # on a busy machine), then at a random moment of the stream.
                wait_until(lambda: _stored(log_, prefix) > before, timeout=120, what="this run to store an offset")
                time.sleep(rng.uniform(0.0, 1.0))
            finally:
                os.killpg(process.pid, signal.SIGKILL)  # the supervisor and its worker, mid-flight
                process.wait()
            offset, _ = _assert_offset_not_ahead(log_, prefix, total)
            offsets_seen.append(offset)
        assert offsets_seen == sorted(offsets_seen), f"the stored offset went backwards: {offsets_seen}"
        # Kills landed mid-stream: the runs made progress between them, and the work was not done yet.
        assert len(set(offsets_seen)) >= 3 and 0 < offsets_seen[-1] < total, offsets_seen
        # Now let it finish.
        final = _start(config)
        output, _ = final.communicate(timeout=180)
        assert final.returncode == 0, output.decode()[-3000:]
        assert _stored(log_, prefix) == total
        _assert_log_equals_source(log_, prefix, total)
    finally:
        log_.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize("retriable", [True, False])
def test_failures_restart_with_backoff_or_stop_the_connector(tmp_path, retriable):
    port = free_port()
    config, _ = _write_config(tmp_path, "embedded", None, events=None, rate=None, http_port=port)
    text = config.read_text().replace("delete_every: 7,", f"delete_every: 7, fail_at: 1200, "
                                                        f"fail_retriable: {str(retriable).lower()},")
    # A second, healthy connector keeps the daemon up whatever happens to the first.
    text = text.replace("\nhttp:", "\n  - {name: steady, type: generator, table: other, rate: 200}\nhttp:")
    config.write_text(text)
    process = _start(config)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the failure was not reported within 60s"
            try:
                code, body = _get(f"http://127.0.0.1:{port}/status")
            except OSError:
                time.sleep(0.2)
                continue
            rows = {row["name"]: row for row in orjson.loads(body)}
            row = rows.get("gen", {})
            steady = rows.get("steady", {}).get("phase") == "streaming"
            if steady and ((retriable and row.get("restarts", 0) >= 2)
                           or (not retriable and row.get("phase") == "failed")):
                break
            time.sleep(0.2)
        assert "fail_at" in row["last_error"]
        assert row["errors"] >= (2 if retriable else 1)
        assert rows["steady"]["phase"] == "streaming" and rows["steady"]["errors"] == 0
        health, _ = _get(f"http://127.0.0.1:{port}/healthz")
        assert health == (200 if retriable else 503)
        _, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert f'cdc_phase{{connector="gen",kind="source",phase="{row["phase"]}"}} 1' in metrics
        process.send_signal(signal.SIGTERM)
        # The daemon exits non-zero when a connector failed for good.
        assert process.wait(timeout=30) == (0 if retriable else 1)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_status_and_tail_read_back_what_run_published(tmp_path, capsys):
    from cdc.cli import main

    config, prefix = _write_config(tmp_path, "embedded", None, events=50, rate=None)
    process = _start(config)
    assert process.wait(timeout=60) == 0
    capsys.readouterr()
    assert main(["status", str(config), "--json"]) == 0
    [row] = orjson.loads(capsys.readouterr().out)
    assert row["name"] == "gen" and row["position"] == "50" and row["phase"] == "not running"

    assert main(["tail", str(config), f"{prefix}.{TOPIC_SUFFIX}", "--from-beginning", "--max", "3"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if not l.startswith("    ")]
    assert len(lines) == 3
    generator = _generator()
    for line in lines:  # "<topic>[<partition>]@<offset> <op> <key> version=<n>"
        where, op, key, version = line.split(" ")
        assert where.startswith(f"{prefix}.{TOPIC_SUFFIX}[")
        event = generator.event(int(version.removeprefix("version=")))
        assert op == event.op.value and orjson.loads(key) == event.key
