"""``cdc validate FILE`` and ``cdc schema``."""

from __future__ import annotations

import argparse
import json

from cdc.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    validate = subparsers.add_parser(
        "validate", help="check a config file and report every problem in it",
        description="Check a config file: YAML, ${VAR} references, secret files, every field of "
                    "every source and sink. Prints each problem as file:line: path: message and "
                    "exits 2, or prints a summary and exits 0.")
    validate.add_argument("file", help="the config file (YAML)")
    validate.set_defaults(handler=run_validate)

    schema = subparsers.add_parser(
        "schema", help="print the JSON Schema of config files (for editors)",
        description="Print the JSON Schema of a config file, including the models of the source "
                    "and sink plugins installed here.")
    schema.add_argument("--indent", type=int, default=2, help="spaces per level (0: one line)")
    schema.set_defaults(handler=run_schema)


def run_validate(args: argparse.Namespace) -> int:
    from cdc.config import load_config

    try:
        config = load_config(args.file)
    except ConfigError as err:
        for problem in err.problems:
            print(problem)
        return 2
    print(f"{args.file}: ok ({len(config.sources)} sources, {len(config.sinks)} sinks)")
    return 0


def run_schema(args: argparse.Namespace) -> int:
    from cdc.config.schema import config_json_schema

    print(json.dumps(config_json_schema(), indent=args.indent or None))
    return 0
