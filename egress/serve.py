"""`egress serve`: the proxy as a standalone process (docs/proxy.md#standalone-egress-serve).

Prints exactly one `listening on HOST:PORT` line per listener on stdout once it accepts
(`listening on HOST:PORT socks5` for a `--socks` listener).
SIGTERM/SIGINT: stop accepting, give open tunnels up to 5 s, close them, flush the audit log,
exit 0. SIGHUP: reload the policy (`reload.py`). Uses uvloop when it is installed (embedding
code keeps its own loop). The options are `options.py`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Any

from .config import Settings
from .options import add_serve_options, limits_from_args
from .policy.target import join_host_port
from .printable import printable
from .proxy.net.listener import ListenError
from .proxy.server import EgressProxy, parse_listen
from .proxy.telemetry.insight import check_admin_address
from .reload import reload_clients, reload_policy
from .validate import as_count, as_timeout
from .workers import READY, check_worker_args, serve_workers


def _open_audit(args: argparse.Namespace) -> Any:
    from .audit.log import DEFAULT_RESERVE_BYTES, RESERVE_PER_EXCHANGE, AuditLog

    if args.audit_rotate_bytes is not None:
        as_count(args.audit_rotate_bytes, "--audit-rotate-bytes")
    if args.audit_keep is not None:
        as_count(args.audit_keep, "--audit-keep")  # 0 would delete every rotated file
    as_timeout(args.audit_interim, "--audit-interim")
    index, count = getattr(args, "worker_index", None), getattr(args, "worker_count", None)
    reserve = None  # closed mode: room for every connection's exchange (docs/audit-log.md)
    if args.audit_fail == "closed":
        reserve = max(DEFAULT_RESERVE_BYTES, args.max_connections * RESERVE_PER_EXCHANGE)
    return AuditLog(
        args.audit_log,
        fail_mode=args.audit_fail,
        keep_query=args.audit_keep_query,
        rotate_bytes=args.audit_rotate_bytes,
        keep=args.audit_keep,
        interim_interval=args.audit_interim,
        worker=None if index is None or count is None else (index, count),
        reserve_bytes=reserve,
    )


def _lint_in_child(settings: Settings) -> None:
    """Print lint warnings from a short-lived child process.

    Lint needs tldextract's suffix list (~10 MB resident); computing it in a child keeps the
    long-running proxy from ever holding it. A failure to lint is itself only a warning.
    """
    rules = [*(r.text for r in settings.policy.allow_rules)]
    blocks = [*(r.text for r in settings.policy.block_rules)]
    by_address = settings.policy.resolve_names_for_address_rules
    # the opt-in per client too (docs/policy.md#no-lookup-decides-nothing)
    clients = [c.client_id for c in settings.clients if c.policy.resolve_names_for_address_rules]
    code = (
        "import sys, json\n"
        "from egress.policy.lint import lint_by_address, lint_policy\n"
        "from egress.policy.rules import Policy\n"
        "a, b, n, clients = json.load(sys.stdin)\n"
        "p = Policy(allow=a, block=b, resolve_names_for_address_rules=n)\n"
        "for f in lint_policy(p): print(f)\n"
        "q = Policy(resolve_names_for_address_rules=True)\n"
        "for c in clients: print(f'client {c!r}: {lint_by_address(q)}')\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps([rules, blocks, by_address, clients]),
            text=True,
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"egress serve: warning: policy lint did not run: {exc}", file=sys.stderr)
        return
    for line in out.splitlines():
        print(f"egress serve: warning: {line}", file=sys.stderr)


async def run_serve(
    args: argparse.Namespace, settings: Settings, ready_fd: int | None = None
) -> int:
    """Serve until SIGTERM/SIGINT. With `ready_fd` (a worker of `--workers`), report
    readiness there instead of printing the `listening on` lines (the parent prints them).
    """
    if not args.quiet and ready_fd is None:
        await asyncio.to_thread(_lint_in_child, settings)
    try:
        audit = _open_audit(args)
        await audit.start()
    except ValueError as exc:  # a bad --audit-* value: say which, not "the audit log None"
        print(f"egress serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        why = exc.strerror or exc
        print(f"egress serve: cannot open the audit log {args.audit_log}: {why}", file=sys.stderr)
        return 2
    if not args.quiet:
        _warn_tokens(settings, args.require_auth)
    proxy = _proxy(args, settings, audit, ready_fd)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    _reloads = _handle_signals(loop, proxy, args, stop)  # held while serving
    started = False
    try:
        try:
            await proxy.start()
        except ListenError as exc:  # which option's address: docs/proxy.md#standalone-egress-serve
            flag = _LISTEN_FLAGS.get(exc.role, "--listen")
            print(
                f"egress serve: cannot listen on {flag} {exc.address}: {exc.why}", file=sys.stderr
            )
            return 2
        started = True
        _announce(proxy, args, ready_fd)
        await stop.wait()
    finally:
        await proxy.stop()
        await audit.aclose()
        if started and not args.quiet:  # nothing was served if it never started
            print(shutdown_summary(proxy.metrics()), file=sys.stderr)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    if audit.lines_abandoned:  # never written, not even as a loss: docs/audit-log.md
        print(
            f"egress serve: {audit.lines_abandoned} audit lines could not be written "
            f"to {args.audit_log}",
            file=sys.stderr,
        )
        return 1
    return 0


def _proxy(
    args: argparse.Namespace, settings: Settings, audit: Any, ready_fd: int | None
) -> EgressProxy:
    """The proxy `egress serve`'s options describe (not started)."""
    on_decision = [] if args.quiet or args.audit_log else [_print_request]
    return EgressProxy(
        settings,
        listen=args.listen or ["127.0.0.1:3128"],
        socks=args.socks,
        listen_netns=args.listen_netns,
        audit=audit,
        limits=limits_from_args(args),
        require_auth=args.require_auth,
        sni_missing=args.sni_missing,
        reuse_port=ready_fd is not None,
        admin=args.admin,
        admin_public=args.admin_public,
        on_decision=on_decision,
    )


