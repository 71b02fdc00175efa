"""The replication slots part of ``cdc status``, and ``cdc drop FILE SOURCE``.

Slots outlive the sources that made them: a source removed from the file leaves its slot holding
WAL on the server. ``cdc status`` asks each source type that owns slots (``SlotOwningSource``,
e.g. PostgreSQL) for every slot on the servers its sources capture (one query per server), and
flags the ones no source owns; ``cdc drop`` removes a source's slot, its publication when this
project created it, and its stored offset.
"""

from __future__ import annotations

import argparse
import sys

from cdc.errors import CdcError, ConfigError

CONNECT_TIMEOUT = 5  # seconds: `cdc status` is a look, not a job
EXIT_UNREACHABLE = 69  # EX_UNAVAILABLE: a server (or the log) cannot be reached
EXIT_REFUSED = 77      # EX_NOPERM: a server answered and refused the login (a setting to correct)


def slot_rows(sources: list) -> tuple[list[dict], list[str], int]:
    """(a row per slot on the servers ``sources`` capture, a message per server that could not be
    asked, the exit code that says why: 0, ``EXIT_UNREACHABLE`` or ``EXIT_REFUSED``)."""
    from cdc.api import SlotOwningSource
    from cdc.plugins import source_plugin

    by_type: dict[str, list] = {}
    for source in sources:
        by_type.setdefault(source.type, []).append(source)
    rows: list[dict] = []
    problems: list[str] = []
    code = 0
    for type_name, configs in by_type.items():
        try:
            plugin = source_plugin(type_name)
        except CdcError:
            continue  # `cdc status` shows the connector's own error; it has no slots to list
        if not issubclass(plugin, SlotOwningSource):
            continue
        listing = plugin.list_slots(configs, CONNECT_TIMEOUT)
        rows += listing.rows
        for problem in listing.problems:
            problems.append(str(problem))
            code = max(code, EXIT_UNREACHABLE if problem.retriable else EXIT_REFUSED)
    return rows, problems, code


def add_drop_parser(subparsers: argparse._SubParsersAction) -> None:
    drop = subparsers.add_parser(
        "drop", help="remove a source's replication slot, its publication (if cdc created it) and stored offset")
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
    from cdc.api import SlotOwningSource
    from cdc.config import load_config
    from cdc.log.open import open_log
    from cdc.offsets import OffsetStore
    from cdc.plugins import source_plugin
    from cdc.runtime.control import refuse_if_daemon_runs

    config = load_config(args.file)
    sources = {s.name: s for s in config.sources}
    source = sources.get(args.source)
    if source is None:
        raise ConfigError(f"no source named {args.source!r}; the file declares: {', '.join(sources) or 'no sources'}")
    plugin = source_plugin(source.type)
    if not issubclass(plugin, SlotOwningSource):
        raise ConfigError(f"cdc drop handles sources that keep a slot on their server (PostgreSQL); "
                          f"{source.name} is of type {source.type}")
    refuse_if_daemon_runs(config, source.name, kind="source")
    drop = plugin.plan_drop(source, CONNECT_TIMEOUT)
    try:
        plan = [f"the stored offset of source {source.name}", *drop.plan]
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
        drop.drop()
    finally:
        drop.close()
    print("dropped: " + "; ".join(p for p in plan if not p.startswith("(")), file=sys.stderr)
    return 0
