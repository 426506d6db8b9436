"""`netcut cut|probe|status|restore` (docs/netcut.md).

Exit codes: 0 success; 1 a check failed (probe, or a cut that could not be applied and was
rolled back); 2 bad usage or bad input, with a one-line error naming the culprit and no
traceback; `status` exits 0 only for `cut`, 3 for `partial`, 4 for `not cut`
(docs/netcut.md#exit-codes). `--json` prints one JSON object on stdout for machines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from netcut import api, modes, resolve
from netcut.direct.probe import ProbeResult
from netcut.errors import InvalidInput, NetcutError, ProbeFailed
from netcut.helper import image as helperimage
from netcut.helper import mode as helper
from netcut.plan.status import CutStatus
from netcut.plan.transparent import Redirect
from netcut.records import plan_to_data

# `netcut status`: 0 only when the namespace is cut (docs/netcut.md#exit-codes).
STATUS_EXIT = {"cut": 0, "partial": 3, "not cut": 4}


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds, more than 0 and at most 60")
    return value


_json_usage = False  # set by main(): `--json` anywhere on the command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints usage; keep it to one line
        if _json_usage:  # docs/netcut.md: with --json, usage errors are JSON on stdout too
            data = {
                "result": "error",
                "kind": "UsageError",
                "error": message,
                "exit_code": 2,
                "probe": None,
            }
            print(json.dumps(data, sort_keys=True), flush=True)
        self.exit(2, f"{self.prog}: error: {message}\n")


_JSON_HELP = "print one JSON object on stdout (errors included)"


def _add_target(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--netns", metavar="NAME", help="a named namespace (/run/netns/NAME)")
    group.add_argument("--netns-path", metavar="PATH", help="a namespace file")
    group.add_argument("--pid", metavar="PID", help="the namespace of a process")
    group.add_argument(
        "--container", metavar="ID", help="a docker or podman container, or a containerd task"
    )
    p.add_argument(
        "--runtime",
        choices=resolve.RUNTIMES,
        help="container runtime (default: $NETCUT_CONTAINER_RUNTIME, else the first engine"
        " that answers of docker, podman, containerd)",
    )
    p.add_argument(
        "--namespace",
        metavar="NS",
        help=f"containerd namespace of --container (default: {resolve.CONTAINERD_NAMESPACE})",
    )


def _add_mode(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        choices=modes.MODES,
        default=None,
        help="direct: enter the namespace from this process (root or CAP_SYS_ADMIN +"
        " CAP_NET_ADMIN); helper: run a helper container in the container's namespace"
        " (default: direct when this process may, else helper for a container)",
    )
    p.add_argument(
        "--helper-image",
        metavar="IMAGE",
        help=f"helper image (default: ${helper.IMAGE_ENV}, else built once)",
    )


def build_parser() -> argparse.ArgumentParser:
    from netcut import __version__

    parser = _Parser(prog="netcut", description="Cut a network namespace at execution time.")
    parser.add_argument("--version", action="version", version=f"netcut {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    cut = sub.add_parser("cut", help="cut the namespace down to loopback and --keep")
    _add_target(cut)
    cut.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="ADDR[:PORT]",
        help="an address (and port) the namespace may still reach, e.g. the egress proxy;"
        " repeat for several",
    )
    cut.add_argument(
        "--expect-blocked",
        action="append",
        default=[],
        metavar="ADDR:PORT",
        help="probe after the cut that this is not reachable",
    )
    cut.add_argument(
        "--dry-run",
        action="store_true",
        help="read the state, run the safety checks and print the plan; change nothing",
    )
    _add_mode(cut)
    cut.add_argument("--no-probe", action="store_true", help="do not probe after the cut")
    cut.add_argument(
        "--probe-timeout",
        type=_seconds,
        default=1.0,
        metavar="SECONDS",
        help="how long the probe waits for each connection (default: 1)",
    )
    cut.add_argument(
        "--force",
        action="store_true",
        help="allow cutting the caller's own or the host's namespace",
    )
    cut.add_argument(
        "--allow-privileged",
        action="store_true",
        help="cut although a process in the namespace holds NET_ADMIN/RAW/SYS_ADMIN",
    )
    cut.add_argument(
        "--transparent",
        action="store_true",
        help="redirect every other TCP connection (and DNS, with --dns-to) to the proxy's "
        "listeners on the namespace's loopback (direct mode only)",
    )
    cut.add_argument(
        "--redirect-to",
        type=int,
        metavar="PORT",
        help="transparent mode: the proxy's transparent listener port",
    )
    cut.add_argument(
        "--dns-to",
        type=int,
        metavar="PORT",
        help="transparent mode: the proxy's DNS responder port",
    )
    cut.add_argument("--json", action="store_true", help=_JSON_HELP)

    probe = sub.add_parser("probe", help="check reachability from inside the namespace")
    _add_target(probe)
    probe.add_argument(
        "--expect-reachable",
        action="append",
        default=[],
        metavar="ADDR:PORT",
        help="must accept a TCP connection from inside; repeat for several",
    )
    probe.add_argument(
        "--expect-blocked",
        action="append",
        default=[],
        metavar="ADDR:PORT",
        help="must not accept a TCP connection from inside; repeat for several",
    )
    probe.add_argument(
        "--timeout",
        type=_seconds,
        default=1.0,
        metavar="SECONDS",
        help="how long to wait for the connections, all at once (default: 1)",
    )
    _add_mode(probe)
    probe.add_argument("--json", action="store_true", help=_JSON_HELP)

    status = sub.add_parser("status", help="say whether and how the namespace is cut")
    _add_target(status)
    _add_mode(status)
    status.add_argument("--json", action="store_true")

    restore = sub.add_parser("restore", help="undo a cut exactly")
    _add_target(restore)
    _add_mode(restore)
    restore.add_argument("--json", action="store_true")

    gc = sub.add_parser("gc", help="remove the records of namespaces that no longer exist")
    gc.add_argument("--json", action="store_true")

    image = sub.add_parser(
        "helper-image", help="assemble the default helper image from this host's files"
    )
    image.add_argument("action", choices=("build", "tag"))
    image.add_argument("--runtime", choices=resolve.HELPER_RUNTIMES, help="engine to import into")
    image.add_argument("--json", action="store_true")
    return parser


def _target(args: argparse.Namespace) -> resolve.TargetRef:
    if (args.runtime or args.namespace) and not args.container:
        raise NetcutError("--runtime and --namespace apply to --container only")
    if args.netns is not None:
        return resolve.netns(args.netns)
    if args.netns_path is not None:
        return resolve.netns_path(args.netns_path)
    if args.pid is not None:
        return resolve.pid(args.pid)
    runtime = args.runtime or ("containerd" if args.namespace else None)
    return resolve.container(args.container, runtime, args.namespace)


def _emit(args: argparse.Namespace, lines: list[str], data: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(data, sort_keys=True))
    else:
        print("\n".join(lines))


def _status_data(status: CutStatus) -> dict[str, Any]:
    return {
        "cut": status.is_cut,
        "state": status.state,
        "keeps": [str(k) for k in status.keeps],
        "details": list(status.details),
    }


def _probe_data(result: ProbeResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    items = [
        {"target": i.target, "expect": i.expect, "outcome": i.outcome, "ok": i.ok}
        for i in result.items
    ]
    return {"ok": result.ok, "items": items, "reason": result.reason() or None}


def _cmd_cut(args: argparse.Namespace) -> int:
    ref = _target(args)
    options = dict(
        probe=not args.no_probe,
        expect_blocked=args.expect_blocked,
        force=args.force,
        allow_privileged=args.allow_privileged,
        dry_run=args.dry_run,
        probe_timeout=args.probe_timeout,
    )
    redirect = _redirect(args)
    choice = modes.choose_mode(ref, args.mode)
    if choice.mode == "helper":
        result = helper.cut(ref, args.keep, image=args.helper_image, redirect=redirect, **options)
    else:
        result = api.cut(ref, args.keep, redirect=redirect, **options)
    result = replace(result, mode=choice.mode, mode_reason=choice.reason)
    data = {
        **_mode_data(choice),
        "identity": list(result.identity) if result.identity else None,
        "result": result.head,
        "repaired": list(result.found),
        "target": result.target,
        "changed": result.changed,
        "status": _status_data(result.status),
        "elapsed_ms": round(result.elapsed_ms, 3),
        "plan": plan_to_data(result.plan) if result.plan else None,
        "plan_lines": result.plan.lines() if result.plan else [],
        "probe": _probe_data(result.probe),
    }
    _emit(args, result.lines(), data)
    return 0


def _redirect(args: argparse.Namespace) -> Redirect | None:
    if not args.transparent:
        if args.redirect_to is not None or args.dns_to is not None:
            raise InvalidInput("--redirect-to and --dns-to need --transparent")
        return None
    if args.redirect_to is None:
        raise InvalidInput("--transparent needs --redirect-to PORT")
    return Redirect(args.redirect_to, args.dns_to)


def _mode_data(choice: modes.ModeChoice) -> dict[str, str]:
    return {"mode": choice.mode, "mode_reason": choice.reason}


def _cmd_probe(args: argparse.Namespace) -> int:
    ref = _target(args)
    choice = modes.choose_mode(ref, args.mode)
    reachable, blocked = args.expect_reachable, args.expect_blocked
    if choice.mode == "helper":
        result = helper.probe(
            ref, reachable, blocked, timeout=args.timeout, image=args.helper_image
        )
    else:
        result = api.probe(ref, reachable, blocked, timeout=args.timeout)
    lines = result.lines() + ([f"probe failed: {result.reason()}"] if not result.ok else [])
    lines = (lines or ["nothing to probe"]) + [choice.line()]
    _emit(args, lines, {**(_probe_data(result) or {}), **_mode_data(choice)})
    return 0 if result.ok else 1


def _cmd_status(args: argparse.Namespace) -> int:
    ref = _target(args)
    choice = modes.choose_mode(ref, args.mode)
    if choice.mode == "helper":
        status = helper.status(ref, image=args.helper_image)
    else:
        status = api.status(ref)
    _emit(args, [*status.lines(), choice.line()], {**_status_data(status), **_mode_data(choice)})
    return STATUS_EXIT[status.state]


def _cmd_restore(args: argparse.Namespace) -> int:
    ref = _target(args)
    choice = modes.choose_mode(ref, args.mode)
    if choice.mode == "helper":
        result = helper.restore(ref, image=args.helper_image)
    else:
        result = api.restore(ref)
    head = "restored" if result.changed else "not cut: nothing to restore"
    lines = [f"{head}: {result.target}", *result.lines, choice.line()]
    _emit(
        args,
        lines,
        {
            **_mode_data(choice),
            "result": "restored" if result.changed else "not cut",
            "target": result.target,
            "changed": result.changed,
            "status": _status_data(result.status),
            "lines": list(result.lines),
        },
    )
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    """docs/netcut.md#collecting-records."""
    found = api.gc()
    lines = [f"removed {len(found.removed)} record(s), kept {found.kept}"]
    lines += [f"  removed {key}" for key in found.removed]
    _emit(args, lines, {"removed": list(found.removed), "kept": found.kept})
    return 0


