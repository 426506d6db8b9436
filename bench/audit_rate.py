"""Audit lines/s the writer sustains: ``python -m bench.audit_rate --json`` (pinned by the
bench to the proxy's core, so the event loop and the writer thread share one core as in
`egress serve`).

The proxy hands every request or tunnel record to `AuditLog.record()` on its loop; a writer
thread chains (SHA-256), batches and writes them. While the writer keeps up, the backlog
stays small and neither `--audit-fail` mode matters; beyond its rate the backlog grows until
`max_backlog` lines (then lines are lost and counted: fail-open keeps serving, fail-closed
refuses). Figures: `record_us` (loop-side cost per line, writer idle), `lines_per_s` (end to
end, loop producing as fast as it can in bursts of one loop iteration, until flush() says
every line reached the OS), and the same with 16 MiB rotation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# A typical request record of the proxy (bench/out audit lines have the same shape).
EVENT: dict[str, object] = {
    "client": "127.0.0.1:51234",
    "method": "GET",
    "scheme": "http",
    "host": "127.0.0.1",
    "port": 8081,
    "decision": "allow",
    "reason": "framework_route",
    "rule": "http://127.0.0.1:8081",
    "addr": "127.0.0.1",
    "status": 200,
    "bytes_up": 58,
    "bytes_down": 173,
    "duration_ms": 0.41,
    "path": "/",
}
BURST = 64  # records per loop iteration (like 64 connections answering in one iteration)


def record_alone(directory: Path, count: int = 50_000) -> float:
    from egress import AuditLog

    best = float("inf")
    for _ in range(5):
        log = AuditLog(str(directory / "unstarted.jsonl"))
        t = time.perf_counter()
        for _ in range(count):
            log.record(EVENT)
        best = min(best, (time.perf_counter() - t) / count)
    return best * 1e6


async def end_to_end(directory: Path, rotate: int | None, seconds: float) -> dict[str, Any]:
    from egress import AuditLog

    path = directory / f"e2e-{rotate}.jsonl"
    async with AuditLog(str(path), rotate_bytes=rotate) as log:
        n = 0
        t = time.perf_counter()
        deadline = t + seconds
        while time.perf_counter() < deadline:
            for _ in range(BURST):
                log.record(EVENT)
            n += BURST
            await asyncio.sleep(0)  # one loop iteration: the batch goes to the writer
        produced = time.perf_counter() - t
        await log.flush()
        total = time.perf_counter() - t
        dropped = log.lines_dropped
    return {
        "lines": n,
        "lines_per_s": round(n / total),
        "produce_only_per_s": round(n / produced),
        "backlog_drain_s": round(total - produced, 3),
        "dropped": dropped,
        "rotate_bytes": rotate,
    }


def measure(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="audit-rate-") as d:
        directory = Path(d)
        return {
            "record_us": round(record_alone(directory), 2),
            "plain": asyncio.run(end_to_end(directory, None, seconds)),
            "rotating": asyncio.run(end_to_end(directory, 16 << 20, seconds)),
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.audit_rate", description=__doc__)
    p.add_argument("--json", action="store_true")
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    out = measure(args.seconds)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
