"""`prepare_execution` / `release_execution(restore=True)` of one docker (or podman) container
in loopback mode, N cycles: what a framework pays per sandbox (docs/benchmarks.md#the-boundary-
through-the-helper). Run it as the user the framework runs as: as a docker-group user
`cut_mode="auto"` is the helper (one helper run opens the listeners inside the namespace,
passes them back and cuts; one restores); as root it is direct mode.

    python -m bench.boundary_helper --cycles 10 [--cut-mode auto|direct|helper]
        [--engine docker] [--image IMAGE] [--network NET] [--transparent]

Prints one JSON object: the mode used and why, prepare and release p50/max in ms. Needs a
running engine and an image with `sleep` (default: the CI's box image); nothing is pulled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution


@contextlib.contextmanager
def container(engine: str, image: str, network: str | None) -> Iterator[str]:
    name = f"egress-bench-{os.getpid()}"
    net = ["--network", network] if network else []
    argv = [engine, "run", "-d", "--rm", "--name", name, "--cap-drop", "ALL", *net, image]
    subprocess.run([*argv, "sleep", "3600"], check=True, capture_output=True, timeout=120)
    try:
        yield name
    finally:
        subprocess.run([engine, "rm", "-f", name], capture_output=True, timeout=120, check=False)


def ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values) * 1000, 1),
        "max": round(max(values) * 1000, 1),
        "min": round(min(values) * 1000, 1),
    }


async def cycles(sandbox: str, n: int, cut_mode: str, transparent: bool) -> dict[str, object]:
    prepare: list[float] = []
    release: list[float] = []
    used = reason = ""
    async with EgressProxy(build_settings({}), listen=()) as proxy:
        for _ in range(n):
            t0 = time.perf_counter()
            execution = await prepare_execution(
                sandbox,
                Policy(allow=["pypi.test"]),
                proxy,
                cut_mode=cut_mode,  # type: ignore[arg-type]
                transparent=transparent,
            )
            prepare.append(time.perf_counter() - t0)
            used = execution.cut_mode
            reason = getattr(execution, "cut_mode_reason", "")  # (older versions: none)
            t0 = time.perf_counter()
            await release_execution(proxy, execution, restore=True)
            release.append(time.perf_counter() - t0)
    return {
        "cycles": n,
        "uid": os.getuid(),
        "cut_mode": used,
        "why": reason,
        "transparent": transparent,
        "prepare_ms": ms(prepare),
        "release_ms": ms(release),
        "loadavg": [round(x, 2) for x in os.getloadavg()],  # a shared machine: say how busy
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.boundary_helper", description=__doc__)
    p.add_argument("--cycles", type=int, default=10)
    p.add_argument("--cut-mode", default="auto", choices=("auto", "direct", "helper"))
    p.add_argument("--engine", default="docker")
    p.add_argument("--image", default="netcut-ci-box:latest")
    p.add_argument("--network", default=None)
    p.add_argument("--transparent", action="store_true")
    args = p.parse_args(argv)
    with container(args.engine, args.image, args.network) as name:
        sandbox = f"{args.engine}:{name}"
        result = asyncio.run(cycles(sandbox, args.cycles, args.cut_mode, args.transparent))
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
