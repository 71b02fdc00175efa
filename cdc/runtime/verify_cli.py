"""``cdc verify FILE SINK [TABLE...]``: whether a sink's store equals its source (cdc/runtime/verify.py).

Exit codes: 0 every table verified is equal (with ``--repair``: is equal once repaired); 1 some
keys differ; 3 none is known to differ but some are unsettled (still changing after every look,
or the store did not apply the log within ``--settle-timeout``): not decided; 2 a usage error (an unknown sink or table, a sink that cannot read its store back,
no source that can be read to verify); 75 a server, or for ``--repair`` the daemon, could not be reached (trying again may help).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from typing import Any

from cdc.errors import ConfigError

EXIT_EQUAL, EXIT_DIFFERENT, EXIT_UNSETTLED = 0, 1, 3


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    verify = subparsers.add_parser(
        "verify", help="compare a sink's store with the source database, chunk by chunk; "
                       "exit 0 equal, 1 different, 3 not decided (unsettled), 2 usage error")
    verify.add_argument("file", help="the config file")
    verify.add_argument("sink", help="the sink whose store to verify, as named in the file")
    verify.add_argument("tables", nargs="*", metavar="TABLE",
                        help="only these tables, as namespace.table (default: every table the sink reads)")
    verify.add_argument("--rows-per-s", type=float, default=None, metavar="N",
                        help="read at most N source rows a second (default: no limit)")
    verify.add_argument("--chunk", type=int, default=10_000, metavar="N", help="rows per chunk (default 10000); where the databases digest chunks, "
                             "a digest covers ten")
    verify.add_argument("--looks", type=int, default=3, metavar="N",
                        help="second looks at a key that keeps changing before it counts as unsettled (default 3; "
                             "a key is reported once two looks in a row find the same difference)")
    verify.add_argument("--show", type=int, default=10, metavar="N",
                        help="keys listed per kind of difference (default 10; the counts are complete)")
    verify.add_argument("--settle-timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the store to apply the log before a second look (default 60)")
    verify.add_argument("--repair", action="store_true",
                        help="send the missing and different keys again through the source's incremental "
                             "snapshot (the daemon must be running), wait until the store holds them, and "
                             "verify them again")
    verify.add_argument("--repair-timeout", type=float, default=300.0, metavar="S",
                        help="seconds a repair waits for the store to hold the keys (default 300)")
    verify.add_argument("--rows", action="store_true",
                        help="compare every chunk's rows here, even where the source and the store could "
                             "compare digests of it in their databases (the default where both can)")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.set_defaults(handler=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    from cdc.api import ReadableSink, VerifiableSource
    from cdc.config import load_config
    from cdc.log.open import open_log
    from cdc.plugins import sink_class, source_plugin
    from cdc.runtime.contexts import sink_context
    from cdc.runtime.verify import LogSettle, Options, Verifier
    from cdc.runtime.verify_repair import repair, require_daemon

    for name in ("chunk", "looks", "show"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1")
    if args.rows_per_s is not None and args.rows_per_s <= 0:
        raise ConfigError("--rows-per-s must be positive")
    config = load_config(args.file)
    if args.repair:
        require_daemon(config)
    sinks = {s.name: s for s in config.sinks}
    if args.sink not in sinks:
        raise ConfigError(f"no sink named {args.sink!r}; the file declares: {', '.join(sinks) or 'no sinks'}")
    sink_config = sinks[args.sink]
    sink_type = sink_class(sink_config)
    if not issubclass(sink_type, ReadableSink):
        raise ConfigError(f"sink {args.sink} ({sink_config.type}) cannot read its store back, so it cannot be verified")
    prefix = config.log.topic_prefix
    reads = [f"{prefix}.{t}" for t in args.tables]

    def wanted(table: str) -> bool:
        topic = f"{prefix}.{table}"
        return any(fnmatch.fnmatchcase(topic, glob) for glob in sink_config.topics) and \
            (not args.tables or topic in reads)

    readers: list[tuple[Any, Any, list[str]]] = []
    sink = sink_type(sink_config)
    sink.attach(sink_context(sink_config.name, log_config=config.log))
    log_ = open_log(config.log)
    try:
        for source_config in config.sources:
            source_type = source_plugin(source_config.type)
            if not issubclass(source_type, VerifiableSource):
                continue
            reader = source_type.open_reader(source_config)
            readers.append((source_config, reader, [t for t in reader.tables() if wanted(t)]))
        found = {t for _, _, tables in readers for t in tables}
        unknown = [t for t in args.tables if t not in found]
        if unknown:
            raise ConfigError(f"sink {args.sink} reads no table {', '.join(unknown)} of a source that can be "
                              f"verified; it reads: {', '.join(sorted(found)) or 'none'}")
        if not found:
            raise ConfigError(f"sink {args.sink} reads no table of a source that can be verified")
        sink.start_reading()
        reports, repaired = [], []
        options = Options(chunk=args.chunk, rows_per_s=args.rows_per_s, looks=args.looks, shown=args.show,
                          digests=not args.rows)
        for source_config, reader, tables in readers:
            if not tables:
                continue
            settle = LogSettle(log_, prefix, source_config.name, args.sink, timeout=args.settle_timeout, store=sink)
            try:
                verifier = Verifier(reader, sink, prefix, settle, options)
                done = []
                for table in tables:
                    report = verifier.table(table)
                    done.append(report)
                    if not args.json:
                        print("\n".join(report.lines()), flush=True)
                reports += done
                if args.repair and any(r.repairable for r in done):
                    again = repair(config, source_config.name, reader, verifier, done, args.repair_timeout)
                    repaired += again
                    if not args.json:
                        for report in again:
                            print(f"repair of {report.table}: " + "\n".join(report.lines()), flush=True)
            finally:
                settle.close()
    finally:
        for _, reader, _ in readers:
            reader.close()
        sink.stop()
        log_.close()
    if args.repair:  # what stands now: the rechecks of the keys sent, and what was not sent
        fixed = {r.table for r in repaired}
        differ = any(r.mismatched for r in repaired) or \
            any(r.counts["extra"] or (r.mismatched and r.table not in fixed) for r in reports)
        undecided = any(r.counts["unsettled"] for r in [*repaired, *reports])
    else:
        differ = any(r.mismatched for r in reports)
        undecided = any(r.counts["unsettled"] for r in reports)
    if args.json:
        json.dump({"sink": args.sink, "equal": not differ and not undecided, "tables": [r.as_json() for r in reports],
                   **({"repair": [r.as_json() for r in repaired]} if args.repair else {})},
                  sys.stdout, indent=2, default=str)
        print()
    return EXIT_DIFFERENT if differ else EXIT_UNSETTLED if undecided else EXIT_EQUAL
