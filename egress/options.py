"""The options of `egress serve` (docs/proxy.md#standalone-egress-serve): serving, limits,
audit log and process flags, and the `Limits` they describe.

Strategy: argparse declares them all in one place, so `egress serve --help` and
docs/cli-reference.md read as one list; each value is checked by the one validator
(`validate.py`) when it is used, so an error names its option.
"""

from __future__ import annotations

import argparse

from .proxy.net.conn import Limits
from .validate import as_count, as_timeout


def add_serve_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving")
    g.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="listen address (repeatable; port 0 = ephemeral; default 127.0.0.1:3128)",
    )
    g.add_argument(
        "--socks",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="also listen for SOCKS5 (RFC 1928 CONNECT, RFC 1929 username/password carrying "
        "the client token) on this address (repeatable)",
    )
    g.add_argument(
        "--listen-netns",
        metavar="NS",
        help="open the listeners inside this network namespace (name, path or PID)",
    )
    g.add_argument(
        "--audit-log",
        metavar="PATH|-",
        help="JSON Lines audit log ('-' = stdout, after the `listening on` lines); without "
        "it, one line per request goes to stderr (see --quiet)",
    )
    g.add_argument(
        "--admin",
        metavar="HOST:PORT",
        help="serve /metrics (Prometheus), /healthz and /readyz here (docs/metrics.md); "
        "a loopback address unless --admin-public",
    )
    g.add_argument(
        "--admin-public",
        action="store_true",
        help="allow --admin on a non-loopback address (anyone who reaches it reads /metrics)",
    )
    g.add_argument(
        "--audit-fail",
        choices=["open", "closed"],
        default="open",
        help="when the audit log cannot be written: keep serving (open) or refuse "
        "new connections (closed)",
    )
    g.add_argument(
        "--audit-rotate-bytes",
        type=int,
        metavar="N",
        help="rotate the audit log to PATH.1.gz before it would exceed N bytes (docs/audit-log.md)",
    )
    g.add_argument(
        "--audit-keep",
        type=int,
        metavar="N",
        help="keep N rotated audit files, removing older ones (default: keep all)",
    )
    g.add_argument(
        "--audit-interim",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds between the progress records of a long tunnel (default: %(default)s)",
    )
    g.add_argument(
        "--audit-keep-query",
        action="store_true",
        help="keep query strings in audit lines (redacted by default)",
    )
    g.add_argument(
        "--require-auth",
        action="store_true",
        help="every client must present a proxy token (407 otherwise)",
    )
    g.add_argument(
        "--sni-missing",
        choices=["if-named", "allow", "deny"],
        default="if-named",
        help="tunnels to 443 without a TLS SNI (no ClientHello, none with SNI, or non-TLS "
        "bytes): allow only if the CONNECT host was a name (not an IP) the policy allowed "
        "(default), always, or never; a malformed ClientHello is always refused",
    )
    lim = Limits()
    for flag, kind, default, metavar, text in (
        ("--max-head", int, lim.max_head, "BYTES", "largest request head"),
        ("--max-headers", int, lim.max_headers, "N", "most header fields in a request head"),
        ("--head-timeout", float, lim.head_timeout, "S", "seconds to receive a request head"),
        ("--connect-timeout", float, lim.connect_timeout, "S", "seconds to connect upstream"),
        ("--idle-timeout", float, lim.idle_timeout, "S", "seconds a connection may stay silent"),
        (
            "--max-connections",
            int,
            lim.max_connections,
            "N",
            "concurrent client connections, 503 beyond",
        ),
    ):
        g.add_argument(
            flag, type=kind, default=default, metavar=metavar, help=f"{text} (default: %(default)s)"
        )
    g.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="N proxy processes sharing each listen port (SO_REUSEPORT), each with its own "
        "audit chain PATH.wI (default 1)",
    )
    g.add_argument("--no-uvloop", action="store_true", help="use the stock asyncio loop")
    g.add_argument(
        "--quiet",
        action="store_true",
        help="no warnings, request lines or shutdown summary on stderr",
    )


def limits_from_args(args: argparse.Namespace) -> Limits:
    """`Limits` from the options, checked by the one validator (`nan`, `inf`, 0 refused) so
    the error names the option (docs/proxy.md#limits)."""
    for name in ("max_head", "max_headers", "max_connections"):
        as_count(getattr(args, name), f"--{name.replace('_', '-')}")
    for name in ("head_timeout", "connect_timeout", "idle_timeout"):
        as_timeout(getattr(args, name), f"--{name.replace('_', '-')}")
    return Limits(
        max_head=args.max_head,
        max_headers=args.max_headers,
        head_timeout=args.head_timeout,
        connect_timeout=args.connect_timeout,
        idle_timeout=args.idle_timeout,
        max_connections=args.max_connections,
    )


__all__ = ["add_serve_options", "limits_from_args"]
