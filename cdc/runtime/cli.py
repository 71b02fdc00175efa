"""``cdc run``, ``cdc status`` and ``cdc tail``: the daemon and a look at what it does."""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import sys

from cdc.errors import CdcError, ConfigError, LogUnavailableError
from cdc.runtime.control import daemon_status, refuse_if_daemon_runs


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser("run", help="run the declared connectors as a long-lived service")
    run.add_argument("file", help="the config file")
    run.add_argument("--only", nargs="+", metavar="NAME", help="run only these connectors")
    run.add_argument("--grace", type=float, default=20.0,
                     help="seconds each connector gets to drain on SIGTERM (default 20)")
    run.set_defaults(handler=cmd_run)

    status = subparsers.add_parser("status", help="per source: phase, position, lag; per sink: consumer lag; "
                                                  "per replication slot: retained WAL, owner")
    status.add_argument("file", help="the config file")
    status.add_argument("names", nargs="*", metavar="NAME",
                        help="only these connectors (the others' settings are not even read)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=cmd_status)

    from cdc.runtime import submit
    from cdc.runtime.slots_cli import add_drop_parser

    add_drop_parser(subparsers)
    submit.add_parser(subparsers)

    bootstrap = subparsers.add_parser(
        "bootstrap", help="fill a sink's store from the compacted topics (offset 0), then follow them")
    bootstrap.add_argument("file", help="the config file")
    bootstrap.add_argument("sink", help="the sink to fill, as named in the file")
    bootstrap.add_argument("--no-follow", action="store_true", help="exit once caught up with the topics' ends")
    bootstrap.set_defaults(handler=cmd_bootstrap)

    rebuild = subparsers.add_parser(
        "rebuild", help="build a sink's store again into a new generation, then switch readers to it "
                        "(through the daemon when it runs the sink)")
    rebuild.add_argument("file", help="the config file")
    rebuild.add_argument("sink", help="the sink to rebuild, as named in the file")
    rebuild.set_defaults(handler=cmd_rebuild)

    for action, text in (("restart", "stop one connector of the running daemon (it drains) and start it again"),
                         ("pause", "stop one connector of the running daemon (it drains) until `cdc resume`"),
                         ("resume", "start a paused connector of the running daemon again")):
        command = subparsers.add_parser(action, help=text)
        command.add_argument("file", help="the config file of the running daemon")
        command.add_argument("name", help="the source or sink, as named in the file")
        command.set_defaults(handler=cmd_control, action=action)

    snapshot = subparsers.add_parser(
        "snapshot", help="re-read tables of a running source in chunks while it streams (an incremental "
                         "snapshot; needs the source's signal_table)")
    snapshot.add_argument("file", help="the config file of the running daemon")
    snapshot.add_argument("name", help="the source, as named in the file")
    snapshot.add_argument("tables", nargs="*", help="the tables, as namespace.table (public.orders, shop.orders)")
    snapshot.add_argument("--where", metavar="SQL",
                          help="read only the rows matching this SQL condition on the table (e.g. \"region = 'eu'\")")
    action = snapshot.add_mutually_exclusive_group()
    action.add_argument("--stop", action="store_const", dest="action", const="stop",
                        help="stop the incremental snapshot of these tables (of all, if none is named)")
    action.add_argument("--pause", action="store_const", dest="action", const="pause",
                        help="pause the incremental snapshot under way: no further chunk is read (the stream "
                             "goes on); kept across restarts")
    action.add_argument("--resume", action="store_const", dest="action", const="resume",
                        help="resume a paused incremental snapshot")
    snapshot.set_defaults(handler=cmd_snapshot)

    tail = subparsers.add_parser("tail", help="print the change events of a topic as they arrive")
    tail.add_argument("file", help="the config file (for the log to read)")
    tail.add_argument("topic", help="the topic, e.g. <prefix>.public.orders (cdc status lists what runs)")
    tail.add_argument("--from-beginning", action="store_true", help="start at offset 0, not at the end")
    tail.add_argument("--max", type=int, default=None, help="stop after this many records")
    tail.add_argument("--idle-exit", type=float, default=None,
                      help="stop after this many seconds without a record")
    tail.set_defaults(handler=cmd_tail)


def _connector_names(config, only: list[str] | None) -> list[str]:
    names = [s.name for s in config.sources] + [s.name for s in config.sinks]
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(f"--only names {', '.join(unknown)}, which the file does not declare; "
                              f"it declares: {', '.join(names) or 'nothing'}")
        names = [n for n in names if n in only]
    return names


def cmd_run(args: argparse.Namespace) -> int:
    from cdc.config import load_config
    from cdc.runtime.status_report import StatusReport, file_digest
    from cdc.runtime.supervisor import Supervisor

    try:
        digest = file_digest(args.file)  # before it is loaded: an edit in between shows as a mismatch
    except OSError:
        digest = ""  # load_config says what is wrong with the file
    config = load_config(args.file, only=args.only)
    names = _connector_names(config, args.only)
    if not names:
        print("nothing to run: the file declares no sources or sinks", file=sys.stderr)
        return 2
    level = logging.getLogger().level
    kinds = {s.name: "sink" for s in config.sinks}
    unhealthy_after = {c.name: c.unhealthy_after for c in [*config.sources, *config.sinks]}
    retry_failed = {c.name: c.retry_failed for c in [*config.sources, *config.sinks]}
    supervisor = Supervisor(args.file, names, http=config.http, grace=args.grace, level=level, kinds=kinds,
                            unhealthy_after=unhealthy_after, retry_failed=retry_failed, token=config.token())
    supervisor.status_report = StatusReport(args.file, config, digest, supervisor.snapshot)
    return supervisor.run()


def cmd_control(args: argparse.Namespace) -> int:
    """``cdc restart|pause|resume FILE NAME``: the daemon does it; the others keep running."""
    from cdc.config import load_config
    from cdc.runtime.control import post_command

    answer = post_command(load_config(args.file, only=[args.name]), args.name, args.action)
    print(answer.get("message", answer), file=sys.stderr)
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``cdc snapshot FILE SOURCE TABLE... [--where SQL] [--stop|--pause|--resume]``: the daemon
    asks the source through its signal table."""
    from cdc.config import load_config
    from cdc.errors import ConfigError
    from cdc.runtime.control import post_command

    action = args.action or "execute"
    if action == "execute" and not args.tables:
        raise ConfigError("name the tables to snapshot (namespace.table), or --stop, --pause, --resume")
    if args.where is not None and action != "execute":
        raise ConfigError("--where goes with the tables to snapshot, not with --stop, --pause or --resume")
    body = {"tables": args.tables, "action": action}
    if args.where is not None:
        body["where"] = args.where
    answer = post_command(load_config(args.file, only=[args.name]), args.name, "snapshot", body)
    print(answer.get("message", answer), file=sys.stderr)
    return 0


EXIT_LOG_UNREACHABLE = 69  # `cdc status`: the log cannot be reached (EX_UNAVAILABLE)
STATUS_LOG_TIMEOUT = 5.0    # seconds `cdc status` waits for the brokers


def cmd_status(args: argparse.Namespace) -> int:
    """Exit codes: 0 shown; 2 the config is invalid; 69 the log (Kafka) or a source's server
    cannot be reached: one line says so, after the daemon's own view of its connectors when it
    answers; 77 a source's server refused the login (the line names the setting to correct).
    Everything that could be read is shown either way."""
    from cdc.config import KafkaLogConfig, load_config
    from cdc.log.kafka_logs import LOGGER as LIBRDKAFKA_LOGGER
    from cdc.runtime.slots_cli import slot_rows
    from cdc.runtime.status_lines import slot_line, status_line, store_lines

    config = load_config(args.file, only=args.names or None)
    _check_names(config, args.names)
    live = {row["name"]: row for row in (daemon_status(config.http) or [])}
    slots, problems, code = slot_rows(config.sources)  # from the servers themselves: shown even without the log
    for problem in problems:
        print(f"cdc status: {problem}", file=sys.stderr)
    if logging.getLogger().level > logging.DEBUG:  # (-v shows them) the one line below says it all
        LIBRDKAFKA_LOGGER.setLevel(logging.CRITICAL + 1)
    try:
        rows = _status_rows(config, live)
    except LogUnavailableError as err:
        if not args.json:
            for row in live.values():
                print(status_line({**row, "consumer_lag": None}))
            for row in slots:
                print(slot_line(row))
        backend = config.log.backend
        where = (f"Kafka at {backend.bootstrap_servers}" if isinstance(backend, KafkaLogConfig)
                 else f"the embedded log at {backend.path}")
        print(f"cdc status: {where} is unreachable ({err})", file=sys.stderr)
        return EXIT_LOG_UNREACHABLE
    if args.json:
        print(json.dumps(rows + slots, indent=2))
        return code
    for row in rows:
        print(status_line(row))
        for line in store_lines(row):
            print(line)
    for row in slots:
        print(slot_line(row))
    if isinstance(config.log.backend, KafkaLogConfig):
        from cdc.config.cli import kafka_warnings

        for warning in kafka_warnings(config):
            print(f"cdc status: warning: {warning}", file=sys.stderr)
    return code


def _check_names(config, names: list[str] | None) -> None:
    declared = {c.name for c in [*config.sources, *config.sinks]}
    unknown = sorted(set(names or ()) - declared)
    if unknown:
        raise ConfigError(f"the file declares no connector named {', '.join(unknown)}")


def _status_rows(config, live: dict[str, dict]) -> list[dict]:
    from cdc.log.open import open_log
    from cdc.offsets import OffsetStore
    from cdc.runtime.status_report import HEALTH, daemon_rows

    rows = daemon_rows(config.sources, config.sinks, live)
    if rows is not None:
        return rows
    log_ = open_log(config.log)
    if hasattr(log_, "timeout"):
        log_.timeout = min(log_.timeout, STATUS_LOG_TIMEOUT)  # a look, not a job: fail fast
    health = HEALTH
    try:
        stored = OffsetStore(log_, config.log.topic_prefix).load_all()
        rows = []
        for source in config.sources:
            row = live.get(source.name, {})
            position = stored.get(source.name)
            rows.append({"kind": "source", "name": source.name,
                         "phase": row.get("phase", "not running"),
                         "position": row.get("position") or (str(position) if position else None),
                         "lag_seconds": row.get("lag_seconds"), "events": row.get("events"),
                         "snapshot_progress": row.get("snapshot_progress"),
                         "incremental_snapshot": row.get("incremental_snapshot"), **{k: row.get(k) for k in health}})
        topics = log_.topics()
        for sink in config.sinks:
            row = live.get(sink.name, {})
            wanted = [t for t in topics if any(fnmatch.fnmatchcase(t, g) for g in sink.topics)]
            rows.append({"kind": "sink", "name": sink.name, "phase": row.get("phase", "not running"),
                         "consumer_lag": _consumer_lag(log_, sink.name, wanted),
                         "stores": _store_details(sink, log_),
                         "details": row.get("details") or {}, **{k: row.get(k) for k in health}})
    finally:
        log_.close()
    return rows


def _store_details(sink_config, log_) -> list[dict] | None:
    """What a sink that can ``describe()`` its store says (e.g. per OpenSearch index: alias,
    generation, documents), each row with the consumer lag of its topic; None for other sinks."""
    from cdc.api import DescribedSink
    from cdc.plugins import sink_class

    try:
        plugin = sink_class(sink_config)
    except CdcError as err:
        return [{"error": str(err)}]
    if not issubclass(plugin, DescribedSink):
        return None
    sink = plugin(sink_config)
    try:
        sink.start()
        rows = sink.describe()
    except CdcError as err:
        return [{"error": f"{type(err).__name__}: {err}"}]
    finally:
        sink.stop()
    topics = set(log_.topics())
    for row in rows:
        if row.get("topic") in topics:
            row["lag"] = _consumer_lag(log_, sink_config.name, [row["topic"]])
    return rows


def _consumer_lag(log_, group: str, topics: list[str]) -> int:
    reader = log_.reader(group)
    try:
        lag = 0
        for topic in topics:
            ends = log_.end_offsets(topic)
            committed = reader.committed(list(ends))
            lag += sum(end - (committed.get(tp) or 0) for tp, end in ends.items())
        return lag
    finally:
        reader.close()


def format_record(record) -> str:
    """One record, in any format (debezium-json and avro records shown as their json envelopes)."""
    from cdc.formats.avro import is_avro
    from cdc.sink_events import decode_key, decode_value

    key = record.key.decode(errors="replace") if record.key is not None else "null"
    if key.startswith('{"schema"') or (record.key is not None and is_avro(record.key)):  # its payload
        try:
            key = json.dumps(decode_key(record.key), ensure_ascii=False, separators=(",", ":"))
        except (ValueError, KeyError, TypeError):
            pass
    where = f"{record.topic}[{record.partition}]@{record.offset}"
    if record.value is None:
        return f"{where} {key} <tombstone>"
    value = decode_value(record.value)
    if not isinstance(value, dict) or "op" not in value:
        return f"{where} {key} {json.dumps(value)}"
    source = value.get("source") or {}
    head = f"{where} {value['op']} {key} version={source.get('version')}"
    body = {k: value[k] for k in ("before", "after") if value.get(k) is not None}
    return head + "".join(f"\n    {k}: {json.dumps(v, ensure_ascii=False)}" for k, v in body.items())


def cmd_tail(args: argparse.Namespace) -> int:
    import time

    from cdc.config import load_config
    from cdc.log.open import open_log

    config = load_config(args.file)
    log_ = open_log(config.log)
    if args.topic not in log_.topics():
        raise LogUnavailableError(f"topic {args.topic} does not exist (yet); topics: "
                                  f"{', '.join(sorted(log_.topics())) or 'none'}")
    ends = log_.end_offsets(args.topic)
    reader = log_.reader()
    reader.assign({tp: 0 if args.from_beginning else end for tp, end in ends.items()})
    shown, last_seen = 0, time.monotonic()
    try:
        while args.max is None or shown < args.max:
            records = reader.poll(100 if args.max is None else min(100, args.max - shown), 0.5)
            if records:
                last_seen = time.monotonic()
            elif args.idle_exit is not None and time.monotonic() - last_seen > args.idle_exit:
                break
            for record in records:
                print(format_record(record), flush=True)
                shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
        log_.close()
    return 0


def _sink_runner(config, name: str, progress=None):
    from cdc.log.open import open_log
    from cdc.plugins import sink_class
    from cdc.runtime.sink_runner import SinkRunner

    sinks = {s.name: s for s in config.sinks}
    if name not in sinks:
        raise ConfigError(f"no sink named {name!r}; the file declares: {', '.join(sinks) or 'no sinks'}")
    sink_config = sinks[name]
    return SinkRunner(sink_class(sink_config)(sink_config), open_log(config.log),
                      config.log.topic_prefix, progress=progress)


def _interruptible():
    from cdc.runtime.stop_signals import stop_on_signals

    return stop_on_signals()


def cmd_bootstrap(args: argparse.Namespace) -> int:
    import time

    from cdc.config import load_config
    from cdc.runtime.progress_bar import ProgressBar

    config = load_config(args.file)
    refuse_if_daemon_runs(config, args.sink)
    runner = _sink_runner(config, args.sink, progress=ProgressBar(f"bootstrap {args.sink}"))
    topics = runner.matching_topics()
    retention = min((r for r in (runner.log.delete_retention_ms(t) for t in topics) if r is not None),
                    default=None)
    stop = _interruptible()
    began = time.monotonic()
    if runner.sink.bootstrap_by_rebuild:
        # Readers keep what they see (nothing, or the current generation) until the new
        # generation has caught up; then they switch to it at once.
        runner.rebuild(stop)
    else:
        runner.run(stop, from_start=True, until_caught_up=True)
    elapsed_ms = (time.monotonic() - began) * 1000
    print(f"bootstrap of {args.sink}: {runner.stats.events:,} events from {len(topics)} topics "
          f"in {elapsed_ms / 1000:.1f}s", file=sys.stderr)
    if retention is not None and elapsed_ms > retention:
        print(f"warning: the scan took {elapsed_ms / 1000:.0f}s, longer than the topics' delete.retention.ms "
              f"({retention / 1000:.0f}s): a delete whose tombstone was compacted away during the scan may "
              "have been missed. Run the bootstrap again (it is idempotent), or raise delete.retention.ms.",
              file=sys.stderr)
    if args.no_follow or stop.is_set():
        return 0
    print("caught up; following the topics (Ctrl-C to stop)", file=sys.stderr)
    runner = _sink_runner(config, args.sink)
    runner.run(stop)
    return 0


def _rebuild_through_daemon(config, name: str, row: dict) -> int:
    """The daemon stops the sink (it drains), rebuilds its store, and streams again; this waits
    for the rebuild to finish and says so."""
    import time

    from cdc.runtime.control import post_command

    before = row.get("rebuilt_at")
    print(post_command(config, name, "rebuild").get("message"), file=sys.stderr)
    stop = _interruptible()
    shown = 0.0
    while not stop.wait(0.5):
        now = {r["name"]: r for r in (daemon_status(config.http) or [])}.get(name)
        if now is None:
            raise LogUnavailableError(f"the daemon at {config.http} stopped answering during the rebuild")
        if now.get("rebuilt_at") not in (None, before):
            print(f"rebuilt {name} in the daemon; it streams again", file=sys.stderr)
            return 0
        if now.get("phase") == "failed":
            raise ConfigError(f"the rebuild of {name} failed in the daemon: {now.get('last_error')}")
        if time.monotonic() - shown > 5:
            print(f"{name}: {now.get('phase')}, {now.get('events') or 0:,} events written", file=sys.stderr)
            shown = time.monotonic()
    print(f"stopped waiting; the daemon goes on rebuilding {name}", file=sys.stderr)
    return 130


def _rebuilds_itself(config, name: str) -> bool:
    """Whether sink ``name`` reads its topics itself (SelfDrivenSink); ConfigError if it does
    and cannot rebuild."""
    from cdc.api import SelfDrivenSink, SelfRebuildingSink
    from cdc.plugins import sink_class

    sink_config = {s.name: s for s in config.sinks}.get(name)
    if sink_config is None:
        return False
    plugin = sink_class(sink_config)
    if not issubclass(plugin, SelfDrivenSink):
        return False
    if not issubclass(plugin, SelfRebuildingSink):
        raise ConfigError(f"sink {name} ({sink_config.type}) reads its topics itself and cannot rebuild its store")
    return True


def _self_rebuild(config, name: str) -> int:
    """A self-driven sink rebuilds in its own run: that run is stopped once it streams again."""
    from cdc.runtime.worker import build_runner

    stop = _interruptible()
    seen: list[str] = []  # the phases reported, each once in a row

    def rebuilt() -> bool:
        return "rebuilding" in seen and "streaming" in seen[seen.index("rebuilding"):]

    def report(stats) -> None:
        if not seen or seen[-1] != stats.phase:
            seen.append(stats.phase)
        if rebuilt():
            stop.set()

    runner = build_runner(config, name, report)
    runner.sink.request_rebuild()
    runner.run(stop)
    if not rebuilt():
        print(f"the rebuild of {name} did not finish (phases: {' -> '.join(seen)})", file=sys.stderr)
        return 130
    print(f"rebuilt {name}", file=sys.stderr)
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from cdc.config import load_config
    from cdc.runtime.progress_bar import ProgressBar

    config = load_config(args.file, only=[args.sink])
    row = {r["name"]: r for r in (daemon_status(config.http) or [])}.get(args.sink)
    if row is not None and row.get("phase") not in ("stopped", "finished"):
        return _rebuild_through_daemon(config, args.sink, row)
    if _rebuilds_itself(config, args.sink):
        return _self_rebuild(config, args.sink)
    runner = _sink_runner(config, args.sink, progress=ProgressBar(f"rebuild {args.sink}"))
    runner.rebuild(_interruptible())
    print(f"rebuilt {args.sink}: readers now see generation {runner.sink.current_generation()}", file=sys.stderr)
    return 0
