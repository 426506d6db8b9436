"""The `egress` command line: serve, check, audit (docs/proxy.md#standalone-egress-serve).

Exit codes: 0 success, 1 the check failed (a target blocked), 2 bad usage or bad input (a
short error naming the culprit, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .config import Settings, settings_from_args
from .errors import EgressError


def add_policy_options(p: argparse.ArgumentParser) -> None:
    """The policy options shared by `serve` and `check`."""
    g = p.add_argument_group("policy")
    g.add_argument("--allow", action="append", default=[], metavar="RULE", help="allow rule")
    g.add_argument("--block", action="append", default=[], metavar="RULE", help="block rule")
    g.add_argument("--default", choices=["deny", "allow"], help="posture (default: deny)")
    g.add_argument(
        "--framework-route",
        action="append",
        default=[],
        metavar="URL",
        help="a framework service the sandbox may reach even on a reserved address, exactly "
        "this host and port (e.g. http://127.0.0.1:8000); repeatable",
    )
    g.add_argument(
        "--resolve",
        action="append",
        default=[],
        metavar="NAME=ADDR",
        help="pin NAME to ADDR instead of asking DNS (repeatable; repeating a NAME gives it "
        "several addresses)",
    )
    g.add_argument(
        "--reserve",
        action="append",
        default=[],
        metavar="CIDR",
        help="also refuse destinations in CIDR, whatever the rules say (repeatable)",
    )
    g.add_argument("--reserve-private", action="store_true", help="also refuse RFC 1918/CGNAT/ULA")
    g.add_argument("--policy", metavar="FILE.toml", help="policy file (rules are merged)")
    g.add_argument(
        "--report-only",
        action="store_true",
        help="report mode for every policy: refusals are let through and recorded as "
        "`would: block` (the address guard still refuses reserved addresses)",
    )


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="egress", description=__doc__)
    parser.add_argument("--version", action="version", version=f"egress {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="judge targets against a policy, without a proxy")
    add_policy_options(check)
    check.add_argument("--lint", action="store_true", help="report suspicious rules")
    check.add_argument("--resolve-names", action="store_true", help="resolve names via DNS")
    check.add_argument(
        "--client",
        metavar="NAME",
        help="judge with the policy of [clients.NAME] (top-level blocks included), as the "
        "proxy does for that client",
    )
    check.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="a URL (http://h/ = absolute-form request, https://h/ = CONNECT) or host[:port] "
        "(a CONNECT; port 443 when omitted)",
    )

    serve = sub.add_parser("serve", help="run the proxy")
    add_policy_options(serve)
    from .serve import add_serve_options

    add_serve_options(serve)

    audit = sub.add_parser(
        "audit", help="read audit logs (summarize|tail|filter|verify|suggest|report|export)"
    )
    audit.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def cmd_check(args: argparse.Namespace) -> int:
    from .check import check_target, system_resolver
    from .policy.lint import lint_policy

    settings = settings_from_args(args)
    if args.client is not None:
        spec = next((c for c in settings.clients if c.client_id == args.client), None)
        if spec is None:
            known = ", ".join(c.client_id for c in settings.clients) or "none configured"
            print(
                f"egress check: no client {args.client!r} ([clients.*]: {known})", file=sys.stderr
            )
            return 2
        settings = Settings(spec.policy, settings.guard, settings.resolve, settings.clients)
    if args.lint:
        for finding in lint_policy(settings.policy, settings.guard):
            print(finding)
    if not args.targets and not args.lint:
        print("egress check: no TARGET given", file=sys.stderr)
        return 2
    status = 0
    resolver = system_resolver if args.resolve_names else None
    for text in args.targets:
        try:
            result = check_target(settings, text, resolver)
        except EgressError as exc:
            print(f"egress check: {exc}", file=sys.stderr)
            status = 2
            continue
        print(result.line(), flush=True)
        if not result.decision.allowed and status == 0:
            status = 1
    return status


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    return parser  # pragma: no cover - build_parser always has subcommands


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["audit"]:
        from .audit.cli import audit_main

        return int(audit_main(argv[1:]))
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's usage, not the top level's: `egress serve --lisen ...`
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if args.command == "check":
            return cmd_check(args)
        if args.command == "serve":
            from .serve import cmd_serve

            return cmd_serve(args, settings_from_args(args))
    except EgressError as exc:
        print(f"egress {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
