"""``cdc verify --repair``: the keys a pass found missing or different in the store, sent again
through the source's incremental snapshot, then looked at until the store holds them.

The keys go to the running daemon as ``cdc snapshot SOURCE TABLE --where <the keys>`` does
(the source's signal table; snapshot/incremental.py), so the rows reach the store through the
normal pipeline, with the snapshot's versions: a row re-sent never overwrites a newer change of
it. The repair then rechecks the keys (``Verifier.recheck``: the source and the store read now,
and the looks of any that still differ) every second until none differs or ``timeout`` passed;
the looks wait for the store no longer than that either, so ``--repair-timeout 0`` sends the keys
and reports them as they stand, unsettled where the store has not applied them yet.

A key the store has and the source does not (extra) is not re-sent: a snapshot reads rows, and
there is none. It is reported as it was; delete it in the store, or rebuild the store
(``cdc rebuild``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cdc.api import TableReader
from cdc.errors import RetriableError
from cdc.runtime.verify import Verifier
from cdc.runtime.verify_compare import TableReport

log = logging.getLogger(__name__)


def require_daemon(config: Any) -> None:
    """RetriableError unless a daemon answers for ``config``: the repair needs it to take the
    snapshot and its sink to apply it."""
    from cdc.runtime.control import daemon_status

    if config.http is None:
        raise RetriableError("--repair sends the keys through the running daemon's API, and this file has "
                             "`http: null`: give it an `http:` address, run `cdc run` with it, then repair")
    if daemon_status(config.http) is None:
        raise RetriableError(f"--repair sends the keys through the running daemon, and none answers at "
                             f"{config.http}: start `cdc run` with this file, then repair (verifying without "
                             f"--repair needs no daemon)")


def repair(config: Any, source: str, reader: TableReader, verifier: Verifier, reports: list[TableReport],
           timeout: float, poll: float = 1.0) -> list[TableReport]:
    """Re-send the keys of ``reports`` (tables of source ``source``) and recheck them; one
    report per table that had any, of the keys that still differ."""
    from cdc.runtime.control import post_command

    sent: dict[str, list[tuple]] = {}
    for report in reports:
        if not report.repairable:
            continue
        keys = report.repairable
        objects = [verifier.key_object(report.table, key) for key in keys]
        where = reader.where_keys(report.table, objects)
        post_command(config, source, "snapshot", {"tables": [report.table], "action": "execute", "where": where})
        log.info("verify: %d keys of %s sent again through source %s's incremental snapshot", len(keys),
                 report.table, source)
        sent[report.table] = keys
    deadline = time.monotonic() + timeout
    while True:
        rechecked = {table: verifier.recheck(table, keys, deadline) for table, keys in sent.items()}
        if all(r.mismatched == 0 for r in rechecked.values()) or time.monotonic() >= deadline:
            return list(rechecked.values())
        sent = {table: r.repairable or keys for (table, keys), r in zip(sent.items(), rechecked.values())
                if r.mismatched}
        time.sleep(poll)
