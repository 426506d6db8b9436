"""docs/cli.md is generated from the argparse parsers themselves, so it cannot drift from the
CLI: as a test this checks the page is what the parsers print today; run as a script
(`python tests/unit/test_cli_reference.py`) it rewrites the page."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "cli.md"
WIDTH = "100"  # argparse wraps to $COLUMNS: fixed, so the page does not depend on a terminal

HEADER = """# Command-line reference

Generated from the argparse parsers by `python tests/unit/test_cli_reference.py`
(`tests/unit/test_cli_reference.py` checks it is current); do not edit by hand. The guides
explain the commands: [proxy.md](proxy.md#running-it) (`egress serve`),
[policy.md](policy.md#egress-check) (`egress check`),
[audit-log.md](audit-log.md#the-reviewers-commands) (`egress audit`), [netcut.md](netcut.md)
(`netcut`).

Exit codes: `egress check` 0 all allowed, 1 any blocked, 2 bad input; `egress serve` 0 after
SIGTERM/SIGINT, 2 bad input or a listener that cannot open; `egress audit` 0, 1 verify found a
problem, 2 bad input; `netcut` see [netcut.md](netcut.md#exit-codes).
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _sections(title: str, parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> str:
    out = [f"## `{title}`", "", "```", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subparsers(parser).items():
        if name in skip:
            continue
        out += [f"### `{title} {name}`", "", "```", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def render() -> str:
    os.environ["COLUMNS"] = WIDTH
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


def test_every_command_is_in_the_reference() -> None:
    text = DOC.read_text()
    for command in ("egress check", "egress serve", "egress audit summarize", "egress audit report",
                    "netcut cut", "netcut restore"):  # fmt: skip
        assert f"### `{command}`" in text, command


if __name__ == "__main__":
    DOC.write_text(render())
