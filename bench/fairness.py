"""`python -m bench.fairness`: one hostile sandbox among 50 on one proxy.

Results: docs/benchmarks.md#fairness.

What issue 19 asked: with 50 sandboxes on one proxy and one of them hostile, the other 49
keep a 100 % success rate with a p99 latency within 2x of the same run without the hostile
one. Three processes besides the bench origin (`bench.origin`), each pinned:

- the proxy (core 0): `EgressProxy` on uvloop with an audit log, 50 clients each known by
  its source address (127.0.10.N), and the hostile sandbox's own SOCKS5, DNS and transparent
  listeners, as `prepare_execution` gives a sandbox;
- the victims (core 1): 49 sandboxes, 2 kept-alive connections each, one GET every 40 ms per
  connection through the HTTP proxy (about 2,450 requests/s in all), every latency kept;
- the hostile sandbox (core 1, `nice 19` so it cannot slow the victims' own clock), in two
  phases: *connections*, a connection flood on the HTTP listener (connections that send
  nothing) with half-open handshakes in every mode (a partial HTTP head, the SOCKS5 greeting
  byte, one byte of a DNS-over-TCP length, a transparent connection that never sends its
  ClientHello), every closed or refused connection reopened at once; then *requests*, 250
  connections of back-to-back GETs (within its connection cap).

The victims are measured in rounds of three slices: without the hostile sandbox (the
baseline), then during each phase (after a 2 s ramp). A shared machine's load drifts by
more than the effect measured, so each round's slices share it; each phase's latencies are
pooled over the rounds, and each round's ratio is shown too. Every slice also reports the
proxy's CPU time, its time waiting for a CPU (/proc/self/schedstat: the other load on its
core) and its event loop's lag. Run as root: it runs in a private network namespace (the
transparent listener is reached through a netfilter DNAT). About 70 s with the default 3
rounds of 4 s slices. `--json` prints the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

SANDBOXES = 50
VICTIM_CONNS = 2
INTERVAL = 0.040  # seconds between one victim connection's requests
FLOOD_CONNS = 250  # the hostile sandbox's request flood
HALF_OPEN = 150  # per mode
SOURCE = "127.0.10.{}"  # sandbox N's source address (N = 1 is the hostile one)
OWN = "127.0.11.1"  # the hostile sandbox's own listeners
REDIRECTED = ("127.0.11.3", 443)  # where its transparent connections go before REDIRECT
NETNS_FLAG = "EGRESS_FAIRNESS_NETNS"


# --- the proxy (its own process, core 0) ------------------------------------------------------
async def serve_proxy(origin_port: int, workdir: Path, fair: bool) -> None:
    import ipaddress

    from egress import AuditLog, EgressProxy, Policy
    from egress.config import ClientSpec, Settings
    from egress.proxy.codec.dns import FakeIPs
    from egress.proxy.core.clients import Identity
    from egress.proxy.modes.dns import open_dns
    from egress.proxy.server import Limits

    policy = Policy(framework_routes=[f"http://127.0.0.1:{origin_port}"])
    clients = tuple(
        ClientSpec(f"sb{n:02d}", policy, sources=(ipaddress.ip_network(SOURCE.format(n)),))
        for n in range(1, SANDBOXES + 1)
    )
    audit = AuditLog(str(workdir / "audit.jsonl"))
    await audit.start()
    limits = Limits() if fair else Limits(max_client_inflight=None)
    proxy = EgressProxy(Settings(Policy(), clients=clients), audit=audit, limits=limits)
    await proxy.start()
    hostile = clients[0]
    socks = await proxy.add_listener(f"{OWN}:0", client=hostile, kind="socks5")
    trans = await proxy.add_listener(f"{OWN}:0", client=hostile, kind="transparent")
    dns = await open_dns(
        proxy, f"{OWN}:0", identity=Identity(hostile.client_id, policy), fake_ips=FakeIPs()
    )
    ports = {
        "http": proxy.addresses[0][1],
        "socks": socks.port,
        "transparent": trans.port,
        "dns": dns.port,
        "max_connections": proxy.limits.max_connections,
    }
    print(json.dumps(ports), flush=True)
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    watch = asyncio.ensure_future(watch_lag(lags))
    sched = schedstat()
    # each line on stdin asks for the proxy's CPU time, its time waiting for a CPU and its
    # event loop's lag since the last one
    while await loop.run_in_executor(None, sys.stdin.readline):
        now = schedstat()
        lag = sorted(lags)
        print(json.dumps({**sched_delta(sched, now), **percentiles(lag, "lag")}), flush=True)
        sched, lags[:] = now, []
    watch.cancel()
    await proxy.stop()
    await audit.aclose()


async def watch_lag(lags: list[float]) -> None:
    """How late the proxy's event loop runs a 10 ms timer: the time every callback waits."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(0.010)
        lags.append(loop.time() - t - 0.010)


