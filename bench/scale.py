"""Hundreds of sandboxes per host: concurrent prepare and release, and churn without leftovers.

    python -m bench.scale [--n 1,50,200] [--pin CPU] [--churn CYCLES] [--json PATH]
    ./dev.sh bench --scale [same options]

One `EgressProxy` in this process (uvloop, as `egress serve` runs it) serves N sandboxes:
network namespaces made here (`ip netns add`, names starting with `ncsc`), each with loopback
and a veth `eth0` (its peer in the same namespace) at 198.19.200.2/24 with a default route,
so a cut has routes to delete.
Loopback mode, direct cut (docs/user-guide.md#sandbox-lifecycle).

- **prepare / release**: for each N, `asyncio.gather` over N `prepare_execution`s, then over
  their N `release_execution(restore=True)`s: per-call p50/p99, the whole batch, and CPU per
  call (this process plus netcut's workers, from /proc: load-independent). Every prepared
  sandbox is checked cut (its status came back `cut` in the same job).
- **churn** (`--churn`): cycles of a namespace made, prepared, released and deleted, half
  with `restore=False, forget=True` (a sandbox that will be destroyed) and half with
  `restore=True`, then the leftovers: records in the state directory, listeners, this
  process's fds, and the RSS of this process and of the workers over the cycles.

`--pin CPU` pins this process and the workers to one CPU (the issue's measurement: proxy and
worker on one core, the other free). Everything made is removed whatever happens. Needs root.
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GOAL_BATCH_200_MS = 600.0
GOAL_CPU_PER_PREPARE_MS = 5.0
GOAL_RELEASE_200_P99_MS = 250.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def make_sandbox(name: str) -> None:
    _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")
    _ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
    _ip("-n", name, "link", "set", "peer0", "up")
    _ip("-n", name, "addr", "add", "198.19.200.2/24", "dev", "eth0")
    _ip("-n", name, "link", "set", "eth0", "up")
    _ip("-n", name, "route", "add", "default", "via", "198.19.200.1")


def drop_sandbox(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False, timeout=30)


@contextmanager
def sandboxes(count: int, tag: str) -> Iterator[list[str]]:
    names = [f"ncsc{os.getpid() % 10000}{tag}{i}" for i in range(count)]
    made: list[str] = []
    try:
        with ThreadPoolExecutor(8) as pool:
            for name, _ in zip(names, pool.map(make_sandbox, names), strict=True):
                made.append(name)
        yield names
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(drop_sandbox, made))


def _proc_cpu(pid: int | str) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_pids() -> list[int]:
    """netcut's workers (a pool now; one `_worker` before, so the script measures both)."""
    from netcut.direct import worker as nsexec

    if hasattr(nsexec, "worker_pids"):
        return list(nsexec.worker_pids())
    single = getattr(nsexec, "_worker", None)
    return [single.pid] if single is not None else []


def cpu_split() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of netcut's workers."""
    workers = 0.0
    for pid in worker_pids():
        try:
            workers += _proc_cpu(pid)
        except OSError:
            continue
    return sum(os.times()[:2]), workers


def cpu_seconds() -> float:
    """CPU of this process and netcut's workers (user + system)."""
    return sum(cpu_split())


