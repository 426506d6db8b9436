"""Hundreds of sandboxes per host: prepare and release, the data path, churn (issue 23).

    python -m bench.scale [--n 1,50,200,400] [--pin 1 --load-cpu 0] [--seconds 10]
                          [--churn 2000] [--json PATH] [--plots DIR]
    ./dev.sh bench --scale [same options]

One `EgressProxy` in this process (uvloop, as `egress serve` runs it, its audit log on)
serves N sandboxes: network namespaces made here (`ip netns add`, named as tests/harness.py
names its own, `egt-PID-K`, so its sweep removes them after a crash), each with loopback and a
veth `eth0` (its peer in the same namespace) at 198.19.200.2/24 with a default route, so a
cut has routes to delete. Sandbox i may reach `si.scale.test` only; every name is pinned to
the origin, which runs in a namespace of its own with a veth to this one (198.18.0.0/17, as
tests/harness.py makes them). Loopback mode, direct cut (docs/user-guide.md#sandbox-lifecycle).

- **prepare / release**: for each N, `asyncio.gather` over N `prepare_execution`s, then over
  their N `release_execution(restore=True)`s: per-call p50/p99, the whole batch, and CPU per
  call (this process plus netcut's workers, from /proc: load-independent). Every prepared
  sandbox is checked cut (its status came back `cut` in the same job). RSS and fds per idle
  sandbox: this process and the workers, before the batch and with all N prepared.
- **data path** (`--seconds`, 0 skips it): with N prepared, the load process
  (`bench/sandboxload.py`, on the load core) sends from inside each sandbox, over one
  keep-alive connection per sandbox: *paced* (`--rate` requests a second each) and then
  *closed-loop* (each next request as soon as the answer is in). Request latency at the
  client; in this process, the event loop's lag (how late a 1 ms ticker wakes up) and every
  garbage-collector pause (`gc.callbacks`), during each phase. Every 10th request asks for the
  neighbour's host: isolation holds when none of those gets 200. The audit chain is verified
  at the end (`egress audit verify`).
- **churn** (`--churn`): cycles of a namespace made, prepared, released and deleted
  (`--churn-slots` at a time), half with `restore=False, forget=True` (a sandbox that will be
  destroyed) and half with `restore=True`, then the leftovers: records in the state
  directory, listeners, this process's fds, namespaces; and the RSS of this process and of
  the workers over the cycles (growth over the last half).

`--pin CPU` pins this process and the workers to one CPU and `--load-cpu` the load process to
another (the issue's measurement: proxy and worker on one core, the load on the other).
`--priority NICE` (e.g. -10) also raises the scheduling weight of this process's session, the
load process's and the workers' (`/proc/PID/autogroup`, restored at the end), so that on a
machine shared with other work the pinned cores are mostly the benchmark's: a quiet machine's
conditions, for the latency targets. Every run reports the load average and the share of its
core the proxy got, and the whole run's longest garbage-collector pause (prepare bursts and
the heap's settles included), so a run with and without it can be told apart.
Everything made is removed whatever happens. Needs root.

The targets of issue 23 come out side by side with N in the `summary` of the JSON (and the
first table of `--markdown`): paced request p99, loop lag p99, the longest GC pause (in the
paced phase, and anywhere in the run), cross-sandbox 200s, the chain's verification, and the
churn's leftovers and RSS slope over its last 1,000 cycles.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GOAL_BATCH_200_MS = 600.0
GOAL_CPU_PER_PREPARE_MS = 5.0
GOAL_RELEASE_200_P99_MS = 250.0
GOAL_PACED_400_P99_MS = 10.0
GOAL_LAG_400_P99_MS = 5.0
GOAL_GC_PAUSE_MS = 10.0
LAST_CYCLES = 1000  # churn: RSS must be flat over the last this many cycles
ORIGIN_PORT = 8080
_names = itertools.count(1)


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


def sandbox_name() -> str:
    """tests/harness.py's naming (`egt-PID-K`): its sweep removes what a killed run left."""
    return f"egt-{os.getpid()}-{next(_names) + 100000}"


@contextmanager
def sandboxes(count: int) -> Iterator[list[str]]:
    names = [sandbox_name() for _ in range(count)]
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
    # with the children this process waited for (a helper binary run per call counts too)
    return sum(os.times()[:4]), workers


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