def schedstat() -> tuple[float, float]:
    """This process's time on a CPU and time runnable but waiting for one (the kernel's
    /proc/self/schedstat, all threads' sum is not needed: one event loop), in seconds."""
    try:
        with open("/proc/self/schedstat") as f:
            run_ns, wait_ns, _ = f.read().split()
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return sum(os.times()[:2]), 0.0


def sched_delta(before: tuple[float, float], after: tuple[float, float]) -> dict[str, float]:
    return {
        "cpu_s": round(after[0] - before[0], 2),
        "cpu_wait_s": round(after[1] - before[1], 2),
    }


def percentiles(values: list[float], name: str) -> dict[str, float]:
    """p50, p99 and max of sorted `values` (seconds), in ms."""

    def at(p: float) -> float:
        return round(values[min(len(values) - 1, int(p * len(values)))] * 1000, 2)

    if not values:
        return {f"{name}_p50_ms": 0.0, f"{name}_p99_ms": 0.0, f"{name}_max_ms": 0.0}
    return {
        f"{name}_p50_ms": at(0.50),
        f"{name}_p99_ms": at(0.99),
        f"{name}_max_ms": round(values[-1] * 1000, 2),
    }


# --- the victims (core 1) ------------------------------------------------------------------------
GET = b"GET http://127.0.0.1:%d/v HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"


async def read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


async def victim_conn(
    n: int, proxy_port: int, origin_port: int, seconds: float, out: dict[str, Any]
) -> None:
    loop = asyncio.get_running_loop()
    request = GET % (origin_port, origin_port)
    end = loop.time() + seconds
    next_at = loop.time()
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while loop.time() < end:
        delay = next_at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        next_at += INTERVAL
        t0 = time.perf_counter()
        try:
            if conn is None:
                conn = await asyncio.wait_for(
                    asyncio.open_connection(
                        "127.0.0.1", proxy_port, local_addr=(SOURCE.format(n), 0)
                    ),
                    5,
                )
            reader, writer = conn
            writer.write(request)
            status = await asyncio.wait_for(read_response(reader), 5)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            status = 0
            if conn is not None:
                conn[1].close()
            conn = None
        out["latency"].append(time.perf_counter() - t0)
        out["ok" if status == 200 else "failed"] += 1
    if conn is not None:
        conn[1].close()


