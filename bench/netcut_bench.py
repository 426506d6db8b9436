"""Latency of a netcut cut and restore, direct mode, full plan (netfilter backstop included).

    python bench/netcut_bench.py [--cycles 200] [--json]
    python bench/netcut_bench.py --engines [--engine-cycles 30] [--json]

`--engines` instead times real containers (tests/engines/up.sh must have started the engines
and imported `netcut-ci-box`): for each engine that answers (docker, podman, containerd) and
each mode that applies (direct everywhere, helper on docker and podman), a cut *with its
probe* of a kept listener on the container's gateway, `status`, and `restore`, as p50/p99 over
`--engine-cycles` cycles; plus the helper image's size and build (assemble + import) time.

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
# the engine run's addresses (tests/engines/instance.sh writes them to its env file), so the
# bench times the instance it is pointed at, not only the default one
DOCKER_GATEWAY = os.environ.get("NETCUT_CI_DOCKER_GATEWAY", "198.19.251.1")  # nc-ci's
PODMAN_GATEWAY = os.environ.get("NETCUT_CI_PODMAN_GATEWAY", "198.19.252.1")
CTR_NET = os.environ.get("NETCUT_CI_CTR_NET", "198.19.253")  # containerd boxes' veth /30


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
        sh(
            "ip",
            "-n",
            host,
            "link",
            "add",
            link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            sandbox,
        )
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
    from netcut.direct import worker as nsexec

    total = sum(os.times()[:2])
    for pid in nsexec.worker_pids():
        with open(f"/proc/{pid}/stat") as f:
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
    out: dict[str, object] = {
        "cycles": cycles,
        "mode": "direct",
        "plan_ops": ops,
        "first_cut_ms": round(first, 3),
        "worker_start_ms": round(worker_start, 3),
    }
    out.update(summary("cut", cuts))
    out.update(summary("restore", restores))
    out.update(summary("probe", probes))
    out.update(summary("cut_in_namespace", inner))
    out["cpu_ms_per_cycle"] = round(cpu, 3)
    out["goal"] = {"cut_ms_p50": GOAL_P50_MS, "cut_ms_p99": GOAL_P99_MS}
    out["load_average"] = os.getloadavg()[0]
    out["cpus"] = os.cpu_count()
    return out


BOX = "netcut-ci-box:latest"
GOAL_HELPER_CUT_P50_MS = 300.0  # issue 10, including the probe


@contextmanager
def engine_box(engine: str) -> Iterator[tuple[netcut.TargetRef, str]]:
    """A `sleep` container with no capabilities; yields its target and gateway address."""
    from netcut import resolve as target

    name = f"nc-bench{os.getpid()}-{engine}"
    if engine == "containerd":
        with _ctr_box(name) as gateway:
            yield target.container(name, "containerd"), gateway
        return
    net = ["--network", "nc-ci"] if engine == "docker" else []
    sh(engine, "run", "-d", "--rm", "--name", name, "--cap-drop", "ALL", *net, BOX, "sleep", "3600")
    try:
        yield (
            target.container(name, engine),
            DOCKER_GATEWAY if engine == "docker" else PODMAN_GATEWAY,
        )
    finally:
        rm = ["rm", "-f"] if engine == "docker" else ["rm", "-f", "-t", "0"]
        subprocess.run([engine, *rm, name], capture_output=True, check=False)


@contextmanager
def _ctr_box(name: str) -> Iterator[str]:
    from netcut.resolve import parse_ctr_tasks

    ctr = ["ctr", "-n", "default"]
    drop = [a for c in ("NET_RAW", "NET_ADMIN", "SYS_ADMIN") for a in ("--cap-drop", f"CAP_{c}")]
    link = f"ncbc{os.getpid() % 100000}"
    try:
        sh(*ctr, "run", "-d", *drop, f"docker.io/library/{BOX}", name, "sleep", "3600")
        tasks = subprocess.run([*ctr, "task", "ls"], capture_output=True, text=True, check=True)
        pid = str(parse_ctr_tasks(tasks.stdout)[name][0])
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", pid)
        sh("ip", "addr", "add", f"{CTR_NET}.253/30", "dev", link)
        sh("ip", "link", "set", link, "up")
        inside = ["nsenter", f"--net=/proc/{pid}/ns/net", "ip"]
        sh(*inside, "addr", "add", f"{CTR_NET}.254/30", "dev", "eth0")
        sh(*inside, "link", "set", "eth0", "up")
        sh(*inside, "route", "add", "default", "via", f"{CTR_NET}.253")
        yield f"{CTR_NET}.253"
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        subprocess.run([*ctr, "tasks", "kill", "-s", "KILL", name], capture_output=True)
        for _ in range(100):
            done = subprocess.run([*ctr, "tasks", "delete", name], capture_output=True)
            if done.returncode == 0 or b"not found" in done.stderr:
                break
            time.sleep(0.05)
        subprocess.run([*ctr, "containers", "delete", name], capture_output=True, check=False)


@contextmanager
def root_listener(addr: str) -> Iterator[int]:
    sock = socket.socket()
    sock.bind((addr, 0))
    sock.listen(128)

    def accept() -> None:
        while True:
            try:
                sock.accept()[0].close()
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def engine_cycles(engine: str, mode: str, cycles: int) -> dict[str, object]:
    from netcut.helper import mode as helper

    cut, status, restore = (
        (helper.cut, helper.status, helper.restore)
        if mode == "helper"
        else (netcut.cut, netcut.status, netcut.restore)
    )
    cuts, statuses, restores = [], [], []
    with engine_box(engine) as (ref, gateway), root_listener(gateway) as port:
        keep = [f"{gateway}:{port}"]
        for _ in range(cycles):
            t0 = time.perf_counter()
            result = cut(ref, keep, probe=True)  # type: ignore[operator]
            t1 = time.perf_counter()
            state = status(ref)  # type: ignore[operator]
            t2 = time.perf_counter()
            restore(ref)  # type: ignore[operator]
            t3 = time.perf_counter()
            if not (
                result.changed and result.probe is not None and result.probe.ok and state.is_cut
            ):
                raise RuntimeError(f"{engine}/{mode} cycle failed: {result.lines()}")
            cuts.append((t1 - t0) * 1000)
            statuses.append((t2 - t1) * 1000)
            restores.append((t3 - t2) * 1000)
    out: dict[str, object] = {"engine": engine, "mode": mode, "cycles": cycles}
    out.update(summary("cut_with_probe", cuts))
    out.update(summary("status", statuses))
    out.update(summary("restore", restores))
    return out


def engines_answering() -> list[str]:
    found = []
    for engine, argv in (
        ("docker", ["docker", "image", "inspect", BOX]),
        ("podman", ["podman", "image", "exists", BOX]),
        ("containerd", ["ctr", "-n", "default", "tasks", "ls"]),
    ):
        try:
            done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            found.append(engine)
    return found


def run_engines(cycles: int) -> dict[str, object]:
    from netcut.helper import image as helperimage

    os.environ["CONTAINERD_NAMESPACE"] = "default"  # where up.sh imported the box image
    results: list[dict[str, object]] = []
    images: dict[str, object] = {}
    for engine in engines_answering():
        if engine != "containerd":
            built = helperimage.build(engine)
            images[engine] = {
                "tag": built.tag,
                "rootfs_tar_mb": round(built.size_bytes / 1e6, 2),
                "files": built.files,
                "build_s": round(built.seconds, 3),
            }
        for mode in ("direct", "helper") if engine != "containerd" else ("direct",):
            results.append(engine_cycles(engine, mode, cycles))
    return {
        "engines": results,
        "helper_image": images,
        "goal": {"helper_cut_with_probe_ms_p50": GOAL_HELPER_CUT_P50_MS},
        "load_average": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--engines", action="store_true", help="time real container engines")
    parser.add_argument("--engine-cycles", type=int, default=30)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("netcut_bench: needs root (it creates network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="netcut-bench-") as state:
        os.environ["NETCUT_STATE_DIR"] = state  # records and lock: nothing left behind
        result = run_engines(args.engine_cycles) if args.engines else run(args.cycles)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
