"""Host event-loop cost: how late a host coroutine's 1 ms tick runs while the proxy works.

Run as ``python -m bench.looplag --json HTTP_PORT SOURCE_PORT`` pinned to the proxy's core
(the bench does, with its origin already running). The process is the *host*: an asyncio
application (stock loop, as embedders have) with a coroutine that sleeps 1 ms in a loop and
records how late each wake-up is. The proxy runs either on that same loop (`EgressProxy`,
the embedded mode) or on its own loop in a thread of the same process (`ProxyThread`), with
the bench's rule set and its audit log on. Loads come from other processes pinned to the load
core: wrk at c64 (absolute-form keep-alive), 8 bulk tunnels (bench/out/loadgen), and 1,000
idle keep-alive client connections (each made one request, then waits). Lag is measured for
SECONDS under each load, after a short ramp-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import rules as rulesmod
from bench.proxies import HOST, LOAD_CPU, pinned

SECONDS = 2.0
TICK_S = 0.001
IDLE_CONNECTIONS = 1000
OUT = Path(__file__).resolve().parent / "out"

IDLE_CLIENT = r"""
import socket, sys, time
proxy, origin, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
req = (f"GET http://127.0.0.1:{origin}/ HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\n\r\n").encode()
socks = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", proxy))
    s.sendall(req)
    got = b""
    while not got.endswith(b"\n") or b"\r\n\r\n" not in got:
        got += s.recv(4096)
    socks.append(s)
print("open", flush=True)
sys.stdin.read()
"""


class Ticker:
    """The host's own work: a 1 ms periodic coroutine; lateness of each wake-up in ms."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.recording = False
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(TICK_S)
            if self.recording:
                self.lags.append((time.perf_counter() - t - TICK_S) * 1e3)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def measure(self, seconds: float) -> dict[str, Any]:
        self.lags.clear()
        self.recording = True
        await asyncio.sleep(seconds)
        self.recording = False
        lags = sorted(self.lags)
        return {
            "ticks": len(lags),
            "p50_ms": round(statistics.median(lags), 3),
            "p99_ms": round(lags[int(0.99 * (len(lags) - 1))], 3),
            "max_ms": round(lags[-1], 3),
        }

    def stop(self) -> None:
        if self._task:
            self._task.cancel()


async def _proc(*argv: str, stdin: bool = False) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *pinned(list(argv), LOAD_CPU),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


async def load_http(proxy: int, origin: int, tick: Ticker, workdir: Path) -> dict[str, Any]:
    script = workdir / "abs.lua"
    script.write_text(
        f'wrk.method = "GET"\nwrk.path = "http://{HOST}:{origin}/"\n'
        f'wrk.headers["Host"] = "{HOST}:{origin}"\n'
    )
    wrk = await _proc(
        "wrk",
        "-t1",
        "-c64",
        f"-d{int(SECONDS) + 2}s",
        "-s",
        str(script),
        f"http://{HOST}:{proxy}/",
    )
    await asyncio.sleep(0.5)
    lag = await tick.measure(SECONDS)
    out, _ = await wrk.communicate()
    lag["load"] = _wrk_rps(out.decode())
    return lag


def _wrk_rps(out: str) -> str:
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return f"{float(line.split()[1]):,.0f} req/s"
    return "?"


async def load_bulk(proxy: int, source: int, tick: Ticker, workdir: Path) -> dict[str, Any]:
    # 8 tunnels, 2 GiB in total: a few seconds at the embedded proxy's rate
    total = 2 << 30
    gen = await _proc(str(OUT / "loadgen"), "bulk", str(proxy), str(source), "8", str(total))
    await asyncio.sleep(0.3)
    lag = await tick.measure(SECONDS - 0.5)
    out, _ = await gen.communicate()
    try:
        lag["load"] = f"{json.loads(out)['mb_per_s']:,.0f} MB/s"
    except (ValueError, KeyError):
        lag["load"] = "?"
    return lag


async def load_idle(proxy: int, origin: int, tick: Ticker, workdir: Path) -> dict[str, Any]:
    client = await _proc(
        sys.executable,
        "-c",
        IDLE_CLIENT,
        str(proxy),
        str(origin),
        str(IDLE_CONNECTIONS),
        stdin=True,
    )
    assert client.stdout is not None
    assert client.stdin is not None
    line = await asyncio.wait_for(client.stdout.readline(), 60)
    lag = await tick.measure(SECONDS)
    client.stdin.close()
    await client.wait()
    lag["load"] = f"{IDLE_CONNECTIONS} idle connections" if line == b"open\n" else "failed"
    return lag


Load = Callable[[int, int, Ticker, Path], Awaitable[dict[str, Any]]]


def _settings(http_ports: list[int], source: int) -> Any:
    from egress.config import build_settings

    r = rulesmod.generate()
    routes = [f"http://{HOST}:{p}" for p in [*http_ports, source]]
    return build_settings(
        {
            "default": "deny",
            "allow": r.allow_wildcards + r.allow_hosts + r.allow_origins + r.allow_cidrs,
            "block": r.block_wildcards + r.block_cidrs,
        },
        framework_routes=routes,
    )


async def measure(http_ports: list[int], source: int) -> dict[str, Any]:
    from egress import AuditLog, EgressProxy, Limits, ProxyThread

    settings = _settings(http_ports, source)
    limits = Limits(max_connections=4 * IDLE_CONNECTIONS)
    results: dict[str, Any] = {}
    tick = Ticker()
    tick.start()
    await asyncio.sleep(0.2)
    results["no proxy"] = {"idle": await tick.measure(1.0)}
    with tempfile.TemporaryDirectory(prefix="looplag-") as d:
        workdir = Path(d)
        loads: dict[str, tuple[Load, int]] = {
            "http_c64": (load_http, http_ports[0]),
            "bulk_8": (load_bulk, source),
            "idle_1k": (load_idle, http_ports[0]),
        }
        for mode in ("same loop", "ProxyThread"):
            audit_path = str(workdir / f"audit-{mode[0]}.jsonl")
            thread: ProxyThread | None = None
            audit: AuditLog | None = None
            if mode == "same loop":
                audit = AuditLog(audit_path)
                await audit.start()
                proxy = EgressProxy(settings, listen=["127.0.0.1:0"], audit=audit, limits=limits)
                await proxy.start()
            else:
                log = AuditLog(audit_path)
                thread = ProxyThread(
                    lambda log=log: EgressProxy(  # type: ignore[misc]
                        settings, listen=["127.0.0.1:0"], audit=log, limits=limits
                    ),
                    audit=log,
                )
                proxy = await asyncio.to_thread(thread.start)
            port = proxy.addresses[0][1]
            row: dict[str, Any] = {}
            try:
                for name, (load, target) in loads.items():
                    row[name] = await load(port, target, tick, workdir)
            finally:
                if thread is not None:
                    await asyncio.to_thread(thread.stop)
                else:
                    await proxy.stop()
                    assert audit is not None
                    await audit.aclose()
            results[mode] = row
    tick.stop()
    return {"seconds": SECONDS, "tick_ms": TICK_S * 1e3, "loop": "asyncio", "modes": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.looplag", description=__doc__)
    p.add_argument("--json", action="store_true")
    p.add_argument("http_ports", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("source_port", type=int)
    args = p.parse_args(argv)
    os.environ.pop("HTTP_PROXY", None)
    out = asyncio.run(measure(args.http_ports, args.source_port))
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
