"""`cdc run` and `cdc status` when something around them is broken: a taken HTTP port, an
unreachable Kafka, a database that refuses connections. Each test waits for the state it wants
(a phase in /status, a line in the output), never for a fixed time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cdc.dev.services import free_port


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cdc(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cdc.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)


def _start(config: Path, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=cwd or config.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _stop(process: subprocess.Popen) -> str:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate(timeout=30)
    return output or ""


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _wait_for(what: str, check, process: subprocess.Popen, limit: float = 180):
    """Poll ``check()`` until it returns something truthy; fail if the daemon exits first (or
    after ``limit`` seconds, a bound on a broken test, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            result = check()
        except OSError:
            result = None
        if result:
            return result
        if process.poll() is not None:
            pytest.fail(f"the daemon exited ({process.returncode}) before {what}:\n{_stop(process)[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {limit:.0f}s:\n{_stop(process)[-3000:]}")
        time.sleep(0.2)


def test_a_taken_http_port_is_one_clear_line_and_the_permanent_exit_code(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "cdc.yaml").write_text(
            "log: {embedded: {path: ./data}}\n"
            "sources:\n  - {name: gen, type: generator, events: 10}\n"
            f'http: "127.0.0.1:{port}"\n')
        result = _cdc("run", "cdc.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [l for l in result.stderr.splitlines() if l.startswith("cdc: error")]
    assert f"http: 127.0.0.1:{port}" in line and "in use" in line.lower()


def _status_row(port: int, name: str) -> dict | None:
    code, body = _get(port, "/status")
    rows = {row["name"]: row for row in json.loads(body)} if code == 200 else {}
    return rows.get(name)


@pytest.mark.postgres
def test_a_source_retrying_a_dead_database_says_so_everywhere(tmp_path, pg_dsn):
    """The database refuses connections (a closed port): the connector is retrying, with the
    error, its time and the attempts, in /status, /metrics and `cdc status`; /healthz is 503."""
    dead = pg_dsn.replace(f":{pg_dsn.rsplit(':', 1)[1].split('/')[0]}/", f":{_closed_port()}/")
    port = free_port()
    (tmp_path / "cdc.yaml").write_text(
        "log: {embedded: {path: ./data}}\n"
        f"sources:\n  - {{name: pg, type: postgres, dsn: '{dead}', unhealthy_after: 1}}\n"
        f'http: "127.0.0.1:{port}"\n')
    process = _start(tmp_path / "cdc.yaml")
    try:
        row = _wait_for("a second failed attempt", lambda: (r := _status_row(port, "pg")) and
                        r["attempts"] >= 2 and r, process)
        assert row["phase"] == "retrying" and row["last_error"] and row["last_error_at"] > 0
        _wait_for("/healthz 503", lambda: _get(port, "/healthz")[0] == 503, process)
        assert "pg: retrying" in _get(port, "/healthz")[1]
        metrics = _get(port, "/metrics")[1]
        assert 'cdc_phase{connector="pg",kind="source",phase="retrying"} 1' in metrics
        assert 'cdc_healthy{connector="pg",kind="source"} 0' in metrics
        assert 'cdc_last_error_timestamp_seconds{connector="pg",kind="source"}' in metrics
        status = _cdc("status", "cdc.yaml", cwd=tmp_path)
        # Everything is shown, and the exit says a server cannot be reached (its slots could not be read).
        assert status.returncode == 69 and "(source pg) is unreachable" in status.stderr, status.stderr
        [line] = [l for l in status.stdout.splitlines() if l.startswith("source pg ")]
        assert "retrying" in line and "attempts=" in line and "last_error_at=" in line and "UNHEALTHY" in line
    finally:
        _stop(process)


def _kafka_pid() -> int:
    from cdc.dev import stack

    [kafka] = [s for s in stack.status() if s.name == "kafka"]
    assert kafka.running and kafka.pid
    return kafka.pid


def _wait_until_kafka_answers(bootstrap: str, timeout: float = 120) -> None:
    """After SIGCONT the broker needs a moment before it serves metadata again (its sessions and
    sockets wake up): reading the log before that failed with a transport error, not with what the
    test checks."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=5)
            return
        except Exception:  # noqa: BLE001 - not answering yet
            if time.monotonic() > deadline:
                raise


@pytest.mark.serial
@pytest.mark.kafka
def test_a_frozen_kafka_turns_healthz_503_and_recovery_clears_it(tmp_path, kafka_bootstrap):
    port = free_port()
    prefix = f"t_{os.urandom(4).hex()}"
    (tmp_path / "cdc.yaml").write_text(
        f"log: {{kafka: {{bootstrap_servers: '{kafka_bootstrap}', topic_prefix: {prefix}}}}}\n"
        "sources:\n  - {name: gen, type: generator, keys: 100, rate: 500, unhealthy_after: 2}\n"
        f'http: "127.0.0.1:{port}"\n')
    process = _start(tmp_path / "cdc.yaml")
    kafka = _kafka_pid()
    frozen = False
    try:
        _wait_for("a stored position", lambda: (r := _status_row(port, "gen")) and r["position"], process)
        assert _get(port, "/healthz")[0] == 200
        os.killpg(kafka, signal.SIGSTOP)
        frozen = True
        _wait_for("/healthz 503 while Kafka is frozen", lambda: _get(port, "/healthz")[0] == 503, process, 90)
        os.killpg(kafka, signal.SIGCONT)
        frozen = False
        row = _wait_for("healthy again", lambda: _get(port, "/healthz")[0] == 200 and
                        (r := _status_row(port, "gen"))["phase"] == "streaming" and r, process)
        assert row["attempts"] == 0 and row["last_error"] is None and row["last_error_at"] is None
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 0, output[-3000:]
    finally:
        if frozen:
            os.killpg(kafka, signal.SIGCONT)
        _stop(process)


def _unreachable_kafka_config(tmp_path: Path, port: int | None) -> Path:
    http = f'"127.0.0.1:{port}"' if port else "null"
    (tmp_path / "cdc.yaml").write_text(
        f"log: {{kafka: {{bootstrap_servers: '127.0.0.1:{_closed_port()}', request_timeout: 30}}}}\n"
        "sources:\n  - {name: gen, type: generator, keys: 10, rate: 100}\n"
        f"http: {http}\n")
    return tmp_path / "cdc.yaml"


def _librdkafka_threads(pid: int) -> bool:
    """True once process ``pid`` runs librdkafka's threads (it made a Kafka client)."""
    try:
        return any(Path(f"/proc/{pid}/task/{task}/comm").read_text().startswith("rdk:")
                   for task in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return False


def test_with_kafka_unreachable_sigterm_is_honoured_and_the_log_is_not_flooded(tmp_path):
    config = _unreachable_kafka_config(tmp_path, None)
    out = tmp_path / "out.log"
    with out.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config)], cwd=tmp_path,
                                   stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # Evidence that the worker is inside its first metadata call to the closed port (which
        # blocks for request_timeout, 30 s): its Kafka client's threads run.
        worker = int(_wait_for("the worker's pid", lambda: next(
            (l.split("(pid ")[1].split(")")[0] for l in out.read_text().splitlines() if "started (pid" in l),
            None), process))
        _wait_for("a Kafka client in the worker", lambda: _librdkafka_threads(worker), process)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=90)
    finally:
        _stop(process)
    output = out.read_text()
    assert "killing it" not in output, output[-3000:]
    assert process.returncode == 0, output[-3000:]
    connect_lines = [l for l in output.splitlines() if "Connect to" in l and "failed" in l]
    assert len(connect_lines) <= 3, "\n".join(connect_lines[:20])