async def run_victims(proxy_port: int, origin_port: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": [], "ok": 0, "failed": 0}
    sched = schedstat()
    lags: list[float] = []
    watch = asyncio.ensure_future(watch_lag(lags))
    await asyncio.gather(
        *(
            victim_conn(n, proxy_port, origin_port, seconds, out)
            for n in range(2, SANDBOXES + 1)
            for _ in range(VICTIM_CONNS)
        )
    )
    watch.cancel()
    lat = sorted(out["latency"])
    total = out["ok"] + out["failed"]

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else 0.0

    return {
        "requests": total,
        "ok": out["ok"],
        "success": round(100 * out["ok"] / total, 3) if total else 0.0,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(lat[-1] * 1000, 2) if lat else 0.0,
        # the victims' own process (core 1): a stall there is no latency of the proxy's
        "client": {**sched_delta(sched, schedstat()), **percentiles(sorted(lags), "lag")},
        "latency_ms": [round(x * 1000, 3) for x in lat],  # pooled over rounds by `run`
    }


# --- the hostile sandbox (core 1, nice 19) --------------------------------------------------------
class Tally:
    def __init__(self) -> None:
        self.opened = 0
        self.refused = 0
        self.requests = 0
        self.errors: dict[str, int] = {}  # why connecting failed, by error

    def failed(self, exc: OSError) -> None:
        self.refused += 1
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


async def hold_open(host: str, port: int, first: bytes, tally: Tally, src: str | None) -> None:
    """Keep one connection open that never finishes its handshake; reopen when closed."""
    while True:
        try:
            reader, writer = await asyncio.open_connection(
                host, port, local_addr=(src, 0) if src else None
            )
        except ConnectionResetError as exc:  # refused at accept: again, at once
            tally.failed(exc)
            continue
        except OSError as exc:
            tally.failed(exc)
            await asyncio.sleep(0.01)
            continue
        tally.opened += 1
        if first:
            writer.write(first)
        with contextlib.suppress(OSError):
            await reader.read(-1)  # until the proxy closes it (refused, or a timeout)
        writer.close()
        tally.refused += 1


async def flood_requests(proxy_port: int, origin_port: int, tally: Tally) -> None:
    request = GET % (origin_port, origin_port)
    while True:
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", proxy_port, local_addr=(SOURCE.format(1), 0)
            )
        except OSError:
            tally.refused += 1
            await asyncio.sleep(0.01)
            continue
        try:
            while True:
                writer.write(request)
                if await read_response(reader) != 200:
                    break
                tally.requests += 1
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        writer.close()
        tally.refused += 1


async def run_hostile(
    phase: str, ports: dict[str, int], origin_port: int, seconds: float
) -> dict[str, int]:
    src = SOURCE.format(1)
    tally = Tally()
    half_open = [
        ("127.0.0.1", ports["http"], b"", src),  # the connection flood: nothing sent
        ("127.0.0.1", ports["http"], b"GET http://x/ HTTP/1.1\r\n", src),  # a partial head
        (OWN, ports["socks"], b"\x05", None),
        (OWN, ports["dns"], b"\x00", None),
        (*REDIRECTED, b"", None),  # transparent: no ClientHello ever
    ]
    if phase == "connections":
        tasks = [
            asyncio.ensure_future(hold_open(h, p, first, tally, s))
            for h, p, first, s in half_open
            for _ in range(HALF_OPEN)
        ]
    else:
        tasks = [
            asyncio.ensure_future(flood_requests(ports["http"], origin_port, tally))
            for _ in range(FLOOD_CONNS)
        ]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "connections_opened": tally.opened,
        "closed_or_refused": tally.refused,
        "requests_served": tally.requests,
        "connect_errors": tally.errors,
    }


# --- the run ------------------------------------------------------------------------------------
def child(*args: str, cpu: int, nice: int = 0) -> subprocess.Popen[str]:
    argv = ["taskset", "-c", str(cpu), "nice", "-n", str(nice), sys.executable, *args]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


PHASES = ("baseline", "connections", "requests")
RAMP = 2.0  # seconds a hostile phase runs before the victims are measured


def one_slice(
    phase: str, proxy: subprocess.Popen[str], ports: dict[str, int], origin_port: int,
    seconds: float,
) -> dict[str, Any]:  # fmt: skip
    """The victims measured for `seconds`, with the hostile sandbox in `phase` (ramped up)."""
    if phase == "baseline":
        return measured(proxy, ports, origin_port, seconds)
    hostile = child("-m", "bench.fairness", "--hostile", phase, json.dumps(ports),
                    str(origin_port), str(seconds + RAMP + 1), cpu=1, nice=19)  # fmt: skip
    time.sleep(RAMP)
    under = measured(proxy, ports, origin_port, seconds)
    assert hostile.stdout is not None
    under["hostile"] = json.loads(hostile.stdout.readline())
    hostile.wait(60)
    return under


