"""containerd targets in direct mode: a real containerd (private socket, started and stopped
here by PID), a real `ctr run` task from a busybox rootfs directory (no image, no registry).

The task's PID comes from `ctr -n NAMESPACE task ls`; its namespace is cut like any other
(a veth into a 198.19 test host proves a real connection before and after); a task holding
NET_RAW is refused by the rail; a stopped task, a container without a task and a missing
container are clear errors; autodetection passes over a docker CLI with no daemon and
picks containerd when it answers. Skips without containerd, unless EGRESS_REQUIRE_ENGINE=1.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from netcut_testlib import Servers, next_subnet, sh, unique, wait_for

import netcut
from netcut import resolve as target

pytestmark = pytest.mark.netns
TOOLS = ("containerd", "ctr", "runc", "busybox")


def _engine_missing() -> str | None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


@pytest.fixture(autouse=True)
def _engine_guard() -> None:
    why = _engine_missing()
    if why is None:
        return
    if os.environ.get("EGRESS_REQUIRE_ENGINE") == "1":
        pytest.fail(f"EGRESS_REQUIRE_ENGINE=1 but containerd is unusable: {why}")
    pytest.skip(f"containerd {why} (set EGRESS_REQUIRE_ENGINE=1 to make this a failure)")


@dataclass
class Containerd:
    root: pathlib.Path
    address: str
    namespace: str
    rootfs: pathlib.Path
    tools: dict[str, str]  # absolute paths: a test may narrow PATH before teardown

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh(
            self.tools["ctr"], "--address", self.address, "-n", self.namespace, *args, check=check
        )

    def run(self, name: str, *flags: str) -> int:
        """Start task `name` (busybox sleep) and return its PID."""
        self.ctr("run", "-d", "--rootfs", *flags, str(self.rootfs), name,
                 "/bin/busybox", "sleep", "600")  # fmt: skip
        return target.parse_ctr_tasks(self.ctr("task", "ls").stdout)[name][0]


@pytest.fixture
def containerd(tmp_path_factory: pytest.TempPathFactory,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[Containerd]:  # fmt: skip
    root = tmp_path_factory.mktemp("ctd")
    rootfs = root / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy(shutil.which("busybox") or "", rootfs / "bin" / "busybox")
    address = str(root / "ctd.sock")
    config = root / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{root}/root"\nstate = "{root}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{address}"\n[ttrpc]\n  address = "{address}.ttrpc"\n'
    )
    log = open(root / "log", "w")
    daemon = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log)
    monkeypatch.setenv("CONTAINERD_ADDRESS", address)  # ctr's own variable: netcut's ctr too
    monkeypatch.delenv("CONTAINERD_NAMESPACE", raising=False)
    tools = {t: shutil.which(t) or t for t in ("ctr", "umount")}
    engine = Containerd(root, address, unique("n"), rootfs, tools)
    try:
        assert wait_for(lambda: engine.ctr("version", check=False).returncode == 0, 15)
        yield engine
    finally:
        for task in target.parse_ctr_tasks(engine.ctr("task", "ls", check=False).stdout):
            engine.ctr("task", "kill", "-s", "KILL", task, check=False)
            wait_for(lambda t=task: engine.ctr("task", "rm", t, check=False).returncode == 0)
        for name in engine.ctr("container", "ls", "-q", check=False).stdout.split():
            engine.ctr("container", "rm", name, check=False)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=20)
        log.close()
        sh(tools["umount"], "-R", str(root / "state"), check=False)
        _remove_shim_dirs(engine.namespace)


def _remove_shim_dirs(namespace: str) -> None:
    """containerd's shim keeps runc's state in /run/containerd/runc/NAMESPACE whatever the
    daemon's root; remove this test's (empty once its tasks are deleted) and the shared parents
    when nothing else uses them, so no state outlives the run (docs/netcut.md#engines-in-ci)."""
    shared = pathlib.Path("/run/containerd")
    for directory in (
        shared / "runc" / namespace,
        shared / "runc",
        shared / "s",
        shared / "fifo",
        shared,
    ):
        try:
            directory.rmdir()
        except OSError:
            pass  # not there, or in use by another containerd (the CI engines' or the machine's)


@pytest.fixture
def peer(make_netns: Callable[[str], str]) -> Iterator[tuple[str, str, Servers]]:
    """A test host (198.19.N.1, TCP echo on 7000) to be linked into a task's namespace."""
    ns = make_netns("c")
    servers = Servers()
    try:
        yield ns, f"198.19.{next_subnet()}", servers
    finally:
        servers.close()


def _link(pid: int, ns: str, net: str, servers: Servers) -> None:
    """veth: `ns` gets NET.1 (echo server), the task's namespace NET.2 and a default route."""
    name = unique("t")
    sh("ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", "eth0",
       "netns", f"/proc/{pid}/ns/net")  # fmt: skip
    sh("ip", "-n", ns, "addr", "add", f"{net}.1/24", "dev", name)
    sh("ip", "-n", ns, "link", "set", name, "up")
    inside = ["nsenter", "--net=" + f"/proc/{pid}/ns/net", "ip"]
    sh(*inside, "addr", "add", f"{net}.2/24", "dev", "eth0")
    sh(*inside, "link", "set", "eth0", "up")
    sh(*inside, "route", "add", "default", "via", f"{net}.1")
    servers.tcp_echo(ns, f"{net}.1", 7000)


def _reaches(pid: int, addr: str) -> bool:
    from pyroute2.netns import create_socket

    sock = create_socket(f"/proc/{pid}/ns/net", socket.AF_INET, socket.SOCK_STREAM, flags=0)
    with sock:
        sock.settimeout(1.0)
        try:
            sock.connect((addr, 7000))
            sock.sendall(b"ping")
            return sock.recv(4) == b"ping"
        except OSError:
            return False


def test_a_ctr_task_is_cut_probed_and_restored(
    containerd: Containerd, peer: tuple[str, str, Servers]
) -> None:
    pid = containerd.run("web", "--cap-drop", "CAP_NET_RAW")
    ns, net, servers = peer
    _link(pid, ns, net, servers)
    assert wait_for(lambda: _reaches(pid, f"{net}.1"))
    ref = netcut.container("web", "containerd", containerd.namespace)
    result = netcut.cut(ref, expect_blocked=[f"{net}.1:7000"])
    assert result.changed
    assert result.target.endswith(f"(/proc/{pid}/ns/net)")
    assert result.probe is not None
    assert result.probe.ok
    assert not _reaches(pid, f"{net}.1")
    assert netcut.status(f"containerd:{containerd.namespace}/web").is_cut
    assert netcut.status(pid).is_cut, "the same namespace by its PID"
    netcut.restore(ref)
    assert _reaches(pid, f"{net}.1")


def test_a_task_holding_net_raw_is_refused(containerd: Containerd) -> None:
    pid = containerd.run("raw")  # containerd's default capabilities include NET_RAW
    with pytest.raises(netcut.UnsafeTarget) as info:
        netcut.cut(netcut.container("raw", "containerd", containerd.namespace))
    assert any(f.startswith(f"pid {pid} (busybox): CAP_NET_RAW") for f in info.value.findings)


def test_stopped_missing_and_taskless_containers_are_clear_errors(
    containerd: Containerd,
) -> None:
    containerd.run("gone", "--cap-drop", "CAP_NET_RAW")
    containerd.ctr("task", "kill", "-s", "KILL", "gone")
    assert wait_for(lambda: "STOPPED" in containerd.ctr("task", "ls").stdout)
    in_ns = containerd.namespace
    with pytest.raises(netcut.TargetNotFound, match=r"not running \(STOPPED\)"):
        netcut.status(netcut.container("gone", "containerd", in_ns))
    containerd.ctr("task", "rm", "gone")
    with pytest.raises(netcut.TargetNotFound, match=r"not running \(no task\)"):
        netcut.status(netcut.container("gone", "containerd", in_ns))
    with pytest.raises(netcut.TargetNotFound, match="no such container"):
        netcut.status(netcut.container("ghost", "containerd", in_ns))
    with pytest.raises(netcut.TargetNotFound, match="no such container"):
        netcut.status(netcut.container("gone", "containerd"))  # default namespace k8s.io


def test_autodetection_passes_a_silent_docker_and_picks_containerd(
    containerd: Containerd, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = containerd.run("auto", "--cap-drop", "CAP_NET_RAW")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "ctr"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool) or "", bin_dir / tool)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/sbin:/sbin")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)
    target._answered.clear()
    assert target.choose_runtime()[0] == "containerd"
    with pytest.raises(netcut.TargetNotFound, match=r"in namespace k8s\.io: no such container"):
        target.resolve_target("container:auto")  # the default namespace
    monkeypatch.setenv("CONTAINERD_NAMESPACE", containerd.namespace)  # ctr's own variable
    assert target.resolve_target("container:auto").pid == pid
    monkeypatch.delenv("CONTAINERD_NAMESPACE")
    assert target.resolve_target(f"containerd:{containerd.namespace}/auto").pid == pid


