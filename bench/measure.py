"""One measurement each: wrk for HTTP, the C load generator for tunnels and bulk, and the
forwarding checks. Load generators run pinned to LOAD_CPU; every figure is checked against the
origin's own request count.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.proxies import HOST, LOAD_CPU, pinned

OUT = Path(__file__).resolve().parent / "out"
LOADGEN_SRC = Path(__file__).resolve().parent / "loadgen.c"
RATIO_TOLERANCE = 0.01  # origin/client count may differ by 1% plus the in-flight requests

WRK_LUA = """-- absolute-form GET through a forward proxy (or origin-form on the direct path)
wrk.method = "GET"
wrk.path = "{path}"
wrk.headers["Host"] = "{host}"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {{"requests": %d, "duration_us": %d, "socket_errors": %d, "status_errors": %d, '
    .. '"p50_us": %.1f, "p99_us": %.1f, "max_us": %.1f}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


class Origin:
    """The bench origin process (bench/origin.py) pinned to LOAD_CPU; query counts by port."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            pinned([sys.executable, "-m", "bench.origin"], LOAD_CPU),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert self.proc.stdout is not None
        ports = json.loads(self.proc.stdout.readline())
        self.http_ports: list[int] = ports["http_ports"]
        self.source_port: int = ports["source_port"]
        self.control_port: int = ports["control_port"]

    def counts(self) -> dict[int, int]:
        with socket.create_connection((HOST, self.control_port), timeout=5) as s:
            s.sendall(b"counts\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        return {int(k): v for k, v in json.loads(data).items()}

    def count(self, port: int) -> int:
        return self.counts().get(port, 0)

    def settled_count(self, port: int, limit: float = 2.0) -> int:
        """`count` once it stops moving (two reads 50 ms apart agree, for at most `limit`
        seconds): a load generator that stops with requests in flight leaves a proxy
        forwarding them after it exited (one that admits every request of a lone client
        at once leaves up to the run's concurrency), and they belong to that run, not the
        next one."""
        last = self.count(port)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.count(port)
            if now == last:
                break
            last = now
        return last

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def build_loadgen() -> Path:
    """Compile bench/loadgen.c into bench/out/ (at run time, with the machine's gcc)."""
    OUT.mkdir(exist_ok=True)
    exe = OUT / "loadgen"
    if not exe.exists() or exe.stat().st_mtime < LOADGEN_SRC.stat().st_mtime:
        cmd = ["gcc", "-O2", "-Wall", "-pthread", "-o", str(exe), str(LOADGEN_SRC)]
        subprocess.run(cmd, check=True)
    return exe


@dataclass
class Target:
    """Where the load goes: through a proxy on proxy_port, or direct (proxy_port None)."""

    proxy_port: int | None

    def url(self, origin_port: int) -> str:
        port = self.proxy_port if self.proxy_port is not None else origin_port
        return f"http://{HOST}:{port}/"

    def request_path(self, origin_port: int) -> str:
        return f"http://{HOST}:{origin_port}/" if self.proxy_port is not None else "/"


def run_wrk(
    target: Target, origin: Origin, conc: int, seconds: int, workdir: Path
) -> dict[str, Any]:
    """wrk -t1 -c{conc} keep-alive; returns req/s, latency and the origin/wrk count ratio."""
    port = origin.http_ports[0]
    script = workdir / "absolute.lua"
    host = f"{HOST}:{port}"
    script.write_text(WRK_LUA.format(path=target.request_path(port), host=host))
    before = origin.settled_count(port)
    argv = ["wrk", "-t1", f"-c{conc}", f"-d{seconds}s", "-s", str(script), target.url(port)]
    out = subprocess.run(pinned(argv, LOAD_CPU), capture_output=True, text=True, timeout=60)
    got = origin.settled_count(port) - before
    line = next((x for x in out.stdout.splitlines() if x.startswith("BENCHJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result: {out.stdout[-300:]} {out.stderr[-300:]}")
    r = json.loads(line.removeprefix("BENCHJSON "))
    n = r["requests"]
    ratio = got / n if n else 0.0
    return {
        "concurrency": conc,
        "requests": n,
        "origin_requests": got,
        "origin_ratio": round(ratio, 4),
        "ratio_ok": n > 0 and abs(ratio - 1) <= RATIO_TOLERANCE + conc / n,
        "seconds": r["duration_us"] / 1e6,
        "rps": n / (r["duration_us"] / 1e6),
        "p50_ms": r["p50_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "max_ms": r["max_us"] / 1000,
        "socket_errors": r["socket_errors"],
        "status_errors": r["status_errors"],
    }


def run_loadgen(exe: Path, mode: str, target: Target, port: int, n: int, arg: str) -> Any:
    proxy = str(target.proxy_port or 0)
    argv = [str(exe), mode, proxy, str(port), str(n), arg]
    out = subprocess.run(pinned(argv, LOAD_CPU), capture_output=True, text=True, timeout=300)
    if not out.stdout.strip():
        raise RuntimeError(f"loadgen {mode} failed ({out.returncode}): {out.stderr[-300:]}")
    return json.loads(out.stdout)


def run_tunnels(
    exe: Path, target: Target, origin: Origin, conc: int, seconds: float
) -> dict[str, Any]:
    """connect, CONNECT, one GET, close, in a loop on conc threads."""
    port = origin.http_ports[0]
    before = origin.settled_count(port)
    r = run_loadgen(exe, "tunnels", target, port, conc, str(seconds))
    got = origin.settled_count(port) - before
    n = r["tunnels"]
    ratio = got / n if n else 0.0
    r["origin_requests"] = got
    r["origin_ratio"] = round(ratio, 4)
    r["ratio_ok"] = n > 0 and abs(ratio - 1) <= RATIO_TOLERANCE + conc / n
    return dict(r)


def run_bulk(exe: Path, target: Target, origin: Origin, streams: int, total: int) -> Any:
    return run_loadgen(exe, "bulk", target, origin.source_port, streams, str(total))


# --- forwarding checks --------------------------------------------------------------------


def _read_response(sock: socket.socket) -> tuple[int, bool]:
    """(status, server_closes) of one Content-Length response; status 0 if the peer closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, True
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    closes = "close" in headers.get("connection", "").lower() or lines[0].startswith("HTTP/1.0")
    return status, closes


def _get(sock: socket.socket, origin_port: int) -> tuple[int, bool]:
    url = f"http://{HOST}:{origin_port}/"
    sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {HOST}:{origin_port}\r\n\r\n".encode())
    return _read_response(sock)


def forward_check(proxy_port: int, origin: Origin) -> dict[str, Any]:
    """One absolute-form GET must reach the origin before anything is measured."""
    port = origin.http_ports[0]
    before = origin.count(port)
    try:
        with socket.create_connection((HOST, proxy_port), timeout=5) as s:
            status, _ = _get(s, port)
    except OSError as exc:
        return {"ok": False, "why": f"{type(exc).__name__}: {exc}"}
    reached = origin.count(port) - before
    ok = status == 200 and reached == 1
    return {"ok": ok, "status": status, "origin_requests": reached}


def routing_check(proxy_port: int, origin: Origin) -> dict[str, Any]:
    """Does a second absolute-form request on the same connection, for another origin port,
    reach that origin? Proxies that pipe a kept-alive connection to the first upstream fail.
    """
    first, second = origin.http_ports
    before = origin.counts()
    try:
        with socket.create_connection((HOST, proxy_port), timeout=5) as s:
            status1, closes = _get(s, first)
            if closes:
                return {"result": "closes connection after each response", "status": status1}
            status2, _ = _get(s, second)
    except OSError as exc:
        return {"result": f"error: {type(exc).__name__}: {exc}"}
    after = origin.counts()
    got_first = after.get(first, 0) - before.get(first, 0)
    got_second = after.get(second, 0) - before.get(second, 0)
    if status2 == 200 and got_second == 1:
        result = "routed per request"
    elif got_first == 2:
        result = "sent to the first origin"
    elif status2 == 0:
        result = "closed before the second response"
    else:
        result = f"second request answered {status2}, origin counts {got_first}/{got_second}"
    return {"result": result, "status": [status1, status2], "origin": [got_first, got_second]}