def _cmd_helper_image(args: argparse.Namespace) -> int:
    """`tag` prints the default image's tag; `build` imports it (docs/netcut.md#helper-mode)."""
    if args.action == "tag":
        tag = helperimage.image_tag()
        _emit(args, [tag], {"tag": tag})
        return 0
    built = helperimage.build(resolve.find_runtime(args.runtime))
    lines = [
        f"built {built.tag}: {built.files} files, {built.size_bytes / 1e6:.1f} MB,"
        f" {built.seconds:.2f} s"
    ]
    data = {
        "tag": built.tag,
        "files": built.files,
        "size_bytes": built.size_bytes,
        "seconds": round(built.seconds, 3),
    }
    _emit(args, lines, data)
    return 0


_COMMANDS = {
    "cut": _cmd_cut,
    "probe": _cmd_probe,
    "status": _cmd_status,
    "restore": _cmd_restore,
    "gc": _cmd_gc,
    "helper-image": _cmd_helper_image,
}


def main(argv: Sequence[str] | None = None) -> int:
    global _json_usage
    argv = list(sys.argv[1:] if argv is None else argv)
    _json_usage = "--json" in argv
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except NetcutError as exc:
        failed = isinstance(exc, ProbeFailed)
        print(f"netcut: {'probe failed' if failed else 'error'}: {exc}", file=sys.stderr)
        if args.json:  # machines get an answer on stdout too
            probe = exc.probe if isinstance(exc, ProbeFailed) else None
            data = {
                "result": "probe failed" if failed else "error",
                "error": str(exc),
                "kind": type(exc).__name__,
                "exit_code": exc.exit_code,
                "probe": _probe_data(probe if isinstance(probe, ProbeResult) else None),
            }
            print(json.dumps(data, sort_keys=True))
        return exc.exit_code
    except BrokenPipeError:  # `netcut ... | head`: the reader left; not our failure
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("netcut: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