@pytest.mark.parametrize("as_json", [False, True])
def test_status_with_kafka_unreachable_is_one_line_and_exit_69(tmp_path, as_json):
    config = _unreachable_kafka_config(tmp_path, None)
    result = _cdc("status", config.name, *(["--json"] if as_json else []), cwd=tmp_path)
    assert result.returncode == 69, result.stderr[-3000:]
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "unreachable" in lines[0] and "Kafka at 127.0.0.1:" in lines[0], lines[:20]


@pytest.mark.postgres
def test_the_postgres_state_dir_is_next_to_the_config_file_wherever_the_daemon_starts(tmp_path, pg_dsn):
    import psycopg2

    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, body text)")
        cur.execute("INSERT INTO items VALUES (1, 'x')")
    conn.close()
    config_dir, cwd = tmp_path / "etc", tmp_path / "elsewhere"
    config_dir.mkdir()
    cwd.mkdir()
    port = free_port()
    (config_dir / "cdc.yaml").write_text(
        "log: {embedded: {path: ./data}}\n"
        f"sources:\n  - {{name: pg, type: postgres, dsn: '{pg_dsn}', state_dir: ./state}}\n"
        f'http: "127.0.0.1:{port}"\n')
    process = _start(config_dir / "cdc.yaml", cwd=cwd)
    try:
        _wait_for("streaming with a stored position", lambda: (r := _status_row(port, "pg")) and
                  r["phase"] == "streaming" and r["position"], process)
        assert (config_dir / "state" / "pg" / "toast.db").exists()
        assert not (cwd / "state").exists()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 0, output[-3000:]
    finally:
        _stop(process)


@pytest.mark.serial
@pytest.mark.kafka
def test_sigterm_with_kafka_frozen_mid_stream_exits_in_time_and_stores_nothing_ahead(tmp_path, kafka_bootstrap):
    from tests.integration.test_daemon import _assert_offset_not_ahead, _open_log, _stored, _write_config

    port = free_port()
    config, _ = _write_config(tmp_path, "kafka", kafka_bootstrap, events=None, rate=2000, http_port=port)
    process = _start(config)
    kafka = _kafka_pid()
    frozen = False
    try:
        _wait_for("a stored position", lambda: (r := _status_row(port, "gen")) and r["position"], process)
        os.killpg(kafka, signal.SIGSTOP)
        frozen = True
        # Evidence of the stall: the source has published records the frozen broker cannot take.
        _wait_for("a stall", lambda: (_status_row(port, "gen") or {}).get("seconds_since_progress", 0) >= 2,
                  process)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=90)
        assert "killing it" not in output, output[-3000:]
        assert process.returncode == 0, output[-3000:]
    finally:
        if frozen:
            os.killpg(kafka, signal.SIGCONT)
        _stop(process)
    _wait_until_kafka_answers(kafka_bootstrap)
    log_, prefix = _open_log(config)
    try:
        offset, _ = _assert_offset_not_ahead(log_, prefix, _stored(log_, prefix) + 100_000)
        assert offset > 0
    finally:
        log_.close()
