"""The targets: the direct path, `egress serve` and the peer proxies.

Each proxy is started pinned to PROXY_CPU (taskset), in its own session and temp directory,
listening on 127.0.0.1 only, and is stopped by signalling its own process group. Nothing here
touches a system-wide instance: squid gets its own service name (-n), pid file, logs and
coredump dir and runs in the foreground (-N); tinyproxy runs in the foreground (-d) with its
own pid and log files.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench import rules as rulesmod

HOST = "127.0.0.1"
PROXY_CPU = 1
LOAD_CPU = 0
START_TIMEOUT_S = 20.0
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Env:
    """What every launcher needs: the origin's ports, a rule set, a work dir, a log mode."""

    http_ports: list[int]
    source_port: int
    rules: rulesmod.RuleSet
    workdir: Path
    log_mode: str  # "quiet" (no access log) or "default" (each proxy's shipped logging)


@dataclass
class Running:
    name: str
    port: int | None  # None: the direct path
    proc: subprocess.Popen[bytes] | None = None
    version: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


class StartError(RuntimeError):
    """A proxy did not come up; the message says why (and where its output is)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def pinned(argv: list[str], cpu: int | str) -> list[str]:
    return ["taskset", "-c", str(cpu), *argv]


def launch(
    argv: list[str], workdir: Path, name: str, cpus: int | str = PROXY_CPU
) -> subprocess.Popen[bytes]:
    out = open(workdir / f"{name}.out", "wb")  # the child gets its own copy
    try:
        return subprocess.Popen(
            pinned(argv, cpus),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            start_new_session=True,
        )
    finally:
        out.close()


@contextlib.contextmanager
def stop_on_error(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Whatever goes wrong while a proxy starts, it does not outlive the bench."""
    try:
        yield
    except BaseException:
        Running("", None, proc).stop()
        raise


def _tail(path: Path, lines: int = 3) -> str:
    """The last few lines of a proxy's output, for a StartError."""
    try:
        text = path.read_bytes()[-4096:].decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(x.strip() for x in text.strip().splitlines()[-lines:])


