"""What counting costs: HTTP c64 req/s with metrics on and off, alternated in one run.

    .venv/bin/python -m bench.metrics_cost [--rounds 5] [--seconds 3]

Each round starts the proxy (in-process `EgressProxy`, uvloop, audit log to a file: the
production shape of `egress serve`) once with `metrics=True` and once with `metrics=False`,
in alternating order, and drives it with wrk -t1 -c64 through bench/origin.py. Prints the
per-round figures and the medians (docs/metrics.md; the machine is shared, so read medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.measure import Origin, run_wrk
from bench.proxies import HOST, PROXY_CPU, REPO, pinned

CHILD = """
import asyncio, sys, uvloop
from egress import AuditLog, EgressProxy, Policy
async def main():
    routes = [f"http://127.0.0.1:{p}" for p in sys.argv[2].split(",")]
    async with AuditLog(sys.argv[3]) as log:
        async with EgressProxy(Policy(framework_routes=routes), listen=["127.0.0.1:0"],
                               audit=log, metrics=sys.argv[1] == "on") as proxy:
            print(proxy.addresses[0][1], flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
uvloop.run(main())
"""


class _Target:
    def __init__(self, port: int) -> None:
        self.port = port

    def request_path(self, origin_port: int) -> str:
        return f"http://{HOST}:{origin_port}/"

    def url(self, _: int) -> str:
        return f"http://{HOST}:{self.port}"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(mode: str, origin: Origin, seconds: int, workdir: Path) -> tuple[float, float]:
    """(req/s, proxy CPU microseconds per request) of one wrk run."""
    ports = ",".join(str(p) for p in origin.http_ports)
    argv = [sys.executable, "-c", CHILD, mode, ports, str(workdir / f"audit-{mode}.jsonl")]
    proc = subprocess.Popen(
        pinned(argv, PROXY_CPU), stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        cpu0 = cpu_seconds(proc.pid)
        result = run_wrk(_Target(port), origin, 64, seconds, workdir)  # type: ignore[arg-type]
        cpu = cpu_seconds(proc.pid) - cpu0
        return float(result["rps"]), cpu / max(1, int(result["requests"])) * 1e6
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=20)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=int, default=3)
    args = p.parse_args()
    origin = Origin()
    got: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                order = ("on", "off") if i % 2 == 0 else ("off", "on")
                for mode in order:
                    rps, us = one(mode, origin, args.seconds, Path(tmp))
                    got[mode].append(rps)
                    cpu[mode].append(us)
                print(
                    json.dumps(
                        {
                            "round": i,
                            "rps_on": round(got["on"][-1]),
                            "rps_off": round(got["off"][-1]),
                            "cpu_us_per_req_on": round(cpu["on"][-1], 2),
                            "cpu_us_per_req_off": round(cpu["off"][-1], 2),
                        }
                    ),
                    flush=True,
                )
    finally:
        origin.close()
    on, off = statistics.median(got["on"]), statistics.median(got["off"])
    con, coff = statistics.median(cpu["on"]), statistics.median(cpu["off"])
    print(
        json.dumps(
            {
                "median_rps_on": round(on),
                "median_rps_off": round(off),
                "rps_cost_percent": round((off - on) / off * 100, 2),
                "median_cpu_us_per_req_on": round(con, 2),
                "median_cpu_us_per_req_off": round(coff, 2),
                "cpu_cost_percent": round((con - coff) / coff * 100, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
