"""The replication slots part of ``cdc status``, and ``cdc drop FILE SOURCE``.

Slots outlive the sources that made them: a source removed from the file leaves its slot holding
WAL on the server. ``cdc status`` lists every logical slot of each PostgreSQL server a source of
the file captures (one query per server) and flags the ones no source owns; ``cdc drop`` removes
a source's slot, its publication when this project created it, and its stored offset.
"""

from __future__ import annotations

import argparse
import sys

from cdc.errors import ConfigError, PermanentError

CONNECT_TIMEOUT = 5  # seconds: `cdc status` is a look, not a job
EXIT_UNREACHABLE = 69  # EX_UNAVAILABLE: a server (or the log) cannot be reached
EXIT_REFUSED = 77      # EX_NOPERM: a server answered and refused the login (a setting to correct)


def slot_rows(sources: list) -> tuple[list[dict], list[str], int]:
    """(a row per slot on the servers ``sources`` capture, a message per server that could not be
    asked, the exit code that says why: 0, ``EXIT_UNREACHABLE`` or ``EXIT_REFUSED``)."""
    postgres = [s for s in sources if s.type == "postgres"]
    if not postgres:
        return [], [], 0
    import psycopg2

    from cdc.errors import CdcError
    from cdc.servers import postgres as pg_server, setting_of
    from sources.postgres.slots import list_slots, server_of

    by_server: dict[str, list] = {}
    for source in postgres:
        by_server.setdefault(server_of(source.dsn.get_secret_value()), []).append(source)
    rows, problems, code = [], [], 0
    for server, sources in by_server.items():
        name = sources[0].name
        try:
            conn = pg_server.connect(sources[0].dsn.get_secret_value(), what=f"PostgreSQL at {server}",
                                     setting=setting_of("source", name, "dsn"), connect_timeout=CONNECT_TIMEOUT,
                                     application_name="cdc-status")
        except CdcError as err:
            problems.append(f"{err} (source {name})" if not err.retriable else
                            f"PostgreSQL at {server} (source {name}) is unreachable: {err}")
            code = max(code, EXIT_UNREACHABLE if err.retriable else EXIT_REFUSED)
            continue
        try:
            rows += [slot.as_row() for slot in list_slots(conn, server, sources)]
        except psycopg2.Error as err:
            problems.append(f"PostgreSQL at {server}: cannot list its slots: {str(err).strip().splitlines()[0]}")
            code = max(code, EXIT_REFUSED)
        finally:
            conn.close()
    return rows, problems, code


def add_drop_parser(subparsers: argparse._SubParsersAction) -> None:
    drop = subparsers.add_parser(
        "drop", help="remove a PostgreSQL source's slot, its publication (if cdc created it) and stored offset")
    drop.add_argument("file", help="the config file")
    drop.add_argument("source", help="the source whose slot, publication and stored offset go")
    drop.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    drop.set_defaults(handler=cmd_drop)


def _confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise ConfigError("cdc drop: no terminal to ask for confirmation on; pass --yes to drop without asking")
    answer = input(f"{question} [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def cmd_drop(args: argparse.Namespace) -> int:
    """Order: the checks (daemon, active slot), the question, then the stored offset, the slot,
    the publication. The offset goes first: should the rest fail, the next start finds no
    position and takes a fresh snapshot (dropping a leftover slot), rather than a position
    whose slot is gone."""
    import psycopg2

    from cdc.config import load_config
    from cdc.log.open import open_log
    from cdc.offsets import OffsetStore
    from cdc.runtime.cli import _refuse_if_daemon_runs
    from sources.postgres.slots import drop_publication, drop_slot, publication_is_ours, slot_of

    config = load_config(args.file)
    sources = {s.name: s for s in config.sources}
    source = sources.get(args.source)
    if source is None:
        raise ConfigError(f"no source named {args.source!r}; the file declares: {', '.join(sources) or 'no sources'}")
    if source.type != "postgres":
        raise ConfigError(f"cdc drop handles PostgreSQL sources; {source.name} is of type {source.type}")
    _refuse_if_daemon_runs(config, source.name, kind="source")
    dsn = source.dsn.get_secret_value()
    try:
        conn = psycopg2.connect(dsn, connect_timeout=CONNECT_TIMEOUT, application_name="cdc-drop")
    except psycopg2.Error as err:
        raise PermanentError(f"cdc drop: cannot connect for source {source.name}: "
                             f"{str(err).strip().splitlines()[0]}") from None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_database()")
            database = cur.fetchone()[0]
            cur.execute("SELECT database, slot_name, active_pid FROM pg_replication_slots "
                        "WHERE database = current_database()")
            slots = {(db, name): pid for db, name, pid in cur.fetchall()}
        conn.rollback()
        slot = slot_of(source, database, set(slots))
        if slots.get((database, slot)) is not None:
            raise ConfigError(f"slot {slot} of source {source.name} is active (pid {slots[(database, slot)]}): "
                              "a process streams from it; stop it first")
        ours = publication_is_ours(conn, source.publication_name)
        plan = [f"the stored offset of source {source.name}"]
        plan.append(f"replication slot {slot} in database {database}" if (database, slot) in slots
                    else f"(no slot {slot} exists)")
        plan.append({None: f"(no publication {source.publication_name} exists)",
                     True: f"publication {source.publication_name}",
                     False: f"(publication {source.publication_name} is kept: cdc did not create it)"}[ours])
        if not _confirm("cdc drop will remove:\n  " + "\n  ".join(plan) + "\nGo on?", args.yes):
            print("nothing dropped", file=sys.stderr)
            return 1
        log_ = open_log(config.log)
        try:
            store = OffsetStore(log_, config.log.topic_prefix)
            store.reset(source.name)
            store.close()
        finally:
            log_.close()
        if (database, slot) in slots:
            drop_slot(conn, slot)
        if ours:
            drop_publication(conn, source.publication_name)
    except psycopg2.Error as err:
        raise PermanentError(f"cdc drop of source {source.name}: {str(err).strip().splitlines()[0]}") from None
    finally:
        conn.close()
    print("dropped: " + "; ".join(p for p in plan if not p.startswith("(")), file=sys.stderr)
    return 0