def wait_port(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartError(f"exited with {proc.returncode}: {_tail(log)}")
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise StartError(f"not listening on {port} after {START_TIMEOUT_S}s: {_tail(log)}")


LISTENING = re.compile(rb"^listening on ([\d.]+):(\d+)\s*$", re.M)


def wait_listening_line(proc: subprocess.Popen[bytes], log: Path) -> int:
    """`egress serve` prints `listening on HOST:PORT` once it accepts
    (docs/proxy.md#standalone-egress-serve)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        m = LISTENING.search(log.read_bytes())
        if m:
            if m.group(1).decode() != HOST:
                raise StartError(f"listening on {m.group(1)!r}, not {HOST}")
            return int(m.group(2))
        if proc.poll() is not None:
            raise StartError(f"exited with {proc.returncode}: {_tail(log)}")
        time.sleep(0.05)
    raise StartError(f"no `listening on` line after {START_TIMEOUT_S}s: {_tail(log)}")


def version_of(argv: list[str], pattern: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    m = re.search(pattern, out.stdout + out.stderr)
    return m.group(1) if m else "?"


# --- the direct path ---------------------------------------------------------------------


def start_direct(env: Env) -> Running:
    return Running("direct", None, version="no proxy")


# --- egress serve ------------------------------------------------------------------------


def egress_command() -> list[str] | None:
    exe = Path(sys.executable).with_name("egress")
    if not exe.exists():
        return None
    probe = subprocess.run([str(exe), "serve", "--help"], capture_output=True, timeout=30)
    return [str(exe)] if probe.returncode == 0 else None


def framework_routes(env: Env) -> list[str]:
    """The bench origin's ports as framework routes (the guard refuses loopback otherwise).

    A framework route is reachable on its exact host and port by any scheme (egress.policy),
    so one URL per port covers absolute-form HTTP and CONNECT.
    """
    return [f"http://{HOST}:{p}" for p in [*env.http_ports, env.source_port]]


def start_egress(env: Env, more: list[str] | None = None, cpus: int | str = PROXY_CPU) -> Running:
    """The production shape: the generated policy file and the audit log to a file."""
    policy = env.workdir / "policy.toml"
    policy.write_text(rulesmod.egress_toml(env.rules))
    extra = ["--policy", str(policy), "--audit-log", str(env.workdir / "audit.jsonl")]
    return _start_egress(env, "egress", [*extra, *(more or [])], cpus)


def start_egress_bare(env: Env) -> Running:
    """Only the framework routes: no rules, no audit log (what policy and audit cost)."""
    return _start_egress(env, "egress-bare", [])


def _start_egress(env: Env, name: str, extra: list[str], cpus: int | str = PROXY_CPU) -> Running:
    exe = egress_command()
    if exe is None:
        raise StartError("`egress serve` is not available in this checkout yet")
    argv = [*exe, "serve", "--quiet", "--listen", f"{HOST}:0", *extra]  # no stderr lines
    for route in framework_routes(env):
        argv += ["--framework-route", route]
    proc = launch(argv, env.workdir, name, cpus)
    with stop_on_error(proc):
        port = wait_listening_line(proc, env.workdir / f"{name}.out")
    git = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return Running(name, port, proc, version=f"egress-netcut@{git.stdout.strip()}")


# --- tinyproxy -------------------------------------------------------------------------


def start_tinyproxy(env: Env) -> Running:
    exe = shutil.which("tinyproxy")
    if exe is None:
        raise StartError("tinyproxy is not installed")
    port, d = free_port(), env.workdir
    (d / "filter").write_text(rulesmod.tinyproxy_filter(env.rules))
    connect_ports = "".join(f"ConnectPort {p}\n" for p in [443, *env.http_ports, env.source_port])
    level = "Info" if env.log_mode == "default" else "Critical"  # Debian ships Info
    (d / "tinyproxy.conf").write_text(
        f"""# Debian's default tinyproxy.conf, on a free port with its own files.
User tinyproxy
Group tinyproxy
Port {port}
Listen {HOST}
Timeout 600
DefaultErrorFile "/usr/share/tinyproxy/default.html"
StatFile "/usr/share/tinyproxy/stats.html"
LogFile "{d}/tinyproxy.log"
LogLevel {level}
PidFile "{d}/tinyproxy.pid"
MaxClients 100
Allow 127.0.0.1
ViaProxyName "tinyproxy"
Filter "{d}/filter"
FilterType ere
FilterDefaultDeny Yes
{connect_ports}"""
    )
    _chown_tree(d, "tinyproxy")
    proc = launch([exe, "-d", "-c", str(d / "tinyproxy.conf")], d, "tinyproxy")
    with stop_on_error(proc):
        wait_port(proc, port, d / "tinyproxy.out")
    version = version_of([exe, "-v"], r"tinyproxy ([\d.]+)")
    return Running("tinyproxy", port, proc, version=f"tinyproxy {version}")


def _chown_tree(d: Path, user: str) -> None:
    """Daemons that drop privileges must be able to write their own files."""
    if os.getuid() != 0:
        return
    for p in [d, *d.iterdir()]:
        shutil.chown(p, user, user if user != "proxy" else "proxy")


# --- squid -------------------------------------------------------------------------------


def start_squid(env: Env) -> Running:
    exe = shutil.which("squid") or ("/usr/sbin/squid" if Path("/usr/sbin/squid").exists() else None)
    if exe is None:
        raise StartError("squid is not installed")
    port, d, r = free_port(), env.workdir, env.rules
    allowed = rulesmod.squid_domains(r.allow_domains(), len(r.allow_wildcards))
    (d / "allow-domains").write_text(allowed)
    (d / "block-domains").write_text(rulesmod.squid_domains(r.block_domains(), 1 << 30))
    (d / "allow-nets").write_text("".join(c + "\n" for c in r.allow_cidrs))
    (d / "block-nets").write_text("".join(c + "\n" for c in r.block_cidrs))
    ports = " ".join(str(p) for p in [*env.http_ports, env.source_port])
    access_log = f"daemon:{d}/access.log" if env.log_mode == "default" else "none"
    (d / "squid.conf").write_text(
        f"""# Forward proxy, ACL allow-list, no caching, one worker, all files in {d}.
workers 1
http_port {HOST}:{port}
pid_filename {d}/squid.pid
cache_log {d}/cache.log
access_log {access_log}
cache_store_log none
coredump_dir {d}
cache deny all
netdb_filename none
pinger_enable off
icp_port 0
htcp_port 0
shutdown_lifetime 0 seconds
acl localnet src 127.0.0.1/32
acl SSL_ports port 443 {ports}
acl Safe_ports port 80 443 1025-65535
acl CONNECT method CONNECT
acl allowed_domains dstdomain "{d}/allow-domains"
acl blocked_domains dstdomain "{d}/block-domains"
acl allowed_nets dst "{d}/allow-nets"
acl blocked_nets dst "{d}/block-nets"
acl bench_origin dst 127.0.0.1/32
http_access deny !Safe_ports
http_access deny CONNECT !SSL_ports
http_access deny blocked_domains
http_access deny blocked_nets
http_access allow localnet allowed_domains
http_access allow localnet allowed_nets
http_access allow localnet bench_origin
http_access deny all
"""
    )
    _chown_tree(d, "proxy")
    service = f"bench{port}"  # its own service name: no clash with a system squid's shm/pid
    argv = [exe, "-N", "-n", service, "-f", str(d / "squid.conf")]
    proc = launch(argv, d, "squid")
    with stop_on_error(proc):
        wait_port(proc, port, d / "cache.log")
    version = version_of([exe, "-v"], r"Version ([\d.]+)")
    return Running("squid", port, proc, version=f"squid {version}")


# --- pproxy ------------------------------------------------------------------------------


def start_pproxy(env: Env) -> Running:
    try:
        version = importlib.metadata.version("pproxy")
    except importlib.metadata.PackageNotFoundError as exc:
        raise StartError("pproxy is not installed (EXTRAS=,bench ./dev.sh setup)") from exc
    port, d = free_port(), env.workdir
    launcher = Path(__file__).with_name("pproxy_uvloop.py")
    argv = [sys.executable, str(launcher), "-l", f"http://{HOST}:{port}"]
    (d / "block.rules").write_text(rulesmod.pproxy_block_file(env.rules))
    argv += ["-b", str(d / "block.rules")]
    proc = launch(argv, d, "pproxy")
    with stop_on_error(proc):
        wait_port(proc, port, d / "pproxy.out")
    run = Running("pproxy", port, proc, version=f"pproxy {version} + uvloop")
    if b"Using uvloop" not in (d / "pproxy.out").read_bytes():
        run.notes.append("pproxy did not report uvloop")
    return run


def start_pproxy_asyncio(env: Env) -> Running:
    """pproxy on the stock asyncio loop: what a plain `pip install pproxy` runs."""
    try:
        version = importlib.metadata.version("pproxy")
    except importlib.metadata.PackageNotFoundError as exc:
        raise StartError("pproxy is not installed (EXTRAS=,bench ./dev.sh setup)") from exc
    port, d = free_port(), env.workdir
    launcher = Path(__file__).with_name("pproxy_uvloop.py")
    argv = [sys.executable, str(launcher), "--stock-asyncio", "-l", f"http://{HOST}:{port}"]
    (d / "block.rules").write_text(rulesmod.pproxy_block_file(env.rules))
    argv += ["-b", str(d / "block.rules")]
    proc = launch(argv, d, "pproxy-asyncio")
    with stop_on_error(proc):
        wait_port(proc, port, d / "pproxy-asyncio.out")
    run = Running("pproxy-asyncio", port, proc, version=f"pproxy {version} + asyncio")
    if b"Using uvloop" in (d / "pproxy-asyncio.out").read_bytes():
        run.notes.append("pproxy reported uvloop although asked for stock asyncio")
    return run


# --- peers in their own venv (bench/out/peers, made by `./dev.sh bench`) ------------------

PEERS_VENV = REPO / "bench" / "out" / "peers"
PEERS_WHY = REPO / "bench" / "out" / "peers-missing.txt"  # why `./dev.sh bench` could not


def _peer_exe(name: str) -> Path:
    exe = PEERS_VENV / "bin" / name
    if not exe.exists():
        why = PEERS_WHY.read_text().strip() if PEERS_WHY.exists() else ""
        raise StartError(
            f"{name} is not installed in {PEERS_VENV} ({why or 'run ./dev.sh bench to set it up'})"
        )
    return exe


def _peer_version(dist: str) -> str:
    py = PEERS_VENV / "bin" / "python"
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or "?"


def start_proxy_py(env: Env) -> Running:
    """proxy.py: one acceptor, one worker (it would start one per CPU), its host filter
    plugin with the rule set's blocked names; INFO logs one line per request (default).
    """
    exe = _peer_exe("proxy")
    port, d = free_port(), env.workdir
    level = "INFO" if env.log_mode == "default" else "WARNING"
    blocked = ",".join(env.rules.block_domains())
    argv = [
        str(exe),
        "--hostname",
        HOST,
        "--port",
        str(port),
        "--num-acceptors",
        "1",
        "--num-workers",
        "1",
        "--log-level",
        level,
        "--pid-file",
        str(d / "proxy.pid"),
        "--plugins",
        "proxy.plugin.FilterByUpstreamHostPlugin",
        "--filtered-upstream-hosts",
        blocked,
    ]
    proc = launch(argv, d, "proxy.py")
    with stop_on_error(proc):
        wait_port(proc, port, d / "proxy.py.out")
    return Running("proxy.py", port, proc, version=f"proxy.py {_peer_version('proxy.py')}")


def start_mitmproxy(env: Env) -> Running:
    """mitmdump in regular-proxy mode, every host passed through untouched (no TLS
    interception, like the others); flow logging off in quiet mode.
    """
    exe = _peer_exe("mitmdump")
    port, d = free_port(), env.workdir
    argv = [
        str(exe),
        "--listen-host",
        HOST,
        "--listen-port",
        str(port),
        "--ignore-hosts",
        ".*",
        "--set",
        f"confdir={d / 'mitm'}",
    ]
    if env.log_mode == "quiet":
        argv += ["--quiet"]
    proc = launch(argv, d, "mitmproxy")
    with stop_on_error(proc):
        wait_port(proc, port, d / "mitmproxy.out")
    return Running("mitmproxy", port, proc, version=f"mitmproxy {_peer_version('mitmproxy')}")


Launcher = Callable[[Env], Running]
TARGETS: dict[str, Launcher] = {
    "direct": start_direct,
    "egress": start_egress,
    "tinyproxy": start_tinyproxy,
    "squid": start_squid,
    "pproxy": start_pproxy,
    "pproxy-asyncio": start_pproxy_asyncio,
    "proxy.py": start_proxy_py,
    "mitmproxy": start_mitmproxy,
}
# Far from every bar (bench/anchors.py) or variants of a peer already measured: in a full run
# they get the first repetition only (all of them with --only).
ONE_REP = frozenset({"pproxy-asyncio", "proxy.py", "mitmproxy"})
# Measured only when asked for by name (--only egress-bare).
EXTRA_TARGETS: dict[str, Launcher] = {"egress-bare": start_egress_bare}
SUBJECT = "egress"  # the proxy the ratios are about
