"""Micro-benchmarks of the per-request pure work, for lever decisions (bench/profile.md).

``python -m bench.micro [--json] [--n N]`` times, in the `egress` it imports, the wire work
one proxied keep-alive request costs (parse the client's absolute-form head, build the
upstream head, parse the upstream's response head, relay it unchanged) and the audit line
(`AuditLog.record` on the loop, then the writer's chain step: `chain_line` + `line_hash`).
Figures are µs per operation, the minimum over ROUNDS rounds of N calls (the least disturbed
round on a shared machine).

``python -m bench.micro --compare DIR_A DIR_B`` runs it alternately with PYTHONPATH=DIR_A and
PYTHONPATH=DIR_B (e.g. a tree with mypyc-compiled modules, and the source tree), several
times each, so both see the same machine; `--callgrind` adds instruction counts under
valgrind (independent of other load: the figure to decide on while the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROUNDS = 7
REQUEST = (
    b"GET http://127.0.0.1:8081/ HTTP/1.1\r\nHost: 127.0.0.1:8081\r\n"
    b"User-Agent: wrk\r\nAccept: */*\r\n\r\n"
)
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
EVENT: dict[str, object] = {
    "client": "127.0.0.1:51234",
    "method": "GET",
    "scheme": "http",
    "host": "127.0.0.1",
    "port": 8081,
    "path": "/",
    "decision": "allow",
    "reason": "framework_route",
    "rule": "http://127.0.0.1:8081",
    "addr": "127.0.0.1",
    "status": 200,
    "bytes_up": 58,
    "bytes_down": 173,
    "duration_ms": 0.41,
}


def cases() -> dict[str, Callable[[], object]]:
    from egress import AuditLog

    try:  # the package layout (egress.proxy, egress.audit.format), or the flat one before it
        from egress.audit.format import chain_line, encode_record, line_hash
        from egress.proxy.codec import http1 as wire
    except ImportError:
        from egress import wire  # type: ignore[attr-defined,no-redef]
        from egress.auditfmt import (  # type: ignore[import-not-found,no-redef]
            chain_line,
            encode_record,
            line_hash,
        )
    try:  # heads as sent on: egress.proxy.codec.rewrite, or still in wire before it was split out
        from egress.proxy.codec import rewrite
    except ImportError:
        rewrite = wire  # type: ignore[assignment]

    req_head, _ = wire.parse_request_head(REQUEST) or (None, 0)
    resp_head, _ = wire.parse_response_head(RESPONSE, request_method="GET") or (None, 0)
    assert req_head is not None
    assert resp_head is not None
    log = AuditLog(os.devnull)  # never started: record() alone, no writer thread
    body = encode_record(dict(EVENT))
    prev = "0" * 64

    print(f"micro: wire from {wire.__file__}", file=sys.stderr)

    def request_cycle() -> object:
        head, _ = wire.parse_request_head(REQUEST)  # type: ignore[misc]
        out = rewrite.passthrough_request_head(head, REQUEST, "/", "127.0.0.1:8081")
        resp, _ = wire.parse_response_head(RESPONSE, request_method="GET")  # type: ignore[misc]
        return out, rewrite.passthrough_response_head(resp, RESPONSE)

    def chain() -> object:
        return line_hash(chain_line(body, 7, prev))

    return {
        "parse_request_head": lambda: wire.parse_request_head(REQUEST),
        "parse_response_head": lambda: wire.parse_response_head(RESPONSE, request_method="GET"),
        "wire per request (both heads)": request_cycle,
        "audit record() on the loop": lambda: log.record(EVENT),
        "audit chain step (writer)": chain,
        "audit encode_record": lambda: encode_record(EVENT),
    }


def wakeups(n: int) -> dict[str, float]:
    """What the event loop costs per hop, on the loop `egress serve` uses (uvloop if present):
    a future resolved from a callback and awaited through 5 coroutine frames (the shape of
    `_one_request -> _http -> _exchange -> _read_response -> read_more`), against the same
    hop as a plain callback (what a protocol-level state machine would pay).
    """
    import asyncio

    try:
        import uvloop

        new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    except ImportError:
        new_loop = asyncio.new_event_loop
    loop = new_loop()

    async def leaf() -> None:
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        await fut

    async def mid(depth: int) -> None:
        if depth:
            await mid(depth - 1)
        else:
            await leaf()

    async def awaited() -> float:
        best = float("inf")
        for _ in range(ROUNDS):
            t = time.perf_counter()
            for _ in range(n):
                await mid(4)
            best = min(best, (time.perf_counter() - t) / n)
        return best

    def callbacks() -> float:
        best = float("inf")
        for _ in range(ROUNDS):
            done = loop.create_future()
            left = [n]

            def hop(left: list[int] = left, done: asyncio.Future[None] = done) -> None:
                left[0] -= 1
                if left[0]:
                    loop.call_soon(hop)
                else:
                    done.set_result(None)

            t = time.perf_counter()
            loop.call_soon(hop)
            loop.run_until_complete(done)
            best = min(best, (time.perf_counter() - t) / n)
        return best

    try:
        a = loop.run_until_complete(awaited())
        b = callbacks()
    finally:
        loop.close()
    return {
        "loop hop: future awaited through 5 frames": round(a * 1e6, 3),
        "loop hop: plain callback": round(b * 1e6, 3),
    }


def run(n: int, only: str | None = None) -> dict[str, float]:
    out: dict[str, float] = {}
    if not only and n:
        out.update(wakeups(n))
    for name, fn in cases().items():
        if only and only != name:
            continue
        best = float("inf")
        for _ in range(ROUNDS):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t) / max(n, 1))
        out[name] = round(best * 1e6, 3)
    return out


def _use_tree(path: str) -> None:
    """Import `egress` from `path`, past the venv's editable-install finder."""
    sys.meta_path[:] = [
        f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
    ]
    sys.path.insert(0, path)


