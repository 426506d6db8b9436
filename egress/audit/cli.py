"""`egress audit summarize|filter|tail|verify|suggest|report|export`: the reviewer's tools
for the audit log, parsed here and carried out by `commands.py`
(docs/audit-log.md#the-reviewers-commands).

Strategy: argparse reads the arguments (a mistyped subcommand gets its own usage, not the
parent's), one table maps the subcommand to its function, and the exit codes are decided
once: 0 ok, 1 verify failed, 2 usage or bad input (`InputError`), 130 on Ctrl-C; a reader
that leaves (`| head`) is no error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Final

from egress.audit.commands import (
    DEFAULT_TOP,
    cmd_export,
    cmd_filter,
    cmd_report,
    cmd_suggest,
    cmd_summarize,
    cmd_tail,
    cmd_verify,
)
from egress.audit.read import InputError
from egress.audit.render import printable

MODES: Final = ("http", "socks5", "transparent", "dns", "forward")  # records' `mode`
DEFAULT_TAIL: Final = 10  # like tail(1)
DEFAULT_INTERVAL: Final = 0.25  # seconds between polls of a followed log


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="egress audit", description="Read, filter and verify egress audit logs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    summarize = commands.add_parser(
        "summarize", help="counts by host, domain, client, reason and rule"
    )
    _add_window(summarize)
    summarize.add_argument("--json", action="store_true", help="JSON for tooling")
    summarize.add_argument(
        "--top",
        type=_positive(int),
        metavar="N",
        help=f"rows per table (default {DEFAULT_TOP}; all with --json)",
    )
    summarize.add_argument("paths", nargs="+", metavar="PATH")
    for name, help_text in (
        ("filter", "print the events that match"),
        ("tail", "print the last events, and follow with -f"),
    ):
        sub = commands.add_parser(name, help=help_text)
        _add_window(sub)
        _add_selectors(sub)
        if name == "tail":
            sub.add_argument(
                "-n", "--lines", type=_positive(int, zero=True), default=DEFAULT_TAIL, metavar="N"
            )
            sub.add_argument(
                "-f",
                "--follow",
                action="store_true",
                help="keep reading as the log grows; survives rotation",
            )
            sub.add_argument(
                "--interval",
                type=_positive(float),
                default=DEFAULT_INTERVAL,
                metavar="SECONDS",
                help="poll interval with --follow",
            )
        sub.add_argument("paths", nargs="+", metavar="PATH")
    suggest = commands.add_parser(
        "suggest",
        help="print a minimal policy (TOML) allowing the logged traffic; reserved "
        "and blocked destinations are listed, not allowed",
    )
    _add_window(suggest)
    suggest.add_argument(
        "--client",
        action="append",
        metavar="ID",
        help="only records of this client_id (repeatable)",
    )
    suggest.add_argument("paths", nargs="+", metavar="LOG")
    report = commands.add_parser(
        "report",
        help="write one self-contained HTML page for a reviewer (verify result, timelines, "
        "blocked hosts and domains, refusals, policy changes); exit 1 if the chain is broken",
    )
    report.add_argument("--html", required=True, metavar="OUT", help="the page to write")
    report.add_argument(
        "--live",
        action="store_true",
        help="accept a last run without an end record (still being written)",
    )
    report.add_argument("paths", nargs="+", metavar="LOG")
    export = commands.add_parser(
        "export",
        help="print the request records as OCSF 1.7.0 events (HTTP, Network and DNS "
        "Activity), one JSON line each, for a SIEM",
    )
    export.add_argument("--format", required=True, choices=("ocsf",), help="the event format")
    _add_window(export)
    export.add_argument("paths", nargs="+", metavar="LOG")
    verify = commands.add_parser("verify", help="check the hash chain: exit 1 if broken")
    verify.add_argument(
        "--live",
        action="store_true",
        help="accept a last run without an end record (still being written)",
    )
    verify.add_argument(
        "--head",
        type=_sha256,
        metavar="SHA256",
        help="the head hash kept out of band; the chain must end there",
    )
    verify.add_argument("paths", nargs="+", metavar="PATH")
    return parser


def _sha256(text: str) -> str:
    """`--head`: 64 hex digits (bad input, exit 2; not a broken chain, exit 1)."""
    value = text.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise argparse.ArgumentTypeError(
            f"not a SHA-256 hash (64 hex digits): {printable(text[:80])}"
        )
    return value


def _positive(kind: type[int] | type[float], zero: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be {'>= 0' if zero else '> 0'}: {text}")
        return value

    return parse


def _add_window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        metavar="TIME",
        help="RFC 3339 (2026-11-30T05:00:00Z) or relative (90s, 15m, 1h, 2d)",
    )
    parser.add_argument("--until", metavar="TIME", help="exclusive; same forms as --since")


def _add_selectors(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--decision", action="append", choices=("allow", "block", "error"))
    parser.add_argument(
        "--host",
        action="append",
        metavar="PATTERN",
        help="fnmatch pattern; *.example.com matches the apex too",
    )
    parser.add_argument(
        "--client",
        action="append",
        metavar="PATTERN",
        help="matches ip:port, ip or client_id (fnmatch)",
    )
    parser.add_argument(
        "--reason",
        action="append",
        metavar="CODE",
        help="a reason code (docs/audit-log.md#reason-codes); an unknown one is an error",
    )
    parser.add_argument(
        "--mode",
        action="append",
        choices=MODES,
        help="how the client reached the proxy: http (the HTTP proxy), socks5, transparent, "
        "dns (transparent mode's DNS), forward (a framework-route forwarder)",
    )
    parser.add_argument(
        "--control", action="store_true", help="also print start/rotate/loss/end records"
    )
    parser.add_argument("--json", action="store_true", help="print the raw JSON lines")


COMMANDS: Final[dict[str, Callable[[argparse.Namespace], int]]] = {
    "summarize": cmd_summarize,
    "filter": cmd_filter,
    "tail": cmd_tail,
    "verify": cmd_verify,
    "suggest": cmd_suggest,
    "report": cmd_report,
    "export": cmd_export,
}


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]  # type: ignore[no-any-return]
    return parser


def audit_main(argv: list[str]) -> int:
    """`egress audit ARGV...` (ARGV without the word "audit"); returns the exit code."""
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # the subcommand's usage, not the parent's: it is the one mistyped
            _subcommand(parser, args.command).error(
                f"unrecognized arguments: {printable(' '.join(extra))}"
            )
    except SystemExit as exc:  # argparse has printed usage and the error
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return COMMANDS[args.command](args)
    except InputError as exc:
        print(f"egress audit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `| head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit-time flush does not fail again
        os.close(devnull)
        return 0


def main() -> None:  # pragma: no cover - `python -m egress.audit.cli`
    sys.exit(audit_main(sys.argv[1:]))


if __name__ == "__main__":  # pragma: no cover
    main()