async def test_prepare_execution_takes_a_containerd_task(containerd: Containerd) -> None:
    """The boundary with a container target: its listener opens in the task's namespace (the
    proxy answers a request made there), the cut holds, and release restores it."""
    from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution

    pid = containerd.run("agent", "--cap-drop", "CAP_NET_RAW")
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    await proxy.start()
    try:
        sandbox = f"containerd:{containerd.namespace}/agent"
        ex = await prepare_execution(sandbox, Policy(), proxy)
        assert ex.sandbox == sandbox
        assert ex.client_id == "containerd-agent"
        assert netcut.status(pid).is_cut
        answer = await asyncio.to_thread(_ask_proxy_from, pid, ex.token)
        assert answer.startswith(b"HTTP/1.1 403"), answer  # the default posture refuses
        await release_execution(proxy, ex, restore=True)
        assert netcut.status(pid).state == "not cut"
    finally:
        await proxy.stop()


def _ask_proxy_from(pid: int, token: str) -> bytes:
    from pyroute2.netns import create_socket

    sock = create_socket(f"/proc/{pid}/ns/net", socket.AF_INET, socket.SOCK_STREAM, flags=0)
    with sock:
        sock.settimeout(5)
        sock.connect(("127.0.0.1", 3128))
        sock.sendall(b"GET http://198.18.0.1/ HTTP/1.1\r\nHost: 198.18.0.1\r\n\r\n")
        return sock.recv(4096)
