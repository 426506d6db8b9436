"""Cost curves: how the proxy's cost grows with load, not only points (docs/benchmarks.md).

Run once per bench run (after the repetitions; `python -m bench --curves` runs only these):

- **rules**: `egress serve` with 10, 1k, 10k and 100k allow rules (+ the bench's 200 block
  rules): start time, idle RSS, and HTTP c64 req/s with CPU µs per request. The proxy caches
  decisions per destination, so the rule count is paid at the first request to each one
  (policy decision time is in the policy table); this curve shows what the size costs beyond.
- **idle connections**: RSS of `egress serve` with 1k, 5k and 10k open keep-alive client
  connections, each having made one request (so each also holds its pooled upstream
  connection); RSS per connection from the slope. The bench raises RLIMIT_NOFILE for itself
  and its children (as root, the hard limit too).
- **tunnels vs concurrency**: CONNECT tunnels/s and p99 at 1, 16, 64, 256 concurrent clients,
  `egress` and `squid` (the per-tunnel bar), CPU µs per tunnel.
- **audit**: lines/s the audit writer sustains on one core (`bench.audit_rate`).
- **host loop lag**: `bench.looplag` (same loop vs ProxyThread, under three loads).
"""

from __future__ import annotations

import contextlib
import functools
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import measure, procfs
from bench import proxies as px
from bench import rules as rulesmod

RULE_COUNTS = (10, 1_000, 10_000, 100_000)
IDLE_STEPS = (1_000, 5_000, 10_000)
TUNNEL_CONCURRENCY = (1, 16, 64, 256)
TUNNEL_TARGETS = ("egress", "squid")
NOFILE_WANTED = 65_536
Costed = Callable[..., dict[str, Any]]


