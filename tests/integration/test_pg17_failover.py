"""PostgreSQL 17 failover slots: the source makes its slot a failover slot where the server has
them (`failover_slot`, on by default), switches an existing slot to match the setting, and
`cdc status` says which slots fail over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from cdc.dev.services import free_port
from tests.integration.test_daemon import _start
from tests.integration.test_daemon_control import _rows, _stop, _wait


def _failover_of_slots(dsn: str) -> dict[str, bool]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT slot_name, failover FROM pg_replication_slots WHERE database = current_database()")
        found = dict(cur.fetchall())
    conn.close()
    return found


def _config(tmp_path: Path, dsn: str, port: int, plain_failover: bool) -> Path:
    config = tmp_path / "cdc.yaml"
    config.write_text(
        "log:\n  embedded: {path: ./data, topic_prefix: failover}\n"
        "sources:\n"
        f"  - {{name: pg, type: postgres, dsn: '{dsn}', tables: [public.items], state_dir: ./state}}\n"
        f"  - {{name: plain, type: postgres, dsn: '{dsn}', tables: [public.items], state_dir: ./state,\n"
        f"     failover_slot: {str(plain_failover).lower()}}}\n"
        f"http: \"127.0.0.1:{port}\"\n")
    return config


@pytest.mark.postgres17
def test_a_slot_on_postgres_17_fails_over_by_default_and_status_says_so(tmp_path, pg17_dsn):
    with psycopg2.connect(pg17_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int")
        assert cur.fetchone()[0] >= 170000
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO items VALUES (1, 'x')")
    conn.close()
    port = free_port()
    config = _config(tmp_path, pg17_dsn, port, plain_failover=False)
    process = _start(config)
    try:
        _wait("both sources stream", lambda: (rows := _rows(port)) and all(
            rows.get(n, {}).get("phase") == "streaming" for n in ("pg", "plain")), process)
        slots = _failover_of_slots(pg17_dsn)
        [pg_slot] = [name for name in slots if name.endswith("_pg")]
        [plain_slot] = [name for name in slots if name.endswith("_plain")]
        assert slots == {pg_slot: True, plain_slot: False}
        status = subprocess.run([sys.executable, "-m", "cdc.cli", "status", str(config)], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        lines = {line.split()[1]: line for line in status.stdout.splitlines() if line.startswith("slot ")}
        assert "failover=true" in lines[pg_slot] and lines[pg_slot].endswith("source pg"), status.stdout
        assert "failover=false" in lines[plain_slot] and lines[plain_slot].endswith("source plain"), status.stdout
    finally:
        _stop(process)

    # The setting changed: the existing slot is switched (ALTER_REPLICATION_SLOT) when the source
    # resumes from it; no new slot, no new snapshot.
    config = _config(tmp_path, pg17_dsn, port, plain_failover=True)
    process = _start(config)
    try:
        _wait("both sources stream again", lambda: (rows := _rows(port)) and all(
            rows.get(n, {}).get("phase") == "streaming" for n in ("pg", "plain")), process)
        assert _failover_of_slots(pg17_dsn) == {pg_slot: True, plain_slot: True}
    finally:
        output = _stop(process)
    assert "snapshot done" not in output, output[-6000:]