def _child(path: str, n: int, callgrind: bool, only: str | None) -> dict[str, Any]:
    env = {**os.environ, "MICRO_EGRESS_TREE": path}
    base = [sys.executable, "-m", "bench.micro", "--json"]
    argv = [*base, "--n", str(n)] + (["--only", only] if only else [])
    if not callgrind:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        return dict(json.loads(out.stdout))
    with tempfile.TemporaryDirectory() as d:
        cg = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg.out"]
        total = {}
        for k in (0, n):  # the difference is the loop's own instructions
            k_argv = [*base, "--n", str(k), "--rounds", "1"] + (["--only", only] if only else [])
            subprocess.run(cg + k_argv, env=env, capture_output=True, text=True, check=True)
            text = open(f"{d}/cg.out").read()
            m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            assert m is not None
            total[k] = int(m.group(1))
        return {"instructions_per_call": round((total[n] - total[0]) / n)}


def compare(a: str, b: str, n: int, reps: int, callgrind: bool) -> dict[str, Any]:
    times: dict[str, list[dict[str, Any]]] = {a: [], b: []}
    for _ in range(reps):
        for path in (a, b):
            times[path].append(_child(path, n, False, None))
    best = {p: {k: min(r[k] for r in rs) for k in rs[0]} for p, rs in times.items()}
    result: dict[str, Any] = {"us_per_call_best": best}
    if callgrind:
        result["instructions"] = {
            p: {name: _child(p, 2000, True, name)["instructions_per_call"] for name in best[a]}
            for p in (a, b)
        }
    return result


def main(argv: list[str] | None = None) -> int:
    global ROUNDS
    p = argparse.ArgumentParser(prog="python -m bench.micro", description=__doc__)
    p.add_argument("--json", action="store_true")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--only", metavar="CASE")
    p.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--callgrind", action="store_true")
    args = p.parse_args(argv)
    ROUNDS = args.rounds
    if os.environ.get("MICRO_EGRESS_TREE"):
        _use_tree(os.environ["MICRO_EGRESS_TREE"])
    if args.compare:
        tree_a, tree_b = args.compare
        out: Any = compare(tree_a, tree_b, args.n, args.reps, args.callgrind)
    else:
        out = run(args.n, args.only)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
