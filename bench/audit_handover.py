"""The audit hand-over's cost and its crash window (bench/profile.md, issue 24's audit round).

    taskset -c 1 .venv/bin/python -m bench.audit_handover [--tunnels N]

CPU per simulated tunnel: an `opened` line and a request record in two event-loop turns,
each turn a socketpair round trip (so the loop waits in epoll as a proxy does), with the log
off (`AuditLog(None)`) and on (a real file); both threads' CPU (`process_time`). Then how
long a handed-over line waits until the writer thread has written it while the loop stays
busy (non-blocking socket calls, never sleeping): the window a crash could lose. Pin it to
one core: the cost measured is the writer thread's wake-up on the loop's core.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import time
from pathlib import Path

from egress.audit.log import AuditLog

OPEN: dict[str, object] = {
    "client": "198.18.0.1:41000",
    "method": "CONNECT",
    "host": "example.test",
    "port": 443,
    "addr": "198.18.0.2",
}
REQUEST: dict[str, object] = {
    "type": "request",
    **OPEN,
    "decision": "allow",
    "reason": "allow_rule",
    "rule": "example.test",
    "status": 200,
    "bytes_up": 1234,
    "bytes_down": 56789,
    "duration_ms": 12,
}


async def per_tunnel(path: Path | None, tunnels: int) -> float:
    """CPU seconds per simulated tunnel, the writer thread included."""
    log = AuditLog(str(path) if path is not None else None)
    await log.start()
    loop = asyncio.get_running_loop()
    near, far = socket.socketpair()
    near.setblocking(False)
    far.setblocking(False)
    waiter: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        far.recv(64)
        if not waiter.done():
            waiter.set_result(None)

    loop.add_reader(far.fileno(), readable)
    started = time.process_time()
    for _ in range(tunnels):
        waiter = loop.create_future()
        link = log.opened(OPEN)
        near.send(b"o")
        await waiter
        waiter = loop.create_future()
        log.record({**REQUEST, "id": link})
        near.send(b"r")
        await waiter
    await log.flush()
    cost = (time.process_time() - started) / tunnels
    loop.remove_reader(far.fileno())
    near.close()
    far.close()
    await log.aclose()
    return cost


async def busy_wait(path: Path, samples: int = 300) -> list[float]:
    """Milliseconds from hand-over to written, the loop busy meanwhile; sorted."""
    log = AuditLog(str(path))
    await log.start()
    await log.flush()
    near, far = socket.socketpair()
    near.setblocking(False)
    far.setblocking(False)
    waits = []
    for number in range(samples):
        before = log.lines_written
        log.opened(OPEN)
        await asyncio.sleep(0)  # the loop turn ends: the line is handed over
        started = time.perf_counter()
        while log.lines_written == before and time.perf_counter() - started < 1.0:
            near.send(b"x")  # a busy loop's system calls (they release the GIL)
            far.recv(64)
        waits.append((time.perf_counter() - started) * 1e3)
        await asyncio.sleep(0.002 if number % 2 else 0)
    near.close()
    far.close()
    await log.aclose()
    return sorted(waits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tunnels", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        off = asyncio.run(per_tunnel(None, args.tunnels))
        on = asyncio.run(per_tunnel(directory / "tunnels.jsonl", args.tunnels))
        print(f"CPU per simulated tunnel: log off {off * 1e6:.1f} us, on {on * 1e6:.1f} us")
        waits = asyncio.run(busy_wait(directory / "wait.jsonl"))
        at = len(waits) - 1
        print(
            "handed over -> written, loop busy: "
            f"p50 {waits[at // 2]:.3f} ms, p90 {waits[at * 9 // 10]:.3f} ms, "
            f"p99 {waits[at * 99 // 100]:.3f} ms, max {waits[-1]:.3f} ms"
        )


if __name__ == "__main__":
    main()
