"""The ``cdc`` command."""

from __future__ import annotations

import argparse
import logging
import sys

from cdc import logs
from cdc.errors import CdcError


def build_parser() -> argparse.ArgumentParser:
    from cdc import demo
    from cdc.config import cli as config_cli
    from cdc.dev import cli as dev_cli

    parser = argparse.ArgumentParser(prog="cdc", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    dev_cli.add_parser(commands)
    demo.add_parser(commands)
    config_cli.add_parser(commands)
    from cdc.runtime import cli as runtime_cli

    runtime_cli.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.setup(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return args.handler(args)
    except CdcError as err:
        print(f"cdc: error: {err}", file=sys.stderr)
        return 2 if not err.retriable else 75  # EX_TEMPFAIL: trying again may help
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
