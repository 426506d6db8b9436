"""docs/cli.md is generated from the argparse parsers themselves, so it cannot drift from the
CLI: as a test this checks the page is what the parsers say today; run as a script
(`python tests/unit/test_cli_reference.py`) it rewrites the page.

The page is laid out here, from the parsers' actions (their option strings, metavars, nargs,
choices, groups and help), not by argparse's `HelpFormatter`: that one wraps and spells
options differently from one Python to the next (3.13 puts a long subcommand on a line of
its own and writes `-n, --lines N` for 3.12's `-n N, --lines N`), and the page must be the
same on every Python the project supports (3.11-3.13)."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest

DOC = Path(__file__).parents[2] / "docs" / "cli.md"
WIDTH = 98  # the page's text width
MAX_HELP_COLUMN = 24  # help text starts after the longest invocation, at most here

HEADER = """# Command-line reference

Generated from the argparse parsers by `python tests/unit/test_cli_reference.py`
(`tests/unit/test_cli_reference.py` checks it is current); do not edit by hand. The guides
explain the commands: [proxy.md](proxy.md#running-it) (`egress serve`),
[policy.md](policy.md#egress-check) (`egress check`),
[audit-log.md](audit-log.md#the-reviewers-commands) (`egress audit`), [netcut.md](netcut.md)
(`netcut`).

Exit codes: `egress check` 0 all allowed, 1 any blocked, 2 bad input; `egress serve` 0 after
SIGTERM/SIGINT, 2 bad input or a listener that cannot open; `egress audit` 0, 1 verify found a
problem or lines that are not JSON were skipped
([audit-log.md](audit-log.md#lines-that-are-not-json)), 2 bad input; `netcut` see
[netcut.md](netcut.md#exit-codes).
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _metavar(action: argparse.Action) -> str:
    if isinstance(action.metavar, str):
        return action.metavar
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _args(action: argparse.Action) -> str:
    """What follows an option (or stands for a positional), by its nargs."""
    name, nargs = _metavar(action), action.nargs
    if isinstance(action, argparse._SubParsersAction):
        return f"{name} ..."
    if nargs == 0:
        return ""
    if nargs is None:
        return name
    if nargs == "?":
        return f"[{name}]"
    if nargs == "*":
        return f"[{name} ...]"
    if nargs == "+":
        return f"{name} [{name} ...]"
    return " ".join([name] * int(nargs))


def _usage_item(action: argparse.Action) -> str:
    if not action.option_strings:
        return _args(action)
    text = " ".join(filter(None, (action.option_strings[0], _args(action))))
    return text


def _usage(parser: argparse.ArgumentParser, prog: str) -> str:
    """`usage: PROG [-h] [--x X] (--a A | --b B) POS [POS ...]`; when longer than WIDTH, the
    optional items wrapped under the first, then the positional ones from a line of their own."""
    groups = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    optional: list[str] = []
    done: set[int] = set()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or id(action) in done:
            continue
        group = groups.get(id(action))
        if group is not None:
            members = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
            done.update(id(a) for a in members)
            inner = " | ".join(_usage_item(a) for a in members)
            optional.append(f"({inner})" if group.required else f"[{inner}]")
        else:
            item = _usage_item(action)
            optional.append(item if action.required else f"[{item}]")
    positional = [_args(a) for a in parser._actions if not a.option_strings]
    head = f"usage: {prog} "
    whole = head + " ".join([*optional, *positional])
    if len(whole) <= WIDTH:
        return whole
    indent = " " * len(head)
    lines = _fill(optional, head, indent)
    if positional:
        lines += _fill(positional, indent, indent)
    return "\n".join(lines)


def _fill(items: list[str], first: str, indent: str) -> list[str]:
    """Items joined by spaces in lines of at most WIDTH, never split."""
    lines: list[str] = []
    line = first
    for item in items:
        if line.strip() and len(line) + len(item) > WIDTH:
            lines.append(line.rstrip())
            line = indent
        line += item + " "
    return [*lines, line.rstrip()]


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "prog": parser.prog}
    return " ".join(text.split())


def _entry(invocation: str, help_text: str, column: int, indent: int = 2) -> list[str]:
    """`  -n N, --lines N    help...`, help wrapped at WIDTH from `column` (on the next line
    when the invocation reaches it)."""
    lead = " " * indent + invocation
    if not help_text:
        return [lead]
    body = textwrap.wrap(help_text, WIDTH - column, break_on_hyphens=False)
    pad = " " * column
    if len(lead) + 2 <= column:
        return [lead.ljust(column) + body[0], *(pad + line for line in body[1:])]
    return [lead, *(pad + line for line in body)]


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return _metavar(action)
    args = _args(action)
    return ", ".join(f"{o} {args}" if args else o for o in action.option_strings)


def _action_lines(
    action: argparse.Action, parser: argparse.ArgumentParser, column: int
) -> list[str]:
    out = _entry(_invocation(action), _help(action, parser), column)
    if isinstance(action, argparse._SubParsersAction):
        for choice in action._choices_actions:
            out += _entry(choice.dest, " ".join((choice.help or "").split()), column, indent=4)
    return out


def _help_column(parser: argparse.ArgumentParser) -> int:
    """Two spaces after the longest invocation (subcommands indented by 4), at most
    MAX_HELP_COLUMN."""
    widths = [2 + len(_invocation(a)) for a in parser._actions if a.help != argparse.SUPPRESS]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            widths += [4 + len(c.dest) for c in action._choices_actions]
    return min(max(widths, default=0) + 2, MAX_HELP_COLUMN)


def _help_page(parser: argparse.ArgumentParser, prog: str) -> str:
    """The parser's usage, description and every argument by group, in this page's layout
    (`prog` given: argparse derives a subcommand's from its own formatter)."""
    out = [_usage(parser, prog)]
    if parser.description:
        out += ["", *textwrap.wrap(" ".join(parser.description.split()), WIDTH)]
    column = _help_column(parser)
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        if not actions:
            continue
        out += ["", f"{group.title}:"]
        for action in actions:
            out += _action_lines(action, parser, column)
    return "\n".join(out)


def _sections(title: str, parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> str:
    out = [f"## `{title}`", "", "```", _help_page(parser, title), "```", ""]
    for name, sub in _subparsers(parser).items():
        if name in skip:
            continue
        out += [f"### `{title} {name}`", "", "```", _help_page(sub, f"{title} {name}"), "```", ""]
    return "\n".join(out)


def render() -> str:
    from egress.audit.cli import _parser as audit_parser
    from egress.cli import build_parser
    from netcut.cli import build_parser as netcut_parser

    parts = [
        HEADER,
        _sections("egress", build_parser(), skip=("audit",)),
        _sections("egress audit", audit_parser()),
        _sections("netcut", netcut_parser()),
    ]
    return "\n".join(parts).rstrip() + "\n"


def test_cli_reference_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/cli.md is stale: python tests/unit/test_cli_reference.py"
    )


def test_reference_does_not_depend_on_argparses_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.13's HelpFormatter wraps and spells options differently from 3.12's: the page
    is laid out here, so another formatter (here, one that mangles everything) changes
    nothing (issue 32)."""
    before = render()
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setattr(argparse.HelpFormatter, "format_help", lambda self: "mangled")
    monkeypatch.setattr(argparse.HelpFormatter, "_format_action_invocation", lambda s, a: "?")
    assert render() == before


def test_every_command_is_in_the_reference() -> None:
    text = DOC.read_text()
    for command in ("egress check", "egress serve", "egress audit summarize", "egress audit report",
                    "netcut cut", "netcut restore"):  # fmt: skip
        assert f"### `{command}`" in text, command


if __name__ == "__main__":
    DOC.write_text(render())
