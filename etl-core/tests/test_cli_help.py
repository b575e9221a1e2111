"""`etl --help` and each command's `--help` explain every option and command they list."""

from __future__ import annotations

import argparse

from etl.cli import _parser


def undocumented(parser: argparse.ArgumentParser, prefix: str = "etl") -> list[str]:
    """The options, commands and command descriptions of ``parser`` (and its commands) with no help text."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions if choice.help}
            for name, sub in action.choices.items():
                if name not in helped:
                    missing.append(f"{prefix} {name} (in the list of commands)")
                if not sub.description:
                    missing.append(f"{prefix} {name} --help (no description)")
                missing += undocumented(sub, f"{prefix} {name}")
        elif not action.help:
            missing.append(f"{prefix} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_and_command_has_help_text() -> None:
    assert undocumented(_parser()) == []
