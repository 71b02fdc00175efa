"""Per-connector control of a running daemon: `cdc restart|pause|resume|rebuild`, the
`retry_failed` policy, and the token that guards commands off loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import psycopg2
import pytest

from cdc.dev.services import free_port
from tests.integration.test_daemon import _get, _start


def _cdc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def _rows(port: int) -> dict[str, dict]:
    try:
        code, body = _get(f"http://127.0.0.1:{port}/status")
    except OSError:
        return {}
    return {row["name"]: row for row in orjson.loads(body)} if code == 200 else {}


def _wait(what: str, check, process: subprocess.Popen, limit: float = 120):
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"the daemon exited ({process.returncode}) before {what}: "
                                 f"{process.stdout.read().decode()[-3000:]}")
        assert time.monotonic() < deadline, f"not within {limit:.0f}s: {what}"
        time.sleep(0.2)


def _stop(process: subprocess.Popen) -> str:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.stdout.read().decode(errors="replace")


def _two_generators(tmp_path: Path, port: int, extra: str = "") -> Path:
    prefix = f"t_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}}}\n"
                      "sources:\n"
                      "  - {name: gen, type: generator, keys: 100, rate: 300}\n"
                      "  - {name: steady, type: generator, table: other, keys: 100, rate: 300}\n"
                      f"http: \"127.0.0.1:{port}\"\n{extra}")
    return config


def _position(row: dict) -> int:
    return int(row.get("position") or 0)


def test_one_connector_restarts_alone_while_the_other_keeps_streaming(tmp_path):
    port = free_port()
    config = _two_generators(tmp_path, port)
    process = _start(config)
    try:
        first = _wait("both connectors stored a position",
                      lambda: (rows := _rows(port)) and all(_position(rows.get(n, {})) > 0 for n in ("gen", "steady"))
                      and rows, process)
        result = _cdc("restart", str(config), "gen", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        # The restarted one runs in a new process, from where it stood; the other never stopped.
        after = _wait("gen to run again in a new process",
                      lambda: (rows := _rows(port)) and rows["gen"]["pid"] not in (None, first["gen"]["pid"])
                      and _position(rows["gen"]) > _position(first["gen"])
                      and _position(rows["steady"]) > _position(first["steady"]) and rows, process)
        assert after["steady"]["pid"] == first["steady"]["pid"], "the other connector was restarted too"
        assert after["steady"]["phase"] == "streaming" and after["gen"]["restarts"] == 0
        assert after["gen"]["errors"] == 0  # a requested restart is not a failure
    finally:
        output = _stop(process)
    assert "restart requested" in output


def test_pause_keeps_a_connector_stopped_and_healthy_until_resume(tmp_path):
    port = free_port()
    config = _two_generators(tmp_path, port)
    process = _start(config)
    try:
        _wait("gen streams", lambda: _position(_rows(port).get("gen", {})) > 0, process)
        assert _cdc("resume", str(config), "gen", cwd=tmp_path).returncode == 2  # not paused: refused
        assert _cdc("pause", str(config), "gen", cwd=tmp_path).returncode == 0
        paused = _wait("gen paused", lambda: (row := _rows(port).get("gen")) and row["phase"] == "paused"
                       and row["pid"] is None and row, process)
        at_pause = _position(_rows(port)["steady"])
        moved = _wait("steady moves on", lambda: (rows := _rows(port)) and _position(rows["steady"]) > at_pause
                      and rows, process)
        assert _position(moved["gen"]) == _position(paused) and moved["gen"]["phase"] == "paused"
        code, _ = _get(f"http://127.0.0.1:{port}/healthz")
        assert code == 200  # paused on request: not a fault
        assert _cdc("resume", str(config), "gen", cwd=tmp_path).returncode == 0
        _wait("gen streams again past where it paused",
              lambda: _position(_rows(port)["gen"]) > _position(paused), process)
    finally:
        _stop(process)


def test_commands_off_loopback_need_the_token(tmp_path):
    from cdc.runtime.control import authorize

    assert authorize("127.0.0.1", None, None) is None
    assert authorize("::1", None, None) is None
    assert authorize("0.0.0.0", None, None)[0] == 403
    assert authorize("0.0.0.0", "s3cret", "Bearer s3cret") is None
    assert authorize("127.0.0.1", "s3cret", "Bearer wrong")[0] == 401
    # And through a real daemon: a token set in the file is required, and the CLI sends it.
    port = free_port()
    (tmp_path / "token").write_text("s3cret\n")
    config = _two_generators(tmp_path, port, "http_token_file: token\n")
    process = _start(config)
    try:
        _wait("gen streams", lambda: _position(_rows(port).get("gen", {})) > 0, process)
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"http://127.0.0.1:{port}/connectors/gen/pause", data=b"", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 401
        assert _rows(port)["gen"]["phase"] == "streaming"
        assert _cdc("pause", str(config), "gen", cwd=tmp_path).returncode == 0
        _wait("gen paused", lambda: _rows(port)["gen"]["phase"] == "paused", process)
    finally:
        _stop(process)


@pytest.mark.postgres
def test_a_sink_failed_by_a_missing_database_comes_back_by_policy(tmp_path, pg_admin_dsn):
    """The target database does not exist: a permanent error. Once it is created, the
    `retry_failed` policy starts the sink again and it writes, without a restart of the daemon."""
    port = free_port()
    database = f"t_target_{uuid.uuid4().hex[:8]}"
    url = pg_admin_dsn.replace("postgresql://", "postgresql+psycopg2://").rsplit("/", 1)[0] + f"/{database}"
    prefix = f"t_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}}}\n"
                      "sources:\n  - {name: gen, type: generator, keys: 50, events: 500}\n"
                      f"sinks:\n  - {{name: warehouse, type: sql, url: '{url}', topics: ['{prefix}.*'],\n"
                      "     retry_failed: {max_attempts: 20, backoff: 1, backoff_max: 2}}\n"
                      f"http: \"127.0.0.1:{port}\"\n")
    admin = psycopg2.connect(pg_admin_dsn)
    admin.autocommit = True
    process = _start(config)
    try:
        failed = _wait("the sink fails for good (a permanent error)",
                       lambda: (row := _rows(port).get("warehouse")) and row["phase"] == "failed"
                       and row["next_attempt_at"] is not None and row, process)
        assert database in failed["last_error"]
        code, _ = _get(f"http://127.0.0.1:{port}/healthz")
        assert code == 503
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{database}"')
        _wait("the sink comes back and writes every key",
              lambda: (row := _rows(port).get("warehouse")) and row["phase"] == "streaming"
              and row["events"] > 0 and row["last_error"] is None, process)
        target = psycopg2.connect(pg_admin_dsn.rsplit("/", 1)[0] + f"/{database}")
        try:
            def written() -> bool:
                with target.cursor() as cur:
                    cur.execute("SELECT count(*) FROM items")
                    target.rollback()
                    return cur.fetchone()[0] == 50
            _wait("the target holds every key", written, process)
        finally:
            target.close()
        code, _ = _get(f"http://127.0.0.1:{port}/healthz")
        assert code == 200
    finally:
        _stop(process)
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()


def _generator_into_sqlite(tmp_path: Path) -> tuple[Path, int]:
    """A config of a generator source into a SQLite warehouse on the embedded log, and its API port."""
    port = free_port()
    prefix = f"t_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}}}\n"
                      "sources:\n  - {name: gen, type: generator, keys: 50, rate: 200}\n"
                      f"sinks:\n  - {{name: warehouse, type: sql, url: 'sqlite:///target.db', topics: ['{prefix}.*']}}\n"
                      f"http: \"127.0.0.1:{port}\"\n")
    return config, port


def test_rebuild_goes_through_the_running_daemon(tmp_path):
    """`cdc rebuild` while the daemon runs the sink: the daemon drains it, rebuilds its store into
    a new generation and streams again; the source never stops."""
    import sqlite3

    config, port = _generator_into_sqlite(tmp_path)
    process = _start(config)
    try:
        first = _wait("the sink writes", lambda: (rows := _rows(port)) and (rows.get("warehouse") or {}).get("events")
                      and _position(rows["gen"]) > 0 and rows, process)
        result = _cdc("rebuild", str(config), "warehouse", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "rebuilt warehouse in the daemon" in result.stderr
        rows = _rows(port)
        assert rows["warehouse"]["rebuilt_at"] is not None and rows["warehouse"]["phase"] == "streaming"
        assert rows["gen"]["pid"] == first["gen"]["pid"] and _position(rows["gen"]) > _position(first["gen"])
        with sqlite3.connect(tmp_path / "target.db") as db:
            states = dict(db.execute("SELECT generation, state FROM cdc_sink_generations").fetchall())
            assert states == {2: "current"}, states  # generation 1 was rebuilt into 2, then dropped
            assert db.execute("SELECT count(*) FROM items").fetchone()[0] > 0
    finally:
        output = _stop(process)
    assert "rebuild requested" in output


def test_a_run_that_rebuilds_first_says_streaming_only_once_it_rebuilt(tmp_path):
    """The daemon's `cdc rebuild` ends at the rebuilding process's first "streaming" report; that
    process said "streaming" before it began to rebuild, so the command could say it was done
    while the store was still rebuilding (this suite's rebuild test saw it on a loaded machine)."""
    import threading

    from cdc.config import load_config
    from cdc.runtime.worker import build_runner

    config, port = _generator_into_sqlite(tmp_path)
    process = _start(config)
    try:
        _wait("the sink writes", lambda: ((_rows(port).get("warehouse") or {}).get("events") or 0) > 0, process)
    finally:
        _stop(process)
    phases: list[str] = []
    stop = threading.Event()

    def report(stats) -> None:
        if not phases or phases[-1] != stats.phase:
            phases.append(stats.phase)
        if phases[-2:] == ["rebuilding", "streaming"]:
            stop.set()  # rebuilt and streaming: enough seen

    runner = build_runner(load_config(str(config)), "warehouse", report=report)
    thread = threading.Thread(target=lambda: runner.run(stop, rebuild_first=True))
    thread.start()
    try:
        assert stop.wait(120), f"the rebuild to end; phases reported: {phases}"
    finally:
        stop.set()
        thread.join(60)
    assert phases[:2] == ["rebuilding", "streaming"], phases


def test_a_sink_behind_the_log_that_commits_nothing_turns_healthz_503(tmp_path):
    """The supervisor measures each sink's lag from the log itself; a streaming sink that is
    behind and whose committed offsets do not move for unhealthy_after is unhealthy, whatever its
    worker says (here it says nothing: its process is frozen on purpose). Thawed, it recovers."""
    from tests.integration.test_daemon import _get as get

    port = free_port()
    prefix = f"t_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}}}\n"
                      "sources:\n  - {name: gen, type: generator, keys: 50, rate: 200}\n"
                      f"sinks:\n  - {{name: warehouse, type: sql, url: 'sqlite:///target.db', "
                      f"topics: ['{prefix}.*'], unhealthy_after: 4}}\n"
                      f"http: \"127.0.0.1:{port}\"\n")
    process = _start(config)
    try:
        row = _wait("the sink writes", lambda: (_rows(port).get("warehouse") or {}).get("events") and
                    _rows(port)["warehouse"], process)
        pid = row["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            body = _wait("/healthz names the stalled sink",
                         lambda: (answer := get(f"http://127.0.0.1:{port}/healthz"))[0] == 503
                         and "records behind the log and no commit" in answer[1] and answer[1], process)
            assert body.startswith("warehouse: streaming"), body
            metrics = get(f"http://127.0.0.1:{port}/metrics")[1]
            assert 'cdc_sink_stalled_seconds{connector="warehouse",kind="sink"}' in metrics
        finally:
            os.kill(pid, signal.SIGCONT)
        _wait("healthy again", lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200, process)
    finally:
        _stop(process)
