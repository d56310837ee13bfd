"""README.md's table of commands against the parser: every option a command takes is shown in its rows, every
option shown exists, alternatives shown as ``[--a | --b]`` exclude each other, and defaults shown are the
parser's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from xstack.cli.parser import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _shown(command: str) -> str:
    """The command cells (the first code span) of the README's table rows for ``command``, unescaped."""
    cells = re.findall(rf"^\| (`xstack {command}(?: [^`]*)?`)", README.read_text(encoding="utf-8"), re.M)
    assert cells, f"README.md has no row for xstack {command}"
    return " ".join(cells).replace("\\|", "|")


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS and a.dest != "help"]


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_option_of_a_command_is_shown_in_its_rows_and_every_option_shown_exists(command: str) -> None:
    parser = _subparsers()[command]
    shown = _shown(command)
    missing = [a.option_strings[-1] for a in _options(parser)
               if not any(re.search(re.escape(o) + r"(?![\w-])", shown) for o in a.option_strings)]  # fmt: skip
    assert not missing, f"xstack {command}: options not in README.md's table: {missing}"
    known = {o for a in parser._actions for o in a.option_strings}
    unknown = sorted(set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", shown)) - known - {"-m"})
    assert not unknown, f"xstack {command}: README.md shows options it does not take: {unknown}"


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_alternatives_and_defaults_shown_are_the_parsers(command: str) -> None:
    parser = _subparsers()[command]
    by_flag = {o: a for a in parser._actions for o in a.option_strings}
    shown = _shown(command)
    for first, second in re.findall(r"\[(--[\w-]+) \| (--[\w-]+)\]", shown):
        exclusive = any(
            by_flag[first] in g._group_actions and by_flag[second] in g._group_actions
            for g in parser._mutually_exclusive_groups
        )
        assert exclusive, f"xstack {command}: README.md shows [{first} | {second}], but they can be given together"
    for flag, value in re.findall(r"\[(--[\w-]+) (\d+)\]", shown):
        assert by_flag[flag].default == int(value), f"xstack {command} {flag}: README.md {value}, parser default"
