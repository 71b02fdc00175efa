"""The slot lines of `cdc status`: `failover=` only where the server has failover slots."""

from cdc.runtime.status_lines import slot_line


def _row(**extra) -> dict:
    return {"kind": "slot", "server": "127.0.0.1:5432", "name": "cdc_shop_pg", "database": "shop",
            "active": False, "active_pid": None, "wal_status": "reserved", "retained_wal_bytes": 2048,
            "owner": "pg", **extra}


def test_a_slot_line_says_failover_only_where_the_server_has_it():
    assert slot_line(_row(failover=None, synced=None)) == (
        "slot   cdc_shop_pg          127.0.0.1:5432/shop inactive retained_wal=2.0 KiB wal_status=reserved source pg")
    assert " wal_status=reserved failover=true source pg" in slot_line(_row(failover=True, synced=False))
    assert " failover=true synced source pg" in slot_line(_row(failover=True, synced=True))
    assert " failover=false source pg" in slot_line(_row(failover=False, synced=False))
