"""Measure AuditLog.record(): `.venv/bin/python -m bench.audit_bench` (numbers in audit-log.md).

record() alone: an AuditLog that was never started, so no writer thread competes for the
GIL. End to end: a started log, timed until `flush()` says every line reached the OS, which
adds the writer thread's work (chain, hash, write) on the same interpreter.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from egress.audit.log import AuditLog

EVENT: dict[str, object] = {
    "client": "10.0.0.2:51234",
    "method": "CONNECT",
    "scheme": "https",
    "host": "api.example.com",
    "port": 443,
    "decision": "allow",
    "reason": "allow_rule",
    "rule": "*.example.com",
    "addr": "198.18.0.5",
    "status": 200,
    "bytes_up": 1234,
    "bytes_down": 56789,
    "duration_ms": 123.4,
    "client_id": "sbx-1",
}


def record_alone(directory: Path, count: int = 100_000, repeats: int = 10) -> float:
    best = float("inf")
    for _ in range(repeats):
        log = AuditLog(str(directory / "unstarted.jsonl"))
        started = time.perf_counter()
        for _ in range(count):
            log.record(EVENT)
        best = min(best, (time.perf_counter() - started) / count)
    return best


async def end_to_end(directory: Path, rotate: int | None, count: int = 200_000) -> float:
    async with AuditLog(str(directory / "e2e.jsonl"), rotate_bytes=rotate) as log:
        started = time.perf_counter()
        for _ in range(count):
            log.record(EVENT)
        await log.flush()
        return (time.perf_counter() - started) / count


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        print(f"record() alone: {record_alone(directory) * 1e6:.2f} us (best of 10 x 100k)")
        for rotate in (None, 16 * 1024 * 1024):
            cost = asyncio.run(end_to_end(directory, rotate))
            print(
                f"end to end, rotate_bytes={rotate}: {cost * 1e6:.2f} us/event "
                f"= {1 / cost:,.0f} events/s"
            )


if __name__ == "__main__":
    main()
