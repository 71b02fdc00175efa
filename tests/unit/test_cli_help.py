"""`cdc --help` says what the tool is, and every argument of every command says what it wants."""

from __future__ import annotations

import argparse

from cdc.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "cdc"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_the_top_level_help_describes_the_tool():
    text = build_parser().format_help()
    assert "change data capture" in text and "``" not in text


def test_every_positional_argument_has_help():
    missing = [f"{path}: {action.dest}" for path, parser in _parsers(build_parser())
               for action in parser._actions
               if not action.option_strings and not isinstance(action, argparse._SubParsersAction)
               and not action.help]
    assert missing == []