def pin(cpu: int | None, nice: int | None = None) -> None:
    """Pin this process and the workers to `cpu`; with `nice`, set their sessions'
    scheduling weight (the workers run in sessions of their own). Called again before each
    batch: the pool replaces a worker after its share of jobs."""
    for pid in worker_pids():
        with contextlib.suppress(OSError):  # a worker that just exited
            if cpu is not None:
                os.sched_setaffinity(pid, {cpu})
            if nice is not None:
                set_autogroup_nice(pid, nice)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def autogroup_nice(pid: int | str = "self") -> int | None:
    """The nice value of `pid`'s autogroup (`/autogroup-N nice X`), None without autogroups."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(pid: int | str, nice: int) -> None:
    with open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(nice))


async def _timed(coro: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await coro
    return (time.perf_counter() - start) * 1000, result


def fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def netns_threads() -> int:
    """The proxy's namespace-listener threads alive: each holds one descriptor, its home
    namespace, for as long as it lives (egress/proxy/net/netns.py, a pool of at most 4 that
    grows when jobs overlap and shrinks when idle), so they are counted apart from leaks."""
    from egress.proxy.net.netns import THREAD_NAME

    return sum(t.name == THREAD_NAME for t in threading.enumerate())


def fds_left(fds0: dict[int, str], threads0: int) -> tuple[int, int, list[str]]:
    """Since `fds0` (`fd_targets()`) and `threads0` (`netns_threads()`): (descriptors left,
    less one per namespace-pool thread started meanwhile; the threads started; what every
    new descriptor refers to). A CI run under load saw a pool thread start during the churn
    and counted its home namespace as a leak."""
    fds1, threads = fd_targets(), netns_threads() - threads0
    new = sorted(t for fd, t in fds1.items() if fds0.get(fd) != t)
    return len(fds1) - len(fds0) - threads, threads, new


def fd_targets(pid: int | str = "self") -> dict[int, str]:
    """Each open descriptor and what it refers to (`socket:[N]`, `net:[N]`, a path)."""
    out: dict[int, str] = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own, say)
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return out


def host_of(i: int) -> str:
    return f"s{i}.scale.test"


def policy_of(i: int) -> Any:
    from egress import Policy

    return Policy(allow=[f"{host_of(i)}:{ORIGIN_PORT}"])


@contextmanager
def origin_namespace() -> Iterator[tuple[str, str]]:
    """The origin's namespace, tests/harness.py style: a veth to this namespace, the root side
    198.18.X.1/30 and the namespace side 198.18.X.2/30 (X from this process's pid)."""
    name = sandbox_name()
    k = (os.getpid() * 37 + 4099) % 8192
    third, fourth = divmod(k * 4, 256)
    here, there = f"198.18.{third}.{fourth + 1}", f"198.18.{third}.{fourth + 2}"
    link = f"egr{os.getpid() % 100000}o"
    try:
        _ip("netns", "add", name)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
        _ip("addr", "add", f"{here}/30", "dev", link)
        _ip("link", "set", link, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "addr", "add", f"{there}/30", "dev", "eth0")
        _ip("-n", name, "link", "set", "eth0", "up")
        yield name, there
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        drop_sandbox(name)


class Pauses:
    """Every garbage-collector pause while recording (gc.callbacks): (generation, wall ms,
    CPU ms). The wall time is what the loop waited; the CPU time (the thread's) is what the
    collection cost, without the time the scheduler gave other processes meanwhile."""

    def __init__(self) -> None:
        self.recording = False
        self.pauses: list[tuple[int, float, float]] = []
        self._t0 = self._c0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0, self._c0 = time.perf_counter(), time.thread_time()
        elif self.recording:
            wall = (time.perf_counter() - self._t0) * 1000
            self.pauses.append((info["generation"], wall, (time.thread_time() - self._c0) * 1000))

    def summary(self) -> dict[str, Any]:
        by_gen = {g: [ms for gen, ms, _ in self.pauses if gen == g] for g in (0, 1, 2)}
        return {
            "gc_pauses": len(self.pauses),
            "gc_max_ms": round(max((ms for _, ms, _ in self.pauses), default=0.0), 2),
            "gc_max_cpu_ms": round(max((c for _, _, c in self.pauses), default=0.0), 2),
            **{f"gc_gen{g}": len(v) for g, v in by_gen.items()},
            **{f"gc_gen{g}_max_ms": round(max(v, default=0.0), 2) for g, v in by_gen.items()},
        }


class RunPauses(Pauses):
    """Every collector pause of the whole run, by stage (`stage` is set as the run goes: the
    prepare bursts, the heap's settles and compactions at their ends, the data path, churn):
    the longest pause anywhere, not only inside a data-path phase."""

    def __init__(self) -> None:
        super().__init__()
        self.recording = True
        self.stage = "start"
        self.longest: dict[str, tuple[int, float, float]] = {}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        before = len(self.pauses)
        super().__call__(phase, info)
        if len(self.pauses) > before:
            pause = self.pauses.pop()  # only the longest of each stage is kept
            if pause[1] > self.longest.get(self.stage, (0, -1.0, 0.0))[1]:
                self.longest[self.stage] = pause

    def summary(self) -> dict[str, Any]:
        stages = sorted(self.longest.items(), key=lambda kv: -kv[1][1])
        top = stages[0][1] if stages else (0, 0.0, 0.0)
        return {
            "gc_max_ms": round(top[1], 2),
            "gc_max_cpu_ms": round(top[2], 2),
            "gc_max_stage": stages[0][0] if stages else None,
            "by_stage": {k: {"generation": g, "ms": round(w, 2), "cpu_ms": round(c, 2)}
                         for k, (g, w, c) in stages},
        }  # fmt: skip


class Ticker:
    """The loop's lag: how late a 1 ms periodic coroutine wakes up, in ms."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.recording = False
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + 0.001
            await asyncio.sleep(0.001)
            if self.recording:
                self.lags.append(max(0.0, (loop.time() - due) * 1000))

    def summary(self) -> dict[str, Any]:
        lags = self.lags or [0.0]
        return {
            "lag_ms_p50": round(pct(lags, 0.5), 2),
            "lag_ms_p99": round(pct(lags, 0.99), 2),
            "lag_ms_max": round(max(lags), 2),
        }


def request_histogram(proxy: Any) -> list[tuple[float, int]]:
    """The proxy's own request durations so far (`egress_request_seconds`, cumulative
    buckets: docs/metrics.md)."""
    latency: dict[str, Any] = proxy.metrics()["latency"]
    return [(float(b), int(n)) for b, n in latency["request"]["buckets"]]


def proxy_side(before: list[tuple[float, int]], after: list[tuple[float, int]]) -> dict[str, Any]:
    """The phase's requests as the proxy timed them (head read to answer written): the
    bucket its p99 falls in, and how many took over the 10 ms target. The client's latency
    adds the load process's own delays (the clients and the origin, on the other core)."""
    counts = [(b, n - m) for (b, n), (_, m) in zip(after, before, strict=True)]
    total = counts[-1][1] if counts else 0
    p99 = next((b for b, n in counts if n >= 0.99 * total), None) if total else None
    within = next((n for b, n in counts if b >= GOAL_PACED_400_P99_MS / 1000), total)
    return {
        "proxy_requests": total,
        "proxy_ms_p99_at_most": None if p99 is None else round(p99 * 1000, 2),
        "proxy_over_10ms": total - within,
    }