def raise_nofile() -> int:
    """Raise RLIMIT_NOFILE for the bench and its children (idle-connection curve)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE_WANTED
    if hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))  # root only
            return want
        except (ValueError, OSError):
            want = hard
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


@contextlib.contextmanager
def started(
    name: str,
    origin: measure.Origin,
    n_rules: int,
    extra: list[str] | None = None,
    cpus: int | str = px.PROXY_CPU,
) -> Iterator[tuple[px.Running, float]]:
    """A fresh target in its own temp dir; yields it with its start-up time in seconds."""
    workdir = Path(tempfile.mkdtemp(prefix=f"curve-{name}-"))
    env = px.Env(
        origin.http_ports, origin.source_port, rulesmod.generate(n_rules), workdir, "quiet"
    )
    t0 = time.monotonic()
    run = px.start_egress(env, extra, cpus) if name == "egress" else px.TARGETS[name](env)
    try:
        yield run, time.monotonic() - t0
    finally:
        run.stop()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


def rules_curve(origin: measure.Origin, costed: Costed, seconds: int) -> list[dict[str, Any]]:
    rows = []
    for n in RULE_COUNTS:
        with started("egress", origin, n, ["--quiet"]) as (run, start_s):
            assert run.pid is not None
            assert run.port is not None
            target = measure.Target(run.port)
            if not measure.forward_check(run.port, origin)["ok"]:
                rows.append({"rules": n, "error": "forward check failed"})
                continue
            rss, _ = procfs.idle_memory(run.pid)
            with tempfile.TemporaryDirectory() as d:
                wrk = functools.partial(measure.run_wrk, target, origin, 64, seconds, Path(d))
                wrk()  # warm-up
                r = costed(wrk, run.pid, "requests", "cpu_us_per_request")
            rows.append(
                {
                    "rules": n + rulesmod.DEFAULT_BLOCK,
                    "allow_rules": n,
                    "start_s": round(start_s, 2),
                    "idle_rss_mb": round(rss, 1),
                    "rps": r["rps"],
                    "cpu_us_per_request": r.get("cpu_us_per_request"),
                    "p99_ms": r["p99_ms"],
                    "noisy": r["noisy"],
                    "ratio_ok": r["ratio_ok"],
                }
            )
    return rows


def _one_request(sock: socket.socket, origin_port: int) -> None:
    sock.sendall(
        f"GET http://{px.HOST}:{origin_port}/ HTTP/1.1\r\n"
        f"Host: {px.HOST}:{origin_port}\r\n\r\n".encode()
    )
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, body = data.split(b"\r\n\r\n", 1)
    fields = head.lower().split(b"\r\n")
    length = next(int(x.split(b":", 1)[1]) for x in fields if x.startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(4096)


def idle_curve(origin: measure.Origin) -> dict[str, Any]:
    """Two series: connections that made one request (each holds a pooled upstream, two
    descriptors in the proxy) and connections that sent nothing yet (one descriptor; the
    head timeout is raised so they stay open). A series stops at the descriptor limit.
    """
    limit = raise_nofile()
    series = {
        "after one request": [n for n in IDLE_STEPS if 2 * n + 256 <= limit],
        "connected, no request": [n for n in IDLE_STEPS if n + 256 <= limit],
    }
    out: dict[str, Any] = {"nofile_limit": limit, "series": {}}
    for name, steps in series.items():
        out["series"][name] = _idle_series(origin, steps, request=name == "after one request")
        out.setdefault("skipped_steps", {})[name] = [n for n in IDLE_STEPS if n not in steps]
    return out


def _idle_series(origin: measure.Origin, steps: list[int], request: bool) -> list[dict[str, Any]]:
    extra = ["--max-connections", str(max(IDLE_STEPS) + 100), "--head-timeout", "300", "--quiet"]
    rows: list[dict[str, Any]] = []
    socks: list[socket.socket] = []
    with started("egress", origin, rulesmod.DEFAULT_ALLOW, extra) as (run, _):
        assert run.pid is not None
        assert run.port is not None
        try:
            base = socket.create_connection((px.HOST, run.port))
            socks.append(base)
            _one_request(base, origin.http_ports[0])  # everything lazily built is built
            rss0, _ = procfs.idle_memory(run.pid)
            rows.append({"connections": 1, "rss_mb": round(rss0, 2)})
            for n in steps:
                while len(socks) < n:
                    s = socket.create_connection((px.HOST, run.port), timeout=10)
                    socks.append(s)
                    if request:
                        _one_request(s, origin.http_ports[0])
                rss, _ = procfs.idle_memory(run.pid, seconds=1.0)
                per_kb = (rss - rss0) * 1024 / (n - 1)
                rows.append(
                    {
                        "connections": n,
                        "rss_mb": round(rss, 2),
                        "kb_per_connection": round(per_kb, 1),
                    }
                )
        except OSError as exc:
            rows.append({"connections": len(socks), "error": f"{type(exc).__name__}: {exc}"})
        finally:
            for s in socks:
                s.close()
    return rows


def tunnel_curve(
    origin: measure.Origin, loadgen: Path, costed: Costed, seconds: int
) -> list[dict[str, Any]]:
    rows = []
    for name in TUNNEL_TARGETS:
        try:
            with started(name, origin, rulesmod.DEFAULT_ALLOW) as (run, _):
                target = measure.Target(run.port)
                for conc in TUNNEL_CONCURRENCY:
                    tun = functools.partial(
                        measure.run_tunnels, loadgen, target, origin, conc, seconds
                    )
                    r = costed(tun, run.pid, "tunnels", "cpu_us_per_tunnel")
                    rows.append(
                        {
                            "target": name,
                            "concurrency": conc,
                            "per_s": r["per_s"],
                            "p99_ms": r["p99_ms"],
                            "cpu_us_per_tunnel": r.get("cpu_us_per_tunnel"),
                            "errors": r["errors"],
                            "noisy": r["noisy"],
                            "ratio_ok": r["ratio_ok"],
                        }
                    )
        except px.StartError as exc:
            rows.append({"target": name, "skipped": str(exc)})
    return rows


WORKER_SETUPS = (  # (workers, CPUs the proxy may use): the load stays pinned to CPU 0
    (1, str(px.PROXY_CPU)),
    (2, str(px.PROXY_CPU)),
    (2, f"{px.LOAD_CPU},{px.PROXY_CPU}"),
)


def workers_curve(
    origin: measure.Origin, loadgen: Path, costed: Costed, seconds: int
) -> list[dict[str, Any]]:
    """`egress serve --workers N`: HTTP c64 and tunnels c16 with 1 or 2 workers, on the
    proxy's core only, or on both cores (then sharing CPU 0 with the load generators).
    """
    rows = []
    for workers, cpus in WORKER_SETUPS:
        extra = ["--workers", str(workers), "--quiet"]
        with started("egress", origin, rulesmod.DEFAULT_ALLOW, extra, cpus) as (run, _):
            target = measure.Target(run.port)
            with tempfile.TemporaryDirectory() as d:
                wrk = functools.partial(measure.run_wrk, target, origin, 64, seconds, Path(d))
                wrk()  # warm-up (each worker)
                http = costed(wrk, run.pid, "requests", "cpu_us_per_request")
            tun = functools.partial(measure.run_tunnels, loadgen, target, origin, 16, seconds)
            tunnels = costed(tun, run.pid, "tunnels", "cpu_us_per_tunnel")
            rows.append(
                {
                    "workers": workers,
                    "cpus": cpus,
                    "rps": http["rps"],
                    "cpu_us_per_request": http.get("cpu_us_per_request"),
                    "p99_ms": http["p99_ms"],
                    "tunnels_per_s": tunnels["per_s"],
                    "cpu_us_per_tunnel": tunnels.get("cpu_us_per_tunnel"),
                    "noisy": http["noisy"] or tunnels["noisy"],
                    "ratio_ok": http["ratio_ok"] and tunnels["ratio_ok"],
                }
            )
    return rows


def _json_child(argv: list[str], timeout: float = 300) -> dict[str, Any]:
    try:
        out = subprocess.run(
            px.pinned(argv, px.PROXY_CPU),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=px.REPO,
        )
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {timeout} s"}
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode or not lines:
        return {"skipped": f"exit {out.returncode}: {out.stderr.strip()[-300:]}"}
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def audit_rate() -> dict[str, Any]:
    return _json_child([sys.executable, "-m", "bench.audit_rate", "--json"])


def loop_lag(origin: measure.Origin) -> dict[str, Any]:
    ports = ",".join(str(p) for p in origin.http_ports)
    return _json_child(
        [sys.executable, "-m", "bench.looplag", "--json", ports, str(origin.source_port)]
    )


def run_all(origin: measure.Origin, loadgen: Path, costed: Costed, seconds: int) -> dict[str, Any]:
    steps: dict[str, Callable[[], Any]] = {
        "rules": lambda: rules_curve(origin, costed, seconds),
        "idle": lambda: idle_curve(origin),
        "tunnels": lambda: tunnel_curve(origin, loadgen, costed, seconds),
        "workers": lambda: workers_curve(origin, loadgen, costed, seconds),
        "audit": audit_rate,
        "loop_lag": lambda: loop_lag(origin),
    }
    out: dict[str, Any] = {}
    for name, step in steps.items():
        print(f"bench: curves: {name} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            out[name] = step()
        except Exception as exc:  # one broken curve must not end the run
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"bench: curves: {name} done ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return out


# ---- report -------------------------------------------------------------------------------


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def _noise(r: dict[str, Any]) -> str:
    flags = (["other work > 5%"] if r.get("noisy") else []) + (
        ["origin count off"] if r.get("ratio_ok") is False else []
    )
    return ", ".join(flags) or "–"


def markdown(curves: dict[str, Any]) -> list[str]:
    lines: list[str] = ["", "### Cost curves", ""]
    rules = curves.get("rules")
    if isinstance(rules, list):
        lines += [
            "`egress`, HTTP c64 keep-alive, by policy size (allow rules + 200 block rules):",
            "",
            "| rules | start s | idle RSS MB | req/s | CPU µs/request | p99 ms | noise |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rules:
            lines.append(
                f"| {r['rules']:,} | {_f(r.get('start_s'), 2)} | {_f(r.get('idle_rss_mb'), 1)} "
                f"| {_f(r.get('rps'))} | {_f(r.get('cpu_us_per_request'), 1)} "
                f"| {_f(r.get('p99_ms'), 2)} | {_noise(r)} |"
            )
        lines.append("")
    idle = curves.get("idle")
    if isinstance(idle, dict) and "series" in idle:
        lines += [
            f"`egress`, open idle client connections (RLIMIT_NOFILE {idle['nofile_limit']:,}; "
            "KB per connection = RSS growth over one connection):",
            "",
            "| connections | state | RSS MB | KB per connection |",
            "|---|---|---|---|",
        ]
        for state, rows in idle["series"].items():
            for r in rows:
                extra = f" {r['error']}" if "error" in r else ""
                lines.append(
                    f"| {r['connections']:,} | {state} | {_f(r.get('rss_mb'), 1)} "
                    f"| {_f(r.get('kb_per_connection'), 1)}{extra} |"
                )
        skipped = {k: v for k, v in idle.get("skipped_steps", {}).items() if v}
        if skipped:
            lines.append(f"\nNot measured (descriptor limit): {skipped}")
        lines.append("")
    tun = curves.get("tunnels")
    if isinstance(tun, list):
        lines += [
            "CONNECT tunnels (connect, CONNECT, one GET, close) by concurrency:",
            "",
            "| target | concurrency | tunnels/s | p99 ms | CPU µs/tunnel | errors | noise |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in tun:
            if "skipped" in r:
                lines.append(f"| {r['target']} | skipped: {r['skipped']} | | | | | |")
                continue
            lines.append(
                f"| {r['target']} | {r['concurrency']} | {_f(r['per_s'])} | {_f(r['p99_ms'], 2)} "
                f"| {_f(r.get('cpu_us_per_tunnel'), 0)} | {r['errors']} | {_noise(r)} |"
            )
        lines.append("")
    workers = curves.get("workers")
    if isinstance(workers, list):
        lines += [
            "`egress serve --workers N` (load generators pinned to CPU 0):",
            "",
            "| workers | proxy CPUs | HTTP c64 req/s | CPU µs/request | p99 ms | tunnels/s c16 "
            "| CPU µs/tunnel | noise |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in workers:
            lines.append(
                f"| {r['workers']} | {r['cpus']} | {_f(r['rps'])} "
                f"| {_f(r.get('cpu_us_per_request'), 1)} | {_f(r['p99_ms'], 2)} "
                f"| {_f(r['tunnels_per_s'])} | {_f(r.get('cpu_us_per_tunnel'))} | {_noise(r)} |"
            )
        lines.append("")
    audit = curves.get("audit")
    if isinstance(audit, dict) and "plain" in audit:
        lines += [
            "Audit writer on one core (loop and writer thread together): "
            f"`record()` {audit['record_us']} µs on the loop; "
            f"{_f(audit['plain']['lines_per_s'])} lines/s sustained end to end "
            f"({_f(audit['rotating']['lines_per_s'])} with 16 MiB rotation and gzip), "
            f"{audit['plain']['dropped']} dropped.",
            "",
        ]
    lag = curves.get("loop_lag")
    if isinstance(lag, dict) and "modes" in lag:
        lines += [
            f"Host event-loop lag: a host coroutine ticking every {lag['tick_ms']:g} ms on "
            f"a stock {lag['loop']} loop, the proxy on the same loop or in a `ProxyThread` "
            "of the same process (one core):",
            "",
            "| proxy | load | p50 ms | p99 ms | max ms | load achieved |",
            "|---|---|---|---|---|---|",
        ]
        for mode, row in lag["modes"].items():
            for load, r in row.items():
                lines.append(
                    f"| {mode} | {load} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} "
                    f"| {r.get('load', '')} |"
                )
        lines.append("")
    for name, value in curves.items():
        if isinstance(value, dict) and ("error" in value or "skipped" in value):
            lines.append(f"{name}: {value.get('error') or value.get('skipped')}")
    return lines
