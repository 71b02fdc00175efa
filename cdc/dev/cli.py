"""``cdc dev up|down|status|env|fetch`` and, one service at a time,
``cdc dev stop|kill|freeze|thaw|start|restart SERVICE``: the local stack from the command line."""

from __future__ import annotations

import argparse
import time

from cdc.dev import jars, stack
from cdc.dev.paths import env_file


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    dev = subparsers.add_parser("dev", help="the local stack of real servers (no Docker)")
    actions = dev.add_subparsers(dest="dev_action", required=True)
    up = actions.add_parser("up", help="start the servers (idempotent) and write dev.env")
    up.add_argument("--only", nargs="+", metavar="SERVICE", type=_services,
                    help=f"start only these ({', '.join(stack.ALL)}; spaces or commas between)")
    up.add_argument("--profile", choices=sorted(stack.PROFILES),
                    help="the default servers and more: 'cluster' adds a replicated Kafka of three nodes")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    actions.add_parser("down", help="stop every server and delete its data")
    actions.add_parser("status", help="show what runs and whether it answers")
    actions.add_parser("env", help="print the connection settings (shell syntax)")
    actions.add_parser("fetch", help="resolve the Kafka, OpenSearch (and its security plugin), Spark and Kafka Connect "
                                     "jars, build the schema registry, and fetch the PostgreSQL 17 binaries into the cache")
    servers = [name for name in stack.ALL if name != "spark"]
    for action, text in ONE_SERVICE.items():
        one = actions.add_parser(action, help=text)
        one.add_argument("service", choices=servers, help="the server: " + ", ".join(servers))
        if action in ("start", "restart"):
            one.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    dev.set_defaults(handler=run)


ONE_SERVICE = {
    "stop": "stop one server cleanly, keeping its data and port",
    "kill": "SIGKILL one server's process group (a crash), keeping its data and port",
    "freeze": "SIGSTOP one server's process group (it hangs with its connections open)",
    "thaw": "SIGCONT a frozen server",
    "start": "start a stopped or crashed server again on its data and port",
    "restart": "stop, then start, one server on its data and port",
}


def _services(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in stack.ALL]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(stack.ALL)})")
    return names


def run(args: argparse.Namespace) -> int:
    if args.dev_action == "up":
        began = time.monotonic()
        only = [name for names in args.only for name in names] if args.only else None
        if args.profile:
            only = [*(only or ()), *stack.PROFILES[args.profile]]
        env = stack.up(only, timeout=args.timeout)
        for key, value in sorted(env.items()):
            print(f"{key}={value}")
        print(f"# up in {time.monotonic() - began:.1f}s; settings in {env_file()}")
        return 0
    if args.dev_action == "down":
        stopped = stack.down()
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        return 0
    if args.dev_action == "status":
        rows = stack.status()
        print(f"{'service':<13} {'state':<10} {'pid':>7}  ports")
        for row in rows:
            state = ("frozen" if row.frozen else "up" if row.answering else
                     "starting" if row.running else "down")
            ports = " ".join(f"{k}={v}" for k, v in row.ports.items())
            print(f"{row.name:<13} {state:<10} {row.pid or '-':>7}  {ports}")
        return 0 if all(r.answering for r in rows if r.running and not r.frozen) else 1
    if args.dev_action == "env":
        for key, value in sorted(stack.read_env().items()):
            print(f"{key}={value}")
        return 0
    if args.dev_action == "fetch":
        from cdc.dev import postgres17

        for component in jars.COMPONENTS:
            print(f"{component}: {jars.ensure_jars(component)}")
        print(f"postgres17 (unpacked): {postgres17.install_dir()}")
        return 0
    if args.dev_action in ONE_SERVICE:
        began = time.monotonic()
        action = getattr(stack, args.dev_action)
        if args.dev_action in ("start", "restart"):
            action(args.service, timeout=args.timeout)
        else:
            action(args.service)
        print(f"{args.service}: {args.dev_action} done in {time.monotonic() - began:.1f}s")
        return 0
    raise AssertionError(args.dev_action)
