"""Added cost per sandbox of the Harbor integration: one agent phase's
`_apply_network_policy(allowlist)` (prepare: cut, transparent redirect, listeners, probe) and
the `_apply_network_policy(public)` after it (release with restore), as Harbor's trial calls
them, through `egress.integrations.harbor.HarborEgress`.

    .venv-harbor/bin/python bench/harbor_cost.py [--cycles 30] [--json]

Runs in Harbor's venv (Python >= 3.12; `./dev.sh test` creates `.venv-harbor`). Builds one
namespace (`nchb<pid>`, loopback only: the cost is the boundary's, not a network's), a proxy
on this loop, and times `apply` over many cycles (wall clock, as the trial sees it); the first
cycle (netcut's worker starting) is reported apart. Needs root; removes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time

from harbor.models.task.config import NetworkPolicy

from egress import EgressProxy, Policy
from egress.integrations.harbor import HarborEgress

ALLOWLIST = NetworkPolicy(
    network_mode="allowlist", allowed_hosts=["pypi.org", "*.pythonhosted.org", "github.com"]
)
PUBLIC = NetworkPolicy(network_mode="public")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def measure(netns: str, cycles: int) -> dict[str, object]:
    proxy = EgressProxy(Policy(), listen=())
    await proxy.start()
    egress = HarborEgress(netns, "bench", proxy=proxy,
                          framework_routes=["http://127.0.0.1:8089/v1"])  # fmt: skip
    prepare: list[float] = []
    release: list[float] = []
    try:
        for _ in range(cycles + 1):
            t0 = time.perf_counter()
            await egress.apply(ALLOWLIST)
            t1 = time.perf_counter()
            await egress.apply(PUBLIC)
            t2 = time.perf_counter()
            prepare.append((t1 - t0) * 1000)
            release.append((t2 - t1) * 1000)
    finally:
        await egress.close()
        await proxy.stop()
    first = prepare.pop(0) + release.pop(0)
    total = [p + r for p, r in zip(prepare, release, strict=True)]
    return {
        "cycles": cycles,
        "first_cycle_ms": round(first, 2),
        "prepare_ms_p50": pct(prepare, 0.5),
        "prepare_ms_p99": pct(prepare, 0.99),
        "release_ms_p50": pct(release, 0.5),
        "release_ms_p99": pct(release, 0.99),
        "per_sandbox_ms_p50": pct(total, 0.5),
        "per_sandbox_ms_mean": round(statistics.fmean(total), 2),
        "load_average": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    netns = f"nchb{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        result = asyncio.run(measure(netns, args.cycles))
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:24} {value}")


if __name__ == "__main__":
    main()