async def prepare_release(proxy: Any, names: list[str]) -> dict[str, Any]:
    from egress import prepare_execution, release_execution

    rss0, wrss0, fds0 = rss_kib("self"), sum(rss_kib(p) for p in worker_pids()), fds()
    (own0, work0), t0 = cpu_split(), time.perf_counter()
    prepared = await asyncio.gather(
        *(_timed(prepare_execution(n, policy_of(i), proxy)) for i, n in enumerate(names))
    )
    batch = (time.perf_counter() - t0) * 1000
    own1, work1 = cpu_split()
    cpu_prepare = (own1 + work1 - own0 - work0) * 1000 / len(names)
    not_cut = [ex.sandbox for _, ex in prepared if ex.cut is None or not ex.probe.ok]
    rss1, wrss1, fds1 = rss_kib("self"), sum(rss_kib(p) for p in worker_pids()), fds()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    released = await asyncio.gather(
        *(_timed(release_execution(proxy, ex, restore=True)) for _, ex in prepared)
    )
    release_batch = (time.perf_counter() - t0) * 1000
    cpu_release = (cpu_seconds() - cpu0) * 1000 / len(names)
    prep = [ms for ms, _ in prepared]
    rel = [ms for ms, _ in released]
    n = len(names)
    return {
        "n": n,
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
        "proxy_rss_kib_per_sandbox": round((rss1 - rss0) / n, 1),
        "workers_rss_kib_per_sandbox": round((wrss1 - wrss0) / n, 1),
        "fds_per_sandbox": round((fds1 - fds0) / n, 2),
        "not_cut": not_cut,
        "listeners_left": len(proxy.listeners) - 1,
    }


