"""Real-kernel fixtures for netcut: a topology made only of namespaces.

    upstream (ncu*) 198.19.N.130/25 --veth-- host (nch*) 198.19.N.129/25   [forwarding on here only]
                                             host bridge ncb* 198.19.N.1/25 (the gateway: a TCP
                                             server stands in for the proxy, a DNS server on 53)
    sandbox (ncs*) eth0 198.19.N.2/25 --veth-- bridge --veth-- peer (ncp*) eth0 198.19.N.3/25

Nothing is created in the machine's root namespace: every link is made inside a test namespace
(`ip -n NS link add ... peer ... netns OTHER`). Addresses come from 198.19.0.0/16 only, every
name starts with `nc` plus pid and counter, and everything is removed in finalizers (atexit as a
last resort). Root-only tests are marked `netns`: they skip when not root, and fail instead
when EGRESS_REQUIRE_NETNS=1.
"""

from __future__ import annotations

import atexit
import os
import socket
from collections.abc import Callable, Iterator

import pytest
from netcut_testlib import (
    Topology,
    link_local,
    next_subnet,
    root_changes,
    root_snapshot,
    sh,
    sysctl,
    unique,
    veth,
)

_created: set[str] = set()
REQUIRE_ENV = "EGRESS_REQUIRE_NETNS"


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture(autouse=True)
def _netns_guard(request: pytest.FixtureRequest) -> None:
    """`@pytest.mark.netns` tests skip when not root, and fail when EGRESS_REQUIRE_NETNS=1."""
    if request.node.get_closest_marker("netns") is None or _is_root():
        return
    reason = "needs root to create network namespaces"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(f"{reason} (set {REQUIRE_ENV}=1 to make this a failure)")


def _cleanup() -> None:
    for name in list(_created):
        sh("ip", "netns", "del", name, check=False)
        _created.discard(name)


atexit.register(_cleanup)


@pytest.fixture
def make_netns() -> Iterator[Callable[[str], str]]:
    mine: list[str] = []

    def make(prefix: str) -> str:
        name = unique(prefix)
        sh("ip", "netns", "add", name)
        _created.add(name)
        mine.append(name)
        for key in ("all", "default"):  # no DAD: link-local addresses usable at once
            sysctl(name, f"net/ipv6/conf/{key}/accept_dad", "0")
        sh("ip", "-n", name, "link", "set", "lo", "up")
        return name

    try:
        yield make
    finally:
        for name in reversed(mine):
            sh("ip", "netns", "del", name, check=False)
            _created.discard(name)


@pytest.fixture
def topo(make_netns: Callable[[str], str]) -> Iterator[Topology]:
    n = next_subnet()
    host, sandbox, peer, upstream = (make_netns(p) for p in ("h", "s", "p", "u"))
    br, up_h = unique("b"), unique("v")
    sh("ip", "-n", host, "link", "add", br, "type", "bridge")
    for ns, ip in ((sandbox, f"198.19.{n}.2"), (peer, f"198.19.{n}.3")):
        port = unique("v")
        veth(host, port, ns)
        sh("ip", "-n", host, "link", "set", port, "master", br, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/25", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", f"198.19.{n}.1")
    sh("ip", "-n", host, "addr", "add", f"198.19.{n}.1/25", "dev", br)
    sh("ip", "-n", host, "link", "set", br, "up")
    veth(host, up_h, upstream)
    sh("ip", "-n", host, "addr", "add", f"198.19.{n}.129/25", "dev", up_h)
    sh("ip", "-n", host, "link", "set", up_h, "up")
    sh("ip", "-n", upstream, "addr", "add", f"198.19.{n}.130/25", "dev", "eth0")
    sh("ip", "-n", upstream, "link", "set", "eth0", "up")
    sh("ip", "-n", upstream, "route", "add", "default", "via", f"198.19.{n}.129")
    sysctl(host, "net/ipv4/ip_forward", "1")
    t = Topology(
        host,
        sandbox,
        peer,
        upstream,
        f"198.19.{n}.1",
        f"198.19.{n}.2",
        f"198.19.{n}.3",
        f"198.19.{n}.130",
    )
    t.peer_v6 = link_local(peer, "eth0")
    t.servers.tcp_echo(host, t.gateway, t.proxy_port)
    t.servers.tcp_echo(host, t.gateway, 53)
    t.servers.udp_echo(host, t.gateway, 53)
    t.servers.tcp_echo(peer, t.peer_ip, t.echo_port)
    t.servers.tcp_echo(peer, "::", t.echo_port, socket.AF_INET6)
    t.servers.tcp_echo(upstream, t.upstream_ip, t.echo_port)
    try:
        yield t
    finally:
        t.servers.close()


@pytest.fixture(autouse=True)
def _netcut_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records go to a per-test directory, never to the machine's /run/netcut."""
    monkeypatch.setenv("NETCUT_STATE_DIR", str(tmp_path_factory.mktemp("netcut-state")))


# ------------------------------------------------ the root namespace stays as it was


@pytest.fixture(scope="session", autouse=True)
def root_namespace_unchanged() -> Iterator[None]:
    """The machine's root namespace (routes, forwarding, netfilter) is identical before and
    after the whole netcut suite; a difference is an error at session teardown."""
    if not _is_root():
        yield
        return
    before = root_snapshot()
    yield
    changed = root_changes(before, root_snapshot())
    assert not changed, f"the netcut suite changed the root namespace: {changed}"
