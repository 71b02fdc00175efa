"""``cdc validate FILE`` and ``cdc schema``."""

from __future__ import annotations

import argparse
import json

from cdc.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    validate = subparsers.add_parser(
        "validate", help="check a config file and report every problem in it",
        description="Check a config file: YAML, ${VAR} references, secret files, every field of "
                    "every source and sink, and what depends on the captured tables' columns (a "
                    "sink's documents) against the newest shapes in the log. Prints each problem as "
                    "file:line: path: message and exits 2, or prints a summary and exits 0.")
    validate.add_argument("file", help="the config file (YAML)")
    validate.add_argument("--offline", action="store_true",
                          help="do not read the log: skip the checks against the captured shapes")
    validate.set_defaults(handler=run_validate)

    schema = subparsers.add_parser(
        "schema", help="print the JSON Schema of config files (for editors)",
        description="Print the JSON Schema of a config file, including the models of the source "
                    "and sink plugins installed here.")
    schema.add_argument("--indent", type=int, default=2, help="spaces per level (0: one line)")
    schema.set_defaults(handler=run_schema)


def run_validate(args: argparse.Namespace) -> int:
    from cdc.config.shapes import check_shapes, shape_checked
    from cdc.config.validate import load_config_with_lines

    try:
        config, doc = load_config_with_lines(args.file)
    except ConfigError as err:
        for problem in err.problems:
            print(problem)
        return 2
    checked = [config.sinks[index].name for index, _ in shape_checked(config)]
    if checked and not args.offline:
        problems = check_shapes(config, doc)
        if problems:
            for problem in problems:
                print(problem)
            return 2
    if config.log.kafka is not None and not args.offline:
        for warning in kafka_warnings(config):
            print(f"{args.file}: warning: {warning}")
    summary = f"{args.file}: ok ({len(config.sources)} sources, {len(config.sinks)} sinks)"
    if checked:
        what = "not checked against the captured shapes (--offline)" if args.offline else \
            "checked against the captured shapes"
        summary += f"; sinks {', '.join(checked)}: {what}"
    print(summary)
    return 0


def kafka_warnings(config) -> list[str]:
    """The replication warnings of the config's Kafka (``KafkaLog.replication_warnings``); one
    line saying it could not be asked when the brokers are unreachable."""
    from cdc.errors import CdcError
    from cdc.log.open import open_log

    try:
        log_ = open_log(config.log)
    except CdcError as err:
        return [f"the replication of the topics was not checked: {err}"]
    try:
        warnings = getattr(log_, "replication_warnings", None)   # Kafka's only
        return warnings(config.log.topic_prefix) if warnings is not None else []
    except CdcError as err:
        return [f"the replication of the topics was not checked: {err}"]
    finally:
        log_.close()


def run_schema(args: argparse.Namespace) -> int:
    from cdc.config.schema import config_json_schema

    print(json.dumps(config_json_schema(), indent=args.indent or None))
    return 0