def _handle_signals(
    loop: asyncio.AbstractEventLoop,
    proxy: EgressProxy,
    args: argparse.Namespace,
    stop: asyncio.Event,
) -> set[asyncio.Task[None]]:
    """SIGTERM and SIGINT set `stop`; SIGHUP reloads the policy. Returns the running
    reloads, which the caller holds (a task nobody holds may be collected)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[None]] = set()
    # one reload at a time, in signal order: the last file read is the one applied
    serial = asyncio.Lock()

    def on_hup() -> None:
        task = loop.create_task(reload_policy(proxy, args, serial))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    return reloads


def _announce(proxy: EgressProxy, args: argparse.Namespace, ready_fd: int | None) -> None:
    """Say the proxy is serving: on `ready_fd` for a worker (its parent prints the lines),
    else a `listening on` line per address."""
    if ready_fd is not None:
        os.write(ready_fd, READY)
        os.close(ready_fd)
    else:
        for host, port in proxy.addresses:
            print(f"listening on {join_host_port(host, port)}", flush=True)
        for host, port in proxy.socks_addresses:
            print(f"listening on {join_host_port(host, port)} socks5", flush=True)
    if proxy.admin_url is not None and not args.quiet:
        print(f"egress serve: admin on {proxy.admin_url}/metrics", file=sys.stderr)


def _warn_tokens(settings: Settings, require_auth: bool) -> None:
    """Tokens without --require-auth: clients that send credentials only after a 407 (git,
    `curl --proxy-anyauth`) never present them (docs/clients.md#proxy-authentication)."""
    named = [c.client_id for c in settings.clients if c.token is not None]
    if named and not require_auth:
        print(
            f"egress serve: warning: clients {printable(', '.join(named))} have tokens but "
            "--require-auth is off: a client that sends credentials only after a 407 "
            "(git, curl --proxy-anyauth) runs under the top-level policy with client_id null",
            file=sys.stderr,
        )


_LISTEN_FLAGS = {"proxy": "--listen", "socks5": "--socks", "admin": "--admin"}


def _print_request(event: dict[str, object]) -> None:
    """One stderr line per access record when there is no --audit-log (docs/proxy.md)."""
    print(request_line(event), file=sys.stderr, flush=True)


def request_line(event: dict[str, object]) -> str:
    """`allow CONNECT pypi.org:443 allow_rule 200 12.3ms [sandbox-a]`."""
    host, port = event.get("host") or "-", event.get("port") or 0
    where = f"{host}:{port}" if port else str(host)
    parts = [str(event["decision"]), str(event.get("method")), where, str(event["reason"])]
    if event.get("status") is not None:
        parts.append(str(event["status"]))
    if event.get("duration_ms") is not None:
        parts.append(f"{event['duration_ms']}ms")
    if event.get("client_id"):
        parts.append(f"[{event['client_id']}]")
    # the host, method and client come from the agent (a SOCKS name may hold newlines and
    # ANSI escapes): escaped, so a name can never forge a line (docs/threat-model.md)
    return printable("egress: " + " ".join(parts))


def shutdown_summary(metrics: dict[str, object]) -> str:
    """`egress serve: 12 requests: 9 allow, 3 block (block_rule 3)` (docs/proxy.md)."""
    rows: list[dict[str, Any]] = metrics["requests"]  # type: ignore[assignment]
    by_decision: dict[str, int] = {}
    refused: dict[str, int] = {}
    for row in rows:
        by_decision[row["decision"]] = by_decision.get(row["decision"], 0) + row["count"]
        if row["decision"] != "allow":
            refused[row["reason"]] = refused.get(row["reason"], 0) + row["count"]
    total = sum(by_decision.values())
    text = f"egress serve: {total} requests"
    if by_decision:
        text += ": " + ", ".join(f"{n} {d}" for d, n in sorted(by_decision.items()))
    if refused:
        text += " (" + ", ".join(f"{r} {n}" for r, n in sorted(refused.items())) + ")"
    return text


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    try:
        limits_from_args(args)
        listens = [parse_listen(spec) for spec in args.listen or ["127.0.0.1:3128"]]
        for spec in args.socks:
            parse_listen(spec)
        if args.admin:
            admin_host, _ = parse_listen(args.admin, "--admin")
            check_admin_address(admin_host, args.admin_public, "--admin")
            if args.workers > 1:
                raise ValueError("--admin serves one process's numbers: not with --workers > 1")
    except ValueError as exc:
        print(f"egress serve: {exc}", file=sys.stderr)
        return 2
    why = check_worker_args(args)
    if args.socks and args.workers > 1:
        why = "--socks is served by one process: use it without --workers"
    if why:
        print(f"egress serve: {why}", file=sys.stderr)
        return 2
    if args.workers > 1:
        if not args.quiet:
            _lint_in_child(settings)  # once, not once per worker
        return serve_workers(args, settings, _run_loop, listens)
    return _run_loop(args, settings, None)


def _run_loop(args: argparse.Namespace, settings: Settings, ready_fd: int | None) -> int:
    runner: Any = asyncio.run
    if not args.no_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            runner = uvloop.run
    try:
        return int(runner(run_serve(args, settings, ready_fd)))
    except OSError as exc:
        print(f"egress serve: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return 2


__all__ = [
    "add_serve_options",
    "cmd_serve",
    "limits_from_args",
    "reload_clients",
    "reload_policy",
    "request_line",
    "run_serve",
    "shutdown_summary",
]
