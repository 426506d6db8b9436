"""Added cost per sandbox of the verifiers and inspect-ai integrations: one prepare (the cut,
the sandbox's proxy listener, a framework route's forwarder, the probe) and the release with
restore after it, through the integration's own object, as the framework calls it.

    .venv-frameworks/verifiers/bin/python bench/integration_cost.py verifiers [--cycles 30]
    .venv-frameworks/inspect/bin/python bench/integration_cost.py inspect [--cycles 30]

- verifiers: `VerifiersBoundary.prepare(routes)` (what `EgressDockerRuntime.prepare_execution`
  runs, with verifiers' interception route on the host's loopback) and `prepare(None)`;
- inspect: the `egress` sandbox's `cut` (what its sample-start hook runs) and `release`
  (what `sample_cleanup` runs), around a stand-in inner sandbox naming the namespace.

Runs in the framework's venv (`./dev.sh test` creates them), on the loop's shared proxy.
Builds one namespace (`ncib<pid>`, loopback only: the cost is the boundary's, not a
network's) and times many cycles (wall clock); the first cycle (netcut's worker starting)
is reported apart. Needs root; removes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable

ROUTE = "http://127.0.0.1:8089/v1"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def steps(framework: str, netns: str) -> tuple[Callable[[], Awaitable[None]], ...]:
    """(prepare, release, close) through the framework's integration."""
    from egress import Policy

    policy = Policy(allow=["pypi.org:*", "**.pythonhosted.org:*"])
    if framework == "verifiers":
        from egress.integrations.verifiers import VerifiersBoundary

        boundary = VerifiersBoundary(netns, policy, client_id="bench")
        return (
            lambda: boundary.prepare([ROUTE]),
            lambda: boundary.prepare(None),
            boundary.release,
        )
    from egress.integrations.inspect import EgressSandboxConfig, EgressSandboxEnvironment

    class Inner:  # the namespace, as an inner sandbox names it
        egress_target = netns

    config = EgressSandboxConfig(inner="local", allow=("pypi.org:*",), framework_routes=(ROUTE,))
    env = EgressSandboxEnvironment(Inner(), "default", config)  # type: ignore[arg-type]
    return (lambda: env.cut("bench", fail=True), env.release, env.release)


async def measure(framework: str, netns: str, cycles: int) -> dict[str, object]:
    from egress import close_shared_proxy

    prepare_step, release_step, close = steps(framework, netns)
    prepare: list[float] = []
    release: list[float] = []
    try:
        for _ in range(cycles + 1):
            t0 = time.perf_counter()
            await prepare_step()
            t1 = time.perf_counter()
            await release_step()
            t2 = time.perf_counter()
            prepare.append((t1 - t0) * 1000)
            release.append((t2 - t1) * 1000)
    finally:
        await close()
        await close_shared_proxy()
    first = prepare.pop(0) + release.pop(0)
    total = [p + r for p, r in zip(prepare, release, strict=True)]
    return {
        "framework": framework,
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
    parser.add_argument("framework", choices=["verifiers", "inspect"])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    netns = f"ncib{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        result = asyncio.run(measure(args.framework, netns, args.cycles))
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:24} {value}")


if __name__ == "__main__":
    main()
