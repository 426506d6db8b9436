"""netcut against the real kernel: a cut, its probe, idempotency, restore, the safety rails."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import pytest
from netcut_testlib import Topology, ifindex_in, root_changes, root_snapshot, sh, wait_for

import netcut
from netcut import api, safety
from netcut.direct import executor as apply
from netcut.direct import worker as nsexec
from netcut.plan.changes import DelRoute
from netcut.plan.model import Route

pytestmark = pytest.mark.netns


def ns_path(ns: str) -> str:
    return f"/run/netns/{ns}"


def netfilter(ns: str) -> list[str]:
    """Chains and rules of the namespace's legacy tables (a table that a cut instantiated
    stays registered, empty, after restore: only its content is compared)."""
    out = []
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        text = sh("ip", "netns", "exec", ns, tool, "-t", "filter").stdout
        out += [f"{tool}: {x}" for x in text.splitlines() if x.startswith(("-", ":NETCUT"))]
    return out


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netcut.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_cut_leaves_only_kept_addr_port(topo: Topology) -> None:
    t = topo
    assert t.reaches(t.upstream_ip, t.echo_port), "upstream reachable before the cut"
    assert t.reaches(t.peer_ip, t.echo_port), "peer reachable before the cut"
    assert t.reaches(t.peer_v6, t.echo_port), "peer reachable over IPv6 before the cut"
    assert t.udp_reaches(t.gateway, 53), "DNS (UDP 53 on the gateway) before the cut"

    result = netcut.cut(ns_path(t.sandbox), [t.proxy], expect_blocked=[f"{t.upstream_ip}:7000"])

    assert result.changed
    assert result.status.is_cut
    assert result.probe is not None
    assert result.probe.ok
    assert t.reaches(t.gateway, t.proxy_port), "the kept ADDR:PORT still answers"
    assert not t.reaches(t.upstream_ip, t.echo_port)
    assert not t.reaches(t.peer_ip, t.echo_port), "peer on the same bridge is cut off"
    assert not t.reaches(t.peer_v6, t.echo_port), "IPv6 is off"
    assert not t.udp_reaches(t.gateway, 53), "DNS over UDP is dropped"
    assert not t.reaches(t.gateway, 53), "DNS over TCP is dropped"
    assert not t.reaches(t.gateway, 22), "other ports of the kept host are not kept"
    status = netcut.status(t.sandbox)
    assert status.is_cut
    assert [str(k) for k in status.keeps] == [t.proxy]


def test_second_cut_changes_nothing_and_says_so(topo: Topology) -> None:
    netcut.cut(topo.sandbox, [topo.proxy])
    routes, rules = topo.routes(), netfilter(topo.sandbox)

    again = netcut.cut(topo.sandbox, [topo.proxy])
    assert not again.changed
    assert again.lines()[0].startswith("already cut")
    assert topo.routes() == routes
    assert netfilter(topo.sandbox) == rules

    done = cli("cut", "--netns", topo.sandbox, "--keep", topo.proxy)
    assert done.returncode == 0, done.stderr
    assert "already cut" in done.stdout
    with pytest.raises(netcut.InvalidInput, match="already cut"):
        netcut.cut(topo.sandbox, [f"{topo.gateway}:9999"], probe=False)


def test_restore_puts_routes_back_byte_for_byte(topo: Topology) -> None:
    routes, rules = topo.routes(), netfilter(topo.sandbox)
    netcut.cut(topo.sandbox, [topo.proxy])
    assert topo.routes() != routes

    restored = netcut.restore(topo.sandbox)

    assert restored.changed
    assert restored.status.state == "not cut"
    # IPv6 link-local routes come back as the kernel regenerates the address: poll.
    assert wait_for(lambda: topo.routes() == routes), (routes, topo.routes())
    assert netfilter(topo.sandbox) == rules
    for names in ("ip_tables_names", "ip6_tables_names"):  # no other table was registered
        listed = sh("ip", "netns", "exec", topo.sandbox, "cat", f"/proc/net/{names}").stdout
        assert listed.split() == ["filter"]
    assert netcut.status(topo.sandbox).state == "not cut"
    assert topo.reaches(topo.upstream_ip, topo.echo_port)
    assert topo.reaches(topo.peer_ip, topo.echo_port)
    assert wait_for(lambda: topo.reaches(topo.peer_v6, topo.echo_port))

    again = cli("restore", "--netns", topo.sandbox)
    assert again.returncode == 0
    assert "not cut" in again.stdout


def test_established_connection_fails_fast_after_cut(topo: Topology) -> None:
    sock = topo.connect(topo.upstream_ip, topo.echo_port, timeout=5.0)
    with sock:
        sock.sendall(b"before")
        assert sock.recv(6) == b"before"

        netcut.cut(topo.sandbox, [topo.proxy])

        start = time.monotonic()
        try:  # ECONNABORTED (the cut destroyed the flow) on send or at the latest on recv
            sock.sendall(b"after")
            got = sock.recv(5)
        except OSError as exc:
            got = exc.errno
        assert got in (errno.ECONNABORTED, errno.ECONNRESET, errno.EPIPE, b""), got
        assert time.monotonic() - start < 2.0, "fails fast, not after a TCP timeout"


def test_connection_beside_listeners_is_destroyed(topo: Topology) -> None:
    """The cut skips the dump of connected sockets only when every TCP socket of the
    namespace is a listener: listeners beside a connection do not hide it."""
    from netcut_testlib import ns_socket

    listeners = [ns_socket(topo.sandbox) for _ in range(2)]
    for srv in listeners:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
    try:
        sock = topo.connect(topo.upstream_ip, topo.echo_port, timeout=5.0)
        with sock:
            sock.sendall(b"before")
            assert sock.recv(6) == b"before"
            netcut.cut(topo.sandbox, [topo.proxy])
            try:
                sock.sendall(b"after")
                got = sock.recv(5)
            except OSError as exc:
                got = exc.errno
            assert got in (errno.ECONNABORTED, errno.ECONNRESET, errno.EPIPE, b""), got
    finally:
        for srv in listeners:
            srv.close()


def test_kept_connection_survives_the_cut(topo: Topology) -> None:
    with topo.connect(topo.gateway, topo.proxy_port) as sock:
        netcut.cut(topo.sandbox, [topo.proxy])
        sock.sendall(b"still")
        assert sock.recv(5) == b"still"


def test_cut_with_no_keep_leaves_loopback_only(topo: Topology) -> None:
    topo.servers.tcp_echo(topo.sandbox, "127.0.0.1", 8080)
    result = netcut.cut(topo.sandbox, [], expect_blocked=[topo.proxy])
    assert result.changed
    assert topo.reaches("127.0.0.1", 8080)
    assert not topo.reaches(topo.gateway, topo.proxy_port)
    assert not topo.reaches(topo.upstream_ip, topo.echo_port)


def test_loopback_keep_needs_no_route(topo: Topology) -> None:
    topo.servers.tcp_echo(topo.sandbox, "127.0.0.1", 8081)
    result = netcut.cut(topo.sandbox, ["127.0.0.1:8081"])
    assert result.plan is not None
    assert not any("add route" in line for line in result.plan.lines())
    assert result.probe is not None
    assert result.probe.ok


def test_capless_process_cannot_readd_default_route(topo: Topology) -> None:
    netcut.cut(topo.sandbox, [topo.proxy])
    routes = topo.routes()
    done = sh(
        "ip", "netns", "exec", topo.sandbox,
        "setpriv", "--bounding-set=-all", "--inh-caps=-all", "--",
        "ip", "route", "add", "default", "via", topo.gateway, "onlink", "dev", "eth0",
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "not permitted" in done.stderr
    assert topo.routes() == routes


def test_privileged_process_in_target_is_refused(topo: Topology) -> None:
    proc = subprocess.Popen(["ip", "netns", "exec", topo.sandbox, "sleep", "60"])
    try:
        assert wait_for(lambda: _in_ns(proc.pid, topo.sandbox))
        with pytest.raises(netcut.UnsafeTarget) as info:
            netcut.cut(topo.sandbox, [topo.proxy])
        assert f"pid {proc.pid}" in str(info.value)
        # A dry run runs the same safety scan: it says what the cut would do, a refusal too.
        with pytest.raises(netcut.UnsafeTarget, match="CAP_NET_ADMIN"):
            netcut.cut(topo.sandbox, [topo.proxy], dry_run=True)
        dry = cli("cut", "--netns", topo.sandbox, "--keep", topo.proxy, "--dry-run")
        assert dry.returncode == 2, dry.stdout
        assert f"pid {proc.pid}" in dry.stderr
        assert "CAP_NET_ADMIN" in str(info.value)
        assert netcut.status(topo.sandbox).state == "not cut"
        assert netcut.cut(topo.sandbox, [topo.proxy], allow_privileged=True).changed
    finally:
        proc.kill()
        proc.wait()


def test_capless_process_in_target_is_accepted(topo: Topology) -> None:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", topo.sandbox,
         "setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", "sleep", "60"]
    )  # fmt: skip
    try:
        assert wait_for(lambda: _in_ns(proc.pid, topo.sandbox) and _capless(proc.pid))
        assert netcut.cut(topo.sandbox, [topo.proxy]).changed
    finally:
        proc.kill()
        proc.wait()


def _in_ns(pid: int, ns: str) -> bool:
    try:
        mine = os.stat(f"/proc/{pid}/ns/net")
    except OSError:
        return False
    target = os.stat(ns_path(ns))
    return (mine.st_dev, mine.st_ino) == (target.st_dev, target.st_ino)


def _capless(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        return any(line.split() == ["CapEff:", "0000000000000000"] for line in f)


def test_cutting_own_or_host_namespace_is_refused(topo: Topology) -> None:
    before = root_snapshot()
    with pytest.raises(netcut.UnsafeTarget, match="own network namespace"):
        netcut.cut("/proc/self/ns/net", [])
    done = cli("cut", "--pid", str(os.getpid()))
    assert done.returncode == 2
    assert "refusing" in done.stderr
    assert "Traceback" not in done.stderr
    assert root_changes(before, root_snapshot()) == []


def test_host_initial_namespace_is_recognised() -> None:
    own = os.stat("/proc/self/ns/net")
    ident = (own.st_dev, own.st_ino)
    expected = own.st_ino == safety.PROC_NET_INIT_INO or ident == safety.identity_of(
        "/proc/1/ns/net"
    )
    assert safety.is_initial_namespace(ident) == expected
    with pytest.raises(netcut.UnsafeTarget, match="refusing to cut"):
        safety.refuse_unsafe_namespace((own.st_dev, safety.PROC_NET_INIT_INO))


def test_missing_namespace_is_a_clear_error_and_is_not_created() -> None:
    name = f"ncnope{os.getpid()}"
    with pytest.raises(netcut.TargetNotFound, match=f"/run/netns/{name}"):
        netcut.status(name)
    done = cli("status", "--netns", name)
    assert done.returncode == 2
    assert f"/run/netns/{name}" in done.stderr
    assert not os.path.exists(f"/run/netns/{name}")


def test_probe_failure_exits_1_fast_with_reason(topo: Topology) -> None:
    # A host firewall dropping container-to-host traffic to the proxy port: the probe must
    # time out quickly and say why.
    sh("ip", "netns", "exec", topo.host, "iptables-legacy", "-A", "INPUT",
       "-p", "tcp", "--dport", str(topo.proxy_port), "-j", "DROP")  # fmt: skip
    start = time.monotonic()
    done = cli("cut", "--netns", topo.sandbox, "--keep", topo.proxy, "--probe-timeout", "0.5")
    assert time.monotonic() - start < 15
    assert done.returncode == 1, done.stderr
    assert "probe failed" in done.stderr
    assert "timeout" in done.stderr
    assert "firewall" in done.stderr
    assert netcut.status(topo.sandbox).is_cut, "fail closed: the cut stays"

    probed = cli("probe", "--netns", topo.sandbox, "--expect-reachable", topo.proxy,
                 "--timeout", "0.3")  # fmt: skip
    assert probed.returncode == 1
    assert "FAIL" in probed.stdout


def test_probe_command_ok(topo: Topology) -> None:
    netcut.cut(topo.sandbox, [topo.proxy], probe=False)
    done = cli("probe", "--netns", topo.sandbox, "--expect-reachable", topo.proxy,
               "--expect-blocked", f"{topo.upstream_ip}:{topo.echo_port}",
               "--expect-blocked", f"{topo.peer_ip}:{topo.echo_port}", "--json")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["ok"]
    assert len(data["items"]) == 3


def test_probe_names_its_own_end_of_each_connection(topo: Topology) -> None:
    """A connected item's `source` is the probe's ADDR:PORT, as the listener sees its peer
    (egress tells the probe's connection from an agent's by it: docs/netcut.md#probe)."""
    blocked = f"{topo.upstream_ip}:{topo.echo_port}"
    netcut.cut(topo.sandbox, [topo.proxy], probe=False)
    result = netcut.probe(topo.sandbox, expect_reachable=[topo.proxy], expect_blocked=[blocked])
    assert result.ok, result.reason()
    reached, refused = result.items
    addr, _, port = reached.source.rpartition(":")
    assert addr == topo.sandbox_ip, reached
    assert 0 < int(port) < 65536, reached
    assert refused.source == "", refused


def test_dry_run_and_status_cli(topo: Topology) -> None:
    routes = topo.routes()
    tables = sh("ip", "netns", "exec", topo.sandbox, "cat", "/proc/net/ip_tables_names").stdout
    dry = cli("cut", "--netns", topo.sandbox, "--keep", topo.proxy, "--dry-run")
    assert dry.returncode == 0
    assert f"add route {topo.gateway}/32 dev eth0 proto netcut" in dry.stdout
    assert "delete route default via" in dry.stdout
    assert topo.routes() == routes

    st = cli("status", "--netns", topo.sandbox)
    assert st.returncode == 4, "exit 0 only for cut (docs/netcut.md#exit-codes)"
    assert st.stdout.splitlines()[0] == "not cut"
    after = sh("ip", "netns", "exec", topo.sandbox, "cat", "/proc/net/ip_tables_names").stdout
    assert after == tables, "a dry run and a status change nothing, not even table registration"
    cut = cli("cut", "--netns", topo.sandbox, "--keep", topo.proxy, "--json")
    assert cut.returncode == 0, cut.stderr
    assert json.loads(cut.stdout)["result"] == "cut"
    st = cli("status", "--netns-path", ns_path(topo.sandbox), "--json")
    assert json.loads(st.stdout)["cut"] is True
    st = cli("status", "--netns", topo.sandbox)
    assert st.stdout.splitlines()[0] == "cut"
    assert st.returncode == 0


def test_partial_cut_is_reported_and_restored(topo: Topology) -> None:
    routes = topo.routes()
    netcut.cut(topo.sandbox, [topo.proxy])
    sh("ip", "netns", "exec", topo.sandbox, "iptables-legacy", "-D", "OUTPUT", "-j", "NETCUT")
    sh("ip", "netns", "exec", topo.sandbox, "iptables-legacy", "-F", "NETCUT")
    sh("ip", "netns", "exec", topo.sandbox, "iptables-legacy", "-X", "NETCUT")
    status = netcut.status(topo.sandbox)
    assert status.state == "partial"
    assert status.lines()[0] == "partial"
    st = cli("status", "--netns", topo.sandbox, "--json")
    assert st.returncode == 3, "partial has its own code (docs/netcut.md#exit-codes)"
    assert json.loads(st.stdout)["state"] == "partial"
    assert "IPv4 backstop is gone" in status.details
    again = netcut.cut(topo.sandbox, [topo.proxy])  # repairs the partial cut to its plan
    assert again.changed
    assert again.repaired
    assert netcut.status(topo.sandbox).is_cut
    netcut.restore(topo.sandbox)
    assert wait_for(lambda: topo.routes() == routes)


def test_failure_midway_rolls_back(topo: Topology) -> None:
    routes, rules = topo.routes(), netfilter(topo.sandbox)
    planned = netcut.cut(topo.sandbox, [topo.proxy], dry_run=True).plan
    assert planned is not None
    bogus = DelRoute(Route(family=2, dst="198.19.255.0", dst_len=24, oif=None, ifname=None))
    fd = os.open(ns_path(topo.sandbox), os.O_RDONLY)
    try:
        with pytest.raises(netcut.ApplyFailed, match="rolled back"):
            nsexec.run_in_netns(fd, apply.job_apply, (*planned.ops[:-1], bogus))
    finally:
        os.close(fd)
    assert wait_for(lambda: topo.routes() == routes)
    assert netfilter(topo.sandbox) == rules
    assert topo.reaches(topo.upstream_ip, topo.echo_port)


def test_caller_namespace_untouched(topo: Topology) -> None:
    before = os.stat("/proc/self/ns/net")
    netcut.cut(topo.sandbox, [topo.proxy])
    netcut.restore(topo.sandbox)
    after = os.stat("/proc/self/ns/net")
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    assert ifindex_in(topo.sandbox, "eth0") > 1


async def test_cut_async_keeps_the_loop_running(topo: Topology) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    try:
        result = await netcut.cut_async(topo.sandbox, [topo.proxy])
        status = await netcut.status_async(topo.sandbox)
        probed = await netcut.probe_async(topo.sandbox, [topo.proxy], [f"{topo.peer_ip}:7000"])
        await netcut.restore_async(topo.sandbox)
    finally:
        task.cancel()
    assert result.changed
    assert status.is_cut
    assert probed.ok
    assert ticks > 1


async def test_async_calls_wait_for_a_worker_in_as_many_threads_as_workers(
    topo: Topology,
) -> None:
    """Concurrent async calls run in netcut's own threads, as many as it has workers (the
    loop's default executor kept more threads than workers waking on the worker pool:
    docs/netcut.md#many-sandboxes-at-once), and every answer still comes back."""
    from netcut.direct.worker import pool_size

    seen: set[str] = set()
    real = netcut.api.status

    def status(target: str) -> object:
        seen.add(threading.current_thread().name)
        return real(target)

    netcut.api.status = status  # type: ignore[assignment]
    try:
        found = await asyncio.gather(*(netcut.status_async(topo.sandbox) for _ in range(12)))
    finally:
        netcut.api.status = real  # type: ignore[assignment]
    assert all(s.state == "not cut" for s in found)
    assert seen
    assert all(name.startswith("netcut") for name in seen), seen
    assert len(seen) <= pool_size()


def test_sync_api_inside_running_loop_thread(topo: Topology) -> None:
    async def main() -> api.CutResult:
        return netcut.cut(topo.sandbox, [topo.proxy])  # blocking, but must not break

    assert asyncio.run(main()).changed


def test_keep_behind_the_gateway_gets_a_host_route_via_it(topo: Topology) -> None:
    framework = f"{topo.upstream_ip}:{topo.echo_port}"
    result = netcut.cut(topo.sandbox, [framework], expect_blocked=[topo.proxy])
    assert result.probe is not None
    assert result.probe.ok
    routes = sh("ip", "-n", topo.sandbox, "route").stdout
    assert f"{topo.upstream_ip} via {topo.gateway} dev eth0 proto 110 " in routes
    assert "onlink" in routes
    assert topo.reaches(topo.upstream_ip, topo.echo_port)
    assert not topo.reaches(topo.peer_ip, topo.echo_port)


def test_a_wedged_worker_is_killed_and_replaced() -> None:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        start = time.monotonic()
        with pytest.raises(netcut.ApplyFailed, match="did not answer"):
            nsexec.run_in_netns(fd, time.sleep, 30, timeout=0.3)
        assert time.monotonic() - start < 5
        assert nsexec.run_in_netns(fd, os.getpid) != os.getpid(), "a fresh worker answers"
    finally:
        os.close(fd)


def test_worker_inherits_none_of_the_callers_descriptors(tmp_path: pathlib.Path) -> None:
    nsexec.stop_workers()  # start from no worker
    marker = tmp_path / "caller-only"
    with open(marker, "w"), socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        netcut.start_worker()
        pids = nsexec.worker_pids()
        assert pids
        links = set()
        for pid in pids:
            fd_dir = f"/proc/{pid}/fd"
            links |= {os.readlink(os.path.join(fd_dir, n)) for n in os.listdir(fd_dir)}
        listening = f"socket:[{os.fstat(sock.fileno()).st_ino}]"
    assert str(marker) not in links
    assert listening not in links


def test_a_job_for_another_namespace_runs_while_one_worker_is_busy(
    topo: Topology, tmp_path: pathlib.Path
) -> None:
    """The pool serves namespaces in parallel: one worker blocked in a job (reading a FIFO
    nobody writes yet) does not hold up a cut of another namespace."""
    import threading

    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    fd = os.open(ns_path(topo.peer), os.O_RDONLY)
    held = threading.Thread(target=nsexec.run_in_netns, args=(fd, pathlib.Path.read_text, fifo))
    held.start()
    try:
        done = threading.Thread(target=netcut.cut, args=(topo.sandbox, [topo.proxy]))
        done.start()
        done.join(60)
        assert not done.is_alive(), "the cut waited for the busy worker"
        assert held.is_alive()
        assert netcut.status(topo.sandbox).is_cut
    finally:
        fifo.write_text("go")
        held.join(30)
        os.close(fd)


def test_a_worker_retires_after_its_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers are recycled (libxtables leaks a little per decoded backstop): after
    RECYCLE_AFTER_JOBS jobs a worker exits and a fresh one serves the next job."""
    monkeypatch.setenv(nsexec.POOL_ENV, "1")
    monkeypatch.setattr(nsexec, "RECYCLE_AFTER_JOBS", 2)
    nsexec.stop_workers()
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        first = [nsexec.run_in_netns(fd, os.getpid) for _ in range(2)]
        then = nsexec.run_in_netns(fd, os.getpid)
    finally:
        os.close(fd)
        nsexec.stop_workers()
    assert first[0] == first[1]
    assert then != first[0]
    assert not os.path.exists(f"/proc/{first[0]}/status"), "the retired worker was reaped"
