"""Latency of a netcut cut and restore, direct mode, full plan (netfilter backstop included).

    python bench/netcut_bench.py [--cycles 200] [--json]

Builds its own two namespaces (a "host" with a TCP listener standing in for the proxy, and a
"sandbox" behind a veth; addresses in 198.19.0.0/16, names starting with `nc`), then times
`netcut.cut(sandbox, keep=[proxy], probe=False)` and `netcut.restore(sandbox)` as a caller
sees them (public API, wall clock, including the hand-off to the namespace worker) over many
cycles, plus the probe on its own. Starting netcut's namespace worker (a fresh interpreter that
imports pyroute2 and python-iptables) is reported apart as `worker_start_ms`, the first cut
after it as `first_cut_ms`; `cpu_ms_per_cycle` is the CPU time (caller + worker) of one cut,
probe and restore, a figure that the machine's load does not inflate. Everything it creates
is removed whatever happens. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import netcut

GOAL_P50_MS, GOAL_P99_MS = 10.0, 20.0  # issue 4


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@contextmanager
def topology() -> Iterator[tuple[str, str, str]]:
    suffix = f"{os.getpid() % 100000}"
    host, sandbox, link = f"ncbh{suffix}", f"ncbs{suffix}", f"ncbv{suffix}"
    n = 250 + os.getpid() % 5  # 198.19.250-254.0/24: away from the test suite's range
    made: list[str] = []
    try:
        for ns in (host, sandbox):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", host, "link", "add", link, "type", "veth", "peer", "name", "eth0",
           "netns", sandbox)  # fmt: skip
        sh("ip", "-n", host, "addr", "add", f"198.19.{n}.1/24", "dev", link)
        sh("ip", "-n", host, "link", "set", link, "up")
        sh("ip", "-n", sandbox, "addr", "add", f"198.19.{n}.2/24", "dev", "eth0")
        sh("ip", "-n", sandbox, "link", "set", "eth0", "up")
        sh("ip", "-n", sandbox, "route", "add", "default", "via", f"198.19.{n}.1")
        yield host, sandbox, f"198.19.{n}.1"
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@contextmanager
def listener(ns: str, addr: str, port: int) -> Iterator[None]:
    from pyroute2.netns import create_socket

    sock = create_socket(f"/run/netns/{ns}", flags=0)

    def accept() -> None:  # keep the backlog empty: each probe opens one connection
        while True:
            try:
                sock.accept()[0].close()
            except OSError:
                return

    try:
        sock.bind((addr, port))
        sock.listen(128)
        threading.Thread(target=accept, daemon=True).start()
        yield
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def cpu_seconds() -> float:
    """CPU time of this process and of netcut's namespace worker (load-independent cost)."""
    from netcut import nsexec

    total = sum(os.times()[:2])
    worker = nsexec._worker
    if worker is not None:
        with open(f"/proc/{worker.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(name: str, values: list[float]) -> dict[str, float]:
    return {
        f"{name}_ms_p50": round(statistics.median(values), 3),
        f"{name}_ms_p99": round(pct(values, 0.99), 3),
        f"{name}_ms_min": round(min(values), 3),
        f"{name}_ms_max": round(max(values), 3),
    }


def run(cycles: int) -> dict[str, object]:
    with topology() as (host, sandbox, gateway), listener(host, gateway, 3128):
        keep = [f"{gateway}:3128"]
        start = time.perf_counter()
        netcut.start_worker()
        worker_start = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        netcut.cut(sandbox, keep, probe=False)
        first = (time.perf_counter() - start) * 1000
        netcut.restore(sandbox)
        cuts, restores, probes, inner = [], [], [], []
        cpu_before = cpu_seconds()
        for _ in range(cycles):
            t0 = time.perf_counter()
            result = netcut.cut(sandbox, keep, probe=False)
            t1 = time.perf_counter()
            probed = netcut.probe(sandbox, keep, timeout=1.0)
            t2 = time.perf_counter()
            netcut.restore(sandbox)
            t3 = time.perf_counter()
            if not (result.changed and probed.ok):
                raise RuntimeError(f"cycle failed: {result.lines()} {probed.lines()}")
            cuts.append((t1 - t0) * 1000)
            probes.append((t2 - t1) * 1000)
            restores.append((t3 - t2) * 1000)
            inner.append(result.elapsed_ms)
        cpu = (cpu_seconds() - cpu_before) * 1000 / cycles
        plan = result.plan
        ops = len(plan.ops) if plan is not None else 0
    out: dict[str, object] = {"cycles": cycles, "mode": "direct", "plan_ops": ops,
                              "first_cut_ms": round(first, 3),
                              "worker_start_ms": round(worker_start, 3)}  # fmt: skip
    out.update(summary("cut", cuts))
    out.update(summary("restore", restores))
    out.update(summary("probe", probes))
    out.update(summary("cut_in_namespace", inner))
    out["cpu_ms_per_cycle"] = round(cpu, 3)
    out["goal"] = {"cut_ms_p50": GOAL_P50_MS, "cut_ms_p99": GOAL_P99_MS}
    out["load_average"] = os.getloadavg()[0]
    out["cpus"] = os.cpu_count()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("netcut_bench: needs root (it creates network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="netcut-bench-") as state:
        os.environ["NETCUT_STATE_DIR"] = state  # records and lock: nothing left behind
        result = run(args.cycles)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