class LoadProcess:
    """bench/sandboxload.py on the load core: the origin and the sandboxes' clients."""

    def __init__(self, setup: dict[str, Any], cpu: int | None) -> None:
        argv = [sys.executable, "-m", "bench.sandboxload"]
        if cpu is not None:
            argv = ["taskset", "-c", str(cpu), *argv]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        self.ask(setup)

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench.sandboxload exited ({self.proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def datapath(
    proxy: Any, names: list[str], origin: tuple[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    """N prepared sandboxes under paced, then closed-loop load; lag and GC pauses here."""
    from egress import prepare_execution, release_execution

    executions = await asyncio.gather(
        *(prepare_execution(n, policy_of(i), proxy) for i, n in enumerate(names))
    )
    await asyncio.sleep(0.2)  # the prepare burst has ended: the heap settles (heap.py)
    boxes = []
    for i, ex in enumerate(executions):
        auth = base64.b64encode(f"{ex.client_id}:{ex.token}".encode()).decode()
        port = ex.listeners[0].port
        boxes.append({"ns": names[i], "port": port, "auth": "Basic " + auth, "host": host_of(i)})
    setup = {
        "origin": {"ns": origin[0], "address": origin[1], "port": ORIGIN_PORT},
        "sandboxes": boxes,
    }
    load = await asyncio.to_thread(LoadProcess, setup, args.load_cpu)
    pauses, ticker = Pauses(), Ticker()
    gc.callbacks.append(pauses)
    ticker.task = asyncio.get_running_loop().create_task(ticker.run())
    out: dict[str, Any] = {
        "n": len(names),
        "rate": args.rate,
        "heap_frozen": gc.get_freeze_count(),
        "heap_walked": len(gc.get_objects()),
    }
    try:
        for phase in ("paced", "closed"):
            pauses.pauses.clear()
            ticker.lags.clear()
            pauses.recording = ticker.recording = True
            cmd = {"phase": phase, "n": len(names), "rate": args.rate, "seconds": args.seconds}
            cpu0, hist0 = sum(os.times()[:2]), request_histogram(proxy)
            profiler = None
            if args.profile and phase == "paced" and len(names) == max(args.n):
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            found = await asyncio.to_thread(load.ask, cmd)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile)
            cpu = sum(os.times()[:2]) - cpu0
            pauses.recording = ticker.recording = False
            # load-independent: this process's CPU per request (the ticker's share included)
            found["proxy_cpu_us_per_request"] = round(cpu * 1e6 / max(1, found["requests"]), 1)
            found["proxy_cpu_share"] = round(cpu / args.seconds, 2)
            found.update(pauses.summary())
            found.update(ticker.summary())
            found.update(proxy_side(hist0, request_histogram(proxy)))
            out[phase] = found
            print(json.dumps(found), file=sys.stderr)
    finally:
        ticker.task.cancel()
        gc.callbacks.remove(pauses)
        await asyncio.to_thread(load.close)
        await asyncio.gather(*(release_execution(proxy, ex, restore=True) for ex in executions))
    return out


async def churn(proxy: Any, cycles: int, slots: int, state: str) -> dict[str, Any]:
    """Cycles of make / prepare / release / delete over `slots` at a time; even cycles
    restore, odd ones forget (a sandbox that will be destroyed)."""
    from egress import prepare_execution, release_execution

    samples: list[dict[str, int]] = []
    total, cycles = cycles, slots
    counter = itertools.count()
    done = 0
    how = {True: 0, False: 0}  # cycles released with restore=True / restore=False, forget=True
    every = max(1, total // 40)

    async def slot(k: int) -> None:
        nonlocal done  # counter and cycles are read when each cycle starts
        while (cycle := next(counter)) < cycles:
            name = sandbox_name()
            await asyncio.to_thread(make_sandbox, name)
            try:
                ex = await prepare_execution(name, policy_of(k), proxy)
                restore = cycle % 2 == 0
                await release_execution(proxy, ex, restore=restore, forget=not restore)
                how[restore] += 1
            finally:
                await asyncio.to_thread(drop_sandbox, name)
            done += 1
            if done % every == 0 or done == cycles:
                workers = sum(rss_kib(p) for p in worker_pids())
                samples.append(
                    {"cycle": done, "proxy_rss_kib": rss_kib("self"), "workers_rss_kib": workers,
                     "frozen": gc.get_freeze_count()}
                )  # fmt: skip

    await asyncio.gather(*(slot(k) for k in range(slots)))  # warm-up: one cycle a slot
    samples.clear()
    how[True] = how[False] = 0
    fds0, threads0 = fd_targets(), netns_threads()
    done, counter, cycles = 0, itertools.count(), total
    start = time.perf_counter()
    await asyncio.gather(*(slot(k) for k in range(slots)))
    seconds = time.perf_counter() - start
    records = [n for n in os.listdir(state) if n.endswith(".json")]
    left, threads, new = fds_left(fds0, threads0)
    half = [s for s in samples if s["cycle"] >= cycles // 2]
    last = (
        [s for s in samples if s["cycle"] >= cycles - LAST_CYCLES] if cycles > LAST_CYCLES else half
    )
    return {
        "cycles": cycles,
        "slots": slots,
        "restored": how[True],
        "forgotten": how[False],
        "cycles_per_s": round(cycles / seconds, 1),
        # KiB per 1,000 cycles over the last 1,000 (least squares over the samples)
        "slope_over_cycles": min(cycles, LAST_CYCLES),
        "proxy_rss_slope_kib_per_1000": slope(last, "proxy_rss_kib"),
        "workers_rss_slope_kib_per_1000": slope(last, "workers_rss_kib"),
        "records_left": len(records),
        "listeners_left": len(proxy.listeners) - 1,
        "fds_left": left,  # less the home namespaces of the pool's threads started meanwhile
        "netns_threads_added": threads,
        "fds_new": new,
        "namespaces_left": len(namespaces_left()) - 1,  # the origin's is still there
        "proxy_rss_growth_last_half_kib": half[-1]["proxy_rss_kib"] - half[0]["proxy_rss_kib"],
        "workers_rss_growth_last_half_kib": half[-1]["workers_rss_kib"]
        - half[0]["workers_rss_kib"],
        "rss": samples,
    }


def slope(samples: list[dict[str, int]], key: str) -> float | None:
    """The least-squares slope of `key` over the samples' cycles, per 1,000 cycles."""
    if len(samples) < 2:
        return None
    xs = [float(s["cycle"]) for s in samples]
    ys = [float(s[key]) for s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return None
    return round(1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den, 1)


def namespaces_left() -> list[str]:
    mine = f"egt-{os.getpid()}-"
    try:
        return [n for n in os.listdir("/run/netns") if n.startswith(mine)]
    except FileNotFoundError:
        return []


def verify_audit(path: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "egress.cli", "audit", "verify", path],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return {"verified": done.returncode == 0, "verify_output": (done.stdout + done.stderr)[-300:]}


async def main_async(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    import netcut

    netcut.start_worker()
    pin(args.pin, args.priority)
    whole = RunPauses()
    gc.callbacks.append(whole)
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "pinned_to": args.pin,
        "load_cpu": args.load_cpu,
        "autogroup_nice": autogroup_nice(),
        "load_average_start": os.getloadavg(),
        "runs": [],
        "datapath": [],
    }
    try:
        await _stages(args, workdir, out, whole)
    finally:
        gc.callbacks.remove(whole)
    out["gc_whole_run"] = whole.summary()
    out["load_average_end"] = os.getloadavg()
    out["summary"] = summary(out)
    return out


async def _stages(
    args: argparse.Namespace, workdir: str, out: dict[str, Any], whole: RunPauses
) -> None:
    from egress import AuditLog, EgressProxy, build_settings

    audit_path = os.path.join(workdir, "audit.jsonl")
    with origin_namespace() as origin:
        pins = {host_of(i): origin[1] for i in range(max(args.n) + args.churn_slots)}
        audit = AuditLog(audit_path)
        await audit.start()
        proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"], audit=audit, resolve=pins)
        await proxy.start()
        try:
            with sandboxes(1) as names:  # warm-up: the workers, imports, first-use caches
                await prepare_release(proxy, names)
            for n in args.n:
                with sandboxes(n) as names:
                    for rep in range(args.reps):
                        pin(args.pin, args.priority)
                        whole.stage = f"prepare/release N={n}"
                        found = await prepare_release(proxy, names)
                        found["rep"] = rep
                        found["load_average"] = os.getloadavg()[0]
                        out["runs"].append(found)
                        print(
                            json.dumps({k: v for k, v in found.items() if k != "not_cut"}),
                            file=sys.stderr,
                        )
                    if args.seconds > 0:
                        whole.stage = f"data path N={n}"
                        found = await datapath(proxy, names, origin, args)
                        found["load_average"] = os.getloadavg()[0]
                        out["datapath"].append(found)
            if args.churn:
                pin(args.pin, args.priority)
                whole.stage = "churn"
                state = os.environ["NETCUT_STATE_DIR"]
                out["churn"] = await churn(proxy, args.churn, args.churn_slots, state)
                print(
                    json.dumps({k: v for k, v in out["churn"].items() if k != "rss"}),
                    file=sys.stderr,
                )
        finally:
            whole.stage = "stop"
            await proxy.stop()
            await audit.aclose()
        out["heap"] = {"settles": proxy.heap.settled, "compactions": proxy.heap.compactions,
                       "longest_settle_ms": round(proxy.heap.longest_ms, 2),
                       "longest_settle_cpu_ms": round(proxy.heap.longest_cpu_ms, 2),
                       "last_compaction_ms": round(proxy.heap.last_compaction_ms, 2),
                       "garbage_found": proxy.heap.garbage,
                       "frozen": gc.get_freeze_count()}  # fmt: skip
    out["audit"] = verify_audit(audit_path)
    out["namespaces_left"] = namespaces_left()
    out["goals"] = {
        "prepare_batch_ms_at_200": GOAL_BATCH_200_MS,
        "prepare_cpu_ms": GOAL_CPU_PER_PREPARE_MS,
        "release_ms_p99_at_200": GOAL_RELEASE_200_P99_MS,
        "paced_ms_p99_at_400": GOAL_PACED_400_P99_MS,
        "lag_ms_p99_at_400": GOAL_LAG_400_P99_MS,
        "gc_pause_ms_max": GOAL_GC_PAUSE_MS,
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Issue 23's data-path and churn targets, side by side with N, from one run."""
    audit = result.get("audit", {})
    rows = []
    for d in result.get("datapath", []):
        x = d["paced"]
        rows.append({
            "n": d["n"],
            "asked_rps": round(d["n"] * d.get("rate", 10.0), 1),
            "rps": x["rps"],
            "request_ms_p99": x["ms_p99"],
            "proxy_ms_p99_at_most": x.get("proxy_ms_p99_at_most"),
            "proxy_over_10ms": x.get("proxy_over_10ms"),
            "lag_ms_p99": x["lag_ms_p99"],
            "gc_max_ms": x["gc_max_ms"],
            "gc_max_cpu_ms": x.get("gc_max_cpu_ms"),
            "gc_collections": x["gc_pauses"],
            "proxy_cpu_share": x.get("proxy_cpu_share"),
            "cross_200": d["paced"]["cross_200"] + d["closed"]["cross_200"],
            "cross_asked": sum(d[p][f"cross_{k}"] for p in ("paced", "closed")
                               for k in ("200", "403", "other")),
            "load_average": d.get("load_average"),
        })  # fmt: skip
    whole = result.get("gc_whole_run", {})
    out: dict[str, Any] = {
        "paced": rows,
        "gc_max_ms_whole_run": whole.get("gc_max_ms"),
        "gc_max_cpu_ms_whole_run": whole.get("gc_max_cpu_ms"),
        "gc_max_stage": whole.get("gc_max_stage"),
        "chain_verified": bool(audit.get("verified")),
        "autogroup_nice": result.get("autogroup_nice"),
    }
    c = result.get("churn")
    if c:
        out["churn"] = {k: c.get(k) for k in (
            "cycles", "restored", "forgotten", "records_left", "listeners_left", "fds_left",
            "namespaces_left", "slope_over_cycles", "proxy_rss_slope_kib_per_1000",
            "workers_rss_slope_kib_per_1000")}  # fmt: skip
    return out


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def markdown_summary(result: dict[str, Any]) -> list[str]:
    """The targets table: one row per N, then the whole run's figures."""
    summ = result.get("summary") or summary(result)
    lines = ["| N | paced req/s (asked) | request p99 ms (in the proxy: p99 at most, over 10 ms) "
             "| loop lag p99 ms "
             "| longest GC pause in the phase, wall / CPU ms (collections) "
             "| proxy CPU share | cross-sandbox 200 / asked | load avg |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in summ["paced"]:
        lines.append(
            f"| {r['n']} | {_cell(r['rps'])} ({_cell(r['asked_rps'])}) "
            f"| {_cell(r['request_ms_p99'])} ({_cell(r.get('proxy_ms_p99_at_most'))}, "
            f"{_cell(r.get('proxy_over_10ms'))}) | {_cell(r['lag_ms_p99'])} "
            f"| {_cell(r['gc_max_ms'])} / {_cell(r['gc_max_cpu_ms'])} ({r['gc_collections']}) "
            f"| {_cell(r['proxy_cpu_share'])} | {r['cross_200']} / {r['cross_asked']} "
            f"| {_cell(round(r['load_average'] or 0, 1))} |"
        )
    nice = summ.get("autogroup_nice")
    lines += ["", f"Longest GC pause anywhere in the run: {_cell(summ['gc_max_ms_whole_run'])} ms "
              f"({_cell(summ['gc_max_cpu_ms_whole_run'])} ms CPU; {summ['gc_max_stage']}). "
              f"Audit chain {'verified' if summ['chain_verified'] else 'NOT verified'}. "
              f"Autogroup nice: {_cell(nice)}."]  # fmt: skip
    c = summ.get("churn")
    if c:
        lines += ["", f"Churn: {c['cycles']} cycles ({_cell(c['restored'])} restore=True, "
                  f"{_cell(c['forgotten'])} restore=False): {c['records_left']} records, "
                  f"{c['listeners_left']} listeners, {c['fds_left']} fds, "
                  f"{c['namespaces_left']} namespaces left; RSS slope over the last "
                  f"{c['slope_over_cycles']} cycles: proxy "
                  f"{_cell(c['proxy_rss_slope_kib_per_1000'])}, workers "
                  f"{_cell(c['workers_rss_slope_kib_per_1000'])} KiB / 1,000 cycles."]  # fmt: skip
    return [*lines, ""]


def markdown(result: dict[str, Any]) -> str:
    """The run's tables for docs/benchmarks.md#hundreds-of-sandboxes."""
    lines = [*(markdown_summary(result) if result.get("datapath") or result.get("churn") else []),
             "| N | prepare p50 / p99 ms | whole batch ms | CPU per prepare ms (proxy + workers) "
             "| release p50 / p99 ms | CPU per release ms | load avg |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["runs"]:
        lines.append(
            f"| {r['n']} | {_cell(r['prepare_ms_p50'])} / {_cell(r['prepare_ms_p99'])} "
            f"| {_cell(r['prepare_batch_ms'])} | {_cell(r['prepare_cpu_ms'])} "
            f"({_cell(r.get('prepare_cpu_ms_proxy'))} + {_cell(r.get('prepare_cpu_ms_workers'))}) "
            f"| {_cell(r['release_ms_p50'])} / {_cell(r['release_ms_p99'])} "
            f"| {_cell(r['release_cpu_ms'])} | {r['load_average']:.1f} |"
        )
    lines += ["", "| N | proxy RSS KiB / sandbox | workers RSS KiB / sandbox | fds / sandbox |",
              "|---|---|---|---|"]  # fmt: skip
    for r in result["runs"]:
        if r["n"] >= 50:
            lines.append(
                f"| {r['n']} | {_cell(r['proxy_rss_kib_per_sandbox'])} "
                f"| {_cell(r['workers_rss_kib_per_sandbox'])} | {_cell(r['fds_per_sandbox'])} |"
            )
    if result.get("datapath"):
        lines += ["", "| N | phase | req/s | p50 / p99 / max ms | loop lag p50 / p99 / max ms "
                  "| GC pauses (gen 2) | longest GC wall / CPU ms | proxy CPU us/req "
                  "| proxy CPU share | cross-sandbox 200 / 403 | load avg |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for d in result["datapath"]:
            for phase in ("paced", "closed"):
                x = d[phase]
                lines.append(
                    f"| {d['n']} | {phase} | {_cell(x['rps'])} "
                    f"| {_cell(x['ms_p50'])} / {_cell(x['ms_p99'])} / {_cell(x['ms_max'])} "
                    f"| {_cell(x['lag_ms_p50'])} / {_cell(x['lag_ms_p99'])} "
                    f"/ {_cell(x['lag_ms_max'])} | {x['gc_pauses']} ({x['gc_gen2']}) "
                    f"| {_cell(x['gc_max_ms'])} / {_cell(x.get('gc_max_cpu_ms'))} "
                    f"| {_cell(x.get('proxy_cpu_us_per_request'))} "
                    f"| {_cell(x.get('proxy_cpu_share'))} "
                    f"| {x['cross_200']} / {x['cross_403']} | {d['load_average']:.1f} |"
                )
    if result.get("churn"):
        c = result["churn"]
        lines += ["", "| cycles (slots) | cycles/s | records / listeners / fds / namespaces left "
                  "| proxy / workers RSS growth over the last half, KiB |",
                  "|---|---|---|---|"]  # fmt: skip
        lines.append(
            f"| {c['cycles']} ({c['slots']}) | {_cell(c['cycles_per_s'])} "
            f"| {c['records_left']} / {c['listeners_left']} / {c['fds_left']} "
            f"/ {c['namespaces_left']} | {c['proxy_rss_growth_last_half_kib']} "
            f"/ {c['workers_rss_growth_last_half_kib']} |"
        )
    heap = result.get("heap")
    if heap:
        longest, cpu = heap["longest_settle_ms"], heap.get("longest_settle_cpu_ms")
        lines += ["", f"The proxy's heap (docs/proxy.md#garbage-collection): {heap['settles']} "
                  f"settles, {heap['compactions']} compactions, the longest {longest:g} ms "
                  f"({_cell(cpu)} ms CPU), at a burst's end, not in a phase."]  # fmt: skip
    audit = result.get("audit", {})
    lines += ["", f"Audit chain: {'verified' if audit.get('verified') else 'NOT verified'} "
              f"({audit.get('verify_output', '').strip()[:80]}). Namespaces left after the run: "
              f"{len(result.get('namespaces_left', []))}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    two = (os.cpu_count() or 1) >= 2
    p = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--n",
        type=lambda t: [int(x) for x in t.split(",")],
        default=[1, 50, 200],
        help="sandbox counts, comma-separated (default 1,50,200)",
    )
    p.add_argument("--reps", type=int, default=2, help="prepare/release batches per N")
    p.add_argument(
        "--pin",
        type=int,
        metavar="CPU",
        default=1 if two else None,
        help="pin the proxy and workers to CPU (default 1 on 2+ CPUs)",
    )
    p.add_argument(
        "--load-cpu",
        type=int,
        metavar="CPU",
        default=0 if two else None,
        help="pin the load process to CPU (default 0 on 2+ CPUs)",
    )
    p.add_argument("--no-pin", action="store_true", help="pin nothing (a smoke run in CI)")
    p.add_argument(
        "--priority",
        type=int,
        metavar="NICE",
        help="autogroup nice of this process's, the load's and the workers' sessions, "
        "e.g. -10: the pinned cores mostly theirs on a shared machine (restored at the end)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="seconds of each data-path phase per N (0: no data path)",
    )
    p.add_argument("--rate", type=float, default=10.0, help="paced requests/s per sandbox")
    p.add_argument("--churn", type=int, default=0, metavar="CYCLES", help="churn cycles")
    p.add_argument("--churn-slots", type=int, default=8, help="churn cycles at a time")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    p.add_argument("--profile", metavar="PATH",
                   help="cProfile the paced phase at the largest N into PATH")  # fmt: skip
    p.add_argument("--plots", type=Path, metavar="DIR", help="write PNG plots here")
    p.add_argument("--markdown", type=Path, metavar="JSON",
                   help="print the tables of an earlier run's JSON, run nothing")  # fmt: skip
    args = p.parse_args(argv)
    if args.no_pin:
        args.pin = args.load_cpu = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())), end="")
        return 0
    if os.geteuid() != 0:
        print("bench.scale: needs root (network namespaces)", file=sys.stderr)
        return 2
    saved = autogroup_nice()
    if args.priority is not None:
        if saved is None:
            print(
                "bench.scale: --priority needs autogroups (/proc/self/autogroup)", file=sys.stderr
            )
            return 2
        set_autogroup_nice("self", args.priority)
    try:
        with tempfile.TemporaryDirectory(prefix="netcut-scale-") as state:
            os.environ["NETCUT_STATE_DIR"] = os.path.join(state, "netcut")
            try:
                import uvloop

                result = uvloop.run(main_async(args, state))
            except ImportError:
                result = asyncio.run(main_async(args, state))
    finally:
        if args.priority is not None and saved is not None:
            set_autogroup_nice("self", saved)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    if args.plots:
        from bench import scaleplots

        scaleplots.write(result, args.plots)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