def rss_kib(pid: int | str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def pin(cpu: int | None) -> None:
    if cpu is None:
        return
    for pid in [0, *worker_pids()]:
        os.sched_setaffinity(pid, {cpu})


async def _timed(coro: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await coro
    return (time.perf_counter() - start) * 1000, result


async def prepare_release(proxy: Any, names: list[str]) -> dict[str, Any]:
    from egress import Policy, prepare_execution, release_execution

    policy = Policy(allow=["example.test"])
    (own0, work0), t0 = cpu_split(), time.perf_counter()
    prepared = await asyncio.gather(*(_timed(prepare_execution(n, policy, proxy)) for n in names))
    batch = (time.perf_counter() - t0) * 1000
    own1, work1 = cpu_split()
    cpu_prepare = (own1 + work1 - own0 - work0) * 1000 / len(names)
    not_cut = [ex.sandbox for _, ex in prepared if ex.cut is None or not ex.probe.ok]
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    released = await asyncio.gather(
        *(_timed(release_execution(proxy, ex, restore=True)) for _, ex in prepared)
    )
    release_batch = (time.perf_counter() - t0) * 1000
    cpu_release = (cpu_seconds() - cpu0) * 1000 / len(names)
    prep = [ms for ms, _ in prepared]
    rel = [ms for ms, _ in released]
    return {
        "n": len(names),
        "prepare_ms_p50": round(statistics.median(prep), 1),
        "prepare_ms_p99": round(pct(prep, 0.99), 1),
        "prepare_batch_ms": round(batch, 1),
        "prepare_cpu_ms": round(cpu_prepare, 2),
        "prepare_cpu_ms_proxy": round((own1 - own0) * 1000 / len(names), 2),
        "prepare_cpu_ms_workers": round((work1 - work0) * 1000 / len(names), 2),
        "release_ms_p50": round(statistics.median(rel), 1),
        "release_ms_p99": round(pct(rel, 0.99), 1),
        "release_batch_ms": round(release_batch, 1),
        "release_cpu_ms": round(cpu_release, 2),
        "not_cut": not_cut,
        "listeners_left": len(proxy.listeners) - 1,
    }


async def churn(proxy: Any, cycles: int, state: str) -> dict[str, Any]:
    """Cycles of make / prepare / release / delete; even cycles restore, odd ones forget."""
    from egress import Policy, prepare_execution, release_execution

    policy = Policy(allow=["example.test"])
    fds0 = len(os.listdir("/proc/self/fd"))
    samples = []
    start = time.perf_counter()
    for cycle in range(cycles):
        name = f"ncsc{os.getpid() % 10000}c{cycle % 8}"
        await asyncio.to_thread(make_sandbox, name)
        try:
            ex = await prepare_execution(name, policy, proxy)
            restore = cycle % 2 == 0
            await release_execution(proxy, ex, restore=restore, forget=not restore)
        finally:
            await asyncio.to_thread(drop_sandbox, name)
        if cycle % max(1, cycles // 20) == 0 or cycle == cycles - 1:
            workers = sum(rss_kib(p) for p in worker_pids())
            samples.append({"cycle": cycle, "proxy_rss_kib": rss_kib("self"),
                            "workers_rss_kib": workers})  # fmt: skip
    seconds = time.perf_counter() - start
    records = [n for n in os.listdir(state) if n.endswith(".json")]
    half = [s for s in samples if s["cycle"] >= cycles // 2]
    return {
        "cycles": cycles,
        "cycles_per_s": round(cycles / seconds, 1),
        "records_left": len(records),
        "listeners_left": len(proxy.listeners) - 1,
        "fds_left": len(os.listdir("/proc/self/fd")) - fds0,
        "proxy_rss_growth_last_half_kib": half[-1]["proxy_rss_kib"] - half[0]["proxy_rss_kib"],
        "workers_rss_growth_last_half_kib": half[-1]["workers_rss_kib"]
        - half[0]["workers_rss_kib"],
        "rss": samples,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import netcut
    from egress import EgressProxy, build_settings

    netcut.start_worker()
    pin(args.pin)
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    await proxy.start()
    out: dict[str, Any] = {"cpus": os.cpu_count(), "pinned_to": args.pin, "runs": []}
    try:
        with sandboxes(2, "w") as names:  # warm-up: first imports, the workers' first jobs
            await prepare_release(proxy, names)
        for n in args.n:
            with sandboxes(n, "s") as names:
                for rep in range(args.reps):
                    found = await prepare_release(proxy, names)
                    found["rep"] = rep
                    out["runs"].append(found)
                    print(json.dumps({k: v for k, v in found.items() if k != "not_cut"}),
                          file=sys.stderr)  # fmt: skip
        if args.churn:
            out["churn"] = await churn(proxy, args.churn, os.environ["NETCUT_STATE_DIR"])
    finally:
        await proxy.stop()
    out["load_average"] = os.getloadavg()[0]
    out["goals"] = {
        "prepare_batch_ms_at_200": GOAL_BATCH_200_MS,
        "prepare_cpu_ms": GOAL_CPU_PER_PREPARE_MS,
        "release_ms_p99_at_200": GOAL_RELEASE_200_P99_MS,
    }
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    p.add_argument("--n", type=lambda t: [int(x) for x in t.split(",")], default=[1, 50, 200],
                   help="sandbox counts, comma-separated (default 1,50,200)")  # fmt: skip
    p.add_argument("--reps", type=int, default=2, help="prepare/release batches per N")
    p.add_argument("--pin", type=int, metavar="CPU", help="pin the proxy and workers to CPU")
    p.add_argument("--churn", type=int, default=0, metavar="CYCLES", help="churn cycles")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.scale: needs root (network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="netcut-scale-") as state:
        os.environ["NETCUT_STATE_DIR"] = state
        try:
            import uvloop

            result = uvloop.run(main_async(args))
        except ImportError:
            result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