def pooled(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase's slices of every round as one: latencies pooled, counts summed."""
    lat = sorted(x for s in slices for x in s["latency_ms"])
    total = sum(s["requests"] for s in slices)
    ok = sum(s["ok"] for s in slices)

    def at(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else 0.0

    def summed(part: str, key: str) -> float:
        return round(sum(s[part][key] for s in slices), 2)

    out: dict[str, Any] = {
        "victims": {
            "requests": total,
            "ok": ok,
            "success": round(100 * ok / total, 3) if total else 0.0,
            "p50_ms": at(0.50),
            "p99_ms": at(0.99),
            "max_ms": round(lat[-1], 2) if lat else 0.0,
            "proxy": {
                "cpu_s": summed("proxy", "cpu_s"),
                "cpu_wait_s": summed("proxy", "cpu_wait_s"),
                "lag_p99_ms": max(s["proxy"]["lag_p99_ms"] for s in slices),  # worst round
            },
            "client": {
                "cpu_s": summed("client", "cpu_s"),
                "cpu_wait_s": summed("client", "cpu_wait_s"),
                "lag_max_ms": max(s["client"]["lag_max_ms"] for s in slices),
            },
        },
        "round_p99_ms": [s["p99_ms"] for s in slices],
    }
    if "hostile" in slices[0]:
        hostile: dict[str, Any] = {"connect_errors": {}}
        for s in slices:
            for key, value in s["hostile"].items():
                if key == "connect_errors":
                    for name, n in value.items():
                        errors = hostile["connect_errors"]
                        errors[name] = errors.get(name, 0) + n
                else:
                    hostile[key] = hostile.get(key, 0) + value
        out["hostile"] = hostile
    return out


class Setup(NamedTuple):
    """What `proxy_and_origin` started: the proxy (a `child`), the ports it printed, and the
    origin's port."""

    proxy: subprocess.Popen[str]
    ports: dict[str, int]
    origin_port: int


@contextlib.contextmanager
def proxy_and_origin(workdir: Path, fair: bool) -> Iterator[Setup]:
    """The origin and the proxy (its audit log `workdir/audit.jsonl`), each its own pinned
    process (`child`), with the hostile sandbox's DNAT in place; both are stopped on the way
    out, so the audit log is whole once this ends."""
    origin = child("-m", "bench.origin", cpu=1)
    assert origin.stdout is not None
    origin_port = json.loads(origin.stdout.readline())["http_ports"][0]
    proxy = child("-m", "bench.fairness", "--proxy", str(origin_port), str(workdir),
                  "fair" if fair else "unfair", cpu=0)  # fmt: skip
    assert proxy.stdout is not None
    ports = json.loads(proxy.stdout.readline())
    dnat(ports)
    try:
        yield Setup(proxy, ports, origin_port)
    finally:
        for p in (proxy, origin):
            assert p.stdin is not None
            p.stdin.close()
            p.wait(60)


def refusals(log: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The audit log's lines, and its connection records: a refusal at accept each, or a
    `count` of them (docs/audit-log.md)."""
    lines = log.read_text().splitlines()
    return lines, [json.loads(x) for x in lines if '"method":"-"' in x]


def run(seconds: float, fair: bool, rounds: int) -> dict[str, Any]:
    slices: dict[str, list[dict[str, Any]]] = {phase: [] for phase in PHASES}
    with tempfile.TemporaryDirectory(prefix="egress-fairness-") as tmp:
        with proxy_and_origin(Path(tmp), fair) as (proxy, ports, origin_port):
            # rounds of (baseline, connections, requests): the machine's load drifts, and
            # each round's three slices share it (docs/benchmarks.md#fairness)
            for _ in range(rounds):
                for phase in PHASES:
                    slices[phase].append(one_slice(phase, proxy, ports, origin_port, seconds))
        log = Path(tmp) / "audit.jsonl"
        lines, refused = refusals(log)
        size = log.stat().st_size
    phases = {phase: pooled(slices[phase]) for phase in PHASES}
    base = phases["baseline"]
    for phase in PHASES[1:]:
        under = phases[phase]
        under["p99_ratio"] = round(under["victims"]["p99_ms"] / base["victims"]["p99_ms"], 2)
        under["round_ratios"] = [
            round(h["p99_ms"] / b["p99_ms"], 2)
            for h, b in zip(slices[phase], slices["baseline"], strict=True)
        ]
    return {
        "sandboxes": SANDBOXES,
        "fair_share": fair,
        "seconds": seconds,
        "rounds": rounds,
        "max_connections": ports["max_connections"],
        "baseline": base["victims"],
        "baseline_round_p99_ms": base["round_p99_ms"],
        "connections": phases["connections"],
        "requests": phases["requests"],
        "audit": {
            "lines": len(lines),
            "bytes": size,
            "connection_records": len(refused),
            "refusals_counted": sum(int(r.get("count", 1)) for r in refused),
        },
    }


def flood_cost(seconds: float) -> dict[str, Any]:
    """The proxy's CPU per connection of the connection flood, with no victims: its CPU
    over `seconds` of the flood less its CPU over `seconds` idle, divided by the refusals
    the audit log counts (docs/benchmarks.md#fairness)."""
    with tempfile.TemporaryDirectory(prefix="egress-fairness-") as tmp:
        with proxy_and_origin(Path(tmp), True) as (proxy, ports, origin_port):

            def mark() -> dict[str, Any]:
                assert proxy.stdin is not None
                assert proxy.stdout is not None
                proxy.stdin.write("mark\n")
                proxy.stdin.flush()
                stats: dict[str, Any] = json.loads(proxy.stdout.readline())
                return stats

            mark()
            time.sleep(seconds)
            idle = mark()
            hostile = child("-m", "bench.fairness", "--hostile", "connections", json.dumps(ports),
                            str(origin_port), str(seconds), cpu=1, nice=19)  # fmt: skip
            assert hostile.stdout is not None
            flood = json.loads(hostile.stdout.readline())
            hostile.wait(60)
            time.sleep(1.0)  # the last refusals' records
            busy = mark()
        _, refused = refusals(Path(tmp) / "audit.jsonl")
    counted = sum(int(r.get("count", 1)) for r in refused)
    cpu = busy["cpu_s"] - idle["cpu_s"] * (seconds + 1.0) / seconds
    return {
        "seconds": seconds,
        "hostile": flood,
        "refusals_counted": counted,
        "proxy_idle": idle,
        "proxy_flood": busy,
        "cpu_us_per_refusal": round(cpu * 1e6 / counted, 1) if counted else None,
    }


def dnat(ports: dict[str, int]) -> None:
    """The hostile sandbox's transparent connections to its transparent listener."""
    subprocess.run(
        ["iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", REDIRECTED[0],
         "--dport", str(REDIRECTED[1]), "-j", "DNAT", "--to-destination",
         f"{OWN}:{ports['transparent']}"],
        check=True,
    )  # fmt: skip


def table(result: dict[str, Any]) -> str:
    """The Markdown table docs/benchmarks.md#fairness shows."""
    rows = [
        "| victims (49 sandboxes) | requests | success | p50 ms | p99 ms | p99 vs baseline "
        "| proxy CPU s | proxy waiting for a CPU s | proxy loop lag p99 ms "
        "| victims' client waiting for a CPU s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, label in (
        ("baseline", "no hostile sandbox"),
        ("connections", "hostile: connection flood + half-open in every mode"),
        ("requests", "hostile: 250 connections of back-to-back GETs"),
    ):
        v = result[name] if name == "baseline" else result[name]["victims"]
        ratio = "1.00" if name == "baseline" else f"{result[name]['p99_ratio']:.2f}"
        p = v["proxy"]
        rows.append(
            f"| {label} | {v['requests']} | {v['success']} % | {v['p50_ms']} | {v['p99_ms']} | "
            f"{ratio}x | {p['cpu_s']} | {p['cpu_wait_s']} | {p['lag_p99_ms']} | "
            f"{v['client']['cpu_wait_s']} |"
        )
    a = result["audit"]
    rows.append("")
    rows.append(
        f"per round ({result['rounds']} of {result['seconds']} s): baseline p99 "
        f"{result['baseline_round_p99_ms']} ms; p99 vs the same round's baseline: connection "
        f"flood {result['connections']['round_ratios']}, request flood "
        f"{result['requests']['round_ratios']}"
    )
    rows.append("")
    rows.append(
        f"hostile: {result['connections']['hostile']}, {result['requests']['hostile']}; "
        f"audit log: {a['lines']} lines, {a['connection_records']} connection records "
        f"standing for {a['refusals_counted']} refusals"
    )
    return "\n".join(rows)


def victims(ports: dict[str, int], origin_port: int, seconds: float) -> dict[str, Any]:
    p = child("-m", "bench.fairness", "--victims", str(ports["http"]), str(origin_port),
              str(seconds), cpu=1)  # fmt: skip
    assert p.stdout is not None
    out = p.stdout.read().splitlines()  # the numbers are the last line (one long line)
    p.wait(60)
    if not out:
        raise RuntimeError("bench.fairness: the victims printed nothing (see their stderr)")
    result: dict[str, Any] = json.loads(out[-1])
    return result


def measured(
    proxy: subprocess.Popen[str], ports: dict[str, int], origin_port: int, seconds: float
) -> dict[str, Any]:
    """The victims' numbers, with the proxy's CPU time and loop lag while they ran."""
    assert proxy.stdin is not None
    assert proxy.stdout is not None
    proxy.stdin.write("mark\n")
    proxy.stdin.flush()
    proxy.stdout.readline()
    result = victims(ports, origin_port, seconds)
    proxy.stdin.write("mark\n")
    proxy.stdin.flush()
    result["proxy"] = json.loads(proxy.stdout.readline())
    return result


def uv_run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    p.add_argument("--seconds", type=float, default=4.0, help="per slice (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (default 3)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument(
        "--no-fair-share",
        action="store_true",
        help="the proxy without a per-client cap on requests in flight (to compare)",
    )
    p.add_argument(
        "--flood-cost",
        action="store_true",
        help="only the connection flood, no victims: the proxy's CPU per refused connection",
    )
    p.add_argument("--proxy", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--victims", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--hostile", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.proxy:
        origin, workdir, fair = args.proxy
        uv_run(serve_proxy(int(origin), Path(workdir), fair == "fair"))
        return 0
    if args.victims:
        port, origin, seconds = args.victims
        print(json.dumps(uv_run(run_victims(int(port), int(origin), float(seconds)))))
        return 0
    if args.hostile:
        phase, ports, origin, seconds = args.hostile
        flood = run_hostile(phase, json.loads(ports), int(origin), float(seconds))
        print(json.dumps(uv_run(flood)))
        return 0
    if os.geteuid() != 0:
        print("bench.fairness: needs root (a private network namespace)", file=sys.stderr)
        return 2
    if not os.environ.get(NETNS_FLAG):
        env = {**os.environ, NETNS_FLAG: "1"}
        argv = ["unshare", "--net", sys.executable, "-m", "bench.fairness", *(argv or sys.argv[1:])]
        return subprocess.run(argv, env=env, check=False).returncode
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    socket.setdefaulttimeout(10)
    if args.flood_cost:
        print(json.dumps(flood_cost(max(args.seconds, 8.0)), indent=2))
        return 0
    result = run(args.seconds, not args.no_fair_share, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
