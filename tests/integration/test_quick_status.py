"""`cdc status` answered by the running daemon (`cdc.runtime.quick_status`): it imports neither
pydantic nor SQLAlchemy, and prints what the slow path prints for the same state; whenever the
daemon's answer may not fit the file (edited since the daemon loaded it), the slow path answers."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg2
import pytest

from cdc.dev.services import free_port
from tests.integration.test_daemon import _start
from tests.integration.test_daemon_control import _rows, _stop, _wait

HEAVY = ("pydantic", "sqlalchemy")


def _status(config: Path, *args: str, exit_code: int = 0) -> tuple[str, set[str]]:
    """`cdc status CONFIG ARGS` in a fresh interpreter: (its output, the top-level packages it imported)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "cdc.cli", "status", str(config), *args],
                          cwd=config.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == exit_code, done.stderr[-3000:]
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    return done.stdout, imported


def _slow_status(config: Path, *args: str, capsys) -> str:
    """The slow path, in this process: the command as `main` ran it before the daemon answered."""
    from cdc.cli import build_parser

    parsed = build_parser().parse_args(["status", str(config), *args])
    capsys.readouterr()
    assert parsed.handler(parsed) == 0
    return capsys.readouterr().out


def _same_as_slow(config: Path, args: tuple[str, ...], capsys) -> str:
    """The quick answer, checked against the slow path's for the same state.

    A slot's retained WAL moves whenever the server writes WAL (checkpoints, its own records), so
    a quick answer and a slow one can see different moments: the slow answer must equal the quick
    one taken just before or just after it, in one of a few tries."""
    seen = []
    for _ in range(5):
        before, imported = _status(config, *args)
        assert not imported & set(HEAVY), f"the quick path imported {sorted(imported & set(HEAVY))}"
        slow = _slow_status(config, *args, capsys=capsys)
        after, _ = _status(config, *args)
        if slow in (before, after):
            return before if slow == before else after
        seen.append((before, slow, after))
    raise AssertionError(f"the quick and slow answers differ:\n{seen[-1][0]}\n---- slow:\n{seen[-1][1]}")


# serial: `cdc status` lists every replication slot of the server, and the slots of tests running
# beside it come and go and move between the quick answer and the slow one.
@pytest.mark.serial
@pytest.mark.postgres
def test_status_from_the_daemon_imports_nothing_heavy_and_prints_what_the_slow_path_prints(tmp_path, pg_dsn,
                                                                                           capsys):
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 20) g")
    conn.close()
    port = free_port()
    prefix = f"t_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "cdc.yaml"
    # `other` needs a variable nobody set: the daemon runs the rest (--only); `cdc status` of the
    # connectors it runs answers quickly all the same.
    config.write_text(
        f"log:\n  embedded: {{path: ./data, topic_prefix: {prefix}}}\n"
        f"sources:\n  - {{name: pg, type: postgres, dsn: '{pg_dsn}', tables: [public.items], state_dir: ./state}}\n"
        "  - {name: gen, type: generator, keys: 20, events: 60, rate: 200, table: generated}\n"
        f"sinks:\n  - {{name: warehouse, type: sql, url: 'sqlite:///target.db', topics: ['{prefix}.*']}}\n"
        "  - {name: other, type: sql, url: '${CDC_TEST_NEVER_SET}', topics: ['x']}\n"
        f"http: \"127.0.0.1:{port}\"\n")
    process = subprocess.Popen([sys.executable, "-m", "cdc.cli", "run", str(config), "--only", "pg", "gen",
                                "warehouse"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        _wait("the pipeline settles: pg streams, gen has finished, the sink has written everything",
              lambda: (rows := _rows(port)) and rows.get("pg", {}).get("phase") == "streaming"
              and rows.get("gen", {}).get("phase") == "finished"
              and rows.get("warehouse", {}).get("consumer_lag") == 0
              and rows["warehouse"].get("events", 0) >= 80, process)
        shown = ("pg", "gen", "warehouse")
        text = _same_as_slow(config, shown, capsys)
        assert [line.split()[1] for line in text.splitlines()[:3]] == list(shown), text
        assert "slot " in text and "source pg" in text.split("slot ", 1)[1], text

        quick_json, imported = _status(config, *shown, "--json")
        assert not imported & set(HEAVY)
        slow_json = json.loads(_slow_status(config, *shown, "--json", capsys=capsys))
        volatile = ("seconds_since_progress", "retained_wal_bytes")
        strip = lambda rows: [{k: v for k, v in row.items() if k not in volatile} for row in rows]  # noqa: E731
        assert strip(json.loads(quick_json)) == strip(slow_json)

        # The whole file names `other`, which this daemon does not run: the slow path answers,
        # and says that other's variable is unset.
        _, imported = _status(config, exit_code=2)
        assert "pydantic" in imported
    finally:
        _stop(process)


def test_a_file_edited_since_the_daemon_loaded_it_is_answered_by_the_slow_path(tmp_path):
    port = free_port()
    config = tmp_path / "cdc.yaml"
    config.write_text(f"log:\n  embedded: {{path: ./data, topic_prefix: t_{uuid.uuid4().hex[:8]}}}\n"
                      "sources:\n  - {name: gen, type: generator, keys: 5, rate: 20}\n"
                      f"http: \"127.0.0.1:{port}\"\n")
    process = _start(config)
    try:
        _wait("the generator streams", lambda: (_rows(port).get("gen") or {}).get("phase") == "streaming", process)
        text, imported = _status(config)
        assert not imported & set(HEAVY) and text.startswith("source gen                  streaming"), text
        config.write_text(config.read_text() + "# edited\n")
        text, imported = _status(config)
        assert "pydantic" in imported and text.startswith("source gen                  streaming"), text
    finally:
        _stop(process)
