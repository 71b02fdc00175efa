"""The lines ``cdc status`` prints: one per connector, one per replication slot.

Both of its paths print through here (the slow one that reads the config and asks the servers,
and the fast one that takes a running daemon's report: ``cdc.runtime.quick_status``), so they
print the same text for the same state; this module imports nothing heavy for the same reason.
"""

from __future__ import annotations

import time

from cdc.units import human_bytes


def status_line(row: dict) -> str:
    """One line per connector; a retrying or unhealthy one says why, since when, how often."""
    if row["kind"] == "source":
        lag = f"{row['lag_seconds']:.1f}s" if row.get("lag_seconds") is not None else "-"
        line = f"source {row['name']:<20} {row['phase']:<12} position={row.get('position') or '-'} lag={lag}"
        snapshot = row.get("snapshot_progress")
        if snapshot:
            eta = snapshot.get("eta_seconds")
            line += (f" snapshot rows={snapshot['rows']:,} chunks={snapshot['chunks_done']}/{snapshot['chunks_total']}"
                     f" eta={'-' if eta is None else f'{eta:.0f}s'}")
        incremental = row.get("incremental_snapshot")
        if incremental:
            after = incremental.get("after_key")
            eta = incremental.get("eta_seconds")
            line += (f" incremental_snapshot={incremental.get('table') or '-'}"
                     f"{' PAUSED' if incremental.get('paused') else ''}"
                     f" after={'start' if after is None else ','.join(map(str, after))}"
                     f" chunks={incremental.get('chunks_done', 0)} rows={incremental.get('rows', 0):,}"
                     f" eta={'-' if eta is None else f'{eta:.0f}s'}"
                     f"{' where=' + repr(incremental['where']) if incremental.get('where') else ''}"
                     f" queued={','.join(incremental.get('tables', [])[1:]) or '-'}")
    else:
        consumer_lag = row.get("consumer_lag")
        line = (f"sink   {row['name']:<20} {row['phase']:<12} "
                f"consumer_lag={'-' if consumer_lag is None else consumer_lag}")
        if row.get("lag_seconds") is not None:
            line += f" lag={row['lag_seconds']:.1f}s"
        line += "".join(f" {name}={value}" for name, value in (row.get("details") or {}).items())
    if row.get("healthy") is False:
        line += f" UNHEALTHY (no progress for {row.get('seconds_since_progress') or 0:.0f}s)"
    if row.get("last_error"):
        at = row.get("last_error_at")
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)) if at else "?"
        line += f" attempts={row.get('attempts') or 0} last_error_at={when} last_error={row['last_error']}"
    return line


def store_lines(row: dict) -> list[str]:
    """A sink's store, as its plugin describes it (an OpenSearch index per line, say)."""
    return ["       " + " ".join(f"{k}={v}" for k, v in store.items()) for store in row.get("stores") or ()]


def slot_line(row: dict) -> str:
    """``failover=`` only where the server has failover slots (PostgreSQL 17+), ``synced`` only for
    a standby's copy of a primary's failover slot."""
    owner = f"source {row['owner']}" if row["owner"] else "ORPHAN (no source in this file uses it)"
    state = f"active pid {row['active_pid']}" if row["active"] else "inactive"
    failover = "" if row.get("failover") is None else f" failover={str(row['failover']).lower()}"
    synced = " synced" if row.get("synced") else ""
    return (f"slot   {row['name']:<20} {row['server']}/{row['database']} {state} "
            f"retained_wal={human_bytes(row['retained_wal_bytes'])} wal_status={row['wal_status'] or '-'}"
            f"{failover}{synced} {owner}")
