"""cdc: change data capture from PostgreSQL and MySQL/MariaDB into Kafka (or an embedded log),
and from there into derived stores (SQL warehouses, OpenSearch, Redis, Delta Lake)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where it is used: `cdc --version` stays quick
    import argparse


def build_parser() -> argparse.ArgumentParser:
    import argparse

    from cdc import demo
    from cdc.config import cli as config_cli
    from cdc.dev import cli as dev_cli

    parser = argparse.ArgumentParser(
        prog="cdc", description=__doc__,
        epilog="Start with: cdc validate FILE, then cdc run FILE; cdc status FILE shows what runs. "
               "cdc COMMAND --help explains each command.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    dev_cli.add_parser(commands)
    demo.add_parser(commands)
    config_cli.add_parser(commands)
    from cdc.runtime import cli as runtime_cli

    runtime_cli.add_parser(commands)
    from cdc.runtime import verify_cli

    verify_cli.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["status"]:
        # The running daemon answers `cdc status` without the config's models, the plugins or
        # the log being loaded here (well under a second); None: it cannot, ask the slow way.
        from cdc.runtime.quick_status import quick_status

        try:
            answered = quick_status(argv[1:])
        except BrokenPipeError:
            return _reader_gone()
        if answered is not None:
            return answered
    import logging

    from cdc import logs
    from cdc.errors import CdcError

    args = build_parser().parse_args(argv)
    logs.setup(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return args.handler(args)
    except CdcError as err:
        print(f"cdc: error: {err}", file=sys.stderr)
        return 2 if not err.retriable else 75  # EX_TEMPFAIL: trying again may help
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    # Whoever read our output stopped (`cdc tail ... | head`): that is the end, not an error.
    # Point stdout at /dev/null so that flushing it at exit does not fail again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
